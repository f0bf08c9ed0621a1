#!/usr/bin/env bash
# Cost of the root agreement before broadcast and reduce (issue 34): braid perf on 4
# ranks over shared memory, 1 KiB..512 KiB, in place, OLD and NEW alternated ROUNDS
# times; prints per size the median time of each and NEW/OLD.
#   results/root_check_ab.sh OLD_BRAID NEW_BRAID [NEW_ENV]
# NEW_ENV (e.g. BRAID_CHECK_ROOTS=1) is set for the NEW runs only. OPS and SIZES
# (perf's size flags) change what is swept. An OLD binary from
# before `--in-place` existed measures in place by default; NEW gets `--in-place`.
set -euo pipefail
old=$1 new=$2 new_env=${3:-} rounds=${ROUNDS:-3}
ops=${OPS:-"broadcast reduce"}
read -r -a sizes <<<"${SIZES:--b 1K -e 1M -f 8 -n 300 -w 20}"
dir=$(mktemp -d)
for r in $(seq "$rounds"); do
  for who in old new; do
    for op in $ops; do
      if [ $who = old ]; then
        timeout 120 "$old" perf --op $op --ranks 4 "${sizes[@]}" >"$dir/$who-$op-$r.txt" 2>&1
      else
        env $new_env timeout 120 "$new" perf --op $op --ranks 4 "${sizes[@]}" --in-place \
          >"$dir/$who-$op-$r.txt" 2>&1
      fi
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
            # The old layout has one time column (6th); the new one prints n/a out of place, then in place.
            col = 9 if t[5] == "n/a" else 5
            data.setdefault((op, int(t[0]), who), []).append(float(t[col]))
print("| op | size | old us (median) | new us (median) | new/old |")
print("|---|---|---|---|---|")
for op, size, who in sorted(k for k in data if k[2] == "old"):
    o, n = statistics.median(data[(op, size, "old")]), statistics.median(data[(op, size, "new")])
    print(f"| {op} | {size} | {o:.2f} | {n:.2f} | {n / o:.3f} |")
PY
