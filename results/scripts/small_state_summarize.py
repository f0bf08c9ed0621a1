#!/usr/bin/env python3
"""Summarise results/scripts/small_state_ab.sh: per op and vCPU state (together: every round
trip under 200 ns; apart: every one over 300 ns; pairs that changed state mid-way are
left out), the medians of braid and Open MPI in µs and how many pairs braid won."""
import collections
import statistics
import sys

rows = collections.defaultdict(lambda: ([], []))
dropped = 0
for line in open(sys.argv[1]):
    p = line.split()
    trips = [int(x) for x in p[2:5]]
    if all(t < 200 for t in trips):
        state = "together"
    elif all(t > 300 for t in trips):
        state = "apart"
    else:
        dropped += 1
        continue
    b, m = rows[(p[1], state)]
    b.append(float(p[6]))
    m.append(float(p[8]))
print("| op | vCPUs | pairs | braid µs (median) | Open MPI µs (median) | Open MPI / braid | pairs braid <= Open MPI |")
print("|---|---|---|---|---|---|---|")
for (op, state), (b, m) in sorted(rows.items()):
    mb, mm = statistics.median(b), statistics.median(m)
    wins = sum(x <= y for x, y in zip(b, m))
    print(f"| {op} | {state} | {len(b)} | {mb:.3f} | {mm:.3f} | {mm / mb:.2f} | {wins} |")
print(f"\n{dropped} pairs left out (the state changed during the pair)")
