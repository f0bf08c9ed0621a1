#!/usr/bin/env bash
# braid beside the peers: all-reduce f32 sum in place at the peers' sizes, one JSON
# file per configuration. Usage: results/scripts/braid_runs.sh TAG   (run it before and
# after ../shared/peers/run_all.sh, then results/scripts/summarize.py).
set -u
B=${BRAID:-target/release/braid}
OUT=${OUT:-/tmp/braid-results}
tag=$1
mkdir -p "$OUT"
for cfg in "2 tcp" "2 shm" "2 shm --registered" "4 tcp" "4 shm" "4 shm --registered"; do
  set -- $cfg; n=$1; t=$2; shift 2; extra="$*"
  name="n${n}-${t}${extra:+-reg}"
  # Enough iterations that the median is stable on a noisy shared VM.
  for si in "4K 500" "64K 500" "1M 200" "16M 40" "64M 15"; do
    set -- $si; s=$1; iters=$2
    $B perf --in-place --ranks "$n" --transport "$t" --min-bytes $s --max-bytes $s --iters $iters --check $extra \
      --json "$OUT/braid-$name-$tag.jsonl" > /dev/null 2>&1 || echo "FAILED $name $s"
  done
done
