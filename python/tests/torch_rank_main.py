"""One rank of a torch.distributed backend test (started by ranks.py):
`torch_rank_main.py SCENARIO [ARGS]`. Rank and world size come from
`BRAID_RANK`/`BRAID_WORLD_SIZE`; every check is exact, and `ok` is printed last.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist

SCENARIOS: Dict[str, Callable[..., None]] = {}

RANK = int(os.environ["BRAID_RANK"])
WORLD = int(os.environ["BRAID_WORLD_SIZE"])


def scenario(fn: Callable[..., None]) -> Callable[..., None]:
    SCENARIOS[fn.__name__] = fn
    return fn


def init_method(kind: str) -> str:
    """A FileStore beside the test's braid store, or a TCPStore at a given port."""
    if kind.startswith("tcp:"):
        return f"tcp://127.0.0.1:{kind[4:]}"
    store_dir = os.environ["BRAID_STORE"][len("file://"):]
    return f"file://{store_dir}-torch-init"


def init(backend: str, kind: str) -> None:
    dist.init_process_group(backend, init_method=init_method(kind), rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=60))


def check(what: str, got: torch.Tensor, want: Any) -> None:
    want_t = torch.as_tensor(want, dtype=got.dtype).reshape(got.shape)
    if not torch.equal(got, want_t):
        raise AssertionError(f"rank {RANK} {what}: got {got.tolist()}, want {want_t.tolist()}")


def refused(what: str, fn: Callable[[], Any], needle: str) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        if needle not in str(e):
            raise AssertionError(f"{what}: error {e!r} does not say {needle!r}") from e
        return
    raise AssertionError(f"{what}: no error")


N = 4


def block(r: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.arange(N, dtype=torch.int64).add(r * 100).to(dtype)


@scenario
def collectives(kind: str) -> None:
    """Every ProcessGroup method torch calls, through torch.distributed, with exact results."""
    import braid.torch  # noqa: F401 - registers the backend

    init("braid", kind)
    assert dist.get_backend() == "braid", dist.get_backend()
    pg = dist.distributed_c10d._get_default_group()
    assert pg.getBackendName() == "braid" and pg.name() == "braid", pg.name()
    assert (dist.get_rank(), dist.get_world_size()) == (RANK, WORLD)
    ranks = range(WORLD)
    total = sum(block(r) for r in ranks)

    # all_reduce: every op, sync and async (Work.wait, get_future), non-contiguous.
    for op, want in ((dist.ReduceOp.SUM, total), (dist.ReduceOp.MAX, block(WORLD - 1)), (dist.ReduceOp.MIN, block(0)),
                     (dist.ReduceOp.PRODUCT, torch.stack([block(r) for r in ranks]).prod(0))):
        t = block(RANK)
        dist.all_reduce(t, op=op)
        check(f"all_reduce {op}", t, want)
    t = block(RANK, torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check("all_reduce avg", t, total.to(torch.float32) / WORLD)
    t = block(RANK)
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, dist.Work)
    fut = work.get_future()
    got = fut.wait()
    check("all_reduce future", got[0], total)
    assert work.is_completed() and work.wait()
    t = torch.stack([block(RANK), block(RANK)], 1)[:, 0]  # non-contiguous
    dist.all_reduce(t)
    check("all_reduce non-contiguous", t, total)
    ts = [block(RANK), block(RANK) * 2]
    dist.all_reduce_coalesced(ts)
    check("all_reduce_coalesced 0", ts[0], total)
    check("all_reduce_coalesced 1", ts[1], total * 2)

    # Dtypes braid lacks: complex, bool, int16; uint64 reductions refused.
    c = torch.complex(block(RANK, torch.float32), -block(RANK, torch.float32))
    dist.all_reduce(c)
    check("all_reduce complex", c, torch.complex(total.float(), -total.float()))
    b = torch.tensor([RANK == 0, False, True, RANK == 1])
    dist.all_reduce(b)
    check("all_reduce bool or", b, [True, False, True, WORLD > 1])
    b = torch.tensor([RANK == 0, True])
    dist.all_reduce(b, op=dist.ReduceOp.MIN)
    check("all_reduce bool and", b, [WORLD == 1, True])
    s = torch.full((N,), 30000, dtype=torch.int16) + RANK
    dist.all_reduce(s)
    check("all_reduce int16 wraps", s, torch.full((N,), 30000 * WORLD + sum(ranks)).to(torch.int16))
    refused("all_reduce uint64", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.uint64)), "cannot be reduced")
    refused("premul_sum", lambda: dist.all_reduce(block(RANK), op=dist._make_nccl_premul_sum(2.0)), "PREMUL_SUM")
    refused("band", lambda: dist.all_reduce(block(RANK), op=dist.ReduceOp.BAND), "not supported")

    # broadcast and reduce, from every root.
    for root in ranks:
        t = block(RANK)
        dist.broadcast(t, src=root)
        check(f"broadcast from {root}", t, block(root))
        h = torch.full((3,), RANK, dtype=torch.float16)
        dist.broadcast(h, src=root)
        check(f"broadcast f16 from {root}", h, [root] * 3)
        t = block(RANK)
        dist.reduce(t, dst=root)
        check(f"reduce to {root}", t, total if RANK == root else block(RANK))

    # all_gather (list and into one tensor, any dtype), gather, scatter.
    outs = [torch.empty(N, dtype=torch.int64) for _ in ranks]
    dist.all_gather(outs, block(RANK))
    for r in ranks:
        check(f"all_gather block {r}", outs[r], block(r))
    outs = [torch.empty(2, dtype=torch.bool) for _ in ranks]
    dist.all_gather(outs, torch.tensor([RANK % 2 == 0, True]))
    for r in ranks:
        check(f"all_gather bool {r}", outs[r], [r % 2 == 0, True])
    flat = torch.empty(WORLD * N, dtype=torch.int32)
    dist.all_gather_into_tensor(flat, block(RANK, torch.int32))
    check("all_gather_into_tensor", flat, torch.cat([block(r, torch.int32) for r in ranks]))
    # torch's layout: got2[r][i] is rank r's i-th input (inputs of different sizes).
    got2: List[List[torch.Tensor]] = [[torch.empty(N, dtype=torch.int64), torch.empty(2, 3, dtype=torch.int64)] for _ in ranks]
    dist.all_gather_coalesced(got2, [block(RANK), torch.full((2, 3), RANK)])
    for r in ranks:
        check(f"all_gather_coalesced {r} first", got2[r][0], block(r))
        check(f"all_gather_coalesced {r} second", got2[r][1], torch.full((2, 3), r))
    for root in ranks:
        gl = [torch.empty(N, dtype=torch.int64) for _ in ranks] if RANK == root else None
        dist.gather(block(RANK), gl, dst=root)
        if RANK == root:
            assert gl is not None
            for r in ranks:
                check(f"gather to {root} block {r}", gl[r], block(r))
        out = torch.empty(N, dtype=torch.int64)
        dist.scatter(out, [block(r) + 7 for r in ranks] if RANK == root else None, src=root)
        check(f"scatter from {root}", out, block(RANK) + 7)

    # reduce_scatter (list and from one tensor).
    out = torch.empty(N, dtype=torch.int64)
    dist.reduce_scatter(out, [block(RANK) * (r + 1) for r in ranks])
    check("reduce_scatter", out, total * (RANK + 1))
    out = torch.empty(N, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, torch.cat([block(RANK, torch.float64) + r for r in ranks]))
    check("reduce_scatter_tensor", out, total.double() + RANK * WORLD)
    out = torch.empty(N, dtype=torch.complex128)
    dist.reduce_scatter_tensor(out, torch.complex(torch.cat([block(RANK, torch.float64)] * WORLD), torch.ones(N * WORLD).double()))
    check("reduce_scatter_tensor complex", out, torch.complex(total.double(), torch.full((N,), float(WORLD)).double()))
    src = torch.cat([block(RANK)] * WORLD)
    dist.reduce_scatter_tensor(torch.empty(N, dtype=torch.int64), src)
    check("reduce_scatter_tensor leaves its input", src, torch.cat([block(RANK)] * WORLD))

    # all_to_all: equal and uneven splits, list form.
    out = torch.empty(WORLD * 2, dtype=torch.int64)
    dist.all_to_all_single(out, torch.tensor([RANK * 10 + j for j in range(WORLD) for _ in range(2)]))
    check("all_to_all_single", out, [r * 10 + RANK for r in ranks for _ in range(2)])
    # Rank r sends j+1 rows of value r*10+j to rank j.
    in_splits = [j + 1 for j in ranks]
    out_splits = [RANK + 1] * WORLD
    inp = torch.cat([torch.full((j + 1, 2), RANK * 10 + j) for j in ranks])
    out = torch.empty(sum(out_splits), 2, dtype=torch.int64)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    check("all_to_all_single uneven", out, torch.cat([torch.full((RANK + 1, 2), r * 10 + RANK) for r in ranks]))
    outs = [torch.empty(r + 1, dtype=torch.int64) for r in ranks]
    dist.all_to_all(outs, [torch.full((RANK + 1,), RANK * 10 + j) for j in ranks])
    for r in ranks:
        check(f"all_to_all from {r}", outs[r], [r * 10 + RANK] * (r + 1))

    # barrier, monitored_barrier, send/recv (and what is refused).
    dist.barrier()
    pg.monitored_barrier(timedelta(seconds=30))
    pg.monitored_barrier(timedelta(seconds=30), wait_all_ranks=True)
    if WORLD > 1:
        peer = 1 - RANK if RANK < 2 else None
        if peer is not None:
            t = block(RANK)
            if RANK == 0:
                dist.send(t, dst=1)
                r = torch.empty(N, dtype=torch.int64)
                dist.recv(r, src=1)
                check("recv from 1", r, block(1))
            else:
                r = torch.empty(N, dtype=torch.int64)
                w = dist.irecv(r, src=0)
                w.wait()
                check("irecv from 0", r, block(0))
                assert w.source_rank() == 0 and w._source_rank() == 0, w.source_rank()
                dist.isend(t, dst=0).wait()
            # Tags: paired in posting order, and checked.
            r = torch.empty(N, dtype=torch.int64)
            if RANK == 0:
                dist.send(t + 5, dst=1, tag=5)
                dist.recv(r, src=1, tag=6)
                check("tagged recv from 1", r, block(1) + 6)
            else:
                dist.recv(r, src=0, tag=5)
                check("tagged recv from 0", r, block(0) + 5)
                dist.send(t + 6, dst=0, tag=6)
    # Receive from any source: rank 0 hears from every other rank once, learning who.
    if WORLD > 1:
        if RANK == 0:
            seen = []
            for _ in range(WORLD - 1):
                r = torch.empty(N, dtype=torch.int64)
                src = dist.recv(r, tag=9)
                check(f"recv from any source (rank {src})", r, block(src) * 3)
                seen.append(src)
            assert sorted(seen) == list(range(1, WORLD)), seen
        else:
            dist.send(block(RANK) * 3, dst=0, tag=9)
        # irecv posted before isend, both ways round a ring: no deadlock.
        got = torch.empty(N, dtype=torch.int64)
        recv_work = dist.irecv(got, src=(RANK - 1) % WORLD, tag=4)
        send_work = dist.isend(block(RANK) + 4, dst=(RANK + 1) % WORLD, tag=4)
        recv_work.wait()
        send_work.wait()
        check("irecv before isend ring", got, block((RANK - 1) % WORLD) + 4)

    # batch_isend_irecv: a ring exchange (every rank sends right, receives from the left).
    if WORLD > 1:
        got = torch.empty(N, dtype=torch.int64)
        ops = [dist.P2POp(dist.isend, block(RANK), (RANK + 1) % WORLD),
               dist.P2POp(dist.irecv, got, (RANK - 1) % WORLD)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check("batch_isend_irecv ring", got, block((RANK - 1) % WORLD))

    # A subgroup of ranks 0 and the last rank meets through its own store prefix.
    if WORLD > 1:
        sub = dist.new_group([0, WORLD - 1])
        if RANK in (0, WORLD - 1):
            t = block(RANK)
            dist.all_reduce(t, group=sub)
            check("subgroup all_reduce", t, block(0) + block(WORLD - 1))
    dist.barrier()
    dist.destroy_process_group()
    print("ok")


@scenario
def mismatch(kind: str) -> None:
    """Ranks disagree on a call's dtype: Work.wait and the future raise braid's
    error naming the mismatch, on every rank."""
    import braid
    import braid.torch  # noqa: F401

    init("braid", kind)
    t = block(RANK, torch.int64 if RANK == 0 else torch.float64)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    for what, wait in (("Work.wait", work.wait), ("future", fut.wait)):
        try:
            wait()
        except Exception as e:  # noqa: BLE001 - checked below
            text = str(e)
            if not isinstance(e, braid.MismatchError) or f"rank {1 - RANK} called all-reduce" not in text:
                raise AssertionError(f"{what}: error {e!r} is not a MismatchError naming rank {1 - RANK}'s call") from e
            print(f"{what}: {type(e).__name__}: {text}")
        else:
            raise AssertionError(f"{what}: no error for int64 against float64")
    print("ok")
    sys.stdout.flush()
    os._exit(0)  # the communicator is broken: no collective destroy


@scenario
def entry_point(env_port: str, store_port: str) -> None:
    """`init_process_group("braid")` with no import of braid: torch finds it
    through the package's `torch.distributed.backends` entry point (env://).
    Then two groups in turn over one TCPStore that outlives both."""
    assert "braid" not in sys.modules
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=env_port, RANK=str(RANK), WORLD_SIZE=str(WORLD))
    dist.init_process_group("braid", timeout=timedelta(seconds=60))
    assert "braid.torch" in sys.modules and dist.get_backend() == "braid"
    t = block(RANK)
    dist.all_reduce(t)
    check("all_reduce", t, sum(block(r) for r in range(WORLD)))
    dist.destroy_process_group()
    # Not env:// again on the same port: rank 0's old TCPStore server may still
    # be closing when rank 1 connects to the new one, and torch fails that
    # connection. An explicit store held here lives across both groups, so
    # the second group meets the first one's keys under the same group name
    # and braid must take a fresh prefix.
    store = dist.TCPStore("127.0.0.1", int(store_port), WORLD, RANK == 0, timeout=timedelta(seconds=60))
    for round_ in ("first", "second"):
        dist.init_process_group("braid", store=store, rank=RANK, world_size=WORLD, timeout=timedelta(seconds=60))
        t = block(RANK)
        dist.all_reduce(t)
        check(f"all_reduce over the held store ({round_} group)", t, sum(block(r) for r in range(WORLD)))
        dist.destroy_process_group()
    print("ok")


@scenario
def ddp(backend: str, kind: str, out_path: str) -> None:
    """A few DDP steps on a tiny model; the final parameters go to `out_path`."""
    if backend == "braid":
        import braid.torch  # noqa: F401

    init(backend, kind)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    if RANK == 1:  # DDP's first broadcast must overwrite this
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp_model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0005)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1234 + RANK)
    for _ in range(6):
        x = torch.randn(5, 8, generator=gen)
        y = torch.randint(0, 3, (5,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp_model(x), y).backward()
        opt.step()
    if RANK == 0:
        torch.save([p.detach().clone() for p in model.parameters()], out_path)
    dist.barrier()
    dist.destroy_process_group()
    print("ok")


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
