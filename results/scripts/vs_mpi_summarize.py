#!/usr/bin/env python3
"""Per configuration and size: braid's and Open MPI's median time (µs) and busbw
(GB/s) over the rounds of results/scripts/vs_mpi.sh, and braid/Open MPI of the busbw
medians (above 1: braid is faster). ar2reg is compared with ar2's Open MPI.
Variants ar2reg (registered buffers) and *cma (BRAID_CMA=1) are compared with
their base configuration's Open MPI runs. braid bound% is the median of the
rows' fraction of the collective's memory bound (braid perf's bound%).
With --by-state, runs are also grouped by the host state recorded before each
(core-to-core round trip above 150 ns: "apart", else "together")."""
import glob, json, os, statistics, sys
args = [a for a in sys.argv[1:] if a != "--by-state"]
by_state = "--by-state" in sys.argv
out = args[0] if args else "/tmp/braid-vs"
rows = {}


def state_of(stem):
    try:
        rt = int(open(f"{out}/state-{stem}.txt").read().strip())
    except (OSError, ValueError):
        return "?"
    return "apart" if rt > 150 else "together"

for f in glob.glob(f"{out}/*.jsonl"):
    stem = os.path.basename(f)[:-6]
    who, cfg, rnd = stem.split("-")
    if by_state:
        cfg = f"{cfg} ({state_of(stem)})"
    for line in open(f):
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if d.get("wrong") not in (0, None) or d.get("correct") is False:
            print(f"WRONG RESULTS in {f}")
        t = d.get("time_us", d.get("median_us"))
        bw = d.get("busbw_gbps", d.get("busbw_GBps"))
        rows.setdefault((cfg, d["bytes"]), {}).setdefault(who, []).append((t, bw, d.get("bound_fraction")))
print("| config | size | braid µs | Open MPI µs | braid busbw | Open MPI busbw | braid/OMPI busbw | braid bound% | runs |")
print("|---|---|---|---|---|---|---|---|---|")
order = ["ar2", "ar2reg", "ar2cma", "ar4", "bc2", "bc2cma", "ag2", "ag2cma", "rs2", "rs2cma", "a2a2"]
for (cfg, b) in sorted(rows, key=lambda k: (order.index(k[0].split()[0]) if k[0].split()[0] in order else 99, k[1], k[0])):
    r = rows[(cfg, b)]
    # A variant of a configuration (registered buffers, BRAID_CMA=1) is compared
    # with the Open MPI runs of its base configuration.
    base = cfg.replace("reg", "").replace("cma", "")
    mpi = r.get("mpi") or rows.get((base, b), {}).get("mpi") or []
    br = r.get("braid", [])
    if not br:
        continue
    bt = statistics.median(x[0] for x in br); bb = statistics.median(x[1] for x in br)
    fr = [x[2] for x in br if x[2] is not None]
    bound = f"{100 * statistics.median(fr):.0f}" if fr else "-"
    if mpi:
        mt = statistics.median(x[0] for x in mpi); mb = statistics.median(x[1] for x in mpi)
        cells = f"{mt:.2f} | {bb:.3f} | {mb:.3f} | {bb / mb:.2f} | {bound}"
    else:
        cells = f"- | {bb:.3f} | - | - | {bound}"
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {cfg} | {size} | {bt:.2f} | {cells} | {len(br)}+{len(mpi)} |")
