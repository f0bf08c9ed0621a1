//! The request layer under the round loop: one [`PeerChannel`] per peer.
//!
//! The executor turns each step of a round into requests on the channels of the
//! peers it names — [`PeerChannel::post_send`] of a region,
//! [`PeerChannel::post_recv`] into a region, optionally combined with a local
//! operand as it lands ([`Reduction`]) — and then drives every channel with
//! [`PeerChannel::progress`] until none is [`busy`](PeerChannel::busy). Deadlines,
//! waiting (spin, yield, sleep, `poll(2)` on the descriptors channels name in
//! [`PeerChannel::readiness`]), the abort flag and the mapping of failures to
//! errors stay in the executor; how bytes move is the channel's business.
//!
//! A receive-reduce that feeds a forward (`RecvReduceSend`) opens *gates*: entries
//! of a slice the executor owns for the round, which the receiving channel raises
//! as the reduction advances and the forwarding channel reads before it sends.
//! Gates work across channels of different kinds because they are plain counters.
//!
//! Every region names its memory kind ([`MemKind`]). The first implementation,
//! [`StreamChannel`](super::stream::StreamChannel), moves host memory over the
//! byte-stream [`Link`](crate::transport::Link)s (TCP, shared-memory rings,
//! in-process rings) and refuses device memory with [`Error::Unsupported`]. The
//! CUDA and RDMA transports will implement this same trait: a CUDA channel posts
//! device-to-device or staged copies on a stream and completes reductions with
//! kernels; a verbs channel posts work requests on a queue pair and reports
//! completions from its completion queue.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::frame::{FrameKind, Header};
use crate::transport::TransportKind;
use crate::types::{DType, ReduceOp};

use super::call::CallInfo;
use super::wait_slot::WaitSlot;

/// Largest payload of one frame. Long transfers are cut into segments of this size
/// so a receiver can reduce one while the next is in flight.
pub const SEGMENT_BYTES: usize = 1 << 20;
/// Gates count the final bytes of pieces of this size: piece `k` of a region is
/// `[k * PIECE_BYTES, min((k + 1) * PIECE_BYTES, len))`, and a zero-length region is
/// one empty piece. Every channel cuts regions this way, so a forward on one channel
/// can follow a receive on another.
pub const PIECE_BYTES: usize = SEGMENT_BYTES;

/// The `(offset, length)` of the pieces of a region of `len` bytes (see [`PIECE_BYTES`]).
pub fn pieces(len: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = len.div_ceil(PIECE_BYTES).max(1);
    (0..n).map(move |i| (i * PIECE_BYTES, (len - i * PIECE_BYTES).min(PIECE_BYTES)))
}

/// Where the memory of a region lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Ordinary host memory of this process.
    Host,
    /// Host memory in a segment registered with braid (a peer on the same host may
    /// map it; a verbs channel would have it registered with the device).
    /// Nothing builds it yet: registered buffers reach the executor as `Host` (they
    /// are found by address); kept for channels that will treat them apart.
    #[allow(dead_code)]
    RegisteredHost,
    /// Memory of an accelerator ([`crate::device::Device`]); the pointer is a device
    /// address. Host channels move it through a
    /// [`StagedChannel`](super::staged::StagedChannel).
    Device,
}

impl MemKind {
    /// Whether the CPU can address the memory directly (host or registered host).
    #[inline]
    pub const fn is_host(self) -> bool {
        matches!(self, MemKind::Host | MemKind::RegisteredHost)
    }
}

/// A contiguous piece of one of the call's buffers.
///
/// The executor builds regions only from the call's buffers, bounds-checked
/// against their lengths; the caller of [`execute`](super::execute) keeps them
/// alive and unaliased for the whole call, and the channel forgets them in
/// [`PeerChannel::end_call`].
#[derive(Clone, Copy, Debug)]
pub struct MemRegion {
    /// First byte.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
    /// Where the memory lives.
    pub kind: MemKind,
}

/// Combine received data with a local operand as it lands: `dst = src ⊕ received`.
#[derive(Clone, Copy, Debug)]
pub struct Reduction {
    /// The local operand: the destination itself or a region disjoint from it, of
    /// the destination's length.
    pub src: MemRegion,
    /// The combining operator (Avg is finalised later; channels see Sum).
    pub op: ReduceOp,
    /// Element type.
    pub dtype: DType,
}

/// How the executor may block on a channel that cannot make progress now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Nothing to poll (memory channels): the executor yields or sleeps.
    NoFd,
    /// Poll `fd` for `events` (`POLLIN`/`POLLOUT`; zero: nothing to wait for here).
    Fd {
        /// The descriptor.
        fd: RawFd,
        /// Requested poll events.
        events: i16,
    },
}

/// What a peer's link holds next, as [`PeerChannel::next_data_frame`] finds it.
#[derive(Clone, Copy, Debug)]
pub enum NextFrame {
    /// No complete data header yet.
    Nothing,
    /// The header of the next data frame, whose payload waits in the link.
    Data(Header),
    /// The peer closed its communicator in order after everything it sent was
    /// read: it will send nothing more.
    Closed,
}

/// One peer's end of the transfers of a call.
///
/// Posted requests complete in posting order per direction; a call's requests are
/// all complete when [`busy`](Self::busy) turns false after a [`progress`](Self::progress).
pub trait PeerChannel: Send {
    /// What carries the bytes.
    fn kind(&self) -> TransportKind;

    /// Post a send of `src` to the peer. With `first_gate`, this is a forward: its
    /// `k`-th piece goes out only as far as `gates[first_gate + k]` says is final
    /// (the pieces are those a receive posted with `forward` opened, in order).
    fn post_send(&mut self, src: MemRegion, first_gate: Option<usize>, call: &CallInfo) -> Result<()>;

    /// Post a receive of `dst.len` bytes from the peer into `dst`, combined with
    /// `reduce` if given. With `forward`, each piece (a [`PIECE_BYTES`] cut of `dst`)
    /// pushes a gate onto it and raises that gate, in bytes, as the piece becomes
    /// final: as it is reduced, or for a plain receive as it lands.
    fn post_recv(
        &mut self,
        dst: MemRegion,
        reduce: Option<Reduction>,
        forward: Option<&mut Vec<usize>>,
        call: &CallInfo,
    ) -> Result<()>;

    /// Move whatever can move without blocking; complete requests. `peer` is this
    /// channel's peer rank (for errors). Returns whether anything moved.
    fn progress(&mut self, peer: usize, gates: &mut [usize], call: &CallInfo) -> Result<bool>;

    /// Whether posted requests (or protocol duties such as acknowledgements) remain.
    fn busy(&self) -> bool;

    /// Whether bytes this side wrote still wait unread by the peer, where the
    /// transport can tell (`false` where it cannot).
    fn sent_unread(&self) -> bool {
        false
    }

    /// What to wait on when nothing moved.
    fn readiness(&self, gates: &[usize]) -> Readiness;

    /// Best effort until `give_up`: tell the peer why this rank stops (`Abort`) or
    /// that it leaves (`Goodbye`), then close the sending side.
    fn send_control_and_close(&mut self, kind: FrameKind, comm_id: u32, epoch: u8, reason: &str, give_up: Instant);

    /// Whether the peer is known to be gone without a word (its process died or
    /// its link was dropped), looked at without blocking: evidence for the
    /// survivors' agreement ([`crate::Communicator::agree`]). False when unknown.
    fn peer_gone(&mut self) -> bool {
        false
    }

    /// Every receive from the peer that this call will post is posted (the
    /// executor says so in the round of the last one, before driving it). A
    /// channel that maps the peer's memory closes those mappings once the work
    /// reading them is done and before it acknowledges the last piece: the peer's
    /// call waits for that acknowledgement, so it cannot return (and its user
    /// free the memory) while this side still has it mapped. Others ignore it.
    fn last_receives_posted(&mut self) {}

    /// Said just before a plain send is posted: whether the same round also
    /// receives plain data from that peer (an exchange, both ranks busy moving
    /// bytes). A channel that can read the peer's memory may then send the data
    /// single-copy where a one-way transfer goes faster through its ring (see
    /// `stream::single_copy`). Others ignore it.
    fn next_send_is_exchange(&mut self, _exchange: bool) {}

    /// The channel's part in asking whom a peer waits for when a call times out
    /// (see [`super::wait_chain`]); None where the link cannot carry the question.
    fn wait_slot(&mut self) -> Option<&mut WaitSlot> {
        None
    }

    /// For a receive from any source, with nothing posted: read what the peer sent
    /// up to the header of its next data frame and leave that frame (header read,
    /// payload untouched) for the receive that will take it. Control frames on the
    /// way are handled as a call's progress handles them. Links that cannot stop
    /// between a header and its payload refuse (the default).
    fn next_data_frame(&mut self, peer: usize, call: &CallInfo) -> Result<NextFrame> {
        Err(Error::Unsupported(format!(
            "{}: a receive from any source cannot look at the next frame from rank {peer} on a {} link",
            call.ctx,
            self.kind()
        )))
    }

    /// The call ends (however it ends): revoke whatever the peer was allowed to read
    /// of this call's buffers and forget every posted request.
    fn end_call(&mut self);
}

/// The error a channel that moves only host memory returns for any other region:
/// `what` (e.g. "a send to") names the operation, `peer` and `kind` the link.
pub fn require_host(region: &MemRegion, what: &str, peer: usize, kind: TransportKind, call: &CallInfo) -> Result<()> {
    if region.kind.is_host() {
        return Ok(());
    }
    Err(Error::Unsupported(format!(
        "{}: {what} rank {peer} of {} bytes is in device memory, and a {kind} link moves host memory only",
        call.ctx, region.len
    )))
}

/// The channels of a communicator, indexed by peer rank (None: no link to it).
pub type Channels<'a> = [Option<Box<dyn PeerChannel + 'a>>];

/// Block in poll(2) until a channel with work is ready. Returns false when some
/// channel has no descriptor, so the caller must sleep instead.
pub(crate) fn block_on_fds(channels: &Channels, gates: &[usize], max: Duration) -> bool {
    let mut fds = Vec::with_capacity(channels.len());
    for ch in channels.iter().flatten() {
        match ch.readiness(gates) {
            Readiness::NoFd => return false,
            Readiness::Fd { events: 0, .. } => {}
            Readiness::Fd { fd, events } => fds.push(libc::pollfd { fd, events, revents: 0 }),
        }
    }
    if fds.is_empty() {
        return false;
    }
    let ms = max.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: fds is a valid array of pollfd for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    true
}
