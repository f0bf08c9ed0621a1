"""Communicator: a group of ranks running collectives (`braid_comm`).

Buffers follow the C ABI's `send`/`recv` convention (include/braid.h): counts are
taken from the buffers, which must share one dtype; `recv=None` (or `send=None`,
where the C ABI's in-place form puts this rank's data inside `recv`) is the
in-place form. Blocking calls return the object holding the result; with
`async_op=True` they return a `Work` instead, which holds the buffers until done.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from ctypes import byref, c_int, c_size_t, c_void_p
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

from . import _lib
from ._buffers import ITEMSIZE, Pinned, pin
from ._errors import InvalidArgumentError, UnsupportedError
from ._work import Work


class ReduceOp(enum.IntEnum):
    """Reduction operators (`braid_reduce_op`). Integers wrap on overflow; AVG on
    integers truncates."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4


OpLike = Union[ReduceOp, str, int]
Result = Any  # the buffer object written (or a Work when async_op=True)


def _op(op: OpLike) -> int:
    if type(op) is ReduceOp:
        return int(op)
    if isinstance(op, str):
        try:
            return int(ReduceOp[op.upper()])
        except KeyError:
            raise InvalidArgumentError(f"unknown reduce op {op!r} (sum, prod, min, max, avg)") from None
    return int(ReduceOp(op))


class Communicator:
    """A braid communicator. Every rank must issue the same calls in the same order.

    `Communicator(rank, world_size, store)` meets the other ranks through the store
    URL (`tcp://HOST:PORT`, `file:///DIR`, ...); `Communicator.from_env()` reads
    `BRAID_RANK`, `BRAID_WORLD_SIZE`, `BRAID_STORE` (or torchrun's, mpirun's, srun's
    variables). Other settings (`BRAID_TIMEOUT`, ...) come from the environment.
    Free it with `destroy()` (collective) or use it as a context manager.
    """

    def __init__(self, rank: int, world_size: int, store: str) -> None:
        out = c_void_p()
        _lib.call("braid_comm_init", int(rank), int(world_size), store.encode(), byref(out))
        self._adopt(out)

    @classmethod
    def from_env(cls) -> "Communicator":
        out = c_void_p()
        _lib.call("braid_comm_init_from_env", byref(out))
        return cls._wrap(out)

    @classmethod
    def _wrap(cls, handle: c_void_p) -> "Communicator":
        self = cls.__new__(cls)
        self._adopt(handle)
        return self

    def _adopt(self, handle: c_void_p) -> None:
        self._handle: Optional[c_void_p] = handle
        self._users = 0
        self._closing = False
        self._cond = threading.Condition()
        rank, size = c_int(), c_int()
        _lib.call("braid_comm_rank", handle, byref(rank))
        _lib.call("braid_comm_size", handle, byref(size))
        self._rank, self._size = rank.value, size.value
        # Async sends and receives not yet issued: they go together as one group at
        # this rank's next other call or wait (see `P2pWork`).
        self._p2p_lock = threading.Lock()
        self._p2p_queue: List[Tuple[str, Tuple[Any, ...], List[Pinned]]] = []
        self._p2p_batch: Optional[_Batch] = None

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    size = world_size

    # Every call holds the handle between _acquire and _release, so destroy (which
    # waits for them) never frees it under a call running on another thread.
    # Plain methods rather than a context manager: this is on every call's path.
    def _acquire(self, call: str) -> c_void_p:
        with self._cond:
            handle = self._handle
            if handle is None or self._closing:
                raise InvalidArgumentError(f"{call}: rank {self._rank}'s communicator was destroyed", call)
            self._users += 1
            return handle

    def _release(self) -> None:
        with self._cond:
            self._users -= 1
            if self._closing:
                self._cond.notify_all()

    @contextlib.contextmanager
    def _using(self, call: str) -> Iterator[c_void_p]:
        """The handle, held as by _acquire/_release, for the rarer calls."""
        if self._p2p_queue and call != "braid_comm_abort":
            self.flush_p2p()
        handle = self._acquire(call)
        try:
            yield handle
        finally:
            self._release()

    def _issue(self, call: str, args: Sequence[Any], pinned: Sequence[Pinned], result: Any, async_op: bool) -> Result:
        if self._p2p_queue:
            self.flush_p2p()
        handle = self._acquire(call)
        try:
            if async_op:
                work = c_void_p()
                try:
                    _lib.call(call + "_async", *args, handle, byref(work))
                except BaseException:
                    for p in pinned:
                        p.release()
                    raise
                return Work(work, call, pinned, result)
            try:
                _lib.call(call, *args, handle)
            finally:
                for p in pinned:
                    p.release()
            return result
        finally:
            self._release()

    # -- argument helpers -------------------------------------------------------

    def _pair(self, call: str, send: Pinned, recv: Pinned) -> None:
        if send.dtype != recv.dtype:
            raise TypeError(f"{call}: send is {send.dtype.name} but recv is {recv.dtype.name}; they must match")

    def _blocks(self, call: str, p: Pinned, what: str) -> int:
        if p.count % self._size:
            raise InvalidArgumentError(
                f"{call} on rank {self._rank}: {what} holds {p.count} elements, not a multiple of the world "
                f"size {self._size} (one equal block per rank)",
                call,
            )
        return p.count // self._size

    def _expect(self, call: str, p: Pinned, what: str, count: int) -> None:
        if p.count != count:
            raise InvalidArgumentError(
                f"{call} on rank {self._rank}: {what} holds {p.count} elements, expected {count} "
                f"(world size {self._size})",
                call,
            )

    def _root(self, call: str, root: int) -> int:
        if not 0 <= root < self._size:
            raise InvalidArgumentError(f"{call}: root {root} is not a rank of world size {self._size}", call)
        return int(root)

    @staticmethod
    def _offset(p: Pinned, block: int, count: int) -> Optional[int]:
        return None if p.address is None else p.address + block * count * ITEMSIZE[p.dtype]

    # -- collectives -------------------------------------------------------------

    def all_reduce(self, send: Any, recv: Any = None, *, op: OpLike = ReduceOp.SUM, async_op: bool = False) -> Result:
        """Every rank's `recv` gets the reduction of every rank's `send` (in place
        when `recv` is None)."""
        call = "braid_all_reduce"
        s = pin(send, "all_reduce send", writable=recv is None)
        r = s if recv is None else pin(recv, "all_reduce recv", writable=True)
        self._pair(call, s, r)
        self._expect(call, r, "recv", s.count)
        args = (s.address, r.address, s.count, int(s.dtype), _op(op))
        return self._issue(call, args, [s, r], send if recv is None else recv, async_op)

    def broadcast(self, send: Any, recv: Any = None, *, root: int = 0, async_op: bool = False) -> Result:
        """Every rank's `recv` gets `root`'s `send`. In place when `recv` is None
        (`send` is overwritten on the other ranks); with `recv` given, `send` is
        read on `root` only and may be None elsewhere."""
        call = "braid_broadcast"
        root = self._root(call, root)
        if recv is None:
            if send is None:
                raise InvalidArgumentError(f"{call}: send and recv are both None", call)
            r = pin(send, "broadcast buffer", writable=True)
            s: Optional[Pinned] = r
        else:
            r = pin(recv, "broadcast recv", writable=True)
            s = pin(send, "broadcast send", writable=False) if send is not None else None
            if s is not None:
                self._pair(call, s, r)
                self._expect(call, s, "send", r.count)
            elif self._rank == root:
                raise InvalidArgumentError(f"{call}: send is None on the root (rank {root})", call)
        args = (s.address if s else None, r.address, r.count, int(r.dtype), root)
        return self._issue(call, args, [p for p in (s, r) if p], send if recv is None else recv, async_op)

    def reduce(
        self, send: Any, recv: Any = None, *, op: OpLike = ReduceOp.SUM, root: int = 0, async_op: bool = False
    ) -> Result:
        """`root`'s `recv` gets the reduction of every rank's `send`. In place when
        `recv` is None (only the root's `send` changes); `recv` matters on the root
        only."""
        call = "braid_reduce"
        root = self._root(call, root)
        in_place = recv is None
        s = pin(send, "reduce send", writable=in_place and self._rank == root)
        r = s if in_place else pin(recv, "reduce recv", writable=True)
        self._pair(call, s, r)
        self._expect(call, r, "recv", s.count)
        args = (s.address, r.address, s.count, int(s.dtype), _op(op), root)
        return self._issue(call, args, [s, r], send if in_place else recv, async_op)

    def all_gather(self, send: Any, recv: Any, *, async_op: bool = False) -> Result:
        """`recv` (world_size blocks) gets every rank's `send` in rank order. In
        place with `send=None`: this rank's block is already at block `rank` of
        `recv`."""
        call = "braid_all_gather"
        r = pin(recv, "all_gather recv", writable=True)
        if send is None:
            count = self._blocks(call, r, "recv")
            s_addr, pinned = self._offset(r, self._rank, count), [r]
        else:
            s = pin(send, "all_gather send", writable=False)
            self._pair(call, s, r)
            count = s.count
            self._expect(call, r, "recv", self._size * count)
            s_addr, pinned = s.address, [s, r]
        return self._issue(call, (s_addr, r.address, count, int(r.dtype)), pinned, recv, async_op)

    def reduce_scatter(self, send: Any, recv: Any = None, *, op: OpLike = ReduceOp.SUM, async_op: bool = False) -> Result:
        """Block `rank` of the reduction of every rank's `send` (world_size blocks)
        lands in `recv`. In place when `recv` is None: the result is left at the
        start of `send`."""
        call = "braid_reduce_scatter"
        s = pin(send, "reduce_scatter send", writable=recv is None)
        count = self._blocks(call, s, "send")
        r = s if recv is None else pin(recv, "reduce_scatter recv", writable=True)
        self._pair(call, s, r)
        if recv is not None:
            self._expect(call, r, "recv", count)
        args = (s.address, r.address, count, int(s.dtype), _op(op))
        return self._issue(call, args, [s, r], send if recv is None else recv, async_op)

    def all_to_all(self, send: Any, recv: Any = None, *, async_op: bool = False) -> Result:
        """Block `j` of `send` goes to rank `j`; block `j` of `recv` comes from rank
        `j`. In place when `recv` is None."""
        call = "braid_all_to_all"
        s = pin(send, "all_to_all send", writable=recv is None)
        count = self._blocks(call, s, "send")
        r = s if recv is None else pin(recv, "all_to_all recv", writable=True)
        self._pair(call, s, r)
        self._expect(call, r, "recv", s.count)
        return self._issue(call, (s.address, r.address, count, int(s.dtype)), [s, r], recv if recv is not None else send, async_op)

    def gather(self, send: Any, recv: Any = None, *, root: int = 0, async_op: bool = False) -> Result:
        """`root`'s `recv` (world_size blocks) gets every rank's `send` in rank
        order; `recv` is used on the root only. In place on the root with
        `send=None`: its block is already at block `root` of `recv`."""
        call = "braid_gather"
        root = self._root(call, root)
        at_root = self._rank == root
        if at_root and recv is None:
            raise InvalidArgumentError(f"{call}: recv is None on the root (rank {root})", call)
        r = pin(recv, "gather recv", writable=True) if at_root else None
        if send is None:
            if r is None:
                raise InvalidArgumentError(f"{call}: send is None on rank {self._rank}, not the root {root}", call)
            count = self._blocks(call, r, "recv")
            s_addr, pinned = self._offset(r, root, count), [r]
        else:
            s = pin(send, "gather send", writable=False)
            count = s.count
            s_addr, pinned = s.address, [s]
            if r is not None:
                self._pair(call, s, r)
                self._expect(call, r, "recv", self._size * count)
                pinned.append(r)
        dtype = (r or pinned[0]).dtype
        args = (s_addr, r.address if r else None, count, int(dtype), root)
        return self._issue(call, args, pinned, recv if at_root else None, async_op)

    def scatter(self, send: Any, recv: Any = None, *, root: int = 0, async_op: bool = False) -> Result:
        """Block `j` of `root`'s `send` (world_size blocks) goes to rank `j`'s
        `recv`; `send` is used on the root only. In place on the root with
        `recv=None`: its block stays at block `root` of `send`."""
        call = "braid_scatter"
        root = self._root(call, root)
        at_root = self._rank == root
        if at_root and send is None:
            raise InvalidArgumentError(f"{call}: send is None on the root (rank {root})", call)
        if not at_root and recv is None:
            raise InvalidArgumentError(f"{call}: recv is None on rank {self._rank}, not the root {root}", call)
        # In place (recv None on the root), the root's block of send is its recv.
        s = pin(send, "scatter send", writable=recv is None) if at_root else None
        if recv is None:
            assert s is not None
            count = self._blocks(call, s, "send")
            r_addr, pinned, out = self._offset(s, root, count), [s], send
        else:
            r = pin(recv, "scatter recv", writable=True)
            count, r_addr, pinned, out = r.count, r.address, [r], recv
            if s is not None:
                self._pair(call, s, r)
                self._expect(call, s, "send", self._size * count)
                pinned.append(s)
        dtype = pinned[0].dtype
        args = (s.address if s else None, r_addr, count, int(dtype), root)
        return self._issue(call, args, pinned, out, async_op)

    def barrier(self, *, async_op: bool = False) -> Optional[Work]:
        """Returns once every rank has called it."""
        work: Optional[Work] = self._issue("braid_barrier", (), [], None, async_op)
        return work

    def send(self, buf: Any, peer: int, *, tag: int = 0, async_op: bool = False) -> Any:
        """Send `buf` to rank `peer` (matched by its `recv` of the same size and
        dtype). A non-zero `tag` must be the receive's tag too: braid pairs a
        peer's messages in posting order and checks the tags (a mismatch fails
        both calls naming both tags); it does not pick messages by tag.
        `async_op=True` returns a `P2pWork` (see there: async sends and receives
        are issued together, so posting a receive before a send cannot deadlock)."""
        p = pin(buf, "send buffer", writable=False)
        return self._p2p(True, p, peer, tag, None, async_op)

    def recv(self, buf: Any, peer: int, *, tag: int = 0, async_op: bool = False) -> Result:
        """Receive into `buf` from rank `peer` (with `tag` and `async_op`: see `send`)."""
        p = pin(buf, "recv buffer", writable=True)
        return self._p2p(False, p, peer, tag, buf, async_op)

    def _p2p(self, send: bool, p: Pinned, peer: int, tag: int, result: Any, async_op: bool) -> Any:
        name = "braid_send" if send else "braid_recv"
        if async_op and _lib.has("braid_group_end_async") and _lib.has(name + "_tagged"):
            call = name + "_tagged"
            try:
                tagged = (p.address, p.count, int(p.dtype), self._peer(call, peer), self._tag_value(call, tag))
            except BaseException:
                p.release()
                raise
            with self._p2p_lock:
                if self._p2p_batch is None:
                    self._p2p_batch = _Batch()
                self._p2p_queue.append((call, tagged, [p]))
                return P2pWork(self, self._p2p_batch, call, result)
        call = name if tag == 0 else self._optional(name + "_tagged", async_op)
        try:
            args = (p.address, p.count, int(p.dtype), self._peer(call, peer)) + self._tag_arg(call, tag)
        except BaseException:
            p.release()
            raise
        return self._issue(call, args, [p], result, async_op)

    def recv_any(self, buf: Any, *, tag: int = 0) -> int:
        """Receive into `buf` from whichever rank first sends this rank a message
        with `tag` (MPI_ANY_SOURCE); returns that rank. Each peer's sends are still
        taken in its order: a peer whose next send has another tag is passed over.
        Blocking (async sends and receives posted before it are issued first)."""
        call = self._optional("braid_recv_any", False)
        if self._p2p_queue:
            self.flush_p2p()
        p = pin(buf, "recv_any buffer", writable=True)
        source = c_int(-1)
        handle = self._acquire(call)
        try:
            _lib.call(call, handle, p.address, p.count, int(p.dtype), self._tag_value(call, tag), byref(source))
        finally:
            p.release()
            self._release()
        return source.value

    def flush_p2p(self) -> None:
        """Issue the async sends and receives posted so far as one group (every
        other call, and waiting on one of them, does this first)."""
        with self._p2p_lock:
            queue, batch = self._p2p_queue, self._p2p_batch
            self._p2p_queue, self._p2p_batch = [], None
            if not queue or batch is None:
                return
            pinned = [p for _, _, ps in queue for p in ps]
            try:
                handle = self._acquire("braid_group_end_async")
            except BaseException as e:
                for p in pinned:
                    p.release()
                batch.error = e
                return
            try:
                lib = _lib.lib()
                _lib.call("braid_group_start")
                for call, args, _ in queue:
                    # Inside the group a refused message is recorded by the library
                    # and reported by the group's end (nothing of it runs then).
                    getattr(lib, call)(*args, handle)
                out = c_void_p()
                _lib.call("braid_group_end_async", byref(out))
                batch.work = Work(out, "braid_group_end_async", pinned, None)
            except BaseException as e:  # noqa: BLE001 - kept for every P2pWork of the batch
                for p in pinned:
                    p.release()
                batch.error = e
            finally:
                self._release()

    @staticmethod
    def _tag_value(call: str, tag: int) -> int:
        if not 0 <= tag < 2**32:
            raise InvalidArgumentError(f"{call}: tag {tag} is outside 0..2**32-1", call)
        return int(tag)

    @classmethod
    def _tag_arg(cls, call: str, tag: int) -> Tuple[int, ...]:
        return () if tag == 0 else (cls._tag_value(call, tag),)

    def _optional(self, name: str, async_op: bool) -> str:
        """`name` (a newer C ABI call), checked present in the loaded libbraid."""
        wanted = name + "_async" if async_op else name
        if not _lib.has(wanted):
            raise UnsupportedError(
                f"{wanted}: the loaded libbraid ({_lib.library_path()}) predates it; rebuild it", wanted
            )
        return name

    def _peer(self, call: str, peer: int) -> int:
        if not 0 <= peer < self._size or peer == self._rank:
            raise InvalidArgumentError(
                f"{call}: peer {peer} is not another rank (rank {self._rank} of world size {self._size})", call
            )
        return int(peer)

    # Newer C ABI calls (v-variants, grouped point-to-point with tags) go below,
    # each checking `_lib.has(name)` and raising UnsupportedError when the loaded
    # libbraid predates it; their prototypes go in _lib.OPTIONAL.

    @staticmethod
    def _counts(call: str, what: str, values: Sequence[int], n: int) -> Any:
        vals = [int(v) for v in values]
        if len(vals) != n or any(v < 0 for v in vals):
            raise InvalidArgumentError(f"{call}: {what} must be {n} non-negative counts, got {list(values)}", call)
        return (c_size_t * n)(*vals)

    @staticmethod
    def _packed(counts: Sequence[int]) -> List[int]:
        out, at = [], 0
        for c in counts:
            out.append(at)
            at += int(c)
        return out

    def all_gather_v(self, send: Any, recv: Any, counts: Sequence[int], *, async_op: bool = False) -> Result:
        """`recv` gets rank `j`'s `send` (`counts[j]` elements) after the blocks of
        ranks before it (MPI_Allgatherv, packed). Every rank passes the same
        `counts`. In place with `send=None`: this rank's block is already in place."""
        call = self._optional("braid_all_gather_v", async_op)
        r = pin(recv, "all_gather_v recv", writable=True)
        n = self._size
        counts_c = self._counts(call, "counts", counts, n)
        displs = self._packed(counts)
        displs_c = self._counts(call, "displacements", displs, n)
        if send is None:
            # In place (MPI_IN_PLACE): this rank's block, already at its displacement.
            s_addr, s_count, pinned = r.address, int(counts[self._rank]), [r]
        else:
            s = pin(send, "all_gather_v send", writable=False)
            self._pair(call, s, r)
            s_addr, s_count, pinned = s.address, s.count, [s, r]
        args = (s_addr, s_count, r.address, counts_c, displs_c, int(r.dtype))
        return self._issue(call, args, pinned, recv, async_op)

    def reduce_scatter_v(
        self, send: Any, recv: Any, counts: Sequence[int], *, op: OpLike = ReduceOp.SUM, async_op: bool = False
    ) -> Result:
        """Reduce every rank's `send` (blocks of `counts[j]` elements packed in rank
        order); block `rank` lands in `recv` (`counts[rank]` elements).
        Every rank passes the same `counts`."""
        call = self._optional("braid_reduce_scatter_v", async_op)
        s = pin(send, "reduce_scatter_v send", writable=recv is None)
        r = s if recv is None else pin(recv, "reduce_scatter_v recv", writable=True)
        self._pair(call, s, r)
        counts_c = self._counts(call, "counts", counts, self._size)
        args = (s.address, r.address, counts_c, int(s.dtype), _op(op))
        return self._issue(call, args, [s, r], send if recv is None else recv, async_op)

    def all_to_all_v(
        self,
        send: Any,
        send_counts: Sequence[int],
        recv: Any,
        recv_counts: Sequence[int],
        send_displs: Optional[Sequence[int]] = None,
        recv_displs: Optional[Sequence[int]] = None,
        *,
        async_op: bool = False,
    ) -> Result:
        """`send_counts[j]` elements of `send` (at `send_displs[j]`, packed when
        None) go to rank `j`; rank `j`'s arrive in `recv` at `recv_displs[j]`
        (`recv_counts[j]` elements, which must equal rank `j`'s
        `send_counts[rank]`). MPI_Alltoallv; torch's all_to_all_single with splits."""
        call = self._optional("braid_all_to_all_v", async_op)
        s = pin(send, "all_to_all_v send", writable=False)
        r = pin(recv, "all_to_all_v recv", writable=True)
        self._pair(call, s, r)
        n = self._size
        sd = self._packed(send_counts) if send_displs is None else send_displs
        rd = self._packed(recv_counts) if recv_displs is None else recv_displs
        args = (
            s.address,
            self._counts(call, "send_counts", send_counts, n),
            self._counts(call, "send_displs", sd, n),
            r.address,
            self._counts(call, "recv_counts", recv_counts, n),
            self._counts(call, "recv_displs", rd, n),
            int(s.dtype),
        )
        return self._issue(call, args, [s, r], recv, async_op)

    # -- communicators ---------------------------------------------------------

    def split(self, color: int, key: int = 0) -> Optional["Communicator"]:
        """Collective: ranks with the same `color >= 0` form a new communicator,
        ranked by `key` (ties by rank). A negative color joins none: None."""
        out = c_void_p()
        with self._using("braid_comm_split") as handle:
            _lib.call("braid_comm_split", handle, int(color), int(key), byref(out))
        return Communicator._wrap(out) if out.value else None

    def dup(self) -> "Communicator":
        """Collective: a new communicator over the same ranks, independent of this one."""
        out = c_void_p()
        with self._using("braid_comm_dup") as handle:
            _lib.call("braid_comm_dup", handle, byref(out))
        return Communicator._wrap(out)

    def new_group(self, ranks: Sequence[int]) -> "Communicator":
        """Called by the listed ranks only: a communicator of them, rank `ranks[i]`
        of this one being rank `i` of the new one (torch's `new_group`)."""
        arr = (c_int * len(ranks))(*[int(r) for r in ranks])
        out = c_void_p()
        with self._using("braid_comm_new_group") as handle:
            _lib.call("braid_comm_new_group", handle, arr, len(ranks), byref(out))
        return Communicator._wrap(out)

    def abort(self) -> None:
        """Abort from any thread: calls in flight and later ones fail with
        AbortedError, and peers' calls needing this rank fail. Destroy it after."""
        with self._using("braid_comm_abort") as handle:
            _lib.lib().braid_comm_abort(handle)

    def destroy(self) -> None:
        """Collective: wait for outstanding work, confirm with the peers and free
        the communicator. Raises (naming the peer) when one exited or aborted;
        the communicator is freed either way."""
        if self._p2p_queue:
            self.flush_p2p()
        with self._cond:
            if self._handle is None or self._closing:
                return
            self._closing = True
            while self._users:
                self._cond.wait()
            handle, self._handle = self._handle, None
        _lib.call("braid_comm_destroy", handle)

    @property
    def destroyed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.destroy()
        else:
            # A call failed: the error at hand says more than destroy's would.
            try:
                self.destroy()
            except Exception:
                pass

    def __repr__(self) -> str:
        state = " destroyed" if self.destroyed else ""
        return f"<braid.Communicator rank {self._rank} of {self._size}{state}>"


__all__: List[str] = ["Communicator", "ReduceOp"]


class _Batch:
    """Async sends and receives issued together: their one `Work` once issued, or
    the error that stopped the group."""

    def __init__(self) -> None:
        self.work: Optional[Work] = None
        self.error: Optional[BaseException] = None


class P2pWork:
    """An async send or receive. It is issued together with every other async send
    and receive this rank posts before its next other call on the communicator (or
    a wait on one of them), as one group, so that a receive posted before a send to
    the same peer completes instead of deadlocking (as with MPI's nonblocking
    calls; braid runs one call at a time otherwise). Completes with its group."""

    def __init__(self, comm: Communicator, batch: _Batch, call: str, result: Any) -> None:
        self._comm = comm
        self._batch = batch
        self._call = call
        self.result = result

    def _work(self) -> Work:
        if self._batch.work is None and self._batch.error is None:
            self._comm.flush_p2p()
        if self._batch.error is not None:
            raise self._batch.error
        assert self._batch.work is not None
        return self._batch.work

    def wait(self, timeout: Optional[float] = None) -> bool:
        """As `Work.wait`: True once the group completed; raises its error."""
        return self._work().wait(timeout)

    def is_completed(self) -> bool:
        try:
            return self._work().is_completed()
        except BaseException:  # noqa: BLE001 - a group that failed to start is complete
            return True

    def is_success(self) -> bool:
        try:
            return self._work().is_success()
        except BaseException:  # noqa: BLE001
            return False

    def exception(self) -> Optional[BaseException]:
        try:
            return self._work().exception()
        except BaseException as e:  # noqa: BLE001
            return e

    def __repr__(self) -> str:
        state = "posted" if self._batch.work is None and self._batch.error is None else "issued"
        return f"<braid.P2pWork {self._call} {state}>"
