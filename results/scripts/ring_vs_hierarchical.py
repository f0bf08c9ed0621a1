#!/usr/bin/env python3
"""Ring against hierarchical all-reduce per size, from `braid perf --algo all` JSON lines
in DIR (one file per run): median over runs and each run's ratio. Usage: ring_vs_hierarchical.py DIR"""
import json,statistics,glob,sys
from collections import defaultdict
t=defaultdict(list)
for f in sorted(glob.glob(sys.argv[1]+'/*.json')):
    for l in open(f):
        r=json.loads(l); t[(r['bytes'],r['algo'])].append(r['time_us'])
print("| size | ring µs | hierarchical µs | ring / hierarchical (median) | per run |")
print("|---|---|---|---|---|")
for b in sorted({k[0] for k in t}):
    ring=statistics.median(t[(b,'ring')]); h=statistics.median(t[(b,'hierarchical')])
    per=[x/y for x,y in zip(t[(b,'ring')],t[(b,'hierarchical')])]
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {size} | {ring:.0f} | {h:.0f} | {ring/h:.3f} | {', '.join(f'{x:.3f}' for x in per)} |")
