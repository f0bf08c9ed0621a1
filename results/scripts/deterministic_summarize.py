#!/usr/bin/env python3
"""Medians of results/scripts/deterministic_ab.sh runs: time with and without reproducible mode."""
import json, statistics, sys, glob
from collections import defaultdict
t = defaultdict(list); algo = defaultdict(set)
for f in glob.glob(sys.argv[1] + "/*.json"):
    mode = f.rsplit("/", 1)[1].split("-")[0]
    for line in open(f):
        r = json.loads(line)
        assert r["wrong"] == 0, f
        t[(r["bytes"], mode)].append(r["time_us"]); algo[(r["bytes"], mode)].add(r["algo"])
print("| size | fastest mode µs (algo) | reproducible µs (algo) | reproducible / fastest |")
print("|---|---|---|---|")
for b in sorted({k[0] for k in t}):
    f, d = statistics.median(t[(b, "fast")]), statistics.median(t[(b, "det")])
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {size} | {f:.1f} ({','.join(sorted(algo[(b,'fast')]))}) | {d:.1f} ({','.join(sorted(algo[(b,'det')]))}) | {d / f:.2f} |")
