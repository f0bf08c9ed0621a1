//! Collectives on borrowed raw buffers: what the C ABI calls, and what the owned
//! (`Vec`) async calls run underneath.
//!
//! Each `*_raw` call runs on the calling thread; each `*_async_raw` call takes its
//! turn now (issue order, as every other call) and runs on the communicator's worker
//! thread, borrowing the caller's memory until its [`Work`] completes.
//!
//! Layouts and aliasing, checked before anything runs:
//! - `send == recv` is in place (NCCL's convention). All-gather also takes NCCL's
//!   `send == recv + rank * send_count` (this rank's block already in place), and
//!   reduce-scatter `recv == send + rank * recv_count` (the result at block `rank`).
//!   With `send == recv`, all-gather reads this rank's block from the start of the
//!   buffer and reduce-scatter leaves the result there.
//!   Gather and scatter take MPI_IN_PLACE's meaning at the root: with `send == recv`
//!   (or NCCL's offsets above, with `root` for `rank`) the root's own block is at
//!   block `root` of the buffer; off the root, `send == recv` is the rank's block.
//! - Any other overlap of the two ranges is [`Error::InvalidArgument`]: the engine
//!   reads one while it writes the other.
//! - A buffer that a rank does not use may be null: broadcast's and scatter's `send`
//!   off the root, gather's `recv` off the root,
//!   reduce's `recv` off the root. A buffer of zero bytes may be null too; any other
//!   null buffer is [`Error::InvalidArgument`].
//! - Byte sizes (count x element size x world size) that do not fit a `usize` are
//!   [`Error::InvalidArgument`], as are roots and peers outside the communicator.

use std::ptr::NonNull;
use std::sync::mpsc;

use super::calls::Core;
use super::{Communicator, Work};
use crate::error::{Error, Result};
use crate::types::{CallSig, DType, Element, OpKind, ReduceOp};

/// How a validated call lays its buffers out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Separate, disjoint input and output.
    OutOfPlace,
    /// One buffer (`recv`), in the in-place layout of [`Communicator::collective_bytes`].
    InPlace,
    /// All-gather with `send == recv` off rank 0: this rank's block moves from the
    /// start of the buffer to block `rank`, then the call runs in place.
    GatherFromStart,
    /// Reduce-scatter with `send == recv` off rank 0: the call runs in place, then
    /// the result moves from block `rank` to the start of the buffer.
    ScatterToStart,
}

/// One collective on borrowed memory, validated: byte lengths worked out, null
/// unused buffers replaced by dangling ones of length 0.
#[derive(Clone, Copy, Debug)]
struct Raw {
    sig: CallSig,
    send: *const u8,
    send_len: usize,
    recv: *mut u8,
    recv_len: usize,
    /// Bytes of one rank's block (all-gather, reduce-scatter).
    block: usize,
    layout: Layout,
}

// SAFETY: a `Raw` is only made by the `unsafe` calls below, whose callers promise
// that the memory stays valid and untouched by anything else until the call (or
// its `Work`) completes, from whichever thread runs it.
unsafe impl Send for Raw {}

/// Null for a buffer of zero bytes becomes a dangling pointer (slices must not be null).
pub(super) fn non_null<T>(p: *mut T, len: usize) -> *mut T {
    if p.is_null() && len == 0 {
        NonNull::dangling().as_ptr()
    } else {
        p
    }
}

/// Whether `[a, a + a_len)` and `[b, b + b_len)` share a byte.
pub(super) fn overlap(a: usize, a_len: usize, b: usize, b_len: usize) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

impl Raw {
    /// Check a collective's arguments and buffers on `core`'s rank.
    fn new(core: &Core, sig: CallSig, send: *const u8, recv: *mut u8) -> Result<Raw> {
        let (rank, world) = (core.rank, core.world);
        let arg = |msg: String| Error::InvalidArgument(format!("rank {rank}: {}: {msg}", sig.op));
        let root = sig.root as usize;
        if sig.op.rooted() && root >= world {
            return Err(arg(format!("root {root} is not a rank of this {world}-rank communicator")));
        }
        let count = usize::try_from(sig.count).map_err(|_| arg("count too large".into()))?;
        let too_big = || arg(format!("{count} elements of {} are more bytes than this machine can address", sig.dtype));
        // A slice spans at most isize::MAX bytes.
        let block = count.checked_mul(sig.dtype.size()).ok_or_else(too_big)?;
        let all = block.checked_mul(world).filter(|&b| b <= isize::MAX as usize).ok_or_else(too_big)?;
        let (mut send_len, mut recv_len) = match sig.op {
            OpKind::AllGather => (block, all),
            OpKind::ReduceScatter => (all, block),
            OpKind::AllToAll => (all, all),
            // Only the root holds every block; the other side of a non-root is unused.
            OpKind::Gather => (block, if rank == root { all } else { 0 }),
            OpKind::Scatter => (if rank == root { all } else { 0 }, block),
            OpKind::Barrier => (0, 0),
            _ => (block, block),
        };
        let (s, r) = (send as usize, recv as usize);
        // Buffers a rank does not use (unless in place).
        if sig.op == OpKind::Broadcast && rank != root && s != r {
            send_len = 0;
        }
        if sig.op == OpKind::Reduce && rank != root && s != r {
            recv_len = 0;
        }
        let layout = if s == r {
            match sig.op {
                OpKind::AllGather if rank > 0 => Layout::GatherFromStart,
                OpKind::ReduceScatter if rank > 0 => Layout::ScatterToStart,
                _ => Layout::InPlace,
            }
        } else if (sig.op == OpKind::AllGather && Some(s) == r.checked_add(rank * block))
            || (sig.op == OpKind::ReduceScatter && Some(r) == s.checked_add(rank * block))
            || (sig.op == OpKind::Gather && rank == root && Some(s) == r.checked_add(rank * block))
            || (sig.op == OpKind::Scatter && rank == root && Some(r) == s.checked_add(rank * block))
        {
            Layout::InPlace
        } else {
            Layout::OutOfPlace
        };
        if layout == Layout::OutOfPlace && overlap(s, send_len, r, recv_len) {
            return Err(arg(format!(
                "the send buffer ({send_len} bytes at {send:p}) and the receive buffer ({recv_len} bytes at {recv:p}) \
                 overlap; pass the same pointer for an in-place call"
            )));
        }
        let mut recv = recv;
        if layout != Layout::OutOfPlace {
            // One buffer, as long as the longer of the two, starting at the lower
            // address (reduce-scatter's `send` in NCCL's in-place layout).
            (send_len, recv_len) = (0, send_len.max(recv_len));
            if s < r {
                recv = send as *mut u8;
            }
        }
        if send.is_null() && send_len > 0 {
            return Err(arg("the send buffer is NULL".into()));
        }
        if recv.is_null() && recv_len > 0 {
            return Err(arg("the receive buffer is NULL".into()));
        }
        let (send, recv) = (non_null(send as *mut u8, send_len) as *const u8, non_null(recv, recv_len));
        Ok(Raw { sig, send, send_len, recv, recv_len, block, layout })
    }

    /// Run at `ticket`.
    ///
    /// # Safety
    /// The buffers are valid for their lengths and used by nothing else until this returns.
    unsafe fn run(self, core: &Core, ticket: u64) -> Result<()> {
        let Raw { sig, send, send_len, recv, recv_len, block, layout } = self;
        let at_rank = core.rank * block;
        if layout == Layout::GatherFromStart {
            // SAFETY: both blocks lie inside `recv` (`recv_len` = world x block); `copy` allows overlap.
            unsafe { std::ptr::copy(recv, recv.add(at_rank), block) };
        }
        // SAFETY: valid for their lengths and unused elsewhere (the caller's promise);
        // out of place they are disjoint (checked in `new`), in place there is one.
        let output = unsafe { std::slice::from_raw_parts_mut(recv, recv_len) };
        let input = match layout {
            // SAFETY: as above; disjoint from `output`.
            Layout::OutOfPlace => Some(unsafe { std::slice::from_raw_parts(send, send_len) }),
            _ => None,
        };
        core.collective_at(ticket, sig, input, output)?;
        if layout == Layout::ScatterToStart {
            // SAFETY: both blocks lie inside `recv` (`recv_len` = world x block).
            unsafe { std::ptr::copy(recv.add(at_rank), recv, block) };
        }
        Ok(())
    }
}

/// A send or receive on borrowed memory.
#[derive(Clone, Copy)]
struct RawP2p {
    op: OpKind,
    buf: *mut u8,
    len: usize,
    dtype: DType,
    peer: usize,
}

// SAFETY: as for `Raw`: made only by `unsafe` calls whose callers vouch for `buf`.
unsafe impl Send for RawP2p {}

impl RawP2p {
    fn new(core: &Core, op: OpKind, buf: *mut u8, count: usize, dtype: DType, peer: usize) -> Result<RawP2p> {
        let arg = |msg: String| Error::InvalidArgument(format!("rank {}: {op}: {msg}", core.rank));
        let len = count
            .checked_mul(dtype.size())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| arg(format!("{count} elements of {dtype} are more bytes than this machine can address")))?;
        if buf.is_null() && len > 0 {
            return Err(arg("the buffer is NULL".into()));
        }
        if peer >= core.world || peer == core.rank {
            return Err(arg(format!("peer {peer} is not another rank of this {}-rank communicator", core.world)));
        }
        Ok(RawP2p { op, buf: non_null(buf, len), len, dtype, peer })
    }

    fn run(self, core: &Core, ticket: u64) -> Result<()> {
        core.p2p_at(ticket, self.op, (self.buf, self.len), self.dtype, self.peer, None)
    }
}

impl<R> Work<R> {
    /// Work that finished before it started (its arguments were refused).
    fn ready(r: Result<R>) -> Work<R> {
        let (_, rx) = mpsc::channel();
        Work { rx, done: Some(r) }
    }
}

impl Communicator {
    pub(super) fn raw(&self, op: OpKind, dtype: DType, count: usize, root: usize, rop: ReduceOp) -> CallSig {
        CallSig::new(op, dtype, count as u64, u32::try_from(root).unwrap_or(u32::MAX), rop)
    }

    /// # Safety
    /// As the public `*_raw` calls.
    pub(super) unsafe fn run_raw(&self, sig: CallSig, send: *const u8, recv: *mut u8) -> Result<()> {
        let raw = Raw::new(&self.core, sig, send, recv)?;
        let ticket = self.core.shared.take_ticket();
        // SAFETY: the caller's promise, passed on.
        unsafe { raw.run(&self.core, ticket) }
    }

    /// # Safety
    /// As the public `*_async_raw` calls.
    pub(super) unsafe fn spawn_raw(&self, sig: CallSig, send: *const u8, recv: *mut u8) -> Result<Work<()>> {
        let raw = Raw::new(&self.core, sig, send, recv)?;
        // SAFETY: the caller keeps the buffers valid and untouched until the Work completes.
        Ok(self.spawn(move |core, t| unsafe { raw.run(core, t) }))
    }

    fn p2p_raw(&self, op: OpKind, buf: *mut u8, count: usize, dtype: DType, peer: usize) -> Result<RawP2p> {
        RawP2p::new(&self.core, op, buf, count, dtype, peer)
    }

    /// The owned async calls: the buffer moves into the job and comes back with its
    /// result, in the in-place layout of [`Communicator::collective_bytes`].
    pub(super) fn typed_async<T: Element>(
        &self,
        op: OpKind,
        rop: ReduceOp,
        root: usize,
        mut buf: Vec<T>,
    ) -> Work<Vec<T>> {
        let count = match op {
            OpKind::AllGather | OpKind::ReduceScatter => match self.core.block(buf.len()) {
                Ok(c) => c,
                Err(e) => return Work::ready(Err(e)),
            },
            _ => buf.len(),
        };
        let base = buf.as_mut_ptr() as *mut u8;
        // Block `rank` of the buffer (NCCL's in-place layouts), or the whole buffer.
        let mine = base.wrapping_add(self.rank() * count * T::DTYPE.size());
        let (send, recv) = match op {
            OpKind::AllGather => (mine as *const u8, base),
            OpKind::ReduceScatter => (base as *const u8, mine),
            _ => (base as *const u8, base),
        };
        match Raw::new(&self.core, self.raw(op, T::DTYPE, count, root, rop), send, recv) {
            // SAFETY: `buf` moves into the job, which owns it until the call is done;
            // moving a Vec does not move its heap memory.
            Ok(raw) => self.spawn(move |core, t| unsafe { raw.run(core, t) }.map(|()| buf)),
            Err(e) => Work::ready(Err(e)),
        }
    }

    /// All-reduce `count` elements of `dtype` from `send` into `recv` on every rank
    /// (`send == recv`: in place).
    ///
    /// # Safety
    /// `send` and `recv` are valid for `count` elements (reads, writes) and used by
    /// nothing else until the call returns; they are equal or disjoint.
    pub unsafe fn all_reduce_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(self.raw(OpKind::AllReduce, dtype, count, 0, op), send, recv) }
    }

    /// Broadcast `count` elements from the root's `send` into every rank's `recv`
    /// (`send` is read only at the root and may be null elsewhere).
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_raw`].
    pub unsafe fn broadcast_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(self.raw(OpKind::Broadcast, dtype, count, root, ReduceOp::Sum), send, recv) }
    }

    /// All-gather `send_count` elements per rank into `recv` (`world_size * send_count`).
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_raw`], with `recv` valid for `world_size * send_count`.
    pub unsafe fn all_gather_raw(&self, send: *const u8, recv: *mut u8, send_count: usize, dtype: DType) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(self.raw(OpKind::AllGather, dtype, send_count, 0, ReduceOp::Sum), send, recv) }
    }

    /// Reduce `send` (`world_size * recv_count`) and leave block `rank` in `recv`.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_raw`], with `send` valid for `world_size * recv_count`.
    pub unsafe fn reduce_scatter_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        recv_count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(self.raw(OpKind::ReduceScatter, dtype, recv_count, 0, op), send, recv) }
    }

    /// Reduce `count` elements into the root's `recv` (`recv` may be null elsewhere).
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_raw`].
    pub unsafe fn reduce_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(self.raw(OpKind::Reduce, dtype, count, root, op), send, recv) }
    }

    /// Send block `j` of `send` to rank `j`, receive rank `j`'s block into block `j`
    /// of `recv` (both `world_size * count_per_rank`).
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_raw`], both valid for `world_size * count_per_rank`.
    pub unsafe fn all_to_all_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count_per_rank: usize,
        dtype: DType,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(self.raw(OpKind::AllToAll, dtype, count_per_rank, 0, ReduceOp::Sum), send, recv) }
    }

    /// Send `count` elements at `buf` to `peer`.
    ///
    /// # Safety
    /// `buf` is valid for reading `count` elements, not written until the call returns.
    pub unsafe fn send_raw(&self, buf: *const u8, count: usize, dtype: DType, peer: usize) -> Result<()> {
        let p = self.p2p_raw(OpKind::Send, buf as *mut u8, count, dtype, peer)?;
        p.run(&self.core, self.core.shared.take_ticket())
    }

    /// Receive `count` elements from `peer` into `buf`.
    ///
    /// # Safety
    /// `buf` is valid for writing `count` elements, used by nothing else until the call returns.
    pub unsafe fn recv_raw(&self, buf: *mut u8, count: usize, dtype: DType, peer: usize) -> Result<()> {
        let p = self.p2p_raw(OpKind::Recv, buf, count, dtype, peer)?;
        p.run(&self.core, self.core.shared.take_ticket())
    }

    /// [`Communicator::all_reduce_raw`], asynchronously: issued now, in order.
    ///
    /// # Safety
    /// As the blocking form, until the returned [`Work`] has completed (`wait`
    /// returned, or `test` returned true) — dropping the `Work` does not end the
    /// borrow; the call still runs. Arguments refused up front (null or overlapping
    /// buffers, sizes, roots) are an `Err` and issue nothing.
    pub unsafe fn all_reduce_async_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<Work<()>> {
        // SAFETY: the caller's promise.
        unsafe { self.spawn_raw(self.raw(OpKind::AllReduce, dtype, count, 0, op), send, recv) }
    }

    /// [`Communicator::broadcast_raw`], asynchronously.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_async_raw`].
    pub unsafe fn broadcast_async_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<Work<()>> {
        // SAFETY: the caller's promise.
        unsafe { self.spawn_raw(self.raw(OpKind::Broadcast, dtype, count, root, ReduceOp::Sum), send, recv) }
    }

    /// [`Communicator::all_gather_raw`], asynchronously.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_async_raw`].
    pub unsafe fn all_gather_async_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        send_count: usize,
        dtype: DType,
    ) -> Result<Work<()>> {
        // SAFETY: the caller's promise.
        unsafe { self.spawn_raw(self.raw(OpKind::AllGather, dtype, send_count, 0, ReduceOp::Sum), send, recv) }
    }

    /// [`Communicator::reduce_scatter_raw`], asynchronously.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_async_raw`].
    pub unsafe fn reduce_scatter_async_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        recv_count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<Work<()>> {
        // SAFETY: the caller's promise.
        unsafe { self.spawn_raw(self.raw(OpKind::ReduceScatter, dtype, recv_count, 0, op), send, recv) }
    }

    /// [`Communicator::reduce_raw`], asynchronously.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_async_raw`].
    pub unsafe fn reduce_async_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<()>> {
        // SAFETY: the caller's promise.
        unsafe { self.spawn_raw(self.raw(OpKind::Reduce, dtype, count, root, op), send, recv) }
    }

    /// [`Communicator::all_to_all_raw`], asynchronously.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_async_raw`].
    pub unsafe fn all_to_all_async_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count_per_rank: usize,
        dtype: DType,
    ) -> Result<Work<()>> {
        // SAFETY: the caller's promise.
        unsafe { self.spawn_raw(self.raw(OpKind::AllToAll, dtype, count_per_rank, 0, ReduceOp::Sum), send, recv) }
    }

    /// [`Communicator::send_raw`], asynchronously.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_async_raw`].
    pub unsafe fn send_async_raw(&self, buf: *const u8, count: usize, dtype: DType, peer: usize) -> Result<Work<()>> {
        let p = self.p2p_raw(OpKind::Send, buf as *mut u8, count, dtype, peer)?;
        Ok(self.spawn(move |core, t| p.run(core, t)))
    }

    /// [`Communicator::recv_raw`], asynchronously.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_async_raw`].
    pub unsafe fn recv_async_raw(&self, buf: *mut u8, count: usize, dtype: DType, peer: usize) -> Result<Work<()>> {
        let p = self.p2p_raw(OpKind::Recv, buf, count, dtype, peer)?;
        Ok(self.spawn(move |core, t| p.run(core, t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `f` on every rank of an in-process communicator of `world` threads.
    fn on_ranks<R: Send>(world: usize, f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
        let comms = Communicator::in_process(world).expect("in-process communicators");
        std::thread::scope(|s| {
            let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
            handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
        })
    }

    const W: usize = 3;
    const N: usize = 5;

    #[test]
    fn gather_and_scatter_with_send_equal_to_recv_use_the_start_of_the_buffer() {
        let results = on_ranks(W, |c| {
            let r = c.rank() as i32;
            // All-gather: this rank's block at the start of the buffer.
            let mut g = vec![-1i32; W * N];
            g[..N].iter_mut().enumerate().for_each(|(j, x)| *x = 10 * r + j as i32);
            let p = g.as_mut_ptr() as *mut u8;
            // SAFETY: `g` holds W x N elements and lives across the call.
            unsafe { c.all_gather_raw(p, p, N, DType::I32) }.expect("all-gather");
            // Reduce-scatter: the result lands at the start.
            let mut s: Vec<i32> = (0..W * N).map(|j| r + j as i32).collect();
            let p = s.as_mut_ptr() as *mut u8;
            // SAFETY: as above.
            unsafe { c.reduce_scatter_raw(p, p, N, DType::I32, ReduceOp::Sum) }.expect("reduce-scatter");
            (g, s[..N].to_vec())
        });
        for (rank, (g, s)) in results.into_iter().enumerate() {
            let want: Vec<i32> = (0..W * N).map(|j| 10 * (j / N) as i32 + (j % N) as i32).collect();
            assert_eq!(g, want, "all-gather on rank {rank}");
            let sum = (0..W as i32).sum::<i32>();
            let want: Vec<i32> = (0..N).map(|k| sum + W as i32 * (rank * N + k) as i32).collect();
            assert_eq!(s, want, "reduce-scatter on rank {rank}");
        }
    }

    #[test]
    fn unused_buffers_may_be_null_and_refused_arguments_issue_nothing() {
        let results = on_ranks(W, |c| {
            let r = c.rank();
            let src = [r as f64 + 1.0; N];
            let mut dst = [0.0f64; N];
            let (s, d) = (src.as_ptr() as *const u8, dst.as_mut_ptr() as *mut u8);
            let null = std::ptr::null_mut::<u8>();
            // SAFETY: the pointers are valid for N elements or null, and every call
            // is refused before touching them.
            let refused = unsafe {
                [
                    c.all_reduce_raw(null, d, N, DType::F64, ReduceOp::Sum),
                    c.all_reduce_raw(s, s.wrapping_add(8) as *mut u8, N - 1, DType::F64, ReduceOp::Sum),
                    c.all_reduce_raw(s, d, usize::MAX / 4, DType::F64, ReduceOp::Sum),
                    c.reduce_raw(s, d, N, DType::F64, ReduceOp::Sum, W),
                    c.send_raw(s, N, DType::F64, r),
                    c.broadcast_async_raw(s, null, N, DType::F64, 0).map(|_| ()),
                ]
            };
            let codes: Vec<bool> = refused.iter().map(|e| matches!(e, Err(Error::InvalidArgument(_)))).collect();
            // Nothing was issued: the next calls match on every rank. Broadcast with
            // NULL send off the root; reduce with NULL recv off the root.
            let send = if r == 1 { s } else { std::ptr::null() };
            // SAFETY: `src` and `dst` outlive the calls.
            unsafe { c.broadcast_raw(send, d, N, DType::F64, 1) }.expect("broadcast");
            let got_bcast = dst;
            let recv = if r == 2 { d } else { null };
            // SAFETY: as above.
            unsafe { c.reduce_raw(s, recv, N, DType::F64, ReduceOp::Max, 2) }.expect("reduce");
            (codes, got_bcast, dst)
        });
        for (rank, (codes, bcast, reduced)) in results.into_iter().enumerate() {
            assert!(codes.iter().all(|&ok| ok), "rank {rank}: refusals {codes:?}");
            assert_eq!(bcast, [2.0; N], "broadcast on rank {rank}");
            let want = if rank == 2 { [W as f64; N] } else { [2.0; N] };
            assert_eq!(reduced, want, "reduce on rank {rank}");
        }
    }

    #[test]
    fn async_raw_calls_borrow_until_their_work_completes() {
        let results = on_ranks(W, |c| {
            let mut bufs: Vec<Vec<i64>> = (0..4).map(|k| vec![(c.rank() * k) as i64; 1000]).collect();
            let works: Vec<Work<()>> = bufs
                .iter_mut()
                .map(|b| {
                    let p = b.as_mut_ptr() as *mut u8;
                    // SAFETY: every buffer outlives its work, waited for below.
                    unsafe { c.all_reduce_async_raw(p, p, b.len(), DType::I64, ReduceOp::Sum) }.expect("issued")
                })
                .collect();
            for w in works.into_iter().rev() {
                w.wait().expect("all-reduce");
            }
            bufs.iter().map(|b| b[999]).collect::<Vec<_>>()
        });
        let ranks = (0..W as i64).sum::<i64>();
        for got in results {
            assert_eq!(got, (0..4).map(|k| ranks * k).collect::<Vec<_>>());
        }
    }
}
