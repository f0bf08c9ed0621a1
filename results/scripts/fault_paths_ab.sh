#!/bin/bash
# Issue 31 acceptance 3: two braid binaries alternated (old first in odd rounds, new
# first in even) on all-reduce, 2 ranks as processes under `braid run`, 4 KiB-64 MiB,
# over shared memory and over TCP (BRAID_TRANSPORTS). Each binary and transport keeps
# its own tuner cache, calibrated on its first run.
#   results/scripts/fault_paths_ab.sh OLD_BRAID NEW_BRAID ROUNDS OUTDIR
#   then results/scripts/ab_binaries_summarize.py OUTDIR/shm and OUTDIR/tcp
set -euo pipefail
# In place, as every binary measured before `braid perf` learned both modes (those
# have no --in-place flag, and measure in place without it).
in_place() { "$1" perf --help | grep -q -- --in-place && echo --in-place || true; }
old=$(realpath "$1") new=$(realpath "$2") rounds=$3 out=$(realpath -m "$4")
for t in shm tcp; do mkdir -p "$out/$t/cache-old" "$out/$t/cache-new"; done
for r in $(seq 1 "$rounds"); do
  order="old new"; [ $((r % 2)) = 0 ] && order="new old"
  for t in shm tcp; do
    for which in $order; do
      b=${!which}
      BRAID_TRANSPORTS=$t XDG_CACHE_HOME=$out/$t/cache-$which "$b" run -n 2 -- "$b" perf $(in_place "$b") --op all-reduce \
        -b 4K -e 64M -f 4 -n 30 -w 5 --json "$out/$t/$which-r$r.json" >/dev/null
    done
  done
done
