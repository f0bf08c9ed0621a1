#!/bin/bash
# Acceptance 3 of issue 18: `braid simulate` against measured time, per run. Each run
# drops this host's cached link costs, so the run's first communicator probes and
# calibrates in the machine's state of that moment, then sweeps every algorithm
# (`braid perf --algo all`), then compares that run's medians with `simulate --probed`.
#   results/scripts/simulate_ab.sh RANKS RUNS OUTDIR [--oversubscribed]   (more ranks than cores)
set -euo pipefail
n=$1 runs=$2 out=$3 extra=${4:-}; mkdir -p "$out"
cache=${BRAID_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/braid}
for r in $(seq 1 "$runs"); do
  rm -f "$cache"/tuner-shm-*
  "$(dirname "$0")/tuner_ab.sh" onehost "$n" 1 "$out/run$r" >/dev/null
  echo "## run $r"
  python3 "$(dirname "$0")/simulate_vs_measured.py" "$n" $extra "$out/run$r"/*.json
done
