"""One rank of a test (started by ranks.py): `rank_main.py SCENARIO [ARGS]`.

Each scenario checks its own results with exact integer values and prints `ok`
last; any failed check is an exception and a non-zero exit, which the test shows
with this rank's output.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, List

import braid

SCENARIOS: Dict[str, Callable[..., None]] = {}


def scenario(fn: Callable[..., None]) -> Callable[..., None]:
    SCENARIOS[fn.__name__] = fn
    return fn


class Arrays:
    """Building and reading arrays of one kind: "numpy" or "torch"."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "numpy":
            import numpy

            self.np = numpy
        else:
            import torch

            self.torch = torch

    def make(self, values: List[int], dtype: str = "int64") -> Any:
        if self.kind == "numpy":
            return self.np.array(values, dtype=dtype)
        return self.torch.tensor(values, dtype=getattr(self.torch, dtype))

    def empty(self, n: int, dtype: str = "int64") -> Any:
        return self.make([-1] * n, dtype)

    @staticmethod
    def values(a: Any) -> List[int]:
        return [int(v) for v in a.tolist()]


def check(what: str, got: Any, want: List[int]) -> None:
    values = Arrays.values(got)
    if values != want:
        raise AssertionError(f"{what}: got {values}, want {want}")


N = 5  # elements per block


@scenario
def collectives(kind: str) -> None:
    """Every collective, in place, out of place and async, with exact results."""
    a = Arrays(kind)
    comm = braid.Communicator.from_env()
    r, w = comm.rank, comm.world_size
    assert (r, w) == (int(os.environ["BRAID_RANK"]), int(os.environ["BRAID_WORLD_SIZE"]))
    idx = list(range(N))
    ranks = range(w)

    # all_reduce: every op, out of place (send unchanged), in place, async.
    for dtype in ("int64", "int32", "float32"):
        send = a.make([r * 10 + i for i in idx], dtype)
        recv = a.empty(N, dtype)
        assert comm.all_reduce(send, recv) is recv
        check(f"all_reduce {dtype} out of place", recv, [sum(q * 10 for q in ranks) + w * i for i in idx])
        check("all_reduce send untouched", send, [r * 10 + i for i in idx])
    x = a.make([r + 1 + i for i in idx])
    comm.all_reduce(x, op=braid.ReduceOp.MAX)
    check("all_reduce max in place", x, [w + i for i in idx])
    x = a.make([r + 1 + i for i in idx])
    comm.all_reduce(x, op="min")
    check("all_reduce min", x, [1 + i for i in idx])
    x = a.make([r + 2] * N)
    comm.all_reduce(x, op=braid.ReduceOp.PROD)
    prod = 1
    for q in ranks:
        prod *= q + 2
    check("all_reduce prod", x, [prod] * N)
    x = a.make([r * 7 + 1] * N)
    comm.all_reduce(x, op=braid.ReduceOp.AVG)
    check("all_reduce avg (truncating)", x, [sum(q * 7 + 1 for q in ranks) // w] * N)
    # async on a temporary: the Work keeps the buffer alive until it completes.
    work = comm.all_reduce(a.make([r] * N), async_op=True)
    gc.collect()
    assert work.wait() is True and work.is_completed() and work.is_success() and work.exception() is None
    check("all_reduce async on a temporary", work.result, [sum(ranks)] * N)
    recv = a.empty(N, "int32")
    work = comm.all_reduce(a.make([1] * N, "int32"), recv, async_op=True)
    assert work.wait(timeout=60) is True and work.result is recv
    check("all_reduce async out of place", recv, [w] * N)

    # broadcast from the last rank: in place, out of place (send None off the root), async.
    root = w - 1
    x = a.make([100 + i if r == root else -1 for i in idx])
    comm.broadcast(x, root=root)
    check("broadcast in place", x, [100 + i for i in idx])
    recv = a.empty(N)
    comm.broadcast(a.make([200 + i for i in idx]) if r == root else None, recv, root=root)
    check("broadcast out of place", recv, [200 + i for i in idx])
    x = a.make([300] * N if r == 0 else [0] * N)
    comm.broadcast(x, root=0, async_op=True).wait()
    check("broadcast async", x, [300] * N)

    # reduce to the last rank: out of place (recv only on the root), in place.
    send = a.make([r + i for i in idx])
    recv = a.empty(N) if r == root else None
    comm.reduce(send, recv, root=root)
    if r == root:
        check("reduce out of place at root", recv, [sum(ranks) + w * i for i in idx])
    check("reduce send untouched", send, [r + i for i in idx])
    x = a.make([r + 1] * N)
    comm.reduce(x, op="max", root=0, async_op=True).wait()
    check("reduce in place async", x, [w] * N if r == 0 else [r + 1] * N)

    # all_gather: out of place, in place (this rank's block already at block r), async.
    gathered = [q * 10 + i for q in ranks for i in idx]
    recv = a.empty(w * N)
    comm.all_gather(a.make([r * 10 + i for i in idx]), recv)
    check("all_gather out of place", recv, gathered)
    buf = a.make([r * 10 + i if q == r else -1 for q in ranks for i in idx])
    comm.all_gather(None, buf)
    check("all_gather in place", buf, gathered)
    recv = a.empty(w * N, "float32")
    comm.all_gather(a.make([r * 10 + i for i in idx], "float32"), recv, async_op=True).wait()
    check("all_gather async", recv, gathered)

    # reduce_scatter: rank q contributes (q+1) * (j*N + i) at block j, element i.
    full = [(r + 1) * (j * N + i) for j in ranks for i in idx]
    mine = [sum(q + 1 for q in ranks) * (r * N + i) for i in idx]
    recv = a.empty(N)
    comm.reduce_scatter(a.make(full), recv)
    check("reduce_scatter out of place", recv, mine)
    x = a.make(full)
    comm.reduce_scatter(x)
    check("reduce_scatter in place (result at the start)", x[:N], mine)
    recv = a.empty(N, "int32")
    comm.reduce_scatter(a.make(full, "int32"), recv, async_op=True).wait()
    check("reduce_scatter async", recv, mine)

    # all_to_all: block j of rank q's send is q*100 + j*10 + i.
    send_blocks = [r * 100 + j * 10 + i for j in ranks for i in idx]
    want = [j * 100 + r * 10 + i for j in ranks for i in idx]
    recv = a.empty(w * N)
    comm.all_to_all(a.make(send_blocks), recv)
    check("all_to_all out of place", recv, want)
    x = a.make(send_blocks)
    comm.all_to_all(x, async_op=True).wait()
    check("all_to_all in place async", x, want)

    # gather to rank 0 and scatter from the last rank, out of place and in place.
    recv = a.empty(w * N) if r == 0 else None
    comm.gather(a.make([r * 10 + i for i in idx]), recv, root=0)
    if r == 0:
        check("gather out of place", recv, gathered)
    if r == root:
        buf = a.make([root * 10 + i if q == root else -1 for q in ranks for i in idx])
        comm.gather(None, buf, root=root)
        check("gather in place at root", buf, gathered)
    else:
        comm.gather(a.make([r * 10 + i for i in idx]), root=root)
    recv = a.empty(N)
    comm.scatter(a.make(gathered) if r == root else None, recv, root=root)
    check("scatter out of place", recv, [r * 10 + i for i in idx])
    if r == 0:
        buf = a.make(gathered)
        comm.scatter(buf, root=0, async_op=True).wait()
        check("scatter in place at root", buf, gathered)
    else:
        recv = a.empty(N)
        comm.scatter(None, recv, root=0, async_op=True).wait()
        check("scatter async", recv, [r * 10 + i for i in idx])

    # send/recv around a ring, async sends then blocking receives.
    if w > 1:
        nxt, prev = (r + 1) % w, (r - 1) % w
        sent = comm.send(a.make([r * 1000 + i for i in idx]), nxt, async_op=True)
        recv = a.empty(N)
        assert comm.recv(recv, prev) is recv
        sent.wait()
        check("recv from the previous rank", recv, [prev * 1000 + i for i in idx])
        # blocking, between ranks 0 and 1 in the order that cannot deadlock
        got = a.empty(N, "int32")
        if r == 0:
            comm.send(a.make([7] * N, "int32"), 1)
            comm.recv(got, 1)
            check("blocking recv on rank 0", got, [8] * N)
        elif r == 1:
            comm.recv(got, 0)
            check("blocking recv on rank 1", got, [7] * N)
            comm.send(a.make([8] * N, "int32"), 0)

    comm.barrier()
    assert comm.barrier(async_op=True).wait() is True

    # split (reversed order by key), dup, new_group.
    sub = comm.split(r % 2, key=-r)
    assert sub is not None
    members = [q for q in ranks if q % 2 == r % 2]
    assert sub.world_size == len(members) and sub.rank == sorted(members, reverse=True).index(r), (sub, members)
    x = a.make([r] * N)
    sub.all_reduce(x)
    check("all_reduce on a split", x, [sum(members)] * N)
    sub.destroy()
    assert sub.destroyed
    none = comm.split(-1 if r == 0 else 0)
    assert (none is None) == (r == 0)
    if none is not None:
        none.destroy()
    twin = comm.dup()
    assert (twin.rank, twin.world_size) == (r, w)
    x = a.make([1] * N)
    twin.all_reduce(x)
    check("all_reduce on a dup", x, [w] * N)
    twin.destroy()
    if w >= 2:
        group = [w - 1, 0]
        if r in group:
            g = comm.new_group(group)
            assert (g.rank, g.world_size) == (group.index(r), 2)
            x = a.make([r] * N)
            g.all_reduce(x)
            check("all_reduce on new_group", x, [w - 1] * N)
            g.destroy()
    comm.barrier()
    comm.destroy()
    print("ok")


@scenario
def dtypes() -> None:
    """Every braid dtype from NumPy, torch, and plain buffers; others refused."""
    import array

    import numpy as np
    import torch

    comm = braid.Communicator.from_env()
    r, w = comm.rank, comm.world_size
    for name in ("float32", "float64", "float16", "int8", "uint8", "int32", "int64"):
        x = np.full(3, r + 1, dtype=name)
        comm.all_reduce(x)
        check(f"numpy {name}", x, [w * (w + 1) // 2] * 3)
    for name in ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"):
        t = torch.full((2, 3), r + 1, dtype=getattr(torch, name))
        comm.all_reduce(t)
        check(f"torch {name}", t.flatten(), [w * (w + 1) // 2] * 6)
    b = bytearray([r + 1] * 4)
    comm.all_reduce(b)
    assert list(b) == [w * (w + 1) // 2] * 4, list(b)
    arr = array.array("i", [r] * 4)
    comm.all_reduce(memoryview(arr))
    assert list(arr) == [sum(range(w))] * 4, list(arr)
    # a DLPack producer that is not a buffer: a torch tensor seen only through __dlpack__
    class OnlyDLPack:
        def __init__(self, t: Any) -> None:
            self.t = t

        def __dlpack__(self, **kw: Any) -> Any:
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self) -> Any:
            return self.t.__dlpack_device__()

    t = torch.full((4,), r, dtype=torch.int64)
    comm.all_reduce(OnlyDLPack(t))
    check("DLPack producer", t, [sum(range(w))] * 4)
    for bad in (np.zeros(3, bool), np.zeros(3, np.complex64), np.zeros(3, np.int16), np.zeros(3, np.uint32),
                torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.complex64), torch.zeros(3, dtype=torch.int16)):
        try:
            comm.all_reduce(bad)
        except TypeError as e:
            assert "does not support" in str(e) and "supported: float32" in str(e), e
        else:
            raise AssertionError(f"{bad.dtype} was accepted")
    comm.destroy()
    print("ok")


def expect(exc: type, fn: Callable[[], Any], *words: str) -> BaseException:
    try:
        fn()
    except exc as e:
        for word in words:
            assert word in str(e), f"{type(e).__name__} {e!r} lacks {word!r}"
        return e
    raise AssertionError(f"no {exc.__name__} raised (wanted one naming {words})")


@scenario
def bad_local_input(kind: str) -> None:
    """Wrong shapes, dtypes, layouts, roots and peers: refused before any rank
    communicates, with exceptions naming the cause (every rank runs the same)."""
    a = Arrays(kind)
    comm = braid.Communicator.from_env()
    r, w = comm.rank, comm.world_size
    IA = braid.InvalidArgumentError
    if kind == "numpy":
        strided = a.np.arange(10, dtype="int64")[::2]
        matrix_t = a.np.zeros((3, 4), dtype="int64").T
        ro = a.np.zeros(4, dtype="int64")
        ro.setflags(write=False)
        expect(IA, lambda: comm.all_reduce(ro), "read-only")
        expect(IA, lambda: comm.all_reduce(a.make([1] * 4), bytes(32)), "read-only")
        expect(TypeError, lambda: comm.all_reduce(a.np.zeros(4, dtype=">i4")), "non-native byte order")
    else:
        strided = a.torch.arange(10)[::2]
        matrix_t = a.torch.zeros(3, 4, dtype=a.torch.int64).t()
    for bad in (strided, matrix_t):
        e = expect(IA, lambda: comm.all_reduce(bad), "contiguous")
        assert isinstance(e, ValueError) and isinstance(e, braid.BraidError)
        expect(IA, lambda: comm.all_reduce(a.make([1] * 5), bad), "contiguous")
    expect(TypeError, lambda: comm.all_reduce(a.make([1] * 4, "int32"), a.empty(4, "int64")), "I32", "I64")
    expect(TypeError, lambda: comm.all_reduce([1, 2, 3]), "list")
    expect(IA, lambda: comm.all_reduce(a.make([1] * 4), a.empty(5)), "recv holds 5 elements, expected 4")
    expect(IA, lambda: comm.all_gather(a.make([1] * 4), a.empty(4 * w + 1)), f"expected {4 * w}")
    expect(IA, lambda: comm.broadcast(a.make([1] * 3), a.empty(4)), "send holds 3 elements, expected 4")
    expect(IA, lambda: comm.broadcast(a.make([1] * 4), root=w), f"root {w} is not a rank")
    expect(IA, lambda: comm.reduce(a.make([1] * 4), root=-1), "root -1")
    expect(IA, lambda: comm.send(a.make([1]), r), f"peer {r} is not another rank")
    expect(IA, lambda: comm.recv(a.empty(1), w + 3), f"peer {w + 3}")
    expect(IA, lambda: comm.gather(None, None, root=r), "recv is None on the root")
    expect(IA, lambda: comm.all_reduce(a.make([1]), op="xor"), "unknown reduce op 'xor'")
    if w > 1:
        expect(IA, lambda: comm.reduce_scatter(a.make([1] * (w + 1))), f"not a multiple of the world size {w}")
        expect(IA, lambda: comm.all_to_all(a.make([1] * (w * 2 + 1))), "not a multiple")
        expect(IA, lambda: comm.scatter(None, None, root=(r + 1) % w), "recv is None on rank")
    # Overlapping buffers are refused by libbraid itself: the message names the call.
    if kind == "numpy":
        big = a.np.zeros(8, dtype="int64")
        e = expect(IA, lambda: comm.all_reduce(big[:4], big[2:6]))
        assert e.call == "braid_all_reduce" and e.code == 1 and str(e), (e.call, e.code, e)
    # Still usable: nothing reached the other ranks.
    x = a.make([1] * 3)
    comm.all_reduce(x)
    check("all_reduce after refused calls", x, [w] * 3)
    comm.destroy()
    expect(IA, lambda: comm.all_reduce(a.make([1])), "destroyed")
    comm.destroy()  # twice is fine
    print("ok")


@scenario
def mismatch(what: str) -> None:
    """Ranks disagreeing on a call's dtype or count: every rank raises."""
    import numpy as np

    comm = braid.Communicator.from_env()
    r = comm.rank
    if what == "dtype":
        x = np.ones(8, dtype=np.int32 if r == 0 else np.float32)
    else:
        x = np.ones(8 if r == 0 else 16, dtype=np.int64)
    try:
        comm.all_reduce(x)
    except braid.BraidError as e:
        print(json.dumps({"type": type(e).__name__, "message": str(e), "call": e.call}))
    else:
        raise AssertionError(f"all_reduce with a {what} differing across ranks succeeded: {x}")
    comm.abort()
    comm.destroy()
    print("ok")


@scenario
def dead_peer(victim: str) -> None:
    """One rank is killed (SIGKILL) after a barrier; the others' next collective
    raises, naming it."""
    import numpy as np

    comm = braid.Communicator.from_env()
    comm.barrier()
    if comm.rank == int(victim):
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        if comm.rank == 0:
            # through a Work: wait raises the call's error, then again on every wait
            work = comm.all_reduce(np.ones(1 << 16, dtype=np.float32), async_op=True)
            try:
                work.wait()
            except braid.BraidError as e:
                assert work.is_completed() and not work.is_success() and work.exception() is e
                assert e.call == "braid_all_reduce" and str(e).startswith("braid_all_reduce (async): "), (e.call, e)
                again = expect(braid.BraidError, work.wait)
                assert again is e, (again, e)
                raise
        else:
            comm.all_reduce(np.ones(1 << 16, dtype=np.float32))
        comm.barrier()
    except braid.BraidError as e:
        print(json.dumps({"type": type(e).__name__, "message": str(e), "seconds": time.monotonic() - start}))
    else:
        raise AssertionError(f"collectives succeeded although rank {victim} was killed")
    comm.destroy()  # a broken communicator is freed without the exchange
    print("ok")


@scenario
def abort() -> None:
    """Rank 1 aborts while rank 0 waits in a collective: rank 1's later calls are
    AbortedError, rank 0's call fails naming rank 1."""
    import numpy as np

    comm = braid.Communicator.from_env()
    comm.barrier()
    if comm.rank == 1:
        comm.abort()
        expect(braid.AbortedError, lambda: comm.all_reduce(np.ones(4, np.int64)))
    else:
        e = expect(braid.BraidError, lambda: comm.all_reduce(np.ones(4, np.int64)), "1")
        print(json.dumps({"type": type(e).__name__, "message": str(e)}))
    comm.destroy()
    print("ok")


@scenario
def late_peer() -> None:
    """Rank 1 joins a collective late: rank 0's Work reports not-yet-complete
    (wait with a timeout returns False), then completes; with BRAID_TIMEOUT short
    and rank 1 absent, rank 0 gets BraidTimeoutError naming rank 1."""
    import numpy as np

    comm = braid.Communicator.from_env()
    comm.barrier()
    x = np.full(4, comm.rank + 1, dtype=np.int64)
    if comm.rank == 1:
        time.sleep(3)
        comm.all_reduce(x)
    else:
        # The Work alone keeps a temporary send buffer alive while the call runs,
        # and lets it go once complete.
        send = x.copy()
        alive = weakref.ref(send)
        work = comm.all_reduce(send, x, async_op=True)
        del send
        gc.collect()
        assert alive() is not None, "the send buffer was freed while braid still reads it"
        assert work.is_completed() is False
        assert work.wait(timeout=0.2) is False
        assert work.wait(timeout=60) is True
        del work
        gc.collect()
        assert alive() is None, "the Work kept the send buffer after completing"
    check("late all_reduce", x, [3] * 4)
    if comm.rank == 1:
        time.sleep(float(os.environ["SILENT_SECONDS"]))
    else:
        e = expect(braid.BraidTimeoutError, lambda: comm.all_reduce(x), "1")
        assert isinstance(e, TimeoutError)
        print(json.dumps({"type": type(e).__name__, "message": str(e)}))
    comm.abort()
    comm.destroy()
    print("ok")


@scenario
def threads() -> None:
    """A blocking call releases the GIL: another Python thread runs meanwhile.
    The communicator comes from the explicit constructor (the BRAID_* variables
    removed first) and closes as a context manager."""
    rank, world = int(os.environ.pop("BRAID_RANK")), int(os.environ.pop("BRAID_WORLD_SIZE"))
    store = os.environ.pop("BRAID_STORE")
    braid.set_log_level("warn")
    expect(braid.InvalidArgumentError, lambda: braid.set_log_level("=[nonsense"), "braid_set_log_level")
    expect(braid.InvalidArgumentError, lambda: braid.Communicator(world, world, store), f"rank {world} of world size {world}")
    with braid.Communicator(rank, world, store) as comm:
        assert (comm.rank, comm.world_size) == (rank, world)
        _ticks_while_waiting(comm)
    assert comm.destroyed
    print("ok")


def _ticks_while_waiting(comm: braid.Communicator) -> None:
    ticks = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.01)

    if comm.rank == 0:
        t = threading.Thread(target=ticker)
        t.start()
        comm.barrier()  # rank 1 arrives after 1 s
        stop.set()
        t.join()
        assert len(ticks) >= 5, f"the other thread ran {len(ticks)} times while braid waited"
    else:
        time.sleep(1)
        comm.barrier()


@scenario
def destroy_waits() -> None:
    """destroy() on one thread waits for a call another thread has in flight on
    the same communicator (never frees the handle under it), then closes."""
    comm = braid.Communicator.from_env()
    if comm.rank == 0:
        outcome: List[Any] = []

        def in_flight() -> None:
            try:
                outcome.append(comm.barrier())  # rank 1 arrives after 1 s
            except BaseException as e:
                outcome.append(e)

        t = threading.Thread(target=in_flight)
        t.start()
        time.sleep(0.3)
        comm.destroy()
        t.join(timeout=60)
        assert outcome == [None], outcome
    else:
        time.sleep(1)
        comm.barrier()
        comm.destroy()
    assert comm.destroyed
    print("ok")


@scenario
def uneven_and_tagged(kind: str) -> None:
    """The v-calls with uneven counts (zeros included) and tagged send/recv, blocking
    and async, with exact results; a tag mismatch raising on both sides."""
    a = Arrays(kind)
    comm = braid.Communicator.from_env()
    r, w = comm.rank, comm.world_size
    ranks = range(w)
    counts = [(q * 2) % 5 for q in ranks]  # 0, 2, 4, 1, 3, ...: zeros included
    total = sum(counts)

    # all_gather_v: rank q contributes counts[q] copies of 100 + q.
    gathered = [100 + q for q in ranks for _ in range(counts[q])]
    for async_op in (False, True):
        recv = a.empty(total)
        out = comm.all_gather_v(a.make([100 + r] * counts[r]), recv, counts, async_op=async_op)
        if async_op:
            out.wait()
        check(f"all_gather_v async={async_op}", recv, gathered)
    start = sum(counts[:r])
    buf = a.make([100 + r if start <= i < start + counts[r] else -1 for i in range(total)])
    comm.all_gather_v(None, buf, counts)
    check("all_gather_v in place", buf, gathered)

    # reduce_scatter_v: element i of every rank's send is r * 1000 + i.
    base = sum(q * 1000 for q in ranks)
    for async_op in (False, True):
        recv = a.empty(counts[r])
        out = comm.reduce_scatter_v(a.make([r * 1000 + i for i in range(total)]), recv, counts, async_op=async_op)
        if async_op:
            out.wait()
        check(f"reduce_scatter_v async={async_op}", recv, [base + w * i for i in range(start, start + counts[r])])

    # all_to_all_v: rank r sends (r + j) % 3 elements of value r * 100 + j to rank j.
    send_counts = [(r + j) % 3 for j in ranks]
    recv_counts = [(j + r) % 3 for j in ranks]
    send = a.make([r * 100 + j for j in ranks for _ in range(send_counts[j])])
    for async_op in (False, True):
        recv = a.empty(sum(recv_counts))
        out = comm.all_to_all_v(send, send_counts, recv, recv_counts, async_op=async_op)
        if async_op:
            out.wait()
        check(f"all_to_all_v async={async_op}", recv, [j * 100 + r for j in ranks for _ in range(recv_counts[j])])

    # Tagged send/recv in a ring, blocking and async; then a tag mismatch.
    if w > 1:
        nxt, prv = (r + 1) % w, (r - 1) % w
        got = a.empty(3)
        if r % 2 == 0:
            comm.send(a.make([r] * 3), nxt, tag=7 + r)
            comm.recv(got, prv, tag=7 + prv)
        else:
            comm.recv(got, prv, tag=7 + prv)
            comm.send(a.make([r] * 3), nxt, tag=7 + r)
        check("tagged ring", got, [prv] * 3)
        got = a.empty(3)
        works = [comm.recv(got, prv, tag=40, async_op=True), comm.send(a.make([r + 1] * 3), nxt, tag=40, async_op=True)]
        for work in works:
            work.wait()
        check("tagged ring async", got, [prv + 1] * 3)
        # Receive from any source: rank 0 hears from every other rank exactly once.
        if r == 0:
            seen = []
            for _ in range(w - 1):
                got = a.empty(2)
                src = comm.recv_any(got, tag=3)
                check(f"recv_any from rank {src}", got, [src * 11] * 2)
                seen.append(src)
            assert sorted(seen) == list(range(1, w)), seen
        else:
            comm.send(a.make([r * 11] * 2), 0, tag=3)
        comm.barrier()
        if r in (0, 1):
            try:
                if r == 0:
                    comm.send(a.make([1] * 4), 1, tag=5)
                    # The sender learns of the mismatch from rank 1's abort, here at the
                    # latest (rank 1 sends nothing back).
                    comm.recv(a.empty(1), 1)
                else:
                    comm.recv(a.empty(4), 0, tag=6)
            except braid.BraidError as e:
                text = str(e)
                assert "5" in text and "6" in text and "tag" in text, text
                print("mismatch:", text)
            else:
                raise AssertionError(f"rank {r}: a tag mismatch went unnoticed")
    print("ok")


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
