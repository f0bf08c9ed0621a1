#!/bin/bash
# Issue 20, acceptance 3: all-reducing 1,000 tensors of 1-64 KiB through the fuser
# against one all-reduce per tensor (`benches/fusion.rs`, 2 ranks as threads), per
# transport. Each run measures the three modes back to back in every group (one_buffer:
# one all-reduce of all the bytes, the bound of any fusion); RUNS runs, per-run ratios
# and their median.
#   results/scripts/fusion_bench.sh RUNS OUTDIR
# FILTER (a criterion filter, e.g. 'fused|one_buffer') runs some modes only.
set -euo pipefail
runs=$1 out=$2; mkdir -p "$out"
for r in $(seq 1 "$runs"); do
  rm -rf target/criterion/fusion_1000_tensors_*
  cargo bench --bench fusion -- --noplot ${FILTER:+"$FILTER"} > "$out/run$r.log" 2>&1
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
    if any("per_tensor" not in t[(g, r)] for r in runs):
        continue
    pt = [t[(g, r)]["per_tensor"] for r in runs]
    fu = [t[(g, r)]["fused"] for r in runs]
    ob = [t[(g, r)].get("one_buffer", float("nan")) for r in runs]
    ratios = [a / b for a, b in zip(pt, fu)]
    bounds = [a / b for a, b in zip(pt, ob)]
    name = g.replace("fusion_1000_tensors_", "").replace("_2ranks", "")
    print(f"| {name} | {statistics.median(pt):.2f} | {statistics.median(fu):.2f} | {statistics.median(ob):.2f} | "
          f"{', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f} | {statistics.median(bounds):.2f} |")
PY
# Issue 39: every mode against the one-buffer bound, per run and median (modes
# that a run lacks are skipped).
python3 - "$out/estimates.tsv" <<'PY'
import statistics, sys
from collections import defaultdict
t = defaultdict(dict)
for line in open(sys.argv[1]):
    run, group, mode, ms = line.split("\t")
    t[(group, run)][mode] = float(ms)
groups = sorted({g for g, _ in t})
print()
print("| transport | mode | ms, per run | median ms | / one buffer, per run | median |")
print("|---|---|---|---|---|---|")
for g in groups:
    runs = sorted(r for gg, r in t if gg == g)
    name = g.replace("fusion_1000_tensors_", "").replace("_2ranks", "")
    modes = sorted({m for r in runs for m in t[(g, r)]})
    for m in modes:
        rs = [r for r in runs if m in t[(g, r)] and "one_buffer" in t[(g, r)]]
        if not rs:
            continue
        ms = [t[(g, r)][m] for r in rs]
        ratio = [t[(g, r)][m] / t[(g, r)]["one_buffer"] for r in rs]
        print(f"| {name} | {m} | {', '.join(f'{x:.2f}' for x in ms)} | {statistics.median(ms):.2f} | "
              f"{', '.join(f'{x:.2f}' for x in ratio)} | {statistics.median(ratio):.2f} |")
# The backward pass: overlapped against max(compute alone, communication alone)
# and against their sum, per run.
print()
print("| transport | compute | overlapped ms, median | / max(compute, comm), per run | median | / (compute + comm), median |")
print("|---|---|---|---|---|---|")
for g in groups:
    runs = sorted(r for gg, r in t if gg == g)
    name = g.replace("fusion_1000_tensors_", "").replace("_2ranks", "")
    for kind in ("cpu", "device"):
        o, c = f"backward_overlap_{kind}", f"backward_compute_{kind}"
        rs = [r for r in runs if {o, c, "backward_comm"} <= t[(g, r)].keys()]
        if not rs:
            continue
        ov = [t[(g, r)][o] for r in rs]
        vmax = [t[(g, r)][o] / max(t[(g, r)][c], t[(g, r)]["backward_comm"]) for r in rs]
        vsum = [t[(g, r)][o] / (t[(g, r)][c] + t[(g, r)]["backward_comm"]) for r in rs]
        print(f"| {name} | {kind} | {statistics.median(ov):.2f} | {', '.join(f'{x:.2f}' for x in vmax)} | "
              f"{statistics.median(vmax):.2f} | {statistics.median(vsum):.2f} |")
PY
