#!/usr/bin/env python3
"""`braid simulate --probed` against measured all-reduce times (medians over runs of
`braid perf --algo all` JSON lines), per algorithm and size from 1 MiB up.
Usage: simulate_vs_measured.py RANKS [SIMULATE ARGS...] FILE.json...   (run right after the
measurement, so the probe cached for this host shape saw the same machine state; with
explicit link arguments instead, drop --probed by passing --no-probed)"""
import json, statistics, subprocess, sys
from collections import defaultdict

ranks = int(sys.argv[1])
# JSON files are measurements; everything else goes to `braid simulate` as it is
# (e.g. `--hosts 2 --link tcp --gbps 1 --latency-us 3.9` without --probed's cache).
files = [a for a in sys.argv[2:] if a.endswith(".json")]
extra = [a for a in sys.argv[2:] if not a.endswith(".json")]
times = defaultdict(list)
for path in files:
    for line in open(path):
        row = json.loads(line)
        if row["algo"].startswith("auto:") or row["bytes"] < 1 << 20:
            continue
        times[(row["bytes"], row["algo"])].append(row["time_us"])
probed = [] if "--no-probed" in extra else ["--probed"]
extra = [a for a in extra if a != "--no-probed"]
out = subprocess.run(["target/release/braid", "simulate", *probed, "--ranks", str(ranks),
                      "-b", "1M", "-e", "64M", *extra], capture_output=True, text=True, check=True).stdout
lines = [l for l in out.splitlines() if l.strip()]
header = lines[1].lstrip("#").split()
algos = header[1:header.index("pick")]
factor = 2 * (ranks - 1) / ranks
print(f"| size | algorithm | measured µs | predicted µs | predicted / measured |")
print("|---|---|---|---|---|")
worst = 0.0
for l in lines[2:]:
    cols = l.split()
    size = int(cols[0])
    for a, busbw in zip(algos, cols[1:1 + len(algos)]):
        if not times.get((size, a)):
            continue
        pred = size / (float(busbw) / factor) / 1e3
        meas = statistics.median(times[(size, a)])
        r = pred / meas
        worst = max(worst, abs(r - 1))
        print(f"| {size >> 20} MiB | {a} | {meas:.0f} | {pred:.0f} | {r:.2f} |")
print(f"\nlargest error {worst * 100:.0f}%")
print(out.splitlines()[0])
