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

pub use super::channel::SEGMENT_BYTES;
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
mod peer;
mod rendezvous;
pub(crate) mod single_copy;
use rendezvous::{SingleCopy, DESC_MAX};

/// Incoming data is reduced in grains of this size as soon as it has arrived.
const REDUCE_GRAIN: usize = 64 << 10;
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
    /// Under `BRAID_CMA=auto`, the communicator's switch saying whether exchanges
    /// of plain buffers go single-copy now (its call tuner times both ways);
    /// `None`: they always do where [`SingleCopy::Exchanges`] allows.
    exchange_switch: Option<crate::transport::stream_copy::TunerSwitch>,
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
            exchange_switch: None,
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
    /// Follow `switch` for whether exchanges of plain buffers go single-copy, on a
    /// link where they can ([`SingleCopy::Exchanges`]); elsewhere nothing changes.
    pub fn time_exchanges(&mut self, switch: &crate::transport::stream_copy::TunerSwitch) {
        if self.single_copy == SingleCopy::Exchanges {
            self.exchange_switch = Some(switch.clone());
        }
    }

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
