"""all_reduce through torch.distributed on CPU tensors, for one backend: the
speed a PyTorch user sees (Python, torch's dispatch, the backend).

    python python/bench/torch_allreduce.py --backend braid --np 2
    python python/bench/torch_allreduce.py --backend gloo --np 2

Spawns `--np` processes meeting through a TCPStore on loopback. Per size (bytes of
float32 per rank): warm-up calls, then `iters` timed calls, each
`barrier; t0; all_reduce (SUM, in place); t1`; a call's time is the slowest
rank's, the size's time the median over calls. busbw = size / time * 2(n-1)/n
(nccl-tests' convention). Data are small integers, so every sum is exact in any
order, and each timed result is checked. One JSON line per size on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

SIZES = [4 << 10, 1 << 20, 64 << 20]


def iters_for(nbytes: int) -> int:
    return 200 if nbytes <= 64 << 10 else 50 if nbytes <= 1 << 20 else 10


def rank_main(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist

    if args.backend == "braid":
        import braid.torch  # noqa: F401 - registers the backend
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.np)
    n = args.np
    for nbytes in [int(s) for s in args.sizes.split(",")]:
        count = nbytes // 4
        base = (torch.arange(count, dtype=torch.float32) % 101) + rank + 1
        want = (torch.arange(count, dtype=torch.float32) % 101) * n + n * (n + 1) / 2
        buf = base.clone()
        iters = args.iters or iters_for(nbytes)
        times = []
        for i in range(args.warmup + iters):
            buf.copy_(base)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            t1 = time.perf_counter()
            if i >= args.warmup:
                times.append(t1 - t0)
            if not torch.equal(buf, want):
                raise SystemExit(f"rank {rank}: wrong all_reduce result at {nbytes} bytes")
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            t = statistics.median(slowest.tolist())
            print(json.dumps({
                "backend": args.backend, "np": n, "bytes": nbytes, "iters": iters,
                "median_us": round(t * 1e6, 2), "busbw_GBps": round(nbytes / t * 2 * (n - 1) / n / 1e9, 4),
            }), flush=True)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", required=True)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=0, help="timed calls per size (0: by size)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(args, port), nprocs=args.np, join=True)


if __name__ == "__main__":
    main()
