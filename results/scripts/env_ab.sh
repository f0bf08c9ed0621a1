#!/bin/bash
# One braid binary under two environments, alternated (A first in odd rounds, B
# first in even), 2 ranks unless RANKS is set, in place, per-size medians:
#   OP=broadcast SIZES=4M,16M,64M [ITERS=30] results/scripts/env_ab.sh "BRAID_X=1" "BRAID_X=0" ROUNDS OUTDIR
#   then results/scripts/env_ab_summarize.py OUTDIR
# Each side is a space-separated list of VAR=value (may be empty: "").
set -euo pipefail
BIN=${BIN:-target/release/braid} OP=${OP:-all-reduce} RANKS=${RANKS:-2} SIZES=${SIZES:-4M,16M,64M} ITERS=${ITERS:-30}
a=$1 b=$2 rounds=$3 out=$4
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  order="A B"; [ $((r % 2)) = 0 ] && order="B A"
  for side in $order; do
    vars=$a; [ "$side" = B ] && vars=$b
    for s in ${SIZES//,/ }; do
      env $vars "$BIN" perf --op "$OP" --ranks "$RANKS" --in-place -b "$s" -e "$s" -n "$ITERS" -w 5 \
        --json "$out/$side-r$r.json" > /dev/null
    done
  done
done
echo "A: $a" > "$out/sides.txt"; echo "B: $b" >> "$out/sides.txt"
