#!/usr/bin/env python3
"""Per-configuration medians of results/ab_runs.sh output: time (µs) and busbw of
build A and build B, and B/A (time ratio: lower is better for B)."""
import glob, json, os, statistics, sys
out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/braid-ab")
rows = {}
for f in glob.glob(f"{out}/*.jsonl"):
    label, t, s, _ = os.path.basename(f)[:-6].split("-")
    for line in open(f):
        d = json.loads(line)
        if d.get("wrong") not in (0, None):
            print(f"WRONG RESULTS in {f}")
        rows.setdefault((t, d["bytes"]), {}).setdefault(label, []).append((d["time_us"], d["busbw_gbps"]))
print("| transport | size | A time µs | B time µs | A busbw | B busbw | B/A time | runs |")
print("|---|---|---|---|---|---|---|---|")
for (t, b) in sorted(rows):
    r = rows[(t, b)]
    if "A" not in r or "B" not in r:
        continue
    at = statistics.median(x[0] for x in r["A"]); bt = statistics.median(x[0] for x in r["B"])
    ab = statistics.median(x[1] for x in r["A"]); bb = statistics.median(x[1] for x in r["B"])
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {t} | {size} | {at:.2f} | {bt:.2f} | {ab:.3f} | {bb:.3f} | {bt / at:.3f} | {len(r['A'])}+{len(r['B'])} |")
