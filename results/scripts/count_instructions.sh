#!/usr/bin/env bash
# Instructions per iteration of `braid perf` (all ranks together), counted by
# valgrind's callgrind, which is deterministic where wall time on a shared VM is not.
# Two runs, ITERS_LO and ITERS_HI timed iterations, are subtracted so set-up
# (launch, connect, planning the first call) cancels out. Pinned to one CPU with
# taskset so a waiting rank yields to its peer (WaitPolicy::for_ranks sees more
# ranks than cores) instead of spinning out a time slice: the count of idle passes
# then stays small and nearly constant from run to run.
# Usage: BIN=target/release/braid T=shm SIZE=4K REPS=2 results/scripts/count_instructions.sh
set -u
BIN=${BIN:?path of a braid binary}
T=${T:-shm}
SIZE=${SIZE:-4K}
REPS=${REPS:-1}
LO=${ITERS_LO:-200}
HI=${ITERS_HI:-2000}
tmp=$(mktemp -d)
total() { # iters -> instructions summed over every process of the run
  taskset -c 0 valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$tmp/cg.%p" \
    "$BIN" perf --in-place --ranks 2 --transport "$T" --min-bytes "$SIZE" --max-bytes "$SIZE" --iters "$1" --warmup 5 2>&1 |
    sed -n 's/.*Collected : //p' | tr -d , | awk '{s += $1} END {print s}'
}
for r in $(seq 1 "$REPS"); do
  lo=$(total "$LO"); hi=$(total "$HI")
  echo "$T $SIZE rep $r: $(( (hi - lo) / (HI - LO) )) instructions per iteration (both ranks)"
done
rm -rf "$tmp"
