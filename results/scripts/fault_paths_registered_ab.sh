#!/bin/bash
# Issue 31, defects 8 and 10 add checks to the single-copy paths (an exposure epoch
# read around each pull, and a length check of a peer's registered segment before
# each read): two braid binaries alternated on all-reduce from registered buffers
# and with BRAID_CMA=1, 2 ranks as processes, 128 KiB-64 MiB.
#   results/scripts/fault_paths_registered_ab.sh OLD_BRAID NEW_BRAID ROUNDS OUTDIR
#   then results/scripts/ab_binaries_summarize.py OUTDIR/registered and OUTDIR/cma
set -euo pipefail
# In place, as every binary measured before `braid perf` learned both modes (those
# have no --in-place flag, and measure in place without it).
in_place() { "$1" perf --help | grep -q -- --in-place && echo --in-place || true; }
old=$(realpath "$1") new=$(realpath "$2") rounds=$3 out=$(realpath -m "$4")
for m in registered cma; do mkdir -p "$out/$m/cache-old" "$out/$m/cache-new"; done
for r in $(seq 1 "$rounds"); do
  order="old new"; [ $((r % 2)) = 0 ] && order="new old"
  for m in registered cma; do
    for which in $order; do
      b=${!which}
      if [ "$m" = registered ]; then flags=(--registered); cma=0; else flags=(); cma=1; fi
      BRAID_CMA=$cma XDG_CACHE_HOME=$out/$m/cache-$which "$b" run -n 2 -- "$b" perf $(in_place "$b") --op all-reduce "${flags[@]}" \
        -b 128K -e 64M -f 8 -n 30 -w 5 --json "$out/$m/$which-r$r.json" >/dev/null
    done
  done
done
