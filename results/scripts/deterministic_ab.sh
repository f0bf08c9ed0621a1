#!/bin/bash
# Reproducible mode's cost: `braid perf` (auto) with and without BRAID_DETERMINISTIC=1,
# alternating (order flipped each round), N ranks on this host.
#   results/scripts/deterministic_ab.sh N ROUNDS OUTDIR && results/scripts/deterministic_summarize.py OUTDIR
set -euo pipefail
BRAID=$(realpath "${BRAID:-target/release/braid}")
n=$1 rounds=$2 out=$3; mkdir -p "$out"
one() { # mode round
  local env=(); [ "$1" = det ] && env=(BRAID_DETERMINISTIC=1)
  env "${env[@]}" "$BRAID" run -n "$n" -- "$BRAID" perf --in-place -b 4K -e 1M -f 4 -c 1 --json "$out/$1-$2.small" >/dev/null
  env "${env[@]}" "$BRAID" run -n "$n" -- "$BRAID" perf --in-place -b 4M -e 64M -f 4 -n 5 -w 1 -c 1 --json "$out/$1-$2.large" >/dev/null
  cat "$out/$1-$2.small" "$out/$1-$2.large" > "$out/$1-$2.json"; rm -f "$out/$1-$2.small" "$out/$1-$2.large"
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then one fast "$r"; one det "$r"; else one det "$r"; one fast "$r"; fi
  echo "round $r done"
done
