//! [`PeerCopyChannel`]: device regions between ranks whose devices map each
//! other's memory, in one device operation per piece and no host staging.
//!
//! Between two ranks whose devices share a [`Device::peer_domain`] (CUDA: GPUs of
//! one host, through IPC handles or peer access; the simulated device: devices of
//! one process) the executor wraps the peer's host channel in a `PeerCopyChannel`
//! for the length of a call. The sender exports its region
//! ([`Device::export`]) and, for each piece once the piece is final, sends a
//! *descriptor*: the export handle, the piece's offset inside the exported
//! allocation, its length and its number. A piece here is a *unit*: a run of the
//! executor's [`pieces`] (one for short transfers, up to 64 MiB for long ones, see
//! [`unit_pieces`]), since every descriptor costs host work a GPU copy does not. The receiver opens the handle
//! ([`Device::open_export`], cached by the device), checks the descriptor against
//! the receive it posted and the size of the mapping, and enqueues one device
//! operation reading the peer's memory: a copy, or for a receive-reduce
//! `dst = src ⊕ peer`. When that work has completed it raises the executor's
//! gate (for a forward) and sends an *acknowledgement*; the sender's send
//! completes only when every piece is acknowledged, so its buffer stays valid
//! while the peer's device reads it.
//!
//! Descriptors and acknowledgements are control messages of one fixed size
//! ([`CONTROL_BYTES`]) on the inner (host) channel. Each side posts, up front, one
//! receive per message it will get: a descriptor per piece of each receive, an
//! acknowledgement per piece of each send. A message is sent when it is ready
//! rather than posted up front behind a gate: sends on a channel leave in posting
//! order, and an acknowledgement queued behind a descriptor that waits for the
//! peer's data (or the reverse) could wait for itself. Messages therefore arrive
//! in readiness order and name their transfer (the n-th send of the call to this
//! peer is the peer's n-th receive from this rank) and piece; every field is
//! checked. Both ends expect the same number of messages of the same size, so a
//! disagreement (the peer staging while this rank copies, other lengths) is a
//! size or protocol error naming the peer, never a hang or a stray write.
//!
//! The receiver opens each allocation a peer names once per call (at most
//! [`MAX_PEER_ALLOCATIONS_PER_CALL`]; more is a protocol error naming the peer),
//! as the peer runs by the communicator's word ([`PeerProcess`]; the untrusted
//! default is another process). It gives the mappings back once the executor has
//! said the call's last receives from the peer are posted
//! ([`PeerChannel::last_receives_posted`]) and all of them completed, just
//! before their last acknowledgement: the peer's call waits for that message,
//! so it never returns, and its user never frees the memory, while this device
//! still has it mapped (the CUDA docs make freeing exported memory that a peer
//! has open undefined). That costs no message: the close (and, for CUDA, the
//! stream synchronization it waits for, which the call's end did anyway) moves
//! before that acknowledgement. A call that fails gives them back when it ends, after its device work
//! is done; the peer's failed call may have returned before that. A send region the device cannot export
//! (`cudaMallocAsync` or `cuMemCreate` memory) goes through an exportable device
//! buffer of this channel: each piece is copied there once it is final, and that
//! copy is described instead; the protocol is the same.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::call_maps::{CallMaps, Refusal, MAX_PEER_ALLOCATIONS_PER_CALL};
use super::channel::{pieces, MemKind, MemRegion, PeerChannel, Readiness, Reduction, PIECE_BYTES};
use super::CallInfo;
use crate::device::{Device, DeviceBuffer, DevicePtr, Export, PeerProcess, Ticket, MAX_EXPORT_HANDLE};
use crate::error::{Error, Result};
use crate::frame::FrameKind;
use crate::transport::TransportKind;
use crate::types::{CallSig, DType, OpKind, ReduceOp};

/// Fixed fields of a control message before the handle.
const FIXED: usize = 40;
/// Size of every control message: fixed fields and room for the longest handle.
pub const CONTROL_BYTES: usize = FIXED + MAX_EXPORT_HANDLE;
const MAGIC: &[u8; 4] = b"BPC1";

type Msg = Box<[u8; CONTROL_BYTES]>;

/// What a control message says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ControlKind {
    /// A piece of the sender's region is final and described.
    Describe = 1,
    /// The receiver's device has finished with a described piece.
    Ack = 2,
}

/// A control message, decoded (untrusted until checked against the posted requests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Control {
    pub(crate) kind: ControlKind,
    /// The sender's transfer (its n-th send to the peer in this call).
    pub(crate) job: u64,
    pub(crate) piece: u64,
    /// Where the piece starts in the exported allocation.
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) handle: Vec<u8>,
}

impl Control {
    pub(crate) fn encode(&self) -> Msg {
        let mut m = Box::new([0u8; CONTROL_BYTES]);
        m[..4].copy_from_slice(MAGIC);
        m[4] = self.kind as u8;
        m[6..8].copy_from_slice(&(self.handle.len() as u16).to_le_bytes());
        m[8..16].copy_from_slice(&self.job.to_le_bytes());
        m[16..24].copy_from_slice(&self.piece.to_le_bytes());
        m[24..32].copy_from_slice(&self.offset.to_le_bytes());
        m[32..40].copy_from_slice(&self.len.to_le_bytes());
        m[FIXED..FIXED + self.handle.len()].copy_from_slice(&self.handle);
        m
    }

    fn decode(m: &[u8; CONTROL_BYTES]) -> std::result::Result<Control, String> {
        if &m[..4] != MAGIC {
            return Err(format!("a control message starting {:02x?}, not a single-copy descriptor or ack", &m[..4]));
        }
        let kind = match m[4] {
            1 => ControlKind::Describe,
            2 => ControlKind::Ack,
            k => return Err(format!("a control message of unknown kind {k}")),
        };
        let hlen = u16::from_le_bytes([m[6], m[7]]) as usize;
        if hlen > MAX_EXPORT_HANDLE {
            return Err(format!("a handle of {hlen} bytes (at most {MAX_EXPORT_HANDLE})"));
        }
        let word = |i: usize| u64::from_le_bytes(m[i..i + 8].try_into().expect("eight bytes"));
        Ok(Control {
            kind,
            job: word(8),
            piece: word(16),
            offset: word(24),
            len: word(32),
            handle: m[FIXED..FIXED + hlen].to_vec(),
        })
    }
}

/// A peer channel that moves device regions by letting the peer's device read them.
pub struct PeerCopyChannel<'a> {
    inner: &'a mut dyn PeerChannel,
    device: Arc<dyn Device>,
    /// Gates of the inner receives of control messages (CONTROL_BYTES: landed).
    private: Vec<usize>,
    /// Where control messages land, one per expected message, in posting order.
    slots: Vec<Msg>,
    /// Slots read so far.
    handled: usize,
    /// Control messages sent, kept until the inner channel is done with them.
    outgoing: Vec<Msg>,
    sends: Vec<SendJob>,
    recvs: Vec<RecvJob>,
    /// Transfers of earlier rounds of this call (transfers are numbered per call).
    sends_before: u64,
    recvs_before: u64,
    /// For a point-to-point send: the call as the inner channel sees it (see [`mirror`]).
    mirrored: Option<CallInfo>,
    /// Where the peer runs, as the communicator established it.
    peer: PeerProcess,
    /// The peer's allocations this call opened.
    maps: CallMaps,
    /// No receive from the peer follows those posted: close `maps` before the
    /// acknowledgement that completes them.
    last_posted: bool,
    /// Exportable stand-ins for send regions that cannot be exported, with their
    /// exports; reused by later sends of the call once free.
    bounces: Vec<(DeviceBuffer, Export)>,
}

/// A send staged through `bounces[slot]` (its region cannot be exported).
struct Bounced {
    slot: usize,
    /// The region's device address.
    src: DevicePtr,
    /// Pieces copied into the bounce buffer so far.
    staged: usize,
    /// The copy of the latest piece, until it completed.
    pending: Option<Ticket>,
}

/// A point-to-point send receives acknowledgements, which its peer sends under
/// its receive's signature, and the inner channel checks every frame's signature
/// against its call (a receive accepts a send, not the other way round). So the
/// sending side runs its control messages under the receiver's signature, exactly:
/// both ends then check the same signature (a mismatched call is still refused).
fn mirror(call: &CallInfo) -> Option<CallInfo> {
    (call.sig.op == OpKind::Send).then(|| CallInfo {
        ctx: call.ctx.clone(),
        sig: CallSig::new(OpKind::Recv, call.sig.dtype, call.sig.count, call.ctx.rank as u32, call.sig.reduce_op)
            .with_tag(call.sig.tag),
        send_seq: call.send_seq,
        recv_seq: call.recv_seq,
        comm_id: call.comm_id,
        epoch: call.epoch,
        dtype: call.dtype,
        reduce_op: call.reduce_op,
        timeout: call.timeout,
        wait: call.wait,
        flags: call.flags.clone(),
    })
}

/// The call the inner channel sees.
fn wire<'c>(mirrored: &'c Option<CallInfo>, call: &'c CallInfo) -> &'c CallInfo {
    mirrored.as_ref().unwrap_or(call)
}

/// A device region the peer reads.
struct SendJob {
    len: usize,
    /// The executor's first gate of a forward (None: the region is final already).
    gate: Option<usize>,
    /// Everything enqueued on this device before the send was posted (the work
    /// that wrote the region): the peer's device must not read before it is done.
    /// None once it is.
    ready: Option<Ticket>,
    export: Export,
    /// Set when the region is copied to an exportable buffer piece by piece.
    bounce: Option<Bounced>,
    described: usize,
    acked: usize,
}

/// A device region filled (and perhaps reduced) from the peer's device memory.
struct RecvJob {
    dst: DevicePtr,
    len: usize,
    reduce: Option<(DevicePtr, DType, ReduceOp)>,
    /// The executor's first gate (a receive feeding a forward).
    feeds: Option<usize>,
    /// Pieces whose descriptor arrived (and whose device work was enqueued).
    landed: usize,
    /// Enqueued device work in order: (piece, ticket; None for an empty piece).
    flight: VecDeque<(usize, Option<Ticket>)>,
    finished: usize,
}

/// Descriptors a long transfer is cut into (see [`unit_pieces`]).
pub(crate) const UNITS_PER_TRANSFER: usize = 8;
/// The most [`PIECE_BYTES`] pieces one descriptor covers.
pub(crate) const MAX_UNIT_PIECES: usize = 64;

/// How many of the executor's pieces (the [`pieces`] cut) one descriptor of a
/// transfer of `len` bytes covers: one up to [`UNITS_PER_TRANSFER`] pieces, then
/// enough for that many descriptors, at most [`MAX_UNIT_PIECES`]. Each descriptor
/// costs a device operation, an event and two control messages, some 10 to 30 us
/// of host work; a piece of 1 MiB takes under 1 us to copy on a GPU, so one
/// descriptor per piece held an H100 near 50 GB/s of its 1.5 TB/s (2026-11-27).
/// A forward still pipelines: a unit goes out once all its pieces are final.
/// Both ends derive it from the length, which they check agrees.
fn unit_pieces(len: usize) -> usize {
    len.div_ceil(PIECE_BYTES).div_ceil(units_per_transfer()).clamp(1, MAX_UNIT_PIECES)
}

/// [`UNITS_PER_TRANSFER`], or `BRAID_PEER_COPY_UNITS` (1 to 64) for measuring
/// others on a GPU. Every rank must see the same value: both ends of a transfer
/// derive its units from it, and check every descriptor against their own cut.
fn units_per_transfer() -> usize {
    static UNITS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *UNITS.get_or_init(|| {
        std::env::var("BRAID_PEER_COPY_UNITS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|n| (1..=MAX_UNIT_PIECES).contains(n))
            .unwrap_or(UNITS_PER_TRANSFER)
    })
}

/// Unit `k` of a region of `len` bytes (`k` below [`unit_count`]): its offset and
/// length, a run of whole [`pieces`] but for the last.
fn unit(len: usize, k: usize) -> (usize, usize) {
    let span = unit_pieces(len) * PIECE_BYTES;
    let off = k * span;
    (off, (len - off).min(span))
}

/// How many units a region of `len` bytes has (an empty one: one).
fn unit_count(len: usize) -> usize {
    len.div_ceil(unit_pieces(len) * PIECE_BYTES).max(1)
}

/// The executor's pieces (indices into its [`pieces`] cut) unit `k` covers.
fn unit_piece_range(len: usize, k: usize) -> std::ops::Range<usize> {
    let per = unit_pieces(len);
    let total = len.div_ceil(PIECE_BYTES).max(1);
    (k * per).min(total)..((k + 1) * per).min(total)
}

/// Whether every piece of unit `k` of a forward whose first gate is `g` is final.
fn unit_final(gates: &[usize], g: usize, len: usize, k: usize) -> bool {
    unit_piece_range(len, k).all(|p| gates.get(g + p).is_some_and(|&v| v >= piece_len(len, p)))
}

/// The length of the executor's piece `p` of a region of `len` bytes.
fn piece_len(len: usize, p: usize) -> usize {
    (len - p * PIECE_BYTES).min(PIECE_BYTES)
}

impl SendJob {
    fn done(&self) -> bool {
        self.acked == unit_count(self.len)
    }
}

impl RecvJob {
    fn done(&self) -> bool {
        self.finished == unit_count(self.len)
    }
}

impl<'a> PeerCopyChannel<'a> {
    /// Wrap `inner` for one call on buffers of `device`, whose peer's device shares
    /// its peer domain, for a peer that runs where `peer` says (the communicator
    /// established it; [`PeerProcess::Other`] when unproven).
    pub fn new(inner: &'a mut dyn PeerChannel, device: Arc<dyn Device>, peer: PeerProcess) -> PeerCopyChannel<'a> {
        PeerCopyChannel {
            inner,
            device,
            private: Vec::new(),
            slots: Vec::new(),
            handled: 0,
            outgoing: Vec::new(),
            sends: Vec::new(),
            recvs: Vec::new(),
            sends_before: 0,
            recvs_before: 0,
            mirrored: None,
            peer,
            maps: CallMaps::default(),
            last_posted: false,
            bounces: Vec::new(),
        }
    }

    /// A free bounce buffer of at least `len` bytes (allocated and exported if
    /// none is), for a send whose region cannot be exported (`why`).
    fn bounce_for(&mut self, len: usize, why: &Error, call: &CallInfo) -> Result<usize> {
        let busy = |slot: usize, sends: &[SendJob]| {
            sends.iter().any(|j| !j.done() && j.bounce.as_ref().is_some_and(|b| b.slot == slot))
        };
        if let Some(slot) = (0..self.bounces.len()).find(|&s| self.bounces[s].0.len() >= len && !busy(s, &self.sends)) {
            return Ok(slot);
        }
        tracing::debug!(ctx = %call.ctx, len, %why, "single-copy send through an exportable device buffer");
        let buf = DeviceBuffer::new(&self.device, len)?;
        let export = self.device.export(buf.ptr(), len).map_err(|e| {
            Error::Device(format!(
                "{}: {} cannot export its own staging memory either: {e}",
                call.ctx,
                self.device.describe()
            ))
        })?;
        self.bounces.push((buf, export));
        Ok(self.bounces.len() - 1)
    }

    /// For a bounced send: copy piece `k` (final now) into its bounce buffer once,
    /// and say whether that copy has completed.
    fn bounce_piece(&mut self, i: usize, k: usize, peer: usize, call: &CallInfo) -> Result<bool> {
        let (len, Some(b)) = (self.sends[i].len, self.sends[i].bounce.as_ref()) else { return Ok(true) };
        let (slot, src, staged, pending) = (b.slot, b.src, b.staged, b.pending);
        let t = if staged == k {
            let (off, plen) = unit(len, k);
            let dst = self.bounces[slot].0.ptr() + off as u64;
            // SAFETY: `src + off` is piece k of the send's bounds-checked region,
            // final now (its gate is open); `dst` is the same piece of this
            // channel's bounce buffer of at least `len` bytes, which no other
            // unfinished send uses and which lives until the call ends.
            unsafe { self.device.copy_on_device(dst, src + off as u64, plen) }
                .and_then(|()| self.device.record())
                .map_err(|e| self.device_error(peer, call, "staging a send to", e))?
        } else {
            match pending {
                Some(t) => t,
                None => return Ok(true),
            }
        };
        let done = self.device.is_complete(t).map_err(|e| self.device_error(peer, call, "staging a send to", e))?;
        let b = self.sends[i].bounce.as_mut().expect("a bounced send");
        b.staged = k + 1;
        b.pending = (!done).then_some(t);
        Ok(done)
    }

    fn device_region(&self, r: &MemRegion, what: &str, call: &CallInfo) -> Result<DevicePtr> {
        super::staged::device_address(r, what, self.device.as_ref(), call)
    }

    /// Forget the transfers of earlier rounds once everything about them is over.
    fn retire(&mut self) {
        let over = !self.inner.busy()
            && self.handled == self.slots.len()
            && self.sends.iter().all(SendJob::done)
            && self.recvs.iter().all(RecvJob::done);
        if over {
            self.sends_before += self.sends.len() as u64;
            self.recvs_before += self.recvs.len() as u64;
            self.sends.clear();
            self.recvs.clear();
            self.slots.clear();
            self.private.clear();
            self.outgoing.clear();
            self.handled = 0;
        }
    }

    /// Post the receive of one control message.
    fn expect_control(&mut self, call: &CallInfo) -> Result<()> {
        let mut slot: Msg = Box::new([0u8; CONTROL_BYTES]);
        let region = MemRegion { ptr: slot.as_mut_ptr(), len: CONTROL_BYTES, kind: MemKind::Host };
        // The slot is on the heap: moving the box into `slots` keeps the address
        // the inner channel writes to, and the box lives until the inner channel
        // is done (retire, end_call).
        if self.mirrored.is_none() {
            self.mirrored = mirror(call);
        }
        self.inner.post_recv(region, None, Some(&mut self.private), wire(&self.mirrored, call))?;
        self.slots.push(slot);
        debug_assert_eq!(self.private.len(), self.slots.len(), "one gate per control message");
        Ok(())
    }

    /// Send a control message now.
    fn send_control(&mut self, c: &Control, call: &CallInfo) -> Result<()> {
        let mut m = c.encode();
        let region = MemRegion { ptr: m.as_mut_ptr(), len: CONTROL_BYTES, kind: MemKind::Host };
        self.inner.post_send(region, None, wire(&self.mirrored, call))?;
        self.outgoing.push(m);
        Ok(())
    }

    fn protocol(call: &CallInfo, peer: usize, detail: String) -> Error {
        Error::Protocol { ctx: call.ctx.clone(), peer, detail: format!("single-copy device transfer: {detail}") }
    }

    fn device_error(&self, peer: usize, call: &CallInfo, what: &str, e: Error) -> Error {
        Error::Device(format!("{}: {what} rank {peer} on {}: {e}", call.ctx, self.device.describe()))
    }

    /// Describe the pieces of sends that are final.
    fn describe_ready(&mut self, peer: usize, gates: &[usize], call: &CallInfo) -> Result<bool> {
        let mut moved = false;
        for i in 0..self.sends.len() {
            if let Some(t) = self.sends[i].ready {
                let done = self.device.is_complete(t);
                if !done.map_err(|e| self.device_error(peer, call, "waiting to send to", e))? {
                    continue;
                }
                self.sends[i].ready = None;
                moved = true;
            }
            loop {
                let job = &self.sends[i];
                if job.described == unit_count(job.len) {
                    break;
                }
                let (off, plen) = unit(job.len, job.described);
                if job.gate.is_some_and(|g| !unit_final(gates, g, job.len, job.described)) {
                    break;
                }
                let k = job.described;
                if !self.bounce_piece(i, k, peer, call)? {
                    break;
                }
                let job = &self.sends[i];
                let c = Control {
                    kind: ControlKind::Describe,
                    job: self.sends_before + i as u64,
                    piece: job.described as u64,
                    offset: (job.export.offset + off) as u64,
                    len: plen as u64,
                    handle: job.export.handle.clone(),
                };
                self.send_control(&c, call)?;
                self.sends[i].described += 1;
                moved = true;
            }
        }
        Ok(moved)
    }

    /// Act on a control message that landed.
    fn handle(&mut self, c: Control, peer: usize, call: &CallInfo) -> Result<()> {
        match c.kind {
            ControlKind::Ack => {
                let job = c.job.checked_sub(self.sends_before).and_then(|i| self.sends.get_mut(i as usize));
                let Some(job) = job else {
                    return Err(Self::protocol(call, peer, format!("acknowledgement of send #{} never posted", c.job)));
                };
                if c.piece != job.acked as u64 || job.acked >= job.described {
                    return Err(Self::protocol(
                        call,
                        peer,
                        format!(
                            "acknowledgement of piece {} of send #{} ({} of its pieces described, {} acknowledged)",
                            c.piece, c.job, job.described, job.acked
                        ),
                    ));
                }
                job.acked += 1;
                Ok(())
            }
            ControlKind::Describe => self.start_piece(c, peer, call),
        }
    }

    /// Check a descriptor against the receive it names and enqueue its device work.
    fn start_piece(&mut self, c: Control, peer: usize, call: &CallInfo) -> Result<()> {
        let what = format!("descriptor of piece {} of the peer's send #{}", c.piece, c.job);
        let idx = c.job.checked_sub(self.recvs_before).filter(|&i| (i as usize) < self.recvs.len());
        let Some(idx) = idx else {
            return Err(Self::protocol(call, peer, format!("{what}: no such receive was posted")));
        };
        let job = &self.recvs[idx as usize];
        let (dst, reduce) = (job.dst, job.reduce);
        let units = unit_count(job.len);
        if c.piece != job.landed as u64 || job.landed >= units {
            return Err(Self::protocol(call, peer, format!("{what}: expected piece {} of {units}", job.landed)));
        }
        let (off, plen) = unit(job.len, job.landed);
        if c.len != plen as u64 {
            return Err(Self::protocol(call, peer, format!("{what}: {} bytes where this rank expects {plen}", c.len)));
        }
        let ticket = if plen == 0 {
            if !c.handle.is_empty() || c.offset != 0 {
                return Err(Self::protocol(call, peer, format!("{what}: an empty piece names memory")));
            }
            None
        } else {
            let (dev, process) = (self.device.clone(), self.peer);
            let (base, size) = match self.maps.get_or_open(&c.handle, |h| dev.open_export(h, process)) {
                Ok(m) => m,
                Err(Refusal::TooMany) => {
                    return Err(Self::protocol(
                        call,
                        peer,
                        format!(
                            "{what}: names a new allocation past the {MAX_PEER_ALLOCATIONS_PER_CALL} one call may \
                             name (refused: each would stay mapped until the call ends)"
                        ),
                    ))
                }
                Err(Refusal::Open(e)) => {
                    return Err(Self::protocol(
                        call,
                        peer,
                        format!("{what}: names memory this device cannot open: {e}"),
                    ))
                }
            };
            let fits = c.offset.checked_add(c.len).is_some_and(|end| end <= size as u64);
            let at = base.checked_add(c.offset).filter(|_| fits);
            let Some(at) = at else {
                return Err(Self::protocol(
                    call,
                    peer,
                    format!("{what}: [{}, +{}) is outside its allocation of {size} bytes", c.offset, c.len),
                ));
            };
            let dev = self.device.clone();
            let enqueued = (|| {
                // SAFETY: `dst` (and a reduction's `src`) is one of the call's
                // bounds-checked device regions, `off + plen` inside it; `at` lies in
                // the peer's allocation as mapped here, `[offset, offset + len)` was
                // checked against the mapping's size just above, and the peer keeps
                // the allocation until this piece is acknowledged, which is after
                // the work completes. The device checks its addresses again.
                unsafe {
                    match reduce {
                        Some((src, dtype, op)) => {
                            dev.reduce(dst + off as u64, src + off as u64, at, plen, dtype, op)?
                        }
                        None => dev.copy_on_device(dst + off as u64, at, plen)?,
                    }
                }
                dev.record()
            })();
            Some(enqueued.map_err(|e| self.device_error(peer, call, "reading the memory of", e))?)
        };
        let job = &mut self.recvs[idx as usize];
        job.flight.push_back((job.landed, ticket));
        job.landed += 1;
        Ok(())
    }

    /// Complete receives whose device work is done: raise gates, acknowledge.
    fn finish_pieces(&mut self, peer: usize, gates: &mut [usize], call: &CallInfo) -> Result<bool> {
        let mut moved = false;
        for i in 0..self.recvs.len() {
            while let Some(&(k, t)) = self.recvs[i].flight.front() {
                if let Some(t) = t {
                    let done = self.device.is_complete(t);
                    if !done.map_err(|e| self.device_error(peer, call, "reading the memory of", e))? {
                        break;
                    }
                }
                let job = &mut self.recvs[i];
                job.flight.pop_front();
                job.finished += 1;
                if let Some(g) = job.feeds {
                    for p in unit_piece_range(job.len, k) {
                        gates[g + p] = piece_len(job.len, p);
                    }
                }
                if self.last_posted && self.recvs[i].done() && self.recvs.iter().all(RecvJob::done) {
                    // The last acknowledgement the peer's call waits for from this
                    // rank: every piece's device work has completed, so the
                    // mappings close now, before the peer can return and free.
                    self.maps.release_all(self.device.as_ref());
                }
                let ack = Control {
                    kind: ControlKind::Ack,
                    job: self.recvs_before + i as u64,
                    piece: k as u64,
                    offset: 0,
                    len: 0,
                    handle: Vec::new(),
                };
                self.send_control(&ack, call)?;
                moved = true;
            }
        }
        Ok(moved)
    }
}

impl PeerChannel for PeerCopyChannel<'_> {
    fn kind(&self) -> TransportKind {
        self.inner.kind()
    }

    fn post_send(&mut self, src: MemRegion, first_gate: Option<usize>, call: &CallInfo) -> Result<()> {
        let dptr = self.device_region(&src, "a send", call)?;
        self.retire();
        let exported =
            if src.len == 0 { Ok(Export { handle: Vec::new(), offset: 0 }) } else { self.device.export(dptr, src.len) };
        let (export, mut bounce) = match exported {
            Ok(export) => (export, None),
            // Memory IPC cannot share: stage it through an exportable buffer.
            Err(why @ Error::Unsupported(_)) => {
                let slot = self.bounce_for(src.len, &why, call)?;
                (self.bounces[slot].1.clone(), Some(Bounced { slot, src: dptr, staged: 0, pending: None }))
            }
            Err(e) => return Err(e),
        };
        if let (Some(b), None) = (bounce.as_mut(), first_gate) {
            // Final already: copied whole now, ahead of the ticket below.
            // SAFETY: the region is this call's, bounds-checked; the bounce buffer
            // holds at least `src.len` bytes and no unfinished send uses it.
            unsafe { self.device.copy_on_device(self.bounces[b.slot].0.ptr(), dptr, src.len)? };
            b.staged = unit_count(src.len);
        }
        if export.handle.len() > MAX_EXPORT_HANDLE {
            return Err(Error::Device(format!(
                "{}: {} exported a handle of {} bytes (at most {MAX_EXPORT_HANDLE})",
                call.ctx,
                self.device.describe(),
                export.handle.len()
            )));
        }
        let ready = Some(self.device.record()?);
        for _ in 0..unit_count(src.len) {
            self.expect_control(call)?;
        }
        self.sends.push(SendJob { len: src.len, gate: first_gate, ready, export, bounce, described: 0, acked: 0 });
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
        for _ in 0..unit_count(dst.len) {
            self.expect_control(call)?;
        }
        let feeds = forward.map(|gates| {
            let first = gates.len();
            gates.extend(pieces(dst.len).map(|_| 0));
            first
        });
        self.recvs.push(RecvJob {
            dst: dptr,
            len: dst.len,
            reduce,
            feeds,
            landed: 0,
            flight: VecDeque::new(),
            finished: 0,
        });
        Ok(())
    }

    fn progress(&mut self, peer: usize, gates: &mut [usize], call: &CallInfo) -> Result<bool> {
        let mut moved = self.describe_ready(peer, gates, call)?;
        moved |= self.inner.progress(peer, &mut self.private, wire(&self.mirrored, call))?;
        while self.handled < self.slots.len() && self.private[self.handled] >= CONTROL_BYTES {
            let c = Control::decode(&self.slots[self.handled]).map_err(|d| Self::protocol(call, peer, d))?;
            self.handled += 1;
            self.handle(c, peer, call)?;
            moved = true;
        }
        moved |= self.finish_pieces(peer, gates, call)?;
        Ok(moved)
    }

    fn busy(&self) -> bool {
        self.inner.busy()
            || self.handled < self.slots.len()
            || !self.sends.iter().all(SendJob::done)
            || !self.recvs.iter().all(RecvJob::done)
    }

    fn readiness(&self, gates: &[usize]) -> Readiness {
        // Device work completes without a descriptor to poll, and so does a forward
        // waiting for another channel's reduction: the executor spins, then yields.
        let device_work = self.recvs.iter().any(|j| !j.flight.is_empty())
            || self.sends.iter().any(|j| {
                let waiting_gate = j.described < unit_count(j.len)
                    && j.gate.is_some_and(|g| !unit_final(gates, g, j.len, j.described));
                j.ready.is_some() || waiting_gate || j.bounce.as_ref().is_some_and(|b| b.pending.is_some())
            });
        if device_work {
            Readiness::NoFd
        } else {
            self.inner.readiness(&self.private)
        }
    }

    fn last_receives_posted(&mut self) {
        self.last_posted = true;
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
        // First this device stops reading the peer's memory (and writing this
        // call's buffers), then the inner channel forgets the control slots, and
        // only then are they freed.
        super::staged::quiesce(self.device.as_ref(), self.inner);
        // The device is done with the peer's memory: this call's holds go back
        // (a mapping no other call holds closes now, not when the device goes).
        self.maps.release_all(self.device.as_ref());
        self.last_posted = false;
        self.sends.clear();
        self.bounces.clear();
        self.recvs.clear();
        self.slots.clear();
        self.private.clear();
        self.outgoing.clear();
        self.handled = 0;
        self.sends_before = 0;
        self.recvs_before = 0;
        self.mirrored = None;
    }
}

impl Drop for PeerCopyChannel<'_> {
    fn drop(&mut self) {
        self.end_call();
    }
}

#[cfg(test)]
#[path = "peer_copy_tests.rs"]
mod tests;
