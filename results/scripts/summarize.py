#!/usr/bin/env python3
# usage: summarize.py PEERS_RESULTS_MD   (braid JSON lines from $OUT, default /tmp/braid-results)
import json, glob, os, statistics, re, sys
OUT = os.environ.get('OUT', '/tmp/braid-results')
sizes=[4096,65536,1<<20,16<<20,64<<20]
names={4096:"4 KiB",65536:"64 KiB",1<<20:"1 MiB",16<<20:"16 MiB",64<<20:"64 MiB"}
def braid(cfg):
    vals={s:[] for s in sizes}; times={s:[] for s in sizes}; wrong=0
    for f in sorted(glob.glob(os.path.join(OUT, f"braid-{cfg}-*.jsonl"))):
        if "-" in os.path.basename(f)[len(f"braid-{cfg}-"):]:
            continue  # another configuration (e.g. n2-shm-reg for n2-shm)
        for l in open(f):
            d=json.loads(l); vals[d["bytes"]].append(d["busbw_gbps"]); times[d["bytes"]].append(d["time_us"]); wrong+=d["wrong"] or 0
    return {s:(statistics.median(vals[s]),statistics.median(times[s]),min(vals[s]),max(vals[s]),len(vals[s])) for s in sizes if vals[s]}, wrong
md=open(sys.argv[1]).read()
def table(title):
    sec=md.split(title)[1]
    rows=[l for l in sec.splitlines() if l.startswith('| ') and 'KiB' in l or l.startswith('| ') and 'MiB' in l][:5]
    out={}
    for l in rows:
        cells=[c.strip() for c in l.strip('|').split('|')]
        out[cells[0]]=[float(re.match(r'[\d.]+',c).group()) for c in cells[1:]]
    return out
bw=table('### All-reduce: busbw, GB/s'); tm=table('### All-reduce: median time per op')
# peer columns: 0 ompi sm n2, 1 ompi tcp n2, 2 gloo n2, 3 ompi sm n4, 4 ompi tcp n4, 5 gloo n4
for cfg in ["n2-tcp","n2-shm","n2-shm-reg","n4-tcp","n4-shm","n4-shm-reg"]:
    b,w=braid(cfg); print(f"\n{cfg}: wrong={w}")
    for s in sizes:
        if s not in b: continue
        med,t,lo,hi,k=b[s]; n=names[s]
        if cfg.startswith("n2"): sm,tcp,gl=bw[n][0],bw[n][1],bw[n][2]; smt,tcpt=tm[n][0],tm[n][1]
        else: sm,tcp,gl=bw[n][3],bw[n][4],bw[n][5]; smt,tcpt=tm[n][3],tm[n][4]
        if "tcp" in cfg:
            best=max(tcp,gl); print(f"  {n:7} braid {med:6.3f} GB/s ({lo:.2f}-{hi:.2f}, {t:9.1f} us) | ompi-tcp {tcp:6.3f} ({tcpt} us) gloo {gl:6.3f} | vs best {med/best:5.2f}x | time vs ompi-tcp {t/tcpt:5.2f}")
        else:
            print(f"  {n:7} braid {med:6.3f} GB/s ({lo:.2f}-{hi:.2f}, {t:9.1f} us) | ompi-sm {sm:6.3f} ({smt} us) | {med/sm:5.2f}x | time ratio {t/smt:5.2f}")
