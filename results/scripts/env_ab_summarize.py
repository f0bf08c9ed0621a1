#!/usr/bin/env python3
"""Per size: the median time (µs) of side A and side B over the rounds of
results/scripts/env_ab.sh, and B/A (below 1: B is faster)."""
import glob, json, os, statistics, sys
out = sys.argv[1]
times = {}
for f in glob.glob(f"{out}/*-r*.json"):
    side = os.path.basename(f).split("-")[0]
    for line in open(f):
        d = json.loads(line)
        times.setdefault((d["bytes"], side), []).append(d["time_us"])
print(open(f"{out}/sides.txt").read().strip())
print("| size | A µs | B µs | B/A | runs |")
print("|---|---|---|---|---|")
for b in sorted({k[0] for k in times}):
    a, bb = times.get((b, "A"), []), times.get((b, "B"), [])
    if a and bb:
        ma, mb = statistics.median(a), statistics.median(bb)
        size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
        print(f"| {size} | {ma:.1f} | {mb:.1f} | {mb / ma:.2f} | {len(a)}+{len(bb)} |")
