#!/bin/bash
# The fusion bench of two source trees alternated (old first in odd rounds), modes
# per_tensor, fused and one_buffer (or the bench filter in FILTER); one row per round,
# mode and transport.
#   [FILTER=regex] results/scripts/fusion_ab.sh OLD_TREE NEW_TREE OUTDIR [ROUNDS]   (trees: git worktrees)
# Each tree builds into its own target/ on the first round.
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2") out=$(realpath -m "$3") rounds=${4:-3}
filter=${FILTER:-per_tensor|fused|one_buffer}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  order="old new"; [ $((r % 2)) = 0 ] && order="new old"
  for w in $order; do
    d=${!w}
    cd "$d"; rm -rf target/criterion/fusion_1000_tensors_*
    CARGO_TARGET_DIR=$d/target cargo bench --bench fusion -- --noplot "$filter" > "$out/$w-r$r.log" 2>&1
    for p in target/criterion/fusion_1000_tensors_*/*/new/estimates.json; do
      g=$(echo "$p" | cut -d/ -f3); m=$(echo "$p" | cut -d/ -f4)
      ms=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['median']['point_estimate']/1e6)" "$p")
      printf "%s\t%s\t%s\t%s\t%s\n" "$w" "$r" "$g" "$m" "$ms" >> "$out/estimates.tsv"
    done
  done
done
