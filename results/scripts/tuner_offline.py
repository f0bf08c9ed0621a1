#!/usr/bin/env python3
"""The tuner's picks under saved calibrations, scored against measured times, without
rerunning the jobs: for each calibration cache (a BRAID_CACHE_DIR a job filled) and each
size, `braid explain --probed` gives the pick; the measured medians of every forced
algorithm (the JSON lines of results/scripts/tuner_ab.sh runs) give its time against the best.
Usage: tuner_offline.py BRAID OP RANKS MEASURED_DIR CACHE_DIR...
  MEASURED_DIR: a folder whose */*.json (or *.json) hold `braid perf --algo all` lines.
More ranks than this host's cores are priced as the job does, oversubscribed."""
import glob, json, os, statistics, subprocess, sys
from collections import defaultdict

braid, op, ranks, measured = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
caches = sys.argv[5:]
per_run = defaultdict(lambda: defaultdict(list))  # (file) -> (bytes, algo) -> [us]
files = glob.glob(os.path.join(measured, "*.json")) + glob.glob(os.path.join(measured, "*", "*.json"))
for path in files:
    if not os.path.getsize(path):
        continue
    for line in open(path):
        row = json.loads(line)
        if row["algo"].startswith("auto:") or row["op"] != op or row["ranks"] != int(ranks):
            continue
        per_run[path][(row["bytes"], row["algo"])].append(row["time_us"])
times = defaultdict(list)
for runs in per_run.values():
    for key, xs in runs.items():
        times[key].append(statistics.median(xs))
med = {k: statistics.median(v) for k, v in times.items()}
sizes = sorted({b for b, _ in med})
worst = 0.0
print(f"| size | best | " + " | ".join(os.path.basename(c.rstrip('/')) for c in caches) + " |")
print("|---" * (len(caches) + 2) + "|")
for b in sizes:
    algos = {a: t for (bb, a), t in med.items() if bb == b}
    best = min(algos, key=algos.get)
    cells = []
    for c in caches:
        busy = ["--oversubscribed"] if int(ranks) > os.cpu_count() else []
        out = subprocess.run([braid, "explain", "--op", op, "--ranks", ranks, "--bytes", str(b), "--probed"] + busy,
                             env={**os.environ, "BRAID_CACHE_DIR": c}, capture_output=True, text=True, check=True).stdout
        pick = [l for l in out.splitlines() if l.startswith("pick: ")][0].split()[1]
        r = algos[pick] / algos[best]
        worst = max(worst, r)
        cells.append(f"{pick} {r:.2f}")
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {size} | {best} | " + " | ".join(cells) + " |")
print(f"\n{len([r for r in per_run.values() if r])} measured runs, {len(caches)} calibrations; worst pick/best {worst:.2f}")
