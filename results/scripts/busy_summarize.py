#!/usr/bin/env python3
"""Medians of results/scripts/busy_ab.sh output: per label, hog count and size, the median
time (µs) over rounds (each round's value is that run's own median), and its ratio
to Open MPI's median under the same load (below 1: braid is faster)."""
import glob, json, os, statistics, sys
out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/braid-busy"
rows = {}
for f in glob.glob(f"{out}/*.jsonl"):
    label, hogs, rnd = os.path.basename(f)[:-6].rsplit("-", 2)
    for line in open(f):
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if d.get("wrong") not in (0, None):
            print(f"WRONG RESULTS in {f}")
        size = d.get("bytes")
        t = d.get("time_us", d.get("median_us"))
        if size is None or t is None:
            continue
        rows.setdefault((hogs, size), {}).setdefault(label, []).append(t)
labels = sorted({l for r in rows.values() for l in r if l != "mpi"})
print("| hogs | size | Open MPI µs | " + " | ".join(f"{l} µs | {l}/mpi" for l in labels) + " | runs |")
print("|---|---|---|" + "---|---|" * len(labels) + "---|")
for (h, b) in sorted(rows):
    r = rows[(h, b)]
    m = statistics.median(r["mpi"]) if "mpi" in r else float("nan")
    cells = []
    for l in labels:
        v = statistics.median(r[l]) if l in r else float("nan")
        cells.append(f"{v:.2f} | {v / m:.2f}")
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {h[1:]} | {size} | {m:.2f} | " + " | ".join(cells) + f" | {len(r.get('mpi', []))} |")
