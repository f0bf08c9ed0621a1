#!/usr/bin/env bash
# The cost of the root check on rooted calls: three configurations alternated
# ROUNDS times (default 3), median out-of-place time per op and size.
#   results/scripts/root_check_ab.sh OLD_BRAID NEW_BRAID
#   off:     OLD with BRAID_CHECK_ROOTS=0 (no check)
#   before:  OLD with BRAID_CHECK_ROOTS=1 (a barrier before the data)
#   merged:  NEW with BRAID_CHECK_ROOTS=1 (the exchange in the data's rounds)
# OPS (default "broadcast reduce gather scatter"), RANKS (4), SIZES, EXTRA as in
# session_ab.sh.
set -euo pipefail
old=$1 new=$2 rounds=${ROUNDS:-3} ranks=${RANKS:-4}
ops=${OPS:-"broadcast reduce gather scatter"}
read -r -a sizes <<<"${SIZES:--b 1K -e 16M -f 16 -n 200 -w 20}"
read -r -a extra <<<"${EXTRA:-}"
dir=$(mktemp -d)
for r in $(seq "$rounds"); do
  for who in off before merged; do
    bin=$old check=1
    [ $who = off ] && check=0
    [ $who = merged ] && bin=$new
    for op in $ops; do
      BRAID_CHECK_ROOTS=$check timeout 300 "$bin" perf --op "$op" --ranks "$ranks" "${sizes[@]}" "${extra[@]}" \
        >"$dir/$who-$op-$r.txt" 2>&1
    done
  done
done
python3 - "$dir" <<'PY'
import glob, os, statistics, sys
data = {}
for f in glob.glob(os.path.join(sys.argv[1], "*.txt")):
    who, op, _ = os.path.basename(f)[:-4].split("-")
    for line in open(f):
        t = line.split()
        if len(t) > 8 and t[0].isdigit():
            data.setdefault((op, int(t[0]), who), []).append(float(t[5]))
print("| op | size | off us | before us | merged us | before/off | merged/off |")
print("|---|---|---|---|---|---|---|")
for op, size, _ in sorted(k for k in data if k[2] == "off"):
    m = {w: statistics.median(data.get((op, size, w), [float("nan")])) for w in ("off", "before", "merged")}
    print(f"| {op} | {size} | {m['off']:.2f} | {m['before']:.2f} | {m['merged']:.2f} | "
          f"{m['before'] / m['off']:.2f} | {m['merged'] / m['off']:.2f} |")
PY
rm -rf "$dir"
