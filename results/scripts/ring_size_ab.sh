#!/bin/bash
# Ring size per direction of shared-memory links, alternating sizes every round:
# 2 ranks (bound by default), f32 sum, in place, 1-64 MiB, real-time priority.
# Usage: results/scripts/ring_size_ab.sh OUTDIR default 512K 2M   ("default": no variable)
OUT=$1; shift; mkdir -p $OUT
for r in 1 2 3 4 5; do
 for op in all-reduce all-gather broadcast reduce-scatter; do
  for rb in "$@"; do
   env $([ "$rb" = default ] || echo BRAID_SHM_RING_BYTES=$rb) chrt -f 5 ${BIN:-target/release/braid} perf --in-place --op $op -b 1M -e 64M -f 4 -n 40 --json $OUT/$rb-$op-r$r.jsonl >/dev/null 2>&1
  done
 done
done
python3 - "$OUT" <<'PY'
import glob,json,os,statistics,sys
rows={}
for f in glob.glob(sys.argv[1]+"/*.jsonl"):
    base=os.path.basename(f)[:-6]; rb=base.split("-")[0]; op="-".join(base.split("-")[1:-1])
    for l in open(f):
        d=json.loads(l); rows.setdefault((op,d["bytes"]),{}).setdefault(rb,[]).append(d["busbw_gbps"])
for k in sorted(rows):
    print(k[0], k[1]>>20, "MiB", "  ".join(f"{rb}:{statistics.median(v):.2f}" for rb,v in sorted(rows[k].items())))
PY
