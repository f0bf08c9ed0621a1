"""braid as a torch.distributed backend: `dist.init_process_group("braid")`.

Registered on `import braid.torch`, and through the `torch.distributed.backends`
entry point (python/pyproject.toml), so a plain `init_process_group("braid")`
finds it with no import. CPU tensors only (devices=["cpu"]).

`ProcessGroupBraid` is a Python `torch.distributed.ProcessGroup`: torch's
Python API calls its methods directly, and C++ callers (DDP's reducer, the
parameter broadcast) reach them through torch's pybind trampoline. Every call
is issued asynchronously on a braid communicator and returns a `BraidWork`
(a `torch.distributed.Work`) whose wait() raises braid's error.

Element types: data movement (broadcast, gathers, scatters, all-to-all,
send/recv) moves any dtype as bytes. Reductions use braid's types directly;
complex as pairs of reals (SUM and AVG only); bool as uint8 (SUM/MAX = or,
MIN/PRODUCT = and); int16/uint16 through int32 and uint32 through int64
(wrapping arithmetic gives the same low bits). Others are refused naming the
dtype. PREMUL_SUM and the bitwise ops are refused.
"""

from __future__ import annotations

import queue
import threading
import uuid
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _lib
from ._comm import Communicator, ReduceOp
from ._errors import UnsupportedError

BACKEND_NAME = "braid"

# Reduction dtypes braid computes on as they are.
_NATIVE = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64}
# Integer dtypes reduced through a wider braid type, then cast back (wrapping
# arithmetic: the low bits of the wide result are the narrow result).
_WIDEN = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64}
_COMPLEX = {torch.complex64, torch.complex128, torch.complex32}

_R = dist.ReduceOp.RedOpType
_OPS = {_R.SUM: ReduceOp.SUM, _R.PRODUCT: ReduceOp.PROD, _R.MIN: ReduceOp.MIN, _R.MAX: ReduceOp.MAX, _R.AVG: ReduceOp.AVG}


def _red_op(op: Any) -> ReduceOp:
    kind = getattr(op, "op", op)
    mapped = _OPS.get(kind)
    if mapped is None:
        raise UnsupportedError(
            f"braid backend: reduce op {kind} is not supported (SUM, PRODUCT, MIN, MAX, AVG are; "
            "for PREMUL_SUM scale the tensor first, for bitwise ops use the gloo backend)"
        )
    return mapped


class BraidWork(dist.Work):
    """A torch Work over braid Works: wait() raises the call's error, and the
    finishers (copying results back into the caller's tensors) run once, on
    the first wait or on the completer thread behind get_future()."""

    def __init__(self, pg: "ProcessGroupBraid", works: Sequence[Any], result: List[torch.Tensor],
                 finish: Optional[Callable[[], None]] = None, source_rank: int = -1) -> None:
        super().__init__()
        self._pg = pg
        self._works = list(works)
        self._result = result
        self._finish = finish
        self._src = source_rank
        self._lock = threading.Lock()
        self._done = False
        self._error: Optional[BaseException] = None
        self._future: Optional["torch.futures.Future[List[torch.Tensor]]"] = None

    def _complete(self, timeout_s: Optional[float] = None) -> bool:
        with self._lock:
            if self._done:
                return True
            try:
                for w in self._works:
                    if not w.wait(timeout_s):
                        return False
                if self._finish is not None:
                    self._finish()
            except BaseException as e:  # noqa: BLE001 - recorded and raised on every wait
                self._error = e
            self._done = True
            self._works = []
            return True

    def wait(self, timeout: Any = None) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if not self._complete(seconds if seconds else None):
            raise RuntimeError(f"braid backend: rank {self._pg._rank}'s work did not complete within {timeout}")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done or (all(w.is_completed() for w in self._works) and self._complete())

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error if self.is_completed() else None

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        return self._src

    def _source_rank(self) -> int:  # torch's private spelling (dist.recv reads it)
        return self._src

    def get_future(self) -> "torch.futures.Future[List[torch.Tensor]]":
        """A future completed with the output tensors by the group's completer
        thread (one per group: works finish in issue order)."""
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                self._pg._complete_later(self)
            return self._future

    def _settle_future(self) -> None:
        self._complete()
        fut = self._future
        assert fut is not None
        if self._error is not None:
            fut.set_exception(self._error)  # type: ignore[arg-type]  # torch stubs type it as the result
        else:
            fut.set_result(self._result)


class ProcessGroupBraid(dist.ProcessGroup):
    """torch.distributed's ProcessGroup over a braid Communicator."""

    def __init__(self, comm: Communicator, timeout: Optional[timedelta] = None) -> None:
        super().__init__(comm.rank, comm.world_size)
        self._comm = comm
        self._rank = comm.rank
        self._size = comm.world_size
        self._timeout = timeout
        self._group_name = ""
        self._group_desc = ""
        self._pending: "queue.Queue[Optional[BraidWork]]" = queue.Queue()
        self._completer: Optional[threading.Thread] = None

    # -- identity ---------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    # The group's name and description: the inherited methods keep them on a
    # C++ backend, which a ProcessGroup subclass does not have (torch's flight
    # recorder and logging read them through these, from C++).
    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def _get_backend(self, device: Any = None) -> "ProcessGroupBraid":
        # torch asks the group for its per-device backend (batch_isend_irecv
        # checks `supports_coalescing` on it); this group is its own backend.
        return self

    @property
    def communicator(self) -> Communicator:
        return self._comm

    def __repr__(self) -> str:
        return f"ProcessGroupBraid(rank={self._rank}, size={self._size})"

    # -- futures ----------------------------------------------------------------

    def _complete_later(self, work: BraidWork) -> None:
        if self._completer is None:
            self._completer = threading.Thread(target=self._complete_loop, name="braid-pg-futures", daemon=True)
            self._completer.start()
        self._pending.put(work)

    def _complete_loop(self) -> None:
        while True:
            work = self._pending.get()
            if work is None:
                return
            work._settle_future()

    def shutdown(self) -> None:
        if self._completer is not None:
            self._pending.put(None)
        self._comm.destroy()

    def abort(self) -> None:
        self._comm.abort()

    # -- helpers ----------------------------------------------------------------

    def _one(self, tensors: Sequence[torch.Tensor], call: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(f"braid backend {call}: expected one tensor per call (CPU), got {len(tensors)}")
        return self._cpu(tensors[0], call)

    def _cpu(self, t: torch.Tensor, call: str) -> torch.Tensor:
        if t.device.type != "cpu":
            raise UnsupportedError(f"braid backend {call}: tensor on {t.device}; this backend takes CPU tensors")
        return t

    def _bytes(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous byte view (or copy) of `t` for moving data of any dtype."""
        return t.contiguous().reshape(-1).view(torch.uint8)

    def _check_root(self, root: int, call: str) -> int:
        if not 0 <= root < self._size:
            raise ValueError(f"braid backend {call}: root {root} is not a rank of group size {self._size}")
        return root

    def _reducible(self, t: torch.Tensor, op: ReduceOp, call: str) -> Tuple[torch.Tensor, ReduceOp, Callable[[torch.Tensor], object]]:
        """(a contiguous buffer braid can reduce, the op to use, how to copy the
        reduced buffer back into `t`)."""
        dt = t.dtype
        if dt in _NATIVE:
            buf = t if t.is_contiguous() else t.contiguous()
            return buf, op, (lambda b: None) if buf is t else (lambda b: t.copy_(b))
        if dt in _COMPLEX:
            if op not in (ReduceOp.SUM, ReduceOp.AVG) or dt == torch.complex32:
                raise UnsupportedError(
                    f"braid backend {call}: {dt} reduces with SUM or AVG only (as pairs of reals; complex32 not at all)"
                )
            buf = torch.view_as_real(t.contiguous()).reshape(-1)
            return buf, op, lambda b: t.copy_(torch.view_as_complex(b.view(*t.shape, 2)))
        if dt == torch.bool:
            buf = t.to(torch.uint8).contiguous()
            mapped = ReduceOp.MAX if op in (ReduceOp.SUM, ReduceOp.MAX) else ReduceOp.MIN
            if op == ReduceOp.AVG:
                raise UnsupportedError(f"braid backend {call}: AVG of bool tensors is not defined")
            return buf, mapped, lambda b: t.copy_(b.to(torch.bool))
        if dt in _WIDEN:
            if op == ReduceOp.AVG:
                raise UnsupportedError(f"braid backend {call}: AVG of {dt} is not supported (cast to float)")
            buf = t.to(_WIDEN[dt]).contiguous()
            return buf, op, lambda b: t.copy_(b.to(dt))
        raise UnsupportedError(
            f"braid backend {call}: dtype {dt} cannot be reduced (braid reduces float32/64, float16, bfloat16, "
            "int8/16/32/64, uint8/16/32, bool, complex64/128)"
        )

    def _work(self, works: Sequence[Any], result: List[torch.Tensor], finishers: Sequence[Callable[[], object]] = (),
              source_rank: int = -1) -> BraidWork:
        fs = list(finishers)

        def finish() -> None:
            for f in fs:
                f()

        return BraidWork(self, works, result, finish if fs else None, source_rank)

    # -- all-reduce ---------------------------------------------------------------

    def _allreduce_each(self, tensors: Sequence[torch.Tensor], op_: Any, call: str) -> BraidWork:
        op = _red_op(op_)
        works, finishers = [], []
        for t in tensors:
            t = self._cpu(t, call)
            buf, bop, back = self._reducible(t, op, call)
            works.append(self._comm.all_reduce(buf, op=bop, async_op=True))
            finishers.append(lambda back=back, buf=buf: back(buf))
        return self._work(works, list(tensors), finishers)

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> BraidWork:
        return self._allreduce_each(tensors, opts.reduceOp if opts is not None else _R.SUM, "allreduce")

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> BraidWork:
        # One braid call per tensor: braid orders them, and the results are the same.
        return self._allreduce_each(tensors, opts.reduceOp if opts is not None else _R.SUM, "allreduce_coalesced")

    # -- rooted -------------------------------------------------------------------

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> BraidWork:
        root = self._check_root(opts.rootRank if opts is not None else 0, "broadcast")
        works, finishers = [], []
        for t in tensors:
            t = self._cpu(t, "broadcast")
            buf = self._bytes(t)
            works.append(self._comm.broadcast(buf, root=root, async_op=True))
            if not t.is_contiguous():
                finishers.append(lambda t=t, buf=buf: t.copy_(buf.view(t.dtype).view(t.shape)))
        return self._work(works, list(tensors), finishers)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> BraidWork:
        t = self._one(tensors, "reduce")
        root = self._check_root(opts.rootRank, "reduce")
        buf, bop, back = self._reducible(t, _red_op(opts.reduceOp), "reduce")
        work = self._comm.reduce(buf, op=bop, root=root, async_op=True)
        return self._work([work], list(tensors), [lambda: back(buf)] if self._rank == root else [])

    # -- gathers --------------------------------------------------------------------

    def _gather_into(self, outs: Sequence[torch.Tensor], flat: torch.Tensor, call: str) -> Callable[[], None]:
        n = flat.numel() // max(1, len(outs))

        def copy_out() -> None:
            for i, o in enumerate(outs):
                o.copy_(flat[i * n:(i + 1) * n].view(o.dtype).view(o.shape))

        return copy_out

    def _same_shape(self, outs: Sequence[torch.Tensor], t: torch.Tensor, call: str) -> None:
        if len(outs) != self._size:
            raise ValueError(f"braid backend {call}: {len(outs)} output tensors for group size {self._size}")
        for o in outs:
            if o.dtype != t.dtype or o.numel() != t.numel():
                raise ValueError(
                    f"braid backend {call}: output {tuple(o.shape)} {o.dtype} does not match input "
                    f"{tuple(t.shape)} {t.dtype} (braid gathers equal blocks)"
                )

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None) -> BraidWork:
        t = self._one(input_tensors, "allgather")
        outs = output_tensors[0]
        self._same_shape(outs, t, "allgather")
        send = self._bytes(t)
        flat = torch.empty(send.numel() * self._size, dtype=torch.uint8)
        work = self._comm.all_gather(send, flat, async_op=True)
        return self._work([work], list(outs), [self._gather_into(outs, flat, "allgather")])

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], input_list: List[torch.Tensor], opts: Any = None) -> BraidWork:
        """`output_lists[r][i]` receives rank r's `input_list[i]` (torch's layout)."""
        if len(output_lists) != self._size or any(len(outs) != len(input_list) for outs in output_lists):
            raise ValueError(
                f"braid backend allgather_coalesced: needs {self._size} output lists (one per rank) of "
                f"{len(input_list)} tensors (one per input)"
            )
        works = [self.allgather([[outs[i] for outs in output_lists]], [t]) for i, t in enumerate(input_list)]
        return self._work(works, [o for outs in output_lists for o in outs])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> BraidWork:
        self._cpu(output, "all_gather_single")
        if output.numel() != input.numel() * self._size or output.dtype != input.dtype:
            raise ValueError(
                f"braid backend all_gather_single: output {tuple(output.shape)} {output.dtype} is not group size "
                f"{self._size} times input {tuple(input.shape)} {input.dtype}"
            )
        send = self._bytes(input)
        if output.is_contiguous():
            work = self._comm.all_gather(send, output.reshape(-1).view(torch.uint8), async_op=True)
            return self._work([work], [output])
        flat = torch.empty(send.numel() * self._size, dtype=torch.uint8)
        work = self._comm.all_gather(send, flat, async_op=True)
        return self._work([work], [output], [lambda: output.copy_(flat.view(output.dtype).view(output.shape))])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> BraidWork:
        return self._work([self.all_gather_single(o, i) for o, i in zip(outputs, inputs)], list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None) -> BraidWork:
        t = self._one(input_tensors, "gather")
        root = self._check_root(opts.rootRank, "gather")
        send = self._bytes(t)
        if self._rank != root:
            return self._work([self._comm.gather(send, None, root=root, async_op=True)], [])
        outs = output_tensors[0]
        self._same_shape(outs, t, "gather")
        flat = torch.empty(send.numel() * self._size, dtype=torch.uint8)
        work = self._comm.gather(send, flat, root=root, async_op=True)
        return self._work([work], list(outs), [self._gather_into(outs, flat, "gather")])

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> BraidWork:
        root = self._check_root(opts.rootRank, "gather_single")
        if self._rank != root:
            return self._work([self._comm.gather(self._bytes(input), None, root=root, async_op=True)], [])
        flat = torch.empty(input.numel() * input.element_size() * self._size, dtype=torch.uint8)
        work = self._comm.gather(self._bytes(input), flat, root=root, async_op=True)
        return self._work([work], [output], [lambda: output.copy_(flat.view(output.dtype).view(output.shape))])

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any = None) -> BraidWork:
        out = self._one(output_tensors, "scatter")
        root = self._check_root(opts.rootRank, "scatter")
        recv = torch.empty(out.numel() * out.element_size(), dtype=torch.uint8)
        send = None
        if self._rank == root:
            ins = input_tensors[0]
            self._same_shape(ins, out, "scatter")
            send = torch.cat([self._bytes(i) for i in ins])
        work = self._comm.scatter(send, recv, root=root, async_op=True)
        return self._work([work], [out], [lambda: out.copy_(recv.view(out.dtype).view(out.shape))])

    # -- reduce-scatter ------------------------------------------------------------------

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> BraidWork:
        self._cpu(input, "reduce_scatter_single")
        if input.numel() != output.numel() * self._size or input.dtype != output.dtype:
            raise ValueError(
                f"braid backend reduce_scatter_single: input {tuple(input.shape)} {input.dtype} is not group size "
                f"{self._size} times output {tuple(output.shape)} {output.dtype}"
            )
        op = _red_op(opts.reduceOp if opts is not None else _R.SUM)
        # Out of place: braid only reads `send`, so a view of the input will do.
        send, bop, _ = self._reducible(input, op, "reduce_scatter_single")
        out, _, back = self._reducible(output, op, "reduce_scatter_single")
        recv = out if out is output else torch.empty_like(out)
        work = self._comm.reduce_scatter(send, recv, op=bop, async_op=True)
        return self._work([work], [output], [] if recv is output else [lambda: back(recv)])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None) -> BraidWork:
        out = self._one(output_tensors, "reduce_scatter")
        ins = input_lists[0]
        self._same_shape(ins, out, "reduce_scatter")
        flat = torch.cat([i.reshape(-1) for i in ins])
        return self.reduce_scatter_single(out, flat, opts)

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> BraidWork:
        return self._work([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)], list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- all-to-all ---------------------------------------------------------------------------

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int],
                          input_split_sizes: List[int], opts: Any = None) -> BraidWork:
        call = "all_to_all_single"
        self._cpu(input, call)
        self._cpu(output, call)
        if output.dtype != input.dtype:
            raise ValueError(f"braid backend {call}: output is {output.dtype} but input is {input.dtype}")
        rows_in = input.shape[0] if input.dim() else 1
        rows_out = output.shape[0] if output.dim() else 1
        in_splits = list(input_split_sizes) or [rows_in // self._size] * self._size
        out_splits = list(output_split_sizes) or [rows_out // self._size] * self._size
        for name, splits, rows in (("input", in_splits, rows_in), ("output", out_splits, rows_out)):
            if len(splits) != self._size or sum(splits) != rows or min(splits) < 0:
                raise ValueError(
                    f"braid backend {call}: {name} splits {splits} do not cut {rows} rows into group size {self._size}"
                )
        row_bytes = (input.numel() // max(1, rows_in)) * input.element_size()
        send = self._bytes(input)
        if len(set(in_splits)) == 1 and in_splits == out_splits:
            recv = output.reshape(-1).view(torch.uint8) if output.is_contiguous() else torch.empty_like(send)
            work = self._comm.all_to_all(send, recv, async_op=True)
            back = [] if output.is_contiguous() else [lambda: output.copy_(recv.view(output.dtype).view(output.shape))]
            return self._work([work], [output], back)
        recv = torch.empty(rows_out * row_bytes, dtype=torch.uint8)
        works = self._uneven(send, [s * row_bytes for s in in_splits], recv, [s * row_bytes for s in out_splits], call)
        return self._work(works, [output], [lambda: output.copy_(recv.view(output.dtype).view(output.shape))])

    def _uneven(self, send: torch.Tensor, send_sizes: List[int], recv: torch.Tensor, recv_sizes: List[int],
                call: str) -> List[Any]:
        """An all-to-all of uneven byte blocks packed in rank order: one braid
        all-to-all-v where the library has it, else pairwise send/recv."""
        if _lib.has("braid_all_to_all_v_async"):
            return [self._comm.all_to_all_v(send, send_sizes, recv, recv_sizes, async_op=True)]
        if _lib.has("braid_all_to_all_v"):
            self._comm.all_to_all_v(send, send_sizes, recv, recv_sizes)
            return []
        return self._exchange(list(torch.split(send, send_sizes)), list(torch.split(recv, recv_sizes)), call)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any = None) -> BraidWork:
        call = "alltoall"
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(f"braid backend {call}: needs {self._size} input and output tensors")
        sends = [self._bytes(self._cpu(t, call)) for t in input_tensors]
        recvs = [torch.empty(o.numel() * o.element_size(), dtype=torch.uint8) for o in output_tensors]
        sizes = {s.numel() for s in sends} | {r.numel() for r in recvs}
        if len(sizes) == 1:
            recv = torch.empty(sum(r.numel() for r in recvs), dtype=torch.uint8)
            works = [self._comm.all_to_all(torch.cat(sends), recv, async_op=True)]
            recvs = list(torch.split(recv, recvs[0].numel()))
        else:
            recv = torch.empty(sum(r.numel() for r in recvs), dtype=torch.uint8)
            works = self._uneven(torch.cat(sends), [t.numel() for t in sends], recv, [r.numel() for r in recvs], call)
            recvs = list(torch.split(recv, [r.numel() for r in recvs]))

        def copy_out() -> None:
            for o, r in zip(output_tensors, recvs):
                o.copy_(r.view(o.dtype).view(o.shape))

        return self._work(works, list(output_tensors), [copy_out])

    def _exchange(self, sends: Sequence[torch.Tensor], recvs: Sequence[torch.Tensor], call: str) -> List[Any]:
        """Uneven all-to-all as point-to-point calls, in an order that cannot
        deadlock even if sends wait for their receivers: pairs (i, j), i < j, in
        one global order; in each, the lower rank sends first, the higher
        receives first. (The earliest unfinished pair always has both ranks at
        it, so it finishes.) Empty blocks are skipped by both sides alike."""
        me = self._rank
        recvs[me].copy_(sends[me])
        works = []
        for i in range(self._size):
            for j in range(i + 1, self._size):
                if me not in (i, j):
                    continue
                peer = j if me == i else i
                ops = [("send", sends[peer]), ("recv", recvs[peer])]
                if me == j:
                    ops.reverse()
                for kind, buf in ops:
                    if buf.numel() == 0:
                        continue
                    if kind == "send":
                        works.append(self._comm.send(buf, peer, async_op=True))
                    else:
                        works.append(self._comm.recv(buf, peer, async_op=True))
        return works

    # -- barrier -----------------------------------------------------------------------------

    def barrier(self, opts: Any = None) -> BraidWork:
        return self._work([self._comm.barrier(async_op=True)], [])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """Rank 0 hears from every rank within `timeout`, then releases them; a
        rank that does not answer in time is named in the error.

        Call it on the group (`pg.monitored_barrier(timedelta(...))`):
        `dist.monitored_barrier` refuses every group whose `_device_types` is
        empty, which is what torch reports for a ProcessGroup subclass (and
        it must: torch attaches its flight recorder to groups with devices,
        which needs a C++ backend this group does not have)."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else (timeout or None)
        token = torch.zeros(1, dtype=torch.uint8)
        if self._rank != 0:
            self._comm.send(token, 0)
            work = self._comm.recv(torch.zeros(1, dtype=torch.uint8), 0, async_op=True)
            if not work.wait(seconds):
                raise RuntimeError(f"braid monitored_barrier: rank {self._rank} was not released by rank 0 within {timeout}")
            return
        missing = []
        for peer in range(1, self._size):
            work = self._comm.recv(torch.zeros(1, dtype=torch.uint8), peer, async_op=True)
            try:
                ok = work.wait(seconds)
            except Exception as e:  # noqa: BLE001 - a dead peer is a missing peer
                ok, seconds = False, seconds
                missing.append(f"{peer} ({e})")
                if not wait_all_ranks:
                    break
                continue
            if not ok:
                missing.append(str(peer))
                if not wait_all_ranks:
                    break
        if missing:
            raise RuntimeError(
                f"braid monitored_barrier: rank(s) {', '.join(missing)} did not reach the barrier within {timeout} "
                f"(seen from rank 0)"
            )
        for peer in range(1, self._size):
            self._comm.send(token, peer)

    # -- point-to-point --------------------------------------------------------------------

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> BraidWork:
        t = self._one(tensors, "send")
        return self._work([self._comm.send(self._bytes(t), dst, tag=tag, async_op=True)], [])

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> BraidWork:
        t = self._one(tensors, "recv")
        buf = self._bytes(t)
        work = self._comm.recv(buf, src, tag=tag, async_op=True)
        back = [] if t.is_contiguous() else [lambda: t.copy_(buf.view(t.dtype).view(t.shape))]
        return self._work([work], list(tensors), back, source_rank=src)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> BraidWork:
        """The receive runs now (braid's receive from any source is blocking): the
        work returned is complete and names the source rank."""
        t = self._one(tensors, "recv_anysource")
        buf = self._bytes(t)
        src = self._comm.recv_any(buf, tag=tag)
        back = [] if t.is_contiguous() else [lambda: t.copy_(buf.view(t.dtype).view(t.shape))]
        return self._work([], list(tensors), back, source_rank=src)

    recvAnysource = recv_anysource


# -- creating the group: meeting through torch's store ---------------------------------------


def _base_store(store: Any) -> Any:
    """The store under torch's PrefixStores (the real TCPStore/FileStore)."""
    seen = 0
    while isinstance(store, dist.PrefixStore) and seen < 64:
        store = store.underlying_store
        seen += 1
    return store


def _store_url(store: Any, rank: int, size: int) -> str:
    """A braid store URL every rank of this group agrees on.

    Why this way: torch hands the backend a c10d Store object (a PrefixStore
    over whatever `init_process_group` used), and braid's C library cannot call
    back into it. So rank 0 of the group draws a fresh random prefix and
    publishes it through the given store; every rank then reaches the *same
    server* torch uses: a TCPStore through braid's torch:// client (keys under
    the prefix, so groups and re-creations never collide), a FileStore through
    a braid file store beside its file (same reachability as the FileStore).
    The key the prefix is published under carries a generation counted with
    `store.add` (every rank adds 1 per creation), so destroying and re-creating
    a group with the same name never reads a stale prefix.
    """
    gen = (int(store.add("braid/generation", 1)) - 1) // size
    key = f"braid/prefix/{gen}"
    if rank == 0:
        token = uuid.uuid4().hex
        store.set(key, token)
    else:
        token = store.get(key).decode()
    if not token.isalnum() or len(token) > 64:
        raise UnsupportedError(f"braid backend: the store holds a malformed braid prefix {token!r} under {key}")
    base = _base_store(store)
    if isinstance(base, dist.TCPStore):
        host = base.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"torch://{host}:{int(base.port)}?prefix=braid-{token}"
    if isinstance(base, dist.FileStore):
        return f"file://{base.path}.braid-{token}"
    raise UnsupportedError(
        f"braid backend: cannot meet through a {type(base).__name__}: initialise torch.distributed with a TCP "
        "store (env://, tcp://HOST:PORT, torchrun) or a file store (file:///PATH)"
    )


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> ProcessGroupBraid:
    # Deadlines are braid's own (BRAID_TIMEOUT, read when the communicator is
    # made), not torch's `timeout` (30 minutes by default): a dead peer should be
    # an error in seconds, and the C ABI takes its settings from the environment.
    comm = Communicator(rank, size, _store_url(store, rank, size))
    return ProcessGroupBraid(comm, timeout)


_registered = False


def register() -> None:
    """Register the "braid" backend with torch.distributed (idempotent; the
    entry point torch calls)."""
    global _registered
    if not _registered:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu"])
        _registered = True


register()

__all__ = ["BraidWork", "ProcessGroupBraid", "register", "BACKEND_NAME"]
