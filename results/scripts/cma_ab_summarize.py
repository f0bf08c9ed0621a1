#!/usr/bin/env python3
"""Medians of results/scripts/cma_ab.sh output, per op and size, with each way's
ratio to `exchange` (the default before `auto`)."""
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)
for line in open(sys.argv[1]):
    r, op, way, size, us, rt = line.rstrip("\n").split("\t")
    runs[(op, size, way)].append(float(us))
sizes = {"1M": 1, "16M": 16, "64M": 64}
print("| op | size | way | runs (µs) | median | / exchange |")
print("|---|---|---|---|---|---|")
for op, size in sorted({(o, s) for o, s, _ in runs}, key=lambda k: (k[0], sizes[k[1]])):
    base = statistics.median(runs[(op, size, "exchange")]) if (op, size, "exchange") in runs else None
    for way in ("auto", "exchange", "0"):
        v = runs.get((op, size, way))
        if not v:
            continue
        m = statistics.median(v)
        ratio = f"{m / base:.2f}" if base else "-"
        print(f"| {op} | {size} | {way} | {', '.join(f'{x:.0f}' if x > 999 else f'{x:.1f}' for x in v)} | {m:.1f} | {ratio} |")
