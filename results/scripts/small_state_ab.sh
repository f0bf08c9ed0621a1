#!/usr/bin/env bash
# Issue 17, acceptance 4 at 4 KiB: braid against Open MPI's shared memory, 2 ranks,
# all-gather, reduce-scatter and broadcast, alternating every round (the order flips
# each round). The VM moves its two vCPUs apart and back every few seconds to
# minutes (a core-to-core round trip of ~90 ns or ~400 ns), which changes a 4 KiB
# call by 3x, so the round trip is measured before, between and after the two runs
# of a pair, and the summary keeps only pairs that ran wholly in one state.
# Usage: BIN=target/release/braid MPI=/tmp/mpi/mpi_allreduce ROUNDS=16 OUT=/tmp/small.txt \
#        results/scripts/small_state_ab.sh; results/scripts/small_state_summarize.py /tmp/small.txt
set -u
BIN=${BIN:?path of braid}
MPI=${MPI:?path of mpi_allreduce}
ROUNDS=${ROUNDS:-16}
OUT=${OUT:-/tmp/braid-small.txt}
PROBE=$(mktemp)
gcc -O2 -pthread -o "$PROBE" "$(dirname "$0")/../probe/core_pingpong.c"
: > "$OUT"
state() { "$PROBE" | sed 's/.*pingpong \([0-9]*\) ns.*/\1/'; }
braid() {
  "$BIN" perf --in-place --op "$1" --ranks 2 -b 4096 -e 4096 -n 100 -w 10 -c 1 2>&1 | grep -E "^ +4096" | awk '{print $10}'
}
mpi() {
  mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo -np 2 "$MPI" --op "$1" --label sm \
    --mode inplace --sizes 4096 --iters 100 2>/dev/null | grep -o '"median_us":[0-9.]*' | cut -d: -f2
}
for i in $(seq 1 "$ROUNDS"); do
  for pair in "all-gather allgather" "reduce-scatter reducescatter" "broadcast bcast"; do
    set -- $pair
    if [ $((i % 2)) = 1 ]; then
      s0=$(state); b=$(braid "$1"); s1=$(state); m=$(mpi "$2"); s2=$(state)
    else
      s0=$(state); m=$(mpi "$2"); s1=$(state); b=$(braid "$1"); s2=$(state)
    fi
    echo "$i $1 $s0 $s1 $s2 braid ${b:-FAILED} mpi ${m:-FAILED}" >> "$OUT"
  done
done
rm -f "$PROBE"
