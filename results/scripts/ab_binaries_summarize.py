#!/usr/bin/env python3
"""Per-size medians over rounds of results/scripts/ab_binaries.sh runs, and new/old.
Usage: ab_binaries_summarize.py OUTDIR"""
import glob, json, statistics, sys
from collections import defaultdict
t = defaultdict(list)
for path in glob.glob(f"{sys.argv[1]}/*-r*.json"):
    which = path.rsplit("/", 1)[1].split("-r")[0]
    for line in open(path):
        j = json.loads(line)
        t[(which, j["bytes"])].append(j["time_us"])
print("| size | old µs | new µs | new/old | old runs | new runs |")
print("|---|---|---|---|---|---|")
for b in sorted({b for _, b in t}):
    o, n = statistics.median(t[("old", b)]), statistics.median(t[("new", b)])
    f = lambda v: ", ".join(f"{x:.1f}" for x in v)
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {size} | {o:.1f} | {n:.1f} | {n / o:.3f} | {f(t[('old', b)])} | {f(t[('new', b)])} |")
