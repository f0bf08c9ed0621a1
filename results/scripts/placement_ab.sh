#!/usr/bin/env bash
# Issue 17, acceptance 1: braid's default placement against the same binary pinned
# by hand (taskset, one core per rank), both under `braid run -n 2`, alternating
# every round, all-reduce f32 sum in place at 1 MiB and 64 MiB with --check.
# Usage: BIN=target/release/braid ROUNDS=8 OUT=/tmp/placement results/scripts/placement_ab.sh
set -u
BIN=${BIN:?path of braid}
# PRIO="chrt -f 5": every rank at real-time priority, so other work on a shared
# machine does not decide the result.
PRIO=${PRIO:-}
ROUNDS=${ROUNDS:-8}
OUT=${OUT:-/tmp/braid-placement}
mkdir -p "$OUT"
perf_args() { echo "perf --min-bytes $1 --max-bytes $1 --iters $2 --warmup 5 --check"; }
one() { # label size iters round
  local label=$1 s=$2 iters=$3 r=$4
  local json="$OUT/$label-$s-r$r.jsonl"
  if [ "$label" = default ]; then
    $PRIO "$BIN" run -n 2 -- "$BIN" $(perf_args "$s" "$iters") --json "$json" > /dev/null 2>&1
  else
    $PRIO "$BIN" run -n 2 -- sh -c "exec taskset -c \$BRAID_LOCAL_RANK $BIN $(perf_args "$s" "$iters") --json $json" > /dev/null 2>&1
  fi || echo "FAILED $label $s round $r"
}
for r in $(seq 1 "$ROUNDS"); do
  for cfg in "1M 200" "64M 20"; do
    set -- $cfg
    if [ $((r % 2)) = 1 ]; then one default "$@" "$r"; one pinned "$@" "$r"
    else one pinned "$@" "$r"; one default "$@" "$r"; fi
  done
  echo "round $r done $(date -u +%H:%M:%S)"
done
