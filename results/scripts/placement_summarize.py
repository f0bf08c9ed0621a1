#!/usr/bin/env python3
"""Summary of results/scripts/placement_ab.sh: per size, the median busbw of default and
pinned runs, their ratio, and the lowest default run against the default median."""
import glob, json, os, statistics, sys
out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/braid-placement"
rows = {}
for f in sorted(glob.glob(f"{out}/*.jsonl")):
    label, size, _ = os.path.basename(f)[:-6].split("-")
    for line in open(f):
        d = json.loads(line)
        assert d.get("wrong") == 0, f"wrong results in {f}"
        rows.setdefault(size, {}).setdefault(label, []).append(d["busbw_gbps"])
print("| size | default busbw (median) | pinned busbw (median) | default / pinned | lowest default / default median | default runs | pinned runs |")
print("|---|---|---|---|---|---|---|")
for size in sorted(rows, key=lambda s: int(s[:-1]) * (1 << 20 if s.endswith("M") else 1 << 10)):
    d, p = rows[size].get("default", []), rows[size].get("pinned", [])
    if not d or not p:
        continue
    md, mp = statistics.median(d), statistics.median(p)
    print(f"| {size} | {md:.3f} | {mp:.3f} | {md / mp:.3f} | {min(d) / md:.3f} | {' '.join(f'{x:.2f}' for x in d)} | {' '.join(f'{x:.2f}' for x in p)} |")
