#!/bin/bash
# Issue 39, item 2: the backward pass with compute on a device, for several bucket
# layouts, alternated: each pass runs every layout once, in turn.
#   results/scripts/fusion_backward_sweep.sh PASSES OUTDIR FIRST_KIB:BUCKET_KIB ...
# Each run is the bench's interleaved measurement (compute, communication and both,
# timed back to back in every round; the ratio overlapped / max(compute, comm) per
# round, median of 15). Writes OUTDIR/interleaved.tsv (layout, pass, transport,
# compute, comm, overlapped ms, ratio) and prints per transport and layout the
# ratio of each pass and their median.
set -euo pipefail
passes=$1 out=$2; shift 2; mkdir -p "$out"
for p in $(seq 1 "$passes"); do
  for layout in "$@"; do
    IFS=: read -r first bucket <<< "$layout"
    # A filter that names the backward pass but no criterion function: only the
    # interleaved measurement runs (benches/fusion.rs, backward_interleaved).
    FUSION_BENCH_FIRST_BUCKET_KIB=$first FUSION_BENCH_BUCKET_KIB=$bucket \
      cargo bench --bench fusion -- --noplot backward_interleaved > "$out/$layout-$p.log" 2>&1
    sed -n "s/^fusion bench: \([a-z]*\): backward interleaved.*compute \([0-9.]*\) ms, comm \([0-9.]*\) ms, overlapped \([0-9.]*\) ms.*median \([0-9.]*\) .*/$layout\t$p\t\1\t\2\t\3\t\4\t\5/p" \
      "$out/$layout-$p.log" >> "$out/interleaved.tsv"
    echo "pass $p layout $layout done"
  done
done
python3 - "$out/interleaved.tsv" <<'PY'
import statistics, sys
from collections import defaultdict
t = defaultdict(list)
for line in open(sys.argv[1]):
    layout, p, transport, c, k, o, ratio = line.split()
    t[(transport, layout)].append((float(c), float(k), float(o), float(ratio)))
print("| transport | first:bucket KiB | compute/comm/overlapped ms (round medians): ratio, per pass | median |")
print("|---|---|---|---|")
for (transport, layout), rows in sorted(t.items()):
    cells = "; ".join(f"{c:.2f}/{k:.2f}/{o:.2f}: {r:.2f}" for c, k, o, r in rows)
    print(f"| {transport} | {layout} | {cells} | {statistics.median(r for *_, r in rows):.2f} |")
PY
