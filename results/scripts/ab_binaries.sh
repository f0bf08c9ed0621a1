#!/bin/bash
# Two braid binaries alternated (old first in odd rounds, new first in even): all-reduce with the tuner's pick (auto), 4 KiB-64 MiB.
# Each binary keeps its own tuner cache (calibrated once, on its first run).
#   results/scripts/ab_binaries.sh OLD_BRAID NEW_BRAID RANKS ROUNDS OUTDIR
#   then results/scripts/ab_binaries_summarize.py OUTDIR (per-size medians of new/old)
# Unlike results/scripts/ab_runs.sh (2 ranks as threads of one `braid perf`), the ranks are
# processes under `braid run`, placed and calibrated as a launched job is.
# OP (default all-reduce) and TRANSPORT (default auto) choose the collective and links.
set -euo pipefail
OP=${OP:-all-reduce} TRANSPORT=${TRANSPORT:-auto}
# In place, as every binary measured before `braid perf` learned both modes (those
# have no --in-place flag, and measure in place without it).
in_place() { "$1" perf --help | grep -q -- --in-place && echo --in-place || true; }
old=$(realpath "$1") new=$(realpath "$2") n=$3 rounds=$4 out=$(realpath -m "$5")
mkdir -p "$out/cache-old" "$out/cache-new"
for r in $(seq 1 "$rounds"); do
  order="old new"; [ $((r % 2)) = 0 ] && order="new old"
  for which in $order; do
    b=${!which}
    XDG_CACHE_HOME=$out/cache-$which "$b" run -n "$n" -- "$b" perf $(in_place "$b") --op "$OP" --transport "$TRANSPORT" -b 4K -e 64M -f 4 -n 30 -w 5 \
      --json "$out/$which-r$r.json" >/dev/null
  done
done
