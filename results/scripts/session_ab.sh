#!/usr/bin/env bash
# Two braid binaries alternated ROUNDS times (default 3) on the same sweep, both in
# place; per op and size the median over rounds of each binary's time, and NEW/OLD.
#   results/scripts/session_ab.sh OLD_BRAID NEW_BRAID
# OPS (default "all-reduce broadcast all-gather send-recv"), RANKS (4), SIZES
# (perf's size flags), EXTRA (more perf flags for both, e.g. "--transport tcp").
set -euo pipefail
old=$1 new=$2 rounds=${ROUNDS:-3} ranks=${RANKS:-4}
ops=${OPS:-"all-reduce broadcast all-gather send-recv"}
read -r -a sizes <<<"${SIZES:--b 1K -e 16M -f 16 -n 100 -w 10}"
read -r -a extra <<<"${EXTRA:-}"
dir=$(mktemp -d)
for r in $(seq "$rounds"); do
  for who in old new; do
    bin=$old; [ $who = new ] && bin=$new
    for op in $ops; do
      place=(--in-place); [ "$op" = send-recv ] && place=()
      timeout 300 "$bin" perf --op "$op" --ranks "$ranks" "${sizes[@]}" "${place[@]}" "${extra[@]}" \
        >"$dir/$who-$op-$r.txt" 2>&1
    done
  done
done
python3 - "$dir" <<'PY'
import glob, os, statistics, sys
data = {}
for f in glob.glob(os.path.join(sys.argv[1], "*.txt")):
    parts = os.path.basename(f)[:-4].split("-")
    who, op = parts[0], "-".join(parts[1:-1])
    for line in open(f):
        t = line.split()
        if len(t) > 8 and t[0].isdigit():
            # One mode per run: the other mode's columns read n/a.
            col = 9 if t[5] == "n/a" else 5
            data.setdefault((op, int(t[0]), who), []).append(float(t[col]))
print("| op | size | old us (median) | new us (median) | new/old |")
print("|---|---|---|---|---|")
for op, size, who in sorted(k for k in data if k[2] == "old"):
    o, n = data[(op, size, "old")], data.get((op, size, "new"), [])
    if n:
        mo, mn = statistics.median(o), statistics.median(n)
        print(f"| {op} | {size} | {mo:.2f} | {mn:.2f} | {mn / mo:.2f} |")
PY
rm -rf "$dir"
