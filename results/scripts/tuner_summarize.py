#!/usr/bin/env python3
"""Medians over runs of `braid perf --algo all` JSON lines: per size, every algorithm's
median time, the best forced one, the tuner's pick and its time against the best.
Usage: tuner_summarize.py FILE..."""
import json, statistics, sys
from collections import defaultdict

times = defaultdict(list)   # (bytes, algo) -> [us]
picks = defaultdict(set)
for path in sys.argv[1:]:
    for line in open(path):
        row = json.loads(line)
        algo = row["algo"]
        if algo.startswith("auto:"):
            picks[row["bytes"]].add(algo[5:])
            algo = "auto"
        times[(row["bytes"], algo)].append(row["time_us"])
sizes = sorted({b for b, _ in times})
algos = sorted({a for _, a in times if a != "auto"})
print("| size | " + " | ".join(algos) + " | best | auto picks | auto µs | auto / best |")
print("|---" * (len(algos) + 5) + "|")
worst = 0.0
for b in sizes:
    med = {a: statistics.median(times[(b, a)]) for a in algos if times.get((b, a))}
    best = min(med, key=med.get)
    auto = statistics.median(times[(b, "auto")])
    ratio = auto / med[best]
    worst = max(worst, ratio)
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    cells = " | ".join(f"{med[a]:.1f}" if a in med else "-" for a in algos)
    print(f"| {size} | {cells} | {best} | {','.join(sorted(picks[b]))} | {auto:.1f} | {ratio:.2f} |")
n = len(sys.argv) - 1
print(f"\n{n} runs; times are medians over runs of each run's median (µs); worst auto/best {worst:.2f}")
