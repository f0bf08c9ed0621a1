#!/bin/bash
# Issue 20, acceptance 3: all-reducing 1,000 tensors of 1-64 KiB through the fuser
# against one all-reduce per tensor (`benches/fusion.rs`, 2 ranks as threads), per
# transport. Each run measures the three modes back to back in every group (one_buffer:
# one all-reduce of all the bytes, the bound of any fusion); RUNS runs, per-run ratios
# and their median.
#   results/fusion_bench.sh RUNS OUTDIR
set -euo pipefail
runs=$1 out=$2; mkdir -p "$out"
for r in $(seq 1 "$runs"); do
  rm -rf target/criterion/fusion_1000_tensors_*
  cargo bench --bench fusion -- --noplot > "$out/run$r.log" 2>&1
  python3 - "$r" >> "$out/estimates.tsv" <<'PY'
import glob, json, sys
for path in sorted(glob.glob("target/criterion/fusion_1000_tensors_*/*/new/estimates.json")):
    group, mode = path.split("/")[2:4]
    median = json.load(open(path))["median"]["point_estimate"] / 1e6
    print(f"{sys.argv[1]}\t{group}\t{mode}\t{median:.3f}")
PY
  echo "run $r done"
done
python3 - "$out/estimates.tsv" <<'PY'
import statistics, sys
from collections import defaultdict
t = defaultdict(dict)
for line in open(sys.argv[1]):
    run, group, mode, ms = line.split("\t")
    t[(group, run)][mode] = float(ms)
groups = sorted({g for g, _ in t})
print("| transport | per-tensor ms | fused ms | one buffer ms | per-tensor / fused, per run | median | per-tensor / one buffer (the bound), median |")
print("|---|---|---|---|---|---|---|")
for g in groups:
    runs = sorted(r for gg, r in t if gg == g)
    pt = [t[(g, r)]["per_tensor"] for r in runs]
    fu = [t[(g, r)]["fused"] for r in runs]
    ob = [t[(g, r)].get("one_buffer", float("nan")) for r in runs]
    ratios = [a / b for a, b in zip(pt, fu)]
    bounds = [a / b for a, b in zip(pt, ob)]
    name = g.replace("fusion_1000_tensors_", "").replace("_2ranks", "")
    print(f"| {name} | {statistics.median(pt):.2f} | {statistics.median(fu):.2f} | {statistics.median(ob):.2f} | "
          f"{', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f} | {statistics.median(bounds):.2f} |")
PY
