#!/usr/bin/env bash
# A/B of two braid builds, alternating: all-reduce f32 sum in place, 2 ranks, at
# 4 KiB, 1 MiB and 64 MiB over shared memory and TCP. Each round runs A then B (B
# then A on odd rounds) for every configuration; results/scripts/ab_summarize.py takes the
# per-size medians. Usage: A=old/braid B=new/braid ROUNDS=5 OUT=/tmp/ab results/scripts/ab_runs.sh
# PRIO="chrt -f 5" runs every rank at real-time priority (root), so other work on a
# shared machine cannot push a rank off its core mid-iteration.
set -u
A=${A:?path of build A}
B=${B:?path of build B}
ROUNDS=${ROUNDS:-5}
PRIO=${PRIO:-}
OUT=${OUT:-/tmp/braid-ab}
# OP=all-gather (or any `braid perf --op`) and CONFIGS="shm 4K 5000;shm 1M 600"
# (transport size iters, `;` between) narrow the comparison.
OP=${OP:-all-reduce}
CONFIGS=${CONFIGS:-shm 4K 5000;shm 1M 600;shm 64M 30;tcp 4K 5000;tcp 1M 400;tcp 64M 16}
mkdir -p "$OUT"
# In place, as every build measured before `braid perf` learned both modes (those
# have no --in-place flag, and measure in place without it).
in_place() { "$1" perf --help | grep -q -- --in-place && echo --in-place || true; }
one() { # build label transport size iters round
  local bin=$1 label=$2 t=$3 s=$4 iters=$5 r=$6
  $PRIO "$bin" perf $(in_place "$bin") --op "$OP" --ranks 2 --transport "$t" --min-bytes "$s" --max-bytes "$s" --iters "$iters" --warmup 5 --check \
    --json "$OUT/$label-$t-$s-r$r.jsonl" > /dev/null 2>&1 || echo "FAILED $label $t $s round $r"
}
for r in $(seq 1 "$ROUNDS"); do
  IFS=';' read -ra cfgs <<< "$CONFIGS"
  for cfg in "${cfgs[@]}"; do
    set -- $cfg
    if [ $((r % 2)) = 1 ]; then one "$A" A "$@" "$r"; one "$B" B "$@" "$r"
    else one "$B" B "$@" "$r"; one "$A" A "$@" "$r"; fi
  done
  echo "round $r done $(date -u +%H:%M:%S)"
done
