#!/usr/bin/env bash
# Issue 17, acceptance 3: all-reduce (2 ranks, f32 sum, in place, shared memory)
# with HOGS unbound busy loops beside the job, braid and Open MPI alternating
# every round, at 4 KiB, 64 KiB and 1 MiB.
# Usage: BIN=target/release/braid MPI=/tmp/mpi/mpi_allreduce HOGS=1 ROUNDS=3 \
#        OUT=/tmp/busy results/scripts/busy_ab.sh; results/scripts/busy_summarize.py /tmp/busy
# (build the peer: mpicc -O2 -o /tmp/mpi/mpi_allreduce ../shared/peers/src/mpi_allreduce.c)
# Extra braid labels: BRAID_ENVS="bound:BRAID_BIND=auto" runs braid again per
# round with those variables (label:VAR=value,VAR=value ...).
set -u
BIN=${BIN:?path of braid}
MPI=${MPI:?path of mpi_allreduce}
HOGS=${HOGS:-1}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-200}
OUT=${OUT:-/tmp/braid-busy}
BRAID_ENVS=${BRAID_ENVS:-}
mkdir -p "$OUT"
hogs=()
for _ in $(seq 1 "$HOGS"); do sh -c 'while :; do :; done' & hogs+=($!); done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
braid() { # label round [env...]
  local label=$1 r=$2; shift 2
  env "$@" "$BIN" perf --in-place -b 4K -e 1M -f 16 -n "$ITERS" -w 20 -c 1 --json "$OUT/$label-h$HOGS-r$r.jsonl" > /dev/null 2>&1 \
    || echo "FAILED $label round $r"
}
mpi() {
  mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo -np 2 "$MPI" --op allreduce \
    --label sm --mode inplace --sizes 4096,65536,1048576 --iters "$ITERS" > "$OUT/mpi-h$HOGS-r$1.jsonl" 2>/dev/null \
    || echo "FAILED mpi round $1"
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then braid braid "$r"; mpi "$r"; else mpi "$r"; braid braid "$r"; fi
  for spec in $BRAID_ENVS; do braid "${spec%%:*}" "$r" $(echo "${spec#*:}" | tr , ' '); done
  echo "round $r done $(date -u +%H:%M:%S)"
done
