//! The collectives and send/recv, blocking and asynchronous.
//!
//! Buffers are host memory of `count` elements of `dtype` (sizes below). `send ==
//! recv` is in place; any other overlap of the two is `BRAID_ERR_INVALID_ARGUMENT`.
//! A NULL buffer is refused unless the call does not use it on this rank or it has
//! zero bytes. Blocking calls return when this rank's part is done. `*_async` calls
//! are issued at once, in order with the rank's other calls, run on the
//! communicator's worker thread, and borrow the buffers until their work completes
//! (`braid_work_wait`, or `braid_work_test` returning `BRAID_SUCCESS` or an error):
//! do not touch or free them before. On success `*work` is a new handle (free it
//! with `braid_work_free`); arguments refused up front return the error and set
//! `*work` to NULL, while failures while running are reported by the work.

use std::ffi::{c_int, c_void};

use braid::{Communicator, DType, ReduceOp, Work};

use crate::braid_result::{self, *};
use crate::comm::{braid_comm, live};
use crate::work::braid_work;
use crate::{dtype_of, entry, op_of, put, rank_of, DTypeArg, OpArg, Res};

/// One call: as C passed it (`Call<DTypeArg, OpArg, c_int>`), then checked
/// (`Call<DType, ReduceOp, usize>`). Buffers are `(send, recv)` or one `buf`.
pub(crate) enum Call<D, O, R> {
    AllReduce(*const c_void, *mut c_void, usize, D, O),
    Broadcast(*const c_void, *mut c_void, usize, D, R),
    AllGather(*const c_void, *mut c_void, usize, D),
    ReduceScatter(*const c_void, *mut c_void, usize, D, O),
    Reduce(*const c_void, *mut c_void, usize, D, O, R),
    AllToAll(*const c_void, *mut c_void, usize, D),
    Gather(*const c_void, *mut c_void, usize, D, R),
    Scatter(*const c_void, *mut c_void, usize, D, R),
    Barrier,
    Send(*const c_void, usize, D, R),
    Recv(*mut c_void, usize, D, R),
}

/// A call as C passed it.
pub(crate) type CCall = Call<DTypeArg, OpArg, c_int>;

impl CCall {
    /// Check the dtype, the operator and the root or peer against `c`.
    fn check(self, c: &Communicator) -> Res<Call<DType, ReduceOp, usize>> {
        let root = |r| rank_of("root", r, c);
        let peer = |r| rank_of("peer", r, c);
        Ok(match self {
            Call::AllReduce(s, r, n, d, op) => Call::AllReduce(s, r, n, dtype_of(d)?, op_of(op)?),
            Call::Broadcast(s, r, n, d, rt) => Call::Broadcast(s, r, n, dtype_of(d)?, root(rt)?),
            Call::AllGather(s, r, n, d) => Call::AllGather(s, r, n, dtype_of(d)?),
            Call::ReduceScatter(s, r, n, d, op) => Call::ReduceScatter(s, r, n, dtype_of(d)?, op_of(op)?),
            Call::Reduce(s, r, n, d, op, rt) => Call::Reduce(s, r, n, dtype_of(d)?, op_of(op)?, root(rt)?),
            Call::AllToAll(s, r, n, d) => Call::AllToAll(s, r, n, dtype_of(d)?),
            Call::Gather(s, r, n, d, rt) => Call::Gather(s, r, n, dtype_of(d)?, root(rt)?),
            Call::Scatter(s, r, n, d, rt) => Call::Scatter(s, r, n, dtype_of(d)?, root(rt)?),
            Call::Barrier => Call::Barrier,
            Call::Send(b, n, d, p) => Call::Send(b, n, dtype_of(d)?, peer(p)?),
            Call::Recv(b, n, d, p) => Call::Recv(b, n, dtype_of(d)?, peer(p)?),
        })
    }
}

impl CCall {
    /// Inside a group (`braid_group_start`): the message this send or receive
    /// queues; anything else is refused.
    ///
    /// # Safety
    /// The buffer is valid as the header documents, until the group ends.
    unsafe fn message(self, c: &Communicator, asynchronous: bool) -> Res<braid::P2p<'static>> {
        let (send, buf, n, d, peer) = match self {
            _ if asynchronous => return Err(crate::Fail::invalid(GROUP_ONLY_P2P)),
            Call::Send(b, n, d, p) => (true, b as *mut c_void, n, d, p),
            Call::Recv(b, n, d, p) => (false, b, n, d, p),
            _ => return Err(crate::Fail::invalid(GROUP_ONLY_P2P)),
        };
        // SAFETY: the caller's promise.
        unsafe { crate::group::message(c, send, (buf, n, dtype_of(d)?), peer, 0) }
    }
}

/// Why a call is refused between `braid_group_start` and `braid_group_end`.
pub(crate) const GROUP_ONLY_P2P: &str = "only braid_send, braid_recv and their _tagged forms may be called between \
                              braid_group_start and braid_group_end (end the group first)";

impl Call<DType, ReduceOp, usize> {
    /// Run on the calling thread.
    ///
    /// # Safety
    /// The buffers are valid as the header documents, until this returns.
    unsafe fn run(self, c: &Communicator) -> braid::Result<()> {
        // SAFETY: the caller's promise, passed on.
        unsafe {
            match self {
                Call::AllReduce(s, r, n, d, op) => c.all_reduce_raw(s.cast(), r.cast(), n, d, op),
                Call::Broadcast(s, r, n, d, root) => c.broadcast_raw(s.cast(), r.cast(), n, d, root),
                Call::AllGather(s, r, n, d) => c.all_gather_raw(s.cast(), r.cast(), n, d),
                Call::ReduceScatter(s, r, n, d, op) => c.reduce_scatter_raw(s.cast(), r.cast(), n, d, op),
                Call::Reduce(s, r, n, d, op, root) => c.reduce_raw(s.cast(), r.cast(), n, d, op, root),
                Call::AllToAll(s, r, n, d) => c.all_to_all_raw(s.cast(), r.cast(), n, d),
                Call::Gather(s, r, n, d, root) => c.gather_raw(s.cast(), r.cast(), n, d, root),
                Call::Scatter(s, r, n, d, root) => c.scatter_raw(s.cast(), r.cast(), n, d, root),
                Call::Barrier => c.barrier(),
                Call::Send(b, n, d, peer) => c.send_raw(b.cast(), n, d, peer),
                Call::Recv(b, n, d, peer) => c.recv_raw(b.cast(), n, d, peer),
            }
        }
    }

    /// Issue on the worker thread.
    ///
    /// # Safety
    /// The buffers are valid as the header documents, until the work completes.
    unsafe fn spawn(self, c: &Communicator) -> braid::Result<Work<()>> {
        // SAFETY: the caller's promise, passed on.
        unsafe {
            match self {
                Call::AllReduce(s, r, n, d, op) => c.all_reduce_async_raw(s.cast(), r.cast(), n, d, op),
                Call::Broadcast(s, r, n, d, root) => c.broadcast_async_raw(s.cast(), r.cast(), n, d, root),
                Call::AllGather(s, r, n, d) => c.all_gather_async_raw(s.cast(), r.cast(), n, d),
                Call::ReduceScatter(s, r, n, d, op) => c.reduce_scatter_async_raw(s.cast(), r.cast(), n, d, op),
                Call::Reduce(s, r, n, d, op, root) => c.reduce_async_raw(s.cast(), r.cast(), n, d, op, root),
                Call::AllToAll(s, r, n, d) => c.all_to_all_async_raw(s.cast(), r.cast(), n, d),
                Call::Gather(s, r, n, d, root) => c.gather_async_raw(s.cast(), r.cast(), n, d, root),
                Call::Scatter(s, r, n, d, root) => c.scatter_async_raw(s.cast(), r.cast(), n, d, root),
                Call::Barrier => Ok(c.barrier_async()),
                Call::Send(b, n, d, peer) => c.send_async_raw(b.cast(), n, d, peer),
                Call::Recv(b, n, d, peer) => c.recv_async_raw(b.cast(), n, d, peer),
            }
        }
    }
}

/// Check the handle and the call, then run it, or issue it and hand its work out
/// through `work` when `work` is Some.
///
/// # Safety
/// `comm` is NULL or a live handle; `work`, when Some, is NULL or valid for writing
/// a pointer; the call's buffers are valid as the header documents.
pub(crate) unsafe fn issue(
    name: &str,
    comm: *mut braid_comm,
    work: Option<*mut *mut braid_work>,
    call: CCall,
) -> braid_result {
    entry(name, || {
        if let Some(out) = work {
            // SAFETY: the caller's promise on `work`.
            unsafe { put(out, "work", std::ptr::null_mut())? };
        }
        if crate::group::open() {
            // SAFETY: the caller's promises on `comm` and the buffers.
            let op = unsafe { live(comm) }.and_then(|c| unsafe { call.message(c, work.is_some()) });
            return crate::group::queue(name, comm, op);
        }
        // SAFETY: the caller's promise on `comm`.
        let c = unsafe { live(comm)? };
        let call = call.check(c)?;
        match work {
            // SAFETY: the caller's promise on the buffers.
            None => unsafe { call.run(c)? },
            Some(out) => {
                // SAFETY: as above, until the work completes.
                let w = unsafe { call.spawn(c)? };
                // SAFETY: the caller's promise on `work`.
                unsafe { put(out, "work", braid_work::new(w))? };
            }
        }
        Ok(BRAID_SUCCESS)
    })
}

/// All-reduce: every rank's `recv` receives the reduction with `op` of every rank's
/// `send`. Both hold `count` elements; `send == recv` is in place.
///
/// # Safety
/// `comm` is NULL or a live handle; `send` and `recv` are NULL or valid for
/// `count` elements of `dtype` (reading and writing) while the call runs.
#[no_mangle]
pub unsafe extern "C" fn braid_all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    op: OpArg,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_all_reduce", comm, None, Call::AllReduce(send, recv, count, dtype, op)) }
}

/// Broadcast: every rank's `recv` receives the `count` elements of `root`'s `send`.
/// `send` is read only on `root` (NULL elsewhere is fine); `send == recv` is in
/// place (on the root the data is already in `recv`).
///
/// # Safety
/// As `braid_all_reduce`.
#[no_mangle]
pub unsafe extern "C" fn braid_broadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    root: c_int,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_broadcast", comm, None, Call::Broadcast(send, recv, count, dtype, root)) }
}

/// All-gather: `recv` (`world_size * send_count` elements) receives every rank's
/// `send` (`send_count` elements) in rank order. In place: `send == recv` (this
/// rank's block is read from the start of `recv`), or NCCL's `send == recv + rank *
/// send_count` elements (the block is already at its place).
///
/// # Safety
/// As `braid_all_reduce`, with `recv` valid for `world_size * send_count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_all_gather(
    send: *const c_void,
    recv: *mut c_void,
    send_count: usize,
    dtype: DTypeArg,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_all_gather", comm, None, Call::AllGather(send, recv, send_count, dtype)) }
}

/// Reduce-scatter: `send` holds `world_size * recv_count` elements; the reduction
/// with `op` of every rank's `send` is computed and block `rank` of it (`recv_count`
/// elements) lands in this rank's `recv`. In place: `send == recv` (the result is
/// left at the start of the buffer), or NCCL's `recv == send + rank * recv_count`
/// elements (the result at block `rank`).
///
/// # Safety
/// As `braid_all_reduce`, with `send` valid for `world_size * recv_count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_reduce_scatter(
    send: *const c_void,
    recv: *mut c_void,
    recv_count: usize,
    dtype: DTypeArg,
    op: OpArg,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_reduce_scatter", comm, None, Call::ReduceScatter(send, recv, recv_count, dtype, op)) }
}

/// Reduce: `root`'s `recv` receives the reduction with `op` of every rank's `send`
/// (`count` elements each). `recv` is written only on `root` (NULL elsewhere is
/// fine); `send == recv` is in place (other ranks' buffers stay unchanged).
///
/// # Safety
/// As `braid_all_reduce`.
#[no_mangle]
pub unsafe extern "C" fn braid_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    op: OpArg,
    root: c_int,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_reduce", comm, None, Call::Reduce(send, recv, count, dtype, op, root)) }
}

/// All-to-all: block `j` of `send` goes to rank `j`, and block `j` of `recv`
/// receives rank `j`'s block `rank`. Both hold `world_size * count_per_rank`
/// elements; `send == recv` is in place.
///
/// # Safety
/// As `braid_all_reduce`, both valid for `world_size * count_per_rank` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_all_to_all(
    send: *const c_void,
    recv: *mut c_void,
    count_per_rank: usize,
    dtype: DTypeArg,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_all_to_all", comm, None, Call::AllToAll(send, recv, count_per_rank, dtype)) }
}

/// Barrier: returns once every rank of `comm` has called it.
///
/// # Safety
/// `comm` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn braid_barrier(comm: *mut braid_comm) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_barrier", comm, None, Call::Barrier) }
}

/// Send `count` elements of `buf` to rank `peer`, matched by that rank's
/// `braid_recv` with the same count and dtype. Point-to-point calls take their
/// place in the rank's order of calls, as collectives do.
/// Between `braid_group_start` and `braid_group_end` it only queues the message.
///
/// # Safety
/// `comm` is NULL or a live handle; `buf` is NULL or valid for reading `count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_send(
    buf: *const c_void,
    count: usize,
    dtype: DTypeArg,
    peer: c_int,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_send", comm, None, Call::Send(buf, count, dtype, peer)) }
}

/// Receive `count` elements from rank `peer` into `buf` (matching its `braid_send`).
/// Between `braid_group_start` and `braid_group_end` it only queues the message.
///
/// # Safety
/// `comm` is NULL or a live handle; `buf` is NULL or valid for writing `count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_recv(
    buf: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    peer: c_int,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_recv", comm, None, Call::Recv(buf, count, dtype, peer)) }
}

/// `braid_all_reduce`, asynchronously: `*work` completes when it is done.
///
/// # Safety
/// As `braid_all_reduce`, with the buffers valid until the work completes; `work`
/// is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_all_reduce_async(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    op: OpArg,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_all_reduce_async", comm, Some(work), Call::AllReduce(send, recv, count, dtype, op)) }
}

/// `braid_broadcast`, asynchronously.
///
/// # Safety
/// As `braid_all_reduce_async`.
#[no_mangle]
pub unsafe extern "C" fn braid_broadcast_async(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    root: c_int,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_broadcast_async", comm, Some(work), Call::Broadcast(send, recv, count, dtype, root)) }
}

/// `braid_all_gather`, asynchronously.
///
/// # Safety
/// As `braid_all_reduce_async`, with `recv` valid for `world_size * send_count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_all_gather_async(
    send: *const c_void,
    recv: *mut c_void,
    send_count: usize,
    dtype: DTypeArg,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_all_gather_async", comm, Some(work), Call::AllGather(send, recv, send_count, dtype)) }
}

/// `braid_reduce_scatter`, asynchronously.
///
/// # Safety
/// As `braid_all_reduce_async`, with `send` valid for `world_size * recv_count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_reduce_scatter_async(
    send: *const c_void,
    recv: *mut c_void,
    recv_count: usize,
    dtype: DTypeArg,
    op: OpArg,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe {
        issue("braid_reduce_scatter_async", comm, Some(work), Call::ReduceScatter(send, recv, recv_count, dtype, op))
    }
}

/// `braid_reduce`, asynchronously.
///
/// # Safety
/// As `braid_all_reduce_async`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn braid_reduce_async(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    op: OpArg,
    root: c_int,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_reduce_async", comm, Some(work), Call::Reduce(send, recv, count, dtype, op, root)) }
}

/// `braid_all_to_all`, asynchronously.
///
/// # Safety
/// As `braid_all_reduce_async`, both valid for `world_size * count_per_rank` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_all_to_all_async(
    send: *const c_void,
    recv: *mut c_void,
    count_per_rank: usize,
    dtype: DTypeArg,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_all_to_all_async", comm, Some(work), Call::AllToAll(send, recv, count_per_rank, dtype)) }
}

/// `braid_barrier`, asynchronously: the work completes once every rank has called it.
///
/// # Safety
/// `comm` is NULL or a live handle; `work` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_barrier_async(comm: *mut braid_comm, work: *mut *mut braid_work) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_barrier_async", comm, Some(work), Call::Barrier) }
}

/// `braid_send`, asynchronously.
///
/// # Safety
/// As `braid_send`, with `buf` valid until the work completes; `work` is NULL or
/// valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_send_async(
    buf: *const c_void,
    count: usize,
    dtype: DTypeArg,
    peer: c_int,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_send_async", comm, Some(work), Call::Send(buf, count, dtype, peer)) }
}

/// `braid_recv`, asynchronously.
///
/// # Safety
/// As `braid_recv`, with `buf` valid until the work completes; `work` is NULL or
/// valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_recv_async(
    buf: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    peer: c_int,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_recv_async", comm, Some(work), Call::Recv(buf, count, dtype, peer)) }
}
