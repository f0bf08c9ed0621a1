#!/usr/bin/env bash
# Plain against non-temporal ring writes (BRAID_NT_STORES=auto|off|on), alternating
# every round, 2 ranks f32 sum in place at 1, 8 and 64 MiB (or MIN..MAX by FACTOR,
# ITERS iterations), with the core-to-core round trip measured before each round
# (results/probe/core_pingpong.c).
# Usage: BIN=target/release/braid ROUNDS=6 OUT=/tmp/nt results/scripts/stream_stores_ab.sh
#        MIN=4K MAX=1M FACTOR=4 ITERS=1000 OPS="all-gather all-to-all" ... (small sizes)
set -u
BIN=${BIN:?path of braid}
ROUNDS=${ROUNDS:-6}
OUT=${OUT:-/tmp/braid-nt}
OPS=${OPS:-all-reduce all-gather}
MIN=${MIN:-1M}
MAX=${MAX:-64M}
FACTOR=${FACTOR:-8}
ITERS=${ITERS:-30}
mkdir -p "$OUT"
PROBE=$OUT/core_pingpong
gcc -O2 -pthread -o "$PROBE" "$(dirname "$0")/../probe/core_pingpong.c"
for r in $(seq 1 "$ROUNDS"); do
  rt=$("$PROBE" | sed 's/.*pingpong \([0-9]*\) ns.*/\1/')
  for op in $OPS; do
    for mode in auto off on; do
      BRAID_NT_STORES=$mode "$BIN" perf --in-place --op "$op" -b "$MIN" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w 5 --json "$OUT/$mode-$op-r$r-rt$rt.jsonl" > /dev/null 2>&1 \
        || echo "FAILED $mode $op round $r"
    done
  done
  echo "round $r: round trip ${rt} ns $(date -u +%H:%M:%S)"
done
python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
rows = {}
for f in glob.glob(sys.argv[1] + "/*.jsonl"):
    mode, rest = os.path.basename(f)[:-6].split("-", 1)
    op, rnd, rt = rest.rsplit("-", 2)
    state = "cores apart (round trip > 150 ns)" if int(rt[2:]) > 150 else "cores together"
    for l in open(f):
        d = json.loads(l)
        rows.setdefault((state, op, d["bytes"]), {}).setdefault(mode, []).append(d["busbw_gbps"])
print("| host state | op | size | auto | off (plain) | on (streaming) | rounds |")
print("|---|---|---|---|---|---|---|")
for k in sorted(rows):
    r = rows[k]
    cell = lambda m: f"{statistics.median(r[m]):.2f}" if m in r else "-"
    size = f"{k[2] >> 20} MiB" if k[2] >= 1 << 20 else f"{k[2] >> 10} KiB"
    print(f"| {k[0]} | {k[1]} | {size} | {cell('auto')} | {cell('off')} | {cell('on')} | {len(r.get('auto', []))} |")
PY
