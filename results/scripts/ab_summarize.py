#!/usr/bin/env python3
"""Per-configuration medians of results/scripts/ab_runs.sh output: time (µs) and busbw of
build A and build B, B/A of the medians (time ratio: lower is better for B), and
the median of the per-round B/A ratios (A and B of one round ran back to back, so
this pairs runs that saw the same machine load)."""
import glob, json, os, statistics, sys
out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/braid-ab")
rows = {}
for f in glob.glob(f"{out}/*.jsonl"):
    label, t, s, rnd = os.path.basename(f)[:-6].split("-")
    for line in open(f):
        d = json.loads(line)
        if d.get("wrong") not in (0, None):
            print(f"WRONG RESULTS in {f}")
        rows.setdefault((t, d["bytes"]), {}).setdefault(label, {})[rnd] = (d["time_us"], d["busbw_gbps"])
print("| transport | size | A time µs | B time µs | A busbw | B busbw | B/A of medians | median per-round B/A | runs |")
print("|---|---|---|---|---|---|---|---|---|")
for (t, b) in sorted(rows):
    r = rows[(t, b)]
    if "A" not in r or "B" not in r:
        continue
    a, bb_ = r["A"], r["B"]
    at = statistics.median(x[0] for x in a.values()); bt = statistics.median(x[0] for x in bb_.values())
    ab = statistics.median(x[1] for x in a.values()); bb = statistics.median(x[1] for x in bb_.values())
    paired = [bb_[k][0] / a[k][0] for k in a if k in bb_ and a[k][0] > 0]
    pr = statistics.median(paired) if paired else float("nan")
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {t} | {size} | {at:.2f} | {bt:.2f} | {ab:.3f} | {bb:.3f} | {bt / at:.3f} | {pr:.3f} | {len(a)}+{len(bb_)} |")
