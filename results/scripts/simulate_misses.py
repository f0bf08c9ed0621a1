#!/usr/bin/env python3
"""Rows of simulate_ab.sh's output (markdown) whose prediction is off by more than
25%, and the largest error per algorithm and size over all runs.
Usage: simulate_misses.py FILE.md..."""
import sys
from collections import defaultdict
rows, worst = [], defaultdict(float)
for path in sys.argv[1:]:
    for l in open(path):
        cols = [c.strip() for c in l.split('|')[1:-1]]
        if len(cols) != 5 or not cols[0].endswith('MiB'):
            continue
        r = float(cols[4])
        rows.append(cols)
        worst[(cols[0], cols[1])] = max(worst[(cols[0], cols[1])], abs(r - 1))
off = [c for c in rows if abs(float(c[4]) - 1) > 0.25]
print(f"{len(rows)} predictions, {len(off)} off by more than 25%")
for c in off:
    print("  " + " | ".join(c))
algos = sorted({a for _, a in worst})
sizes = sorted({s for s, _ in worst}, key=lambda s: int(s.split()[0]))
print("\n| algorithm | " + " | ".join(sizes) + " |")
print("|---|" + "---|" * len(sizes))
for a in algos:
    print(f"| {a} | " + " | ".join(f"{worst[(s, a)] * 100:.0f}%" for s in sizes) + " |")
