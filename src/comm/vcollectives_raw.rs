//! The `*v` collectives on borrowed raw buffers (what the C ABI calls), with
//! MPI's meaning: counts and displacements in elements, one entry per rank.
//!
//! Every size is checked before anything runs: array lengths against the world,
//! `displacement + count` and the byte sizes against overflow (and `isize::MAX`,
//! the most a slice may span), null buffers that would hold bytes, and overlapping
//! send and receive buffers. In place (`send == recv`, MPI_IN_PLACE): all-gather-v
//! reads this rank's block at `displs[rank]` of the buffer; reduce-scatter-v takes
//! the packed blocks from the buffer and leaves this rank's result at its start.
//! All-to-all-v has no in-place form.

use super::borrowed::{non_null, overlap};
use super::calls::Core;
use super::vcollectives::{packed, OwnedBlocks, VCall};
use super::{Communicator, Work};
use crate::algorithm::VBlocks;
use crate::error::{Error, Result};
use crate::types::{CallSig, DType, OpKind, ReduceOp};

/// The arguments of one raw `*v` call, checked into byte lengths.
struct Checked {
    send: *const u8,
    send_len: usize,
    recv: *mut u8,
    recv_len: usize,
}

impl Core {
    fn arg_v(&self, op: OpKind, msg: String) -> Error {
        self.arg(format!("{op}: {msg}"))
    }

    /// `what` has one entry per rank.
    fn per_rank(&self, op: OpKind, what: &str, a: &[usize]) -> Result<()> {
        if a.len() == self.world {
            return Ok(());
        }
        Err(self.arg_v(op, format!("{what} has {} entries for a world of {}", a.len(), self.world)))
    }

    /// Bytes of `elems` elements of `dtype`, at most `isize::MAX`.
    fn bytes_of(&self, op: OpKind, what: &str, elems: Option<usize>, dtype: DType) -> Result<usize> {
        elems.and_then(|e| e.checked_mul(dtype.size())).filter(|&b| b <= isize::MAX as usize).ok_or_else(|| {
            self.arg_v(op, format!("{what}: more bytes of {dtype} than this machine can address (the counts overflow)"))
        })
    }

    /// Check the buffers of a call whose send side has `send_len` bytes and receive
    /// side `recv_len`: null only when empty; disjoint unless `in_place` allows
    /// `send == recv`.
    fn buffers_v(
        &self,
        op: OpKind,
        (send, send_len): (*const u8, usize),
        (recv, recv_len): (*mut u8, usize),
        in_place: bool,
    ) -> Result<Checked> {
        if send.is_null() && send_len > 0 {
            return Err(self.arg_v(op, format!("send is NULL but the counts give it {send_len} bytes")));
        }
        if recv.is_null() && recv_len > 0 {
            return Err(self.arg_v(op, format!("recv is NULL but the counts give it {recv_len} bytes")));
        }
        let same = std::ptr::eq(send, recv.cast_const()) && !send.is_null();
        if !(in_place && same) && overlap(send as usize, send_len, recv as usize, recv_len) {
            let how = if in_place { "pass the same pointer for an in-place call" } else { "it has no in-place form" };
            return Err(self.arg_v(
                op,
                format!("send ({send_len} bytes at {send:p}) and recv ({recv_len} bytes at {recv:p}) overlap; {how}"),
            ));
        }
        Ok(Checked {
            send: non_null(send as *mut u8, send_len) as *const u8,
            send_len,
            recv: non_null(recv, recv_len),
            recv_len,
        })
    }
}

/// A checked raw `*v` call, its counts owned: ready to run now or on the worker.
struct RawV {
    sig: CallSig,
    blocks: OwnedBlocks,
    b: Checked,
    /// In-place reduce-scatter-v: the byte offset of this rank's result, which
    /// MPI_IN_PLACE wants at the start of the buffer.
    to_start: Option<usize>,
}

// SAFETY: the pointers are the caller's buffers, promised valid and unused
// elsewhere until the call completes, on whichever thread runs it.
unsafe impl Send for RawV {}

impl RawV {
    /// Run the call at `ticket`; `send == recv` runs in place.
    ///
    /// # Safety
    /// The buffers are valid for their lengths and unused elsewhere until this returns.
    unsafe fn run(self, core: &Core, ticket: u64) -> Result<()> {
        let b = &self.b;
        let in_place = std::ptr::eq(b.send, b.recv.cast_const()) && b.send_len > 0 && b.recv_len > 0;
        let (input, output) = if in_place {
            // One buffer, as long as the longer side.
            // SAFETY: the caller's promise.
            (None, unsafe { std::slice::from_raw_parts_mut(b.recv, b.send_len.max(b.recv_len)) })
        } else {
            // SAFETY: the caller's promise; disjoint (checked in `buffers_v`).
            unsafe {
                (
                    Some(std::slice::from_raw_parts(b.send, b.send_len)),
                    std::slice::from_raw_parts_mut(b.recv, b.recv_len),
                )
            }
        };
        let call = VCall { sig: self.sig, blocks: self.blocks.view(), input, output };
        core.collective_v_at(ticket, call)?;
        if let Some(at) = self.to_start.filter(|_| std::ptr::eq(b.send, b.recv.cast_const()) && b.recv_len > 0) {
            // SAFETY: both ranges lie inside the buffer; `copy` allows overlap.
            unsafe { std::ptr::copy(b.recv.add(at), b.recv, b.recv_len) };
        }
        Ok(())
    }
}

impl Communicator {
    fn check_all_gather_v(
        &self,
        send: *const u8,
        send_count: usize,
        recv: *mut u8,
        recv_counts: &[usize],
        displs: &[usize],
        dtype: DType,
    ) -> Result<RawV> {
        let (core, op) = (&self.core, OpKind::AllGatherV);
        core.per_rank(op, "recv_counts", recv_counts)?;
        core.per_rank(op, "displs", displs)?;
        let own = recv_counts[core.rank];
        if send_count != own {
            return Err(
                core.arg_v(op, format!("send_count {send_count} differs from recv_counts[{}] = {own}", core.rank))
            );
        }
        let send_len = core.bytes_of(op, "send", Some(send_count), dtype)?;
        let recv_len = core.bytes_of(op, "recv", VBlocks::extent(recv_counts, displs), dtype)?;
        let b = core.buffers_v(op, (send, send_len), (recv, recv_len), true)?;
        let total = recv_counts.iter().fold(0u64, |s, &c| s.saturating_add(c as u64));
        let sig = CallSig::new(op, dtype, total, 0, ReduceOp::Sum);
        let blocks = OwnedBlocks::copy(VBlocks { recv_counts, recv_displs: displs, ..VBlocks::default() });
        Ok(RawV { sig, blocks, b, to_start: None })
    }

    fn check_reduce_scatter_v(
        &self,
        send: *const u8,
        recv: *mut u8,
        recv_counts: &[usize],
        dtype: DType,
        rop: ReduceOp,
    ) -> Result<RawV> {
        let (core, op) = (&self.core, OpKind::ReduceScatterV);
        core.per_rank(op, "recv_counts", recv_counts)?;
        let sum = recv_counts.iter().try_fold(0usize, |s, &c| s.checked_add(c));
        let send_len = core.bytes_of(op, "send", sum, dtype)?;
        let recv_len = core.bytes_of(op, "recv", Some(recv_counts[core.rank]), dtype)?;
        let b = core.buffers_v(op, (send, send_len), (recv, recv_len), true)?;
        let displs = packed(recv_counts);
        let sig = CallSig::new(op, dtype, sum.unwrap_or(0) as u64, 0, rop);
        // In place the engine leaves the result at block `rank`; MPI_IN_PLACE's is
        // at the start.
        let to_start = Some(displs[core.rank] * dtype.size());
        let blocks = OwnedBlocks { send_counts: recv_counts.to_vec(), send_displs: displs, ..OwnedBlocks::default() };
        Ok(RawV { sig, blocks, b, to_start })
    }

    #[allow(clippy::too_many_arguments)]
    fn check_all_to_all_v(
        &self,
        send: *const u8,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: *mut u8,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DType,
    ) -> Result<RawV> {
        let (core, op) = (&self.core, OpKind::AllToAllV);
        for (what, a) in [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ] {
            core.per_rank(op, what, a)?;
        }
        let send_len = core.bytes_of(op, "send", VBlocks::extent(send_counts, send_displs), dtype)?;
        let recv_len = core.bytes_of(op, "recv", VBlocks::extent(recv_counts, recv_displs), dtype)?;
        let b = core.buffers_v(op, (send, send_len), (recv, recv_len), false)?;
        let sig = CallSig::new(op, dtype, 0, 0, ReduceOp::Sum);
        let blocks = OwnedBlocks::copy(VBlocks { send_counts, send_displs, recv_counts, recv_displs });
        Ok(RawV { sig, blocks, b, to_start: None })
    }

    /// Run a checked call now.
    ///
    /// # Safety
    /// As [`RawV::run`].
    unsafe fn run_v_raw(&self, raw: RawV) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { raw.run(&self.core, self.core.shared.take_ticket()) }
    }

    /// Issue a checked call on the worker.
    ///
    /// # Safety
    /// As [`RawV::run`], until the work completes.
    unsafe fn spawn_v_raw(&self, raw: RawV) -> Work<()> {
        // SAFETY: the caller keeps the buffers valid and untouched until the Work completes.
        self.spawn(move |core, t| unsafe { raw.run(core, t) })
    }

    /// All-gather-v: `recv` receives rank `j`'s `send` (`recv_counts[j]` elements;
    /// this rank's `send_count` must equal `recv_counts[rank]`) at element
    /// `displs[j]`, MPI_Allgatherv. `send == recv` is in place (this rank's block
    /// already at `displs[rank]`). Every rank passes the same counts.
    ///
    /// # Safety
    /// `send` is valid for `send_count` elements and `recv` for the furthest
    /// `displs[j] + recv_counts[j]`, used by nothing else until the call returns.
    pub unsafe fn all_gather_v_raw(
        &self,
        send: *const u8,
        send_count: usize,
        recv: *mut u8,
        recv_counts: &[usize],
        displs: &[usize],
        dtype: DType,
    ) -> Result<()> {
        let raw = self.check_all_gather_v(send, send_count, recv, recv_counts, displs, dtype)?;
        // SAFETY: the caller's promise; out of place the two are disjoint (checked).
        unsafe { self.run_v_raw(raw) }
    }

    /// [`Communicator::all_gather_v_raw`], asynchronously: the counts are copied
    /// before this returns.
    ///
    /// # Safety
    /// As [`Communicator::all_gather_v_raw`], until the work completes.
    pub unsafe fn all_gather_v_async_raw(
        &self,
        send: *const u8,
        send_count: usize,
        recv: *mut u8,
        recv_counts: &[usize],
        displs: &[usize],
        dtype: DType,
    ) -> Result<Work<()>> {
        let raw = self.check_all_gather_v(send, send_count, recv, recv_counts, displs, dtype)?;
        // SAFETY: the caller's promise; out of place the two are disjoint (checked).
        Ok(unsafe { self.spawn_v_raw(raw) })
    }

    /// Reduce-scatter-v: the reduction with `op` of every rank's `send` (blocks of
    /// `recv_counts[j]` elements packed in rank order) is computed and block `rank`
    /// lands in `recv` (`recv_counts[rank]` elements), MPI_Reduce_scatter. `send ==
    /// recv` is in place (the result left at the start of the buffer). Every rank
    /// passes the same counts.
    ///
    /// # Safety
    /// `send` is valid for the sum of `recv_counts` elements and `recv` for
    /// `recv_counts[rank]`, used by nothing else until the call returns.
    pub unsafe fn reduce_scatter_v_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        recv_counts: &[usize],
        dtype: DType,
        rop: ReduceOp,
    ) -> Result<()> {
        let raw = self.check_reduce_scatter_v(send, recv, recv_counts, dtype, rop)?;
        // SAFETY: the caller's promise; out of place the two are disjoint (checked).
        unsafe { self.run_v_raw(raw) }
    }

    /// [`Communicator::reduce_scatter_v_raw`], asynchronously: the counts are
    /// copied before this returns.
    ///
    /// # Safety
    /// As [`Communicator::reduce_scatter_v_raw`], until the work completes.
    pub unsafe fn reduce_scatter_v_async_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        recv_counts: &[usize],
        dtype: DType,
        rop: ReduceOp,
    ) -> Result<Work<()>> {
        let raw = self.check_reduce_scatter_v(send, recv, recv_counts, dtype, rop)?;
        // SAFETY: the caller's promise; out of place the two are disjoint (checked).
        Ok(unsafe { self.spawn_v_raw(raw) })
    }

    /// All-to-all-v: `send_counts[j]` elements at element `send_displs[j]` of
    /// `send` go to rank `j`, whose block arrives in `recv` at `recv_displs[j]`
    /// (`recv_counts[j]` elements, which must equal rank `j`'s
    /// `send_counts[rank]`), MPI_Alltoallv. No in-place form.
    ///
    /// # Safety
    /// `send` and `recv` are valid for their furthest block ends, disjoint, and used
    /// by nothing else until the call returns.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_all_v_raw(
        &self,
        send: *const u8,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: *mut u8,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DType,
    ) -> Result<()> {
        let raw = self.check_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype)?;
        // SAFETY: the caller's promise; the two are disjoint (checked).
        unsafe { self.run_v_raw(raw) }
    }

    /// [`Communicator::all_to_all_v_raw`], asynchronously: the counts and
    /// displacements are copied before this returns.
    ///
    /// # Safety
    /// As [`Communicator::all_to_all_v_raw`], until the work completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_all_v_async_raw(
        &self,
        send: *const u8,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: *mut u8,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DType,
    ) -> Result<Work<()>> {
        let raw = self.check_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype)?;
        // SAFETY: the caller's promise; the two are disjoint (checked).
        Ok(unsafe { self.spawn_v_raw(raw) })
    }
}
