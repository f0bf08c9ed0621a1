"""Data-parallel training of a small MLP on the digits data set with PyTorch DDP,
over braid or Gloo: the same program, the backend named on the command line.

    torchrun --nproc-per-node 4 python/examples/ddp_digits.py --backend braid
    torchrun --nproc-per-node 4 python/examples/ddp_digits.py --backend gloo

`import braid.torch` registers the "braid" backend (installing the package also
registers it through torch's entry point, so the import is only needed here to
fail early with a clear message when braid is missing).

Every rank seeds torch the same way, so the model starts identical everywhere;
each step, rank r trains on its shard of a global batch drawn by a seeded
generator, and DDP averages the gradients. With `--save-at N --params FILE`,
rank 0 saves the parameters after step N (to compare backends bit for bit). At
the end rank 0 prints one JSON line: test accuracy, steps, and the median step
time in milliseconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from typing import Tuple

import torch
import torch.distributed as dist
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "..", "..", "..", "shared", "data", "digits.csv.gz")


def load(path: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Features scaled to [0, 1] (pixel counts are 0..16) and integer labels."""
    with gzip.open(path, "rt") as f:
        rows = [[float(v) for v in line.split(",")] for line in f if line.strip()]
    data = torch.tensor(rows, dtype=torch.float32)
    return data[:, :64] / 16.0, data[:, 64].to(torch.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="braid", help="torch.distributed backend (braid or gloo)")
    ap.add_argument("--data", default=os.environ.get("DIGITS_CSV", DEFAULT_DATA))
    ap.add_argument("--steps", type=int, default=400, help="optimizer steps")
    ap.add_argument("--batch", type=int, default=64, help="global batch size (split across ranks)")
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-at", type=int, default=0, help="save the parameters after this step (0: never)")
    ap.add_argument("--params", default="", help="where rank 0 saves them")
    args = ap.parse_args()

    if args.backend == "braid":
        import braid.torch  # noqa: F401 - registers the backend

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the world size {world}")

    x, y = load(args.data)
    # A fixed split: every rank draws the same permutation.
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1234))
    test_n = len(x) // 5
    test_idx, train_idx = order[:test_n], order[test_n:]
    x_train, y_train = x[train_idx], y[train_idx]

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    batches = torch.Generator().manual_seed(args.seed + 1)
    per_rank = args.batch // world

    times = []
    for step in range(1, args.steps + 1):
        pick = torch.randint(len(x_train), (args.batch,), generator=batches)
        mine = pick[rank * per_rank:(rank + 1) * per_rank]
        start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(ddp(x_train[mine]), y_train[mine])
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        if step == args.save_at and rank == 0 and args.params:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.params)

    with torch.no_grad():
        correct = (model(x[test_idx]).argmax(dim=1) == y[test_idx]).sum().item()
    accuracy = correct / len(test_idx)
    # Every rank holds the same model: check it, then report from rank 0.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    same = bool(torch.equal(lo, hi))
    if rank == 0:
        print(json.dumps({
            "backend": args.backend,
            "world": world,
            "steps": args.steps,
            "accuracy": round(accuracy, 4),
            "replicas_identical": same,
            "median_step_ms": round(statistics.median(times) * 1e3, 4),
        }))
    dist.destroy_process_group()
    if not same:
        raise SystemExit("the replicas' parameters differ after training")


if __name__ == "__main__":
    main()
