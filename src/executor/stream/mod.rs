//! [`StreamChannel`]: the [`PeerChannel`] over byte-stream [`Link`]s (TCP,
//! shared-memory rings, in-process rings).
//!
//! It frames every transfer into segments (a header plus at most
//! [`SEGMENT_BYTES`] of payload), receives plain copies straight into their
//! destination and reduces incoming data from a staging chunk as it arrives (so
//! reduction overlaps the transfer), and validates every header against the call
//! this rank is making.
//!
//! A forward (a send posted with a gate) writes each frame as far as its
//! reduction has got, so the result leaves while it is still in cache. On
//! shared-memory and in-process links incoming data is reduced straight out of the
//! ring ([`Link::peek`]), and long plain receives are copied out with non-temporal
//! stores.
//!
//! On links that can read the peer's memory ([`Link::can_read_peer`]: shared memory
//! between processes, threads of one process) a frame of a transfer of at least
//! [`RENDEZVOUS_BYTES`] may be sent as a *rendezvous* — between processes from
//! registered buffers, and from plain ones in exchanges through `process_vm_readv`
//! (`BRAID_CMA`, see [`single_copy::SingleCopy`]) — a small frame with the address of
//! the data. The receiver copies (or reduces) straight from the sender's memory in
//! cache-sized chunks and answers with an ack; the sender stays busy until the
//! ack, so its buffer stays valid while it is read. One copy instead of two.
//! A call that ends early (a timeout, a mismatch, an abort) revokes what it exposed
//! ([`Link::revoke_exposed`]) in [`PeerChannel::end_call`], so a peer that reads
//! late gets an error instead of memory its owner has freed.

use std::collections::VecDeque;
use std::io;
use std::time::Instant;

use super::channel::{require_host, MemRegion, NextFrame, PeerChannel, Readiness, Reduction};
use super::wait_chain::WaitSlot;
use super::{peer_error, CallInfo};
use crate::config::Tuning;
use crate::error::{Error, Result};
use crate::frame::{FrameKind, Header, HEADER_LEN};
use crate::registered::SegmentCache;
use crate::transport::{Link, TransportKind};
use crate::types::{CallSig, DType, ReduceOp};

mod inbound;
mod outbound;
pub(crate) mod single_copy;
use inbound::progress_recv;
use outbound::{frame_parts, progress_send, queue_send, send_now, writable};
use single_copy::{SingleCopy, DESC_MAX};

/// Largest payload of one frame. Long transfers are cut into segments of this size
/// so a receiver can reduce one while the next is in flight.
pub const SEGMENT_BYTES: usize = 1 << 20;
/// Incoming data is reduced in grains of this size as soon as it has arrived.
const REDUCE_GRAIN: usize = 64 << 10;
/// Smallest default of [`Tuning::stream_recv_bytes`].
pub const STREAM_RECV_MIN: usize = 4 << 20;
/// Largest default of [`Tuning::stream_recv_bytes`].
pub const STREAM_RECV_MAX: usize = 64 << 20;

/// Default of [`Tuning::stream_recv_bytes`]: receives at least this long, whose
/// destination will not stay in cache anyway, are copied out of shared rings with
/// non-temporal stores, which skips reading each destination line before
/// overwriting it (a quarter of the memory traffic) but leaves the data out of
/// the cache. A sixteenth of the last-level cache, between 4 and 64 MiB: on the
/// 2-core VM (480 MiB L3) a 2-rank broadcast of 4 and 16 MiB ran 1.5x and 1.4x
/// slower with them (the destination would have stayed in cache), and 64 MiB 1.2x
/// faster (results/one-host-2026-11-27.md).
pub fn default_stream_recv_bytes() -> usize {
    (last_level_cache_bytes().unwrap_or(0) / 16).clamp(STREAM_RECV_MIN, STREAM_RECV_MAX)
}

/// The size of the largest cache of CPU 0 (Linux sysfs), if it can be read.
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| parse_cache_size(&s))
        .max()
}

/// A sysfs cache size (`491520K`, `2048K`, `32M`).
fn parse_cache_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: usize = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}
/// Transfers at least this long go single-copy on links that can read peer memory
/// (the default of [`Tuning::rendezvous_bytes`]).
pub const RENDEZVOUS_BYTES: usize = 128 << 10;
/// Default of [`Tuning::forward_grain`]: minimum a forward sends at a time on memory
/// links while its reduction goes on (see `outbound.rs` for the measurement).
pub const FORWARD_GRAIN: usize = 16 << 10;
/// Default of [`Tuning::forward_pass_bytes`]: bytes of a forwarded segment reduced
/// per pass before its forward gets a turn. 2 ranks on the 2-core VM, same session:
/// 64 KiB passes gave 9.4–10.6 GB/s at 1 MiB, unbounded ones 3.6–4.5 at 16 MiB;
/// 256 KiB gave 12.3–12.9 and 3.7–5.0.
pub const FORWARD_PASS_BYTES: usize = 256 << 10;
/// Default of [`Tuning::peer_chunk`] (see `single_copy.rs` for the measurement).
pub const PEER_CHUNK: usize = 1 << 20;
/// Plain sends up to this long are written when posted, if nothing is queued
/// before them (one frame: below [`SEGMENT_BYTES`] and the rendezvous threshold).
const EAGER_BYTES: usize = 64 << 10;
/// Longest an abort message may be.
const MAX_REASON: usize = 64 << 10;

/// Receive-side framing state of a channel.
enum Rx {
    /// Reading a header; `have` bytes of it are in `hdr`.
    Header { have: usize },
    /// A data header has been read and awaits the receive step it belongs to.
    Ready(Header),
    /// Reading an abort frame's reason.
    Reason { want: usize, buf: Vec<u8> },
    /// Reading the ranks listed in a wait reply (header `head`).
    WaitList { head: Header, want: usize, buf: Vec<u8> },
    /// Skipping the padding after a payload.
    Pad { left: usize },
    /// The peer will send nothing more (it said goodbye, aborted, or its link
    /// ended): fine until this rank needs something of it.
    Gone(Gone),
}

/// Why a peer will send nothing more on its link. Everything it sent before is
/// consumed first, so a peer that finished a call and then left fails only the
/// calls that still need it (a receive from it, a send it has not taken, an ack).
pub(super) enum Gone {
    /// It said goodbye: its communicator was closed in order.
    Goodbye,
    /// It sent an abort frame with this reason.
    Aborted(String),
    /// The link ended or failed without a word (the process exited or was killed).
    Lost(io::ErrorKind, String),
}

impl Gone {
    /// Why the peer stopped, for a rank that asked it whom it waits for.
    pub(super) fn describe(&self) -> String {
        match self {
            Gone::Goodbye => "it closed its communicator".to_string(),
            Gone::Aborted(reason) => reason.clone(),
            Gone::Lost(_, detail) => format!("its link ended ({detail})"),
        }
    }

    /// The error of a call that needs the peer that is gone.
    pub(super) fn error(&self, call: &CallInfo, peer: usize) -> Error {
        match self {
            Gone::Goodbye => peer_error(call, peer, true, io::Error::new(io::ErrorKind::UnexpectedEof, "closed")),
            Gone::Aborted(reason) => Error::PeerAborted { ctx: call.ctx.clone(), peer, reason: reason.clone() },
            Gone::Lost(kind, detail) => peer_error(call, peer, false, io::Error::new(*kind, detail.clone())),
        }
    }
}

/// A link plus the framing state that survives between operations, and the
/// frames posted in the current call.
pub struct StreamChannel {
    link: Box<dyn Link>,
    hdr: [u8; HEADER_LEN],
    rx: Rx,
    staging: Vec<u8>,
    /// Set when the peer said goodbye (orderly close of its communicator).
    said_goodbye: bool,
    /// False while a frame is partly written: nothing else may be injected then.
    tx_at_boundary: bool,
    /// Which long transfers on this link go single-copy (the sender decides per
    /// frame; the receiver follows each frame's kind).
    single_copy: SingleCopy,
    /// Whether incoming data can be reduced straight out of the link ([`Link::peek`]).
    peek: bool,
    /// Smallest piece of a forward written before its frame is complete.
    forward_grain: usize,
    /// Thresholds and grains (from the communicator's [`Config`](crate::config::Config)).
    tuning: Tuning,
    /// Rendezvous frames sent whose ack has not arrived.
    acks_awaited: usize,
    /// Rendezvous reads finished whose ack is still to be sent.
    acks_owed: usize,
    /// The peer's registered segments mapped so far (until their owner frees them).
    peer_segments: SegmentCache,
    /// Whether this call exposed memory on the link ([`Link::expose`]), to revoke.
    exposed: bool,
    /// Frames posted to send, in order (kept between calls so a call allocates nothing).
    out: VecDeque<OutMsg>,
    /// Frames posted to receive, in order.
    inq: VecDeque<InMsg>,
    /// Whether the send about to be posted is half of an exchange with the peer
    /// ([`PeerChannel::next_send_is_exchange`]).
    exchange: bool,
    /// Questions and answers about whom the ranks wait for (see `wait_chain`).
    wait: WaitSlot,
}

// SAFETY: the raw pointers in `out` and `inq` are held only during `execute`, whose
// `CallEnd` calls `end_call` (emptying both) before returning, on success, on error
// and on panic alike; the link itself is `Send`.
unsafe impl Send for StreamChannel {}

impl StreamChannel {
    /// Wrap a connected link, with the default [`Tuning`].
    #[cfg(test)]
    pub fn new(link: Box<dyn Link>) -> StreamChannel {
        StreamChannel::with_tuning(link, Tuning::default())
    }

    /// Wrap a connected link with these thresholds and grains.
    pub fn with_tuning(link: Box<dyn Link>, tuning: Tuning) -> StreamChannel {
        StreamChannel {
            single_copy: SingleCopy::for_link(link.as_ref(), tuning.cma_exchanges_only),
            exchange: false,
            peek: link.can_peek(),
            forward_grain: if link.can_peek() { tuning.forward_grain } else { usize::MAX },
            tuning,
            acks_awaited: 0,
            acks_owed: 0,
            peer_segments: SegmentCache::default(),
            exposed: false,
            link,
            hdr: [0; HEADER_LEN],
            rx: Rx::Header { have: 0 },
            staging: Vec::new(),
            said_goodbye: false,
            tx_at_boundary: true,
            out: VecDeque::new(),
            inq: VecDeque::new(),
            wait: WaitSlot::default(),
        }
    }
}

impl StreamChannel {
    /// [`require_host`] for this link, which asks the link for its peer and kind
    /// (two dynamic calls) only to word the error: posting runs once per step.
    #[inline]
    fn require_host(&self, region: &MemRegion, what: &str, call: &CallInfo) -> Result<()> {
        if region.kind.is_host() {
            return Ok(());
        }
        require_host(region, what, self.link.peer(), self.link.kind(), call)
    }

    /// A transfer with a peer that is gone fails when posted: it would never be taken.
    #[inline]
    fn require_present(&self, call: &CallInfo) -> Result<()> {
        match &self.rx {
            Rx::Gone(g) => Err(g.error(call, self.link.peer())),
            _ => Ok(()),
        }
    }

    /// Whether a transfer posted in this call still needs the peer: a receive from
    /// it, a send it has not taken whole, or the ack of a read of this rank's memory.
    /// (An ack this rank owes a peer that is gone is owed to nobody.)
    fn needs_peer(&self) -> bool {
        !self.inq.is_empty() || !self.out.is_empty() || self.acks_awaited > 0
    }
}

impl PeerChannel for StreamChannel {
    fn kind(&self) -> TransportKind {
        self.link.kind()
    }

    fn next_send_is_exchange(&mut self, exchange: bool) {
        self.exchange = exchange;
    }

    fn post_send(&mut self, src: MemRegion, first_gate: Option<usize>, call: &CallInfo) -> Result<()> {
        // The flag holds for the send it was said for, not the ones after.
        let exchange = std::mem::take(&mut self.exchange) && first_gate.is_none();
        self.require_host(&src, "a send to", call)?;
        self.require_present(call)?;
        // A small plain send with nothing queued before it leaves now: no queue entry,
        // and the peer's data (and so its wait) starts a pass earlier.
        if first_gate.is_none()
            && src.len <= EAGER_BYTES
            && src.len < self.tuning.rendezvous_bytes
            && self.out.is_empty()
            && self.tx_at_boundary
            && self.acks_owed == 0
        {
            return send_now(self, call, src.ptr as *const u8, src.len);
        }
        queue_send(self, call, src.ptr as *const u8, src.len, first_gate, exchange);
        Ok(())
    }

    fn post_recv(
        &mut self,
        dst: MemRegion,
        reduce: Option<Reduction>,
        mut forward: Option<&mut Vec<usize>>,
        call: &CallInfo,
    ) -> Result<()> {
        self.require_host(&dst, "a receive from", call)?;
        self.require_present(call)?;
        if let Some(r) = &reduce {
            self.require_host(&r.src, "the local operand of a receive-reduce from", call)?;
        }
        let (base, s) = (dst.ptr, reduce.map(|r| r.src.ptr as *const u8));
        let (dtype, op) = reduce.map_or((DType::U8, ReduceOp::Sum), |r| (r.dtype, r.op));
        for (off, len) in frames(dst.len) {
            // SAFETY: off + len <= dst.len (== the operand's length), inside the
            // regions the executor bounds-checked.
            let mut m = InMsg::new(unsafe { base.add(off) }, s.map(|s| unsafe { s.add(off) }), len, dtype, op);
            // What its frames must say, fixed now: a group posts receives of several
            // messages (each its own sequence number and signature) in one call.
            (m.seq, m.sig) = (call.recv_seq, call.sig);
            // By the call's whole buffer, not this receive's part of it: a chain or a
            // ring moves a long message in pieces, and it is the buffer that leaves
            // the cache (2-rank broadcast of 64 MiB: the chain's pieces with
            // ordinary stores took 1.4x the tree's one receive with streaming ones).
            let call_bytes = (call.sig.count as usize).saturating_mul(call.sig.dtype.size());
            m.stream = reduce.is_none() && dst.len.max(call_bytes) >= self.tuning.stream_recv_bytes;
            if let Some(gates) = forward.as_deref_mut() {
                m.feeds = Some(gates.len());
                gates.push(0);
            }
            self.inq.push_back(m);
        }
        Ok(())
    }

    fn progress(&mut self, peer: usize, gates: &mut [usize], call: &CallInfo) -> Result<bool> {
        if let Rx::Gone(g) = &self.rx {
            if self.wait.awaiting && self.wait.gone.is_none() {
                self.wait.gone = Some(g.describe());
            }
            self.acks_owed = 0;
            return if self.needs_peer() { Err(g.error(call, peer)) } else { Ok(false) };
        }
        // Most passes of a small call have nothing to send: that costs a check here,
        // not a call (progress_send would find both queues empty and return false).
        let sent = if self.out.is_empty() && self.acks_owed == 0 && self.wait.unsent().is_empty() {
            false
        } else {
            match progress_send(self, gates, call) {
                Ok(sent) => sent,
                Err(e) => return Err(inbound::write_failed(self, peer, call, e)),
            }
        };
        let received = progress_recv(self, peer, gates, call)?;
        Ok(sent | received)
    }

    fn busy(&self) -> bool {
        !self.out.is_empty() || !self.inq.is_empty() || self.acks_awaited > 0 || self.acks_owed > 0
    }

    fn sent_unread(&self) -> bool {
        self.link.sent_unread()
    }

    fn readiness(&self, gates: &[usize]) -> Readiness {
        let Some(fd) = self.link.poll_fd() else { return Readiness::NoFd };
        let mut events = 0;
        // A forward waiting for its reduction waits on input, not on the socket.
        if self.out.front().is_some_and(|m| writable(m, gates, self.forward_grain) > m.sent)
            || self.acks_owed > 0
            || !self.wait.unsent().is_empty()
        {
            events |= libc::POLLOUT;
        }
        // Watch input when a receive or an ack is awaited, or (idle) for an abort
        // or EOF — but not when a complete header already waits for its step.
        // A peer that is gone is not watched: progress fails at once if it is needed.
        if matches!(self.rx, Rx::Gone(_)) {
            return Readiness::Fd { fd, events: 0 };
        }
        if !self.inq.is_empty()
            || self.acks_awaited > 0
            || matches!(self.rx, Rx::Header { .. } | Rx::Reason { .. } | Rx::WaitList { .. })
        {
            events |= libc::POLLIN;
        }
        Readiness::Fd { fd, events }
    }

    fn peer_gone(&mut self) -> bool {
        // Asked when a call fails and while the survivors agree: what the peer
        // sent is no longer wanted, and its goodbye may wait behind it unread.
        if !matches!(self.rx, Rx::Gone(_)) {
            inbound::read_ahead(self, |_| None);
        }
        // A peer that said goodbye closed its communicator: it will not agree
        // either. One that aborted is alive, failing as this rank is.
        match &self.rx {
            Rx::Gone(Gone::Lost(..) | Gone::Goodbye) => true,
            Rx::Gone(Gone::Aborted(_)) => false,
            _ => self.said_goodbye || self.link.peer_gone(),
        }
    }

    /// Bounded in time: `give_up` is shared by all the channels a rank closes at
    /// once, so closing many full links still takes at most
    /// [`CONTROL_GRACE`](super::CONTROL_GRACE) in all.
    fn send_control_and_close(&mut self, kind: FrameKind, comm_id: u32, epoch: u8, reason: &str, give_up: Instant) {
        if self.tx_at_boundary {
            let payload = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
            let hdr = Header::control(kind, comm_id, epoch, payload.len() as u32).encode();
            let total = HEADER_LEN + payload.len();
            let mut sent = 0;
            while sent < total && Instant::now() < give_up {
                match self.link.try_write(&frame_parts(&hdr, payload, 0, sent)) {
                    Ok(0) => std::thread::yield_now(),
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
            }
        }
        self.tx_at_boundary = false;
        self.link.close();
    }

    fn wait_slot(&mut self) -> Option<&mut WaitSlot> {
        Some(&mut self.wait)
    }

    /// With nothing posted, progress reads up to the next data header and stops
    /// there (`Rx::Ready`): the frame stays whole for the receive that takes it.
    fn next_data_frame(&mut self, peer: usize, call: &CallInfo) -> Result<NextFrame> {
        if !self.inq.is_empty() || !self.out.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{}: looking for the next frame from rank {peer} with transfers posted",
                call.ctx
            )));
        }
        self.progress(peer, &mut [], call)?;
        match &self.rx {
            Rx::Ready(h) => Ok(NextFrame::Data(*h)),
            Rx::Gone(Gone::Goodbye) => Ok(NextFrame::Closed),
            Rx::Gone(g) => Err(g.error(call, peer)),
            _ => Ok(NextFrame::Nothing),
        }
    }

    fn end_call(&mut self) {
        self.wait.end_call();
        if std::mem::take(&mut self.exposed) {
            self.link.revoke_exposed();
        }
        self.out.clear();
        self.inq.clear();
    }
}

struct OutMsg {
    hdr: [u8; HEADER_LEN],
    kind: FrameKind,
    /// Data frames: the payload. Rendezvous frames: the data the peer will read.
    data: *const u8,
    len: usize,
    /// Rendezvous payload (see [`single_copy::DESC_FIXED`]) and its length.
    desc: [u8; DESC_MAX],
    desc_len: usize,
    sent: usize,
    /// A forward: the gate saying how many bytes of `data` are final (reduced) yet.
    /// None: all of them.
    gate: Option<usize>,
}

impl OutMsg {
    fn payload(&self) -> &[u8] {
        match self.kind {
            FrameKind::Rendezvous => &self.desc[..self.desc_len],
            FrameKind::Data => {
                // SAFETY: data..data+len is inside a live buffer region (see execute()).
                unsafe { std::slice::from_raw_parts(self.data, self.len) }
            }
            _ => &[],
        }
    }

    fn ack(call: &CallInfo) -> OutMsg {
        let hdr = Header::control(FrameKind::Ack, call.comm_id, call.epoch, 0).encode();
        OutMsg {
            hdr,
            kind: FrameKind::Ack,
            data: std::ptr::null(),
            len: 0,
            desc: [0; DESC_MAX],
            desc_len: 0,
            sent: 0,
            gate: None,
        }
    }
}

struct InMsg {
    len: usize,
    dst: *mut u8,
    /// Local operand for receive-reduce (may equal dst); None for plain receives.
    src: Option<*const u8>,
    /// Element type and combining operator of a receive-reduce.
    dtype: DType,
    op: ReduceOp,
    got: usize,
    reduced: usize,
    started: bool,
    /// Plain receive part of a long transfer: copy out with non-temporal stores.
    stream: bool,
    /// The bytes of an element split by the end of a ring's data area, gathered
    /// before it is reduced (zero-copy receive only).
    carry: [u8; 8],
    carry_len: usize,
    /// Rendezvous descriptor bytes read so far.
    desc: [u8; DESC_MAX],
    desc_got: usize,
    /// The gate this receive-reduce opens for its forward.
    feeds: Option<usize>,
    /// The sequence number and signature the frames of this receive must carry.
    seq: u64,
    sig: CallSig,
}

impl InMsg {
    fn new(dst: *mut u8, src: Option<*const u8>, len: usize, dtype: DType, op: ReduceOp) -> InMsg {
        InMsg {
            len,
            dst,
            src,
            dtype,
            op,
            got: 0,
            reduced: 0,
            started: false,
            stream: false,
            carry: [0; 8],
            carry_len: 0,
            desc: [0; DESC_MAX],
            desc_got: 0,
            feeds: None,
            seq: 0,
            sig: CallSig::new(crate::types::OpKind::Barrier, DType::U8, 0, 0, ReduceOp::Sum),
        }
    }
}

/// (offset, length) of the frames a transfer of `len` bytes is cut into. Both ends
/// compute the same cut from the length alone; each frame then goes as data or, the
/// sender's choice, as a rendezvous, which the receiver sees from its kind. A
/// zero-length transfer is one empty frame (barrier messages).
/// The cut is that of the gates' pieces ([`super::channel::pieces`]).
fn frames(len: usize) -> impl Iterator<Item = (usize, usize)> {
    super::channel::pieces(len)
}

#[cfg(test)]
mod tests;
