#!/bin/bash
# Issue 36: BRAID_CMA ways alternated on one binary (the order reverses every
# round), 2 ranks over shared memory, in place, 1, 16 and 64 MiB; the core-to-core
# round trip is recorded before each run (which machine state it ran in).
#   [KINDS="auto exchange 0"] [BIN=target/release/braid] results/scripts/cma_ab.sh OUT.tsv ROUNDS OP...
#   results/scripts/cma_ab_summarize.py OUT.tsv
# Columns: round, op, BRAID_CMA, size, in-place µs, round trip ns.
set -euo pipefail
BIN=${BIN:-target/release/braid}
out=$1 rounds=$2; shift 2
probe=$(mktemp -d)/core_pingpong
gcc -O2 -pthread -o "$probe" "$(dirname "$0")/../probe/core_pingpong.c"
for r in $(seq 1 "$rounds"); do
  order=${KINDS:-"auto exchange 0"}
  [ $((r % 2)) = 0 ] && order=$(echo $order | tr " " "\n" | tac | tr "\n" " ")
  for op in "$@"; do
    for c in $order; do
      st=$("$probe" | sed 's/.*pingpong \([0-9]*\) ns.*/\1/')
      for s in 1M 16M 64M; do
        n=100; [ $s = 64M ] && n=30
        t=$(BRAID_CMA=$c "$BIN" perf --op "$op" --ranks 2 -b $s -e $s -n $n -w 10 --in-place 2>&1 | grep -v '^#' | awk '{print $10}')
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$op" "$c" "$s" "$t" "$st"
      done
    done
  done
done >> "$out"
