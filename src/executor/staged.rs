//! [`StagedChannel`]: device regions over a channel that moves host memory.
//!
//! For the length of one call on device buffers, each peer's channel is wrapped in
//! a `StagedChannel`. A send of a device region becomes a send of a host staging
//! buffer of the device (pinned memory for CUDA) gated piece by piece: each piece
//! is copied off the device as soon as it is final — at once, or for a forward when
//! the receive-reduce feeding it has finished that piece — and goes on the wire
//! when its copy completes. A receive into a device region lands in a staging
//! buffer; each piece, once complete, is copied onto the device and, for a
//! receive-reduce, combined there with the local operand by the device's reduction
//! (`dst = src ⊕ incoming`), and only then raises the executor's gate for a forward.
//!
//! So transfer, device copies and device reductions overlap piece by piece, the
//! bytes on the wire are exactly those of a host call (the peer may hold host or
//! device buffers), and nothing here knows which accelerator it is: the device
//! work goes through [`Device`], whose tickets say when it has completed.
//!
//! The inner channel's gates are private to this wrapper; the executor's gates
//! (forwards across channels) are raised only when device work has completed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::channel::{pieces, MemKind, MemRegion, PeerChannel, Readiness, Reduction};
use super::CallInfo;
use crate::device::{Device, DeviceBuffer, DevicePtr, HostBuffer, Ticket};
use crate::error::{Error, Result};
use crate::frame::FrameKind;
use crate::transport::TransportKind;
use crate::types::{DType, ReduceOp};

/// A peer channel that moves device regions through host staging buffers.
pub struct StagedChannel<'a> {
    inner: &'a mut dyn PeerChannel,
    device: Arc<dyn Device>,
    /// Gates of the inner channel: how much of each staging piece is final (sends)
    /// or has landed (receives).
    private: Vec<usize>,
    sends: Vec<SendJob>,
    recvs: Vec<RecvJob>,
    /// Staging buffers of finished rounds, reused by later ones. They are freed
    /// only after the call, when the inner channel has revoked what its peer was
    /// allowed to read of them (a peer on a single-copy link reads staging buffers
    /// in place).
    spare: Vec<HostBuffer>,
}

/// A device region on its way out.
struct SendJob {
    src: DevicePtr,
    len: usize,
    stage: HostBuffer,
    /// The executor's first gate of a forward (None: the region is final already).
    gate: Option<usize>,
    /// The inner send's first private gate.
    private_first: usize,
    /// Pieces whose copy off the device has been enqueued.
    enqueued: usize,
    /// Enqueued copies in order: (piece, ticket).
    flight: VecDeque<(usize, Ticket)>,
}

/// A device region being received (and perhaps reduced).
struct RecvJob {
    dst: DevicePtr,
    len: usize,
    /// Local operand, element type and operator of a receive-reduce.
    reduce: Option<(DevicePtr, DType, ReduceOp)>,
    stage: HostBuffer,
    /// Where incoming data waits on the device for its reduction.
    incoming: Option<DeviceBuffer>,
    /// The inner receive's first private gate.
    private_first: usize,
    /// The executor's first gate (a receive feeding a forward).
    feeds: Option<usize>,
    enqueued: usize,
    flight: VecDeque<(usize, Ticket)>,
    finished: usize,
}

// SAFETY: the raw pointers in the jobs are staging buffers owned by the jobs and
// device addresses (plain numbers); the inner channel is Send.
unsafe impl Send for StagedChannel<'_> {}

fn piece(len: usize, k: usize) -> (usize, usize) {
    pieces(len).nth(k).expect("piece index below the piece count")
}

fn piece_count(len: usize) -> usize {
    pieces(len).count()
}

impl<'a> StagedChannel<'a> {
    /// Wrap `inner` for one call on buffers of `device`.
    pub fn new(inner: &'a mut dyn PeerChannel, device: Arc<dyn Device>) -> StagedChannel<'a> {
        StagedChannel { inner, device, private: Vec::new(), sends: Vec::new(), recvs: Vec::new(), spare: Vec::new() }
    }

    fn device_region(&self, r: &MemRegion, what: &str, call: &CallInfo) -> Result<DevicePtr> {
        device_address(r, what, self.device.as_ref(), call)
    }

    /// Forget the jobs of earlier rounds once the inner channel is done with them,
    /// keeping their staging buffers for reuse.
    fn retire(&mut self) {
        if !self.inner.busy() && self.sends.iter().all(SendJob::done) && self.recvs.iter().all(RecvJob::done) {
            self.spare.extend(self.sends.drain(..).map(|j| j.stage));
            self.spare.extend(self.recvs.drain(..).map(|j| j.stage));
            self.private.clear();
        }
    }

    /// A staging buffer of at least `len` bytes: the smallest spare one that fits,
    /// or a new one.
    fn stage(&mut self, len: usize) -> Result<HostBuffer> {
        let best = (0..self.spare.len()).filter(|&i| self.spare[i].len() >= len).min_by_key(|&i| self.spare[i].len());
        match best {
            Some(i) => Ok(self.spare.swap_remove(i)),
            None => HostBuffer::new(&self.device, len),
        }
    }

    fn device_error(&self, peer: usize, call: &CallInfo, what: &str, e: Error) -> Error {
        Error::Device(format!("{}: {what} for rank {peer} on {}: {e}", call.ctx, self.device.describe()))
    }
}

impl SendJob {
    fn pieces(&self) -> usize {
        piece_count(self.len)
    }

    fn done(&self) -> bool {
        self.enqueued == self.pieces() && self.flight.is_empty()
    }

    /// Enqueue the copies of pieces that are final; release the pieces whose copy completed.
    fn advance(&mut self, dev: &dyn Device, gates: &[usize], private: &mut [usize]) -> Result<bool> {
        let mut moved = false;
        while self.enqueued < self.pieces() {
            let (off, plen) = piece(self.len, self.enqueued);
            if self.gate.is_some_and(|g| gates[g + self.enqueued] < plen) {
                break;
            }
            // SAFETY: [off, off + plen) lies in the staging buffer (of `len` bytes),
            // which this job owns until the channel is dropped, and the channel
            // synchronizes the device before it drops its jobs. The inner send reads
            // the piece only after its gate is raised, below, once the copy completed.
            unsafe { dev.copy_to_host(self.stage.ptr().add(off), self.src + off as u64, plen)? };
            self.flight.push_back((self.enqueued, dev.record()?));
            self.enqueued += 1;
            moved = true;
        }
        while let Some(&(k, t)) = self.flight.front() {
            if !dev.is_complete(t)? {
                break;
            }
            private[self.private_first + k] = piece(self.len, k).1;
            self.flight.pop_front();
            moved = true;
        }
        Ok(moved)
    }
}

impl RecvJob {
    fn pieces(&self) -> usize {
        piece_count(self.len)
    }

    fn done(&self) -> bool {
        self.finished == self.pieces()
    }

    /// Move pieces that have landed onto the device (reducing them there); raise
    /// the executor's gate of each piece whose device work completed.
    fn advance(&mut self, dev: &dyn Device, gates: &mut [usize], private: &[usize]) -> Result<bool> {
        let mut moved = false;
        while self.enqueued < self.pieces() {
            let (off, plen) = piece(self.len, self.enqueued);
            if private[self.private_first + self.enqueued] < plen {
                break;
            }
            // SAFETY: the piece lies inside the staging buffer, complete (its gate
            // says so) and not written again this call; the buffer outlives the copy
            // (see SendJob::advance). Device addresses are the call's bounds-checked
            // regions and this job's `incoming` buffer of `len` bytes.
            unsafe {
                let landed = self.stage.ptr().add(off) as *const u8;
                match (self.reduce, &self.incoming) {
                    (Some((src, dtype, op)), Some(inc)) => {
                        let at = inc.ptr() + off as u64;
                        dev.copy_to_device(at, landed, plen)?;
                        dev.reduce(self.dst + off as u64, src + off as u64, at, plen, dtype, op)?;
                    }
                    _ => dev.copy_to_device(self.dst + off as u64, landed, plen)?,
                }
            }
            self.flight.push_back((self.enqueued, dev.record()?));
            self.enqueued += 1;
            moved = true;
        }
        while let Some(&(k, t)) = self.flight.front() {
            if !dev.is_complete(t)? {
                break;
            }
            if let Some(g) = self.feeds {
                gates[g + k] = piece(self.len, k).1;
            }
            self.finished += 1;
            self.flight.pop_front();
            moved = true;
        }
        Ok(moved)
    }
}

impl PeerChannel for StagedChannel<'_> {
    fn kind(&self) -> TransportKind {
        self.inner.kind()
    }

    fn post_send(&mut self, src: MemRegion, first_gate: Option<usize>, call: &CallInfo) -> Result<()> {
        let dptr = self.device_region(&src, "a send", call)?;
        self.retire();
        let stage = self.stage(src.len)?;
        let private_first = self.private.len();
        self.private.extend(pieces(src.len).map(|_| 0));
        let host = MemRegion { ptr: stage.ptr(), len: src.len, kind: MemKind::Host };
        self.inner.post_send(host, Some(private_first), call)?;
        self.sends.push(SendJob {
            src: dptr,
            len: src.len,
            stage,
            gate: first_gate,
            private_first,
            enqueued: 0,
            flight: VecDeque::new(),
        });
        Ok(())
    }

    fn post_recv(
        &mut self,
        dst: MemRegion,
        reduce: Option<Reduction>,
        forward: Option<&mut Vec<usize>>,
        call: &CallInfo,
    ) -> Result<()> {
        let dptr = self.device_region(&dst, "a receive", call)?;
        let reduce = match reduce {
            Some(r) => Some((self.device_region(&r.src, "the operand of a receive-reduce", call)?, r.dtype, r.op)),
            None => None,
        };
        self.retire();
        let stage = self.stage(dst.len)?;
        let incoming = if reduce.is_some() { Some(DeviceBuffer::new(&self.device, dst.len)?) } else { None };
        let private_first = self.private.len();
        let host = MemRegion { ptr: stage.ptr(), len: dst.len, kind: MemKind::Host };
        self.inner.post_recv(host, None, Some(&mut self.private), call)?;
        debug_assert_eq!(self.private.len() - private_first, piece_count(dst.len));
        let feeds = forward.map(|gates| {
            let first = gates.len();
            gates.extend(pieces(dst.len).map(|_| 0));
            first
        });
        self.recvs.push(RecvJob {
            dst: dptr,
            len: dst.len,
            reduce,
            stage,
            incoming,
            private_first,
            feeds,
            enqueued: 0,
            flight: VecDeque::new(),
            finished: 0,
        });
        Ok(())
    }

    fn progress(&mut self, peer: usize, gates: &mut [usize], call: &CallInfo) -> Result<bool> {
        let dev = self.device.clone();
        let mut moved = false;
        for job in &mut self.sends {
            moved |= job.advance(dev.as_ref(), gates, &mut self.private).map_err(|e| {
                Error::Device(format!("{}: staging a send to rank {peer} on {}: {e}", call.ctx, dev.describe()))
            })?;
        }
        moved |= self.inner.progress(peer, &mut self.private, call)?;
        for i in 0..self.recvs.len() {
            let advanced = self.recvs[i].advance(dev.as_ref(), gates, &self.private);
            moved |= advanced.map_err(|e| self.device_error(peer, call, "staging a receive", e))?;
        }
        Ok(moved)
    }

    fn busy(&self) -> bool {
        self.inner.busy() || !self.sends.iter().all(SendJob::done) || !self.recvs.iter().all(RecvJob::done)
    }

    fn readiness(&self, _gates: &[usize]) -> Readiness {
        // Device work completes without a descriptor to poll, and so does a forward
        // waiting for another channel's reduction: the executor spins, then yields.
        let device_work = self.sends.iter().any(|j| !j.flight.is_empty() || (j.gate.is_some() && !j.done()))
            || self.recvs.iter().any(|j| !j.flight.is_empty());
        if device_work {
            Readiness::NoFd
        } else {
            self.inner.readiness(&self.private)
        }
    }

    fn send_control_and_close(&mut self, kind: FrameKind, comm_id: u32, epoch: u8, reason: &str, give_up: Instant) {
        self.inner.send_control_and_close(kind, comm_id, epoch, reason, give_up);
    }

    fn peer_gone(&mut self) -> bool {
        self.inner.peer_gone()
    }

    fn wait_slot(&mut self) -> Option<&mut super::wait_chain::WaitSlot> {
        self.inner.wait_slot()
    }

    fn end_call(&mut self) {
        // Order matters: first the device stops touching the staging buffers, then
        // the inner channel revokes what its peer may read of them and forgets its
        // requests, and only then are they freed.
        quiesce(self.device.as_ref(), self.inner);
        self.sends.clear();
        self.recvs.clear();
        self.spare.clear();
        self.private.clear();
    }
}

/// The device address of a region of a call on device buffers; a host region
/// there is an error naming the operation and the device.
pub(super) fn device_address(r: &MemRegion, what: &str, device: &dyn Device, call: &CallInfo) -> Result<DevicePtr> {
    if r.kind != MemKind::Device {
        return Err(Error::InvalidArgument(format!(
            "{}: {what} of {} bytes in host memory during a call on device buffers ({})",
            call.ctx,
            r.len,
            device.describe()
        )));
    }
    Ok(r.ptr as usize as DevicePtr)
}

/// The first half of ending a device call on a wrapped channel: wait for the
/// device's work on this call's memory, then let the inner channel revoke what its
/// peer may read and forget its requests. The wrapper frees its buffers after.
pub(super) fn quiesce(device: &dyn Device, inner: &mut dyn PeerChannel) {
    if let Err(e) = device.synchronize() {
        tracing::error!("{}: synchronizing at the end of a call failed: {e}", device.describe());
    }
    inner.end_call();
}

impl Drop for StagedChannel<'_> {
    fn drop(&mut self) {
        self.end_call();
    }
}
