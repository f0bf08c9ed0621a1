#!/usr/bin/env bash
# Issue 17, acceptance 2 and 4: braid against Open MPI's shared memory, f32 sum,
# in place, nccl-tests sizes and busbw, alternating braid and Open MPI every round
# (the order flips each round). Configurations (CONFIGS, space separated):
#   ar2 ar2reg ar4 bc2 ag2 rs2 a2a2 — all-reduce 2 ranks, the same --registered,
#   all-reduce 4 ranks (on however many cores there are), broadcast, all-gather,
#   reduce-scatter, all-to-all with 2 ranks (Open MPI's all-to-all through our own
#   results/probe/mpi_alltoall.c, timed like the shared peer: the peer has none).
#   Any of ar2 bc2 ag2 rs2 with the suffix cma (ag2cma) runs braid alone with
#   BRAID_CMA=1 (plain buffers single-copy); the summary compares it with the base.
# Usage: BIN=target/release/braid MPI=/tmp/mpi/mpi_allreduce ROUNDS=3 OUT=/tmp/vs \
#        results/scripts/vs_mpi.sh; results/scripts/vs_mpi_summarize.py /tmp/vs
# (build the peer: mpicc -O2 -o /tmp/mpi/mpi_allreduce ../shared/peers/src/mpi_allreduce.c)
# PRIO="chrt -f 5" runs both at real-time priority (a shared machine).
set -u
BIN=${BIN:?path of braid}
MPI=${MPI:?path of mpi_allreduce}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-100}
OUT=${OUT:-/tmp/braid-vs}
PRIO=${PRIO:-}
CONFIGS=${CONFIGS:-ar2 ar2reg ar4 bc2 ag2 rs2}
SIZES=${SIZES:-4096,65536,1048576,16777216,67108864}
mkdir -p "$OUT"
# The VM host now and then moves the two vCPUs apart (core-to-core round trip
# ~55 ns -> ~330 ns) for tens of seconds; every run records the round trip
# measured just before it, and the summary compares runs of the same state.
PROBE=$OUT/core_pingpong
gcc -O2 -pthread -o "$PROBE" "$(dirname "$0")/../probe/core_pingpong.c"
A2A=$OUT/mpi_alltoall
case " $CONFIGS " in *" a2a2 "*) mpicc -O2 -o "$A2A" "$(dirname "$0")/../probe/mpi_alltoall.c" -lm;; esac
state() { "$PROBE" | sed 's/.*pingpong \([0-9]*\) ns.*/\1/' > "$OUT/state-$1.txt"; }
braid_op() { case $1 in ar*) echo all-reduce;; bc*) echo broadcast;; ag*) echo all-gather;; rs*) echo reduce-scatter;; a2a*) echo all-to-all;; esac; }
mpi_op() { case $1 in ar*) echo allreduce;; bc*) echo bcast;; ag*) echo allgather;; rs*) echo reducescatter;; a2a*) echo alltoall;; *) echo none;; esac; }
ranks() { case $1 in *4*) echo 4;; *) echo 2;; esac; }
braid() { # config round
  local c=$1 r=$2 extra=--in-place f="$OUT/braid-$1-r$2.jsonl"
  local env=()
  [ "$c" = ar2reg ] && extra="--in-place --registered"
  # *cma: plain buffers single-copy through process_vm_readv (BRAID_CMA=1).
  case $c in *cma) env=(BRAID_CMA=1);; esac
  # The peer's all-to-all probe is out of place: so is braid's here.
  case $c in a2a*) extra=--out-of-place;; esac
  state "braid-$c-r$r"
  : > "$f"
  for s in ${SIZES//,/ }; do
    env "${env[@]}" $PRIO "$BIN" perf --op "$(braid_op "$c")" --ranks "$(ranks "$c")" -b "$s" -e "$s" -n "$ITERS" -w 10 -c 1 $extra \
      --json "$f.part" > /dev/null 2>&1 || echo "FAILED braid $c $s round $r"
    cat "$f.part" >> "$f" 2>/dev/null; rm -f "$f.part"
  done
}
mpi() { # config round
  local c=$1 r=$2 op
  op=$(mpi_op "$c")
  [ "$op" = none ] || [ "$c" = ar2reg ] && return 0
  case $c in *cma) return 0;; esac
  state "mpi-$c-r$r"
  local prog=("$MPI" --op "$op" --label sm --mode inplace)
  [ "$op" = alltoall ] && prog=("$A2A")
  $PRIO mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo -np "$(ranks "$c")" "${prog[@]}" \
    --sizes "$SIZES" --iters "$ITERS" > "$OUT/mpi-$c-r$r.jsonl" 2>/dev/null \
    || echo "FAILED mpi $c round $r"
}
for r in $(seq 1 "$ROUNDS"); do
  for c in $CONFIGS; do
    if [ $((r % 2)) = 1 ]; then braid "$c" "$r"; mpi "$c" "$r"; else mpi "$c" "$r"; braid "$c" "$r"; fi
  done
  echo "round $r done $(date -u +%H:%M:%S)"
done
