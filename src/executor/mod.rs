//! The executor: the one place a [`Schedule`] meets links.
//!
//! It frames every transfer into segments (a header plus at most
//! [`SEGMENT_BYTES`] of payload), drives all transfers of a round without blocking,
//! receives plain copies straight into their destination and reduces incoming
//! data from a staging chunk as it arrives (so reduction overlaps the transfer),
//! validates every header against the call this rank is making, and waits —
//! spinning briefly, then blocking in `poll(2)` or sleeping — under a deadline that
//! restarts whenever any byte moves.
//!
//! A [`Step::RecvReduceSend`] queues its receive-reduce and its forward together:
//! each forwarded frame is written as far as its reduction has got (a gate per
//! frame), so the result leaves while it is still in cache. On shared-memory and
//! in-process links incoming data is reduced straight out of the ring
//! ([`Link::peek`]), and long plain receives are copied out with non-temporal stores.
//!
//! On links that can read the peer's memory ([`Link::can_read_peer`]: shared memory
//! between processes, threads of one process) a frame of a transfer of at least
//! [`RENDEZVOUS_BYTES`] may be sent as a *rendezvous* — between processes only
//! from registered buffers, unless `BRAID_CMA=1` — a small frame with the address of
//! the data. The receiver copies (or reduces) straight from the sender's memory in
//! cache-sized chunks and answers with an ack; the sender's round ends only after
//! the ack, so its buffer stays valid while it is read. One copy instead of two.
//! A call that ends early (a timeout, a mismatch, an abort) revokes what it exposed
//! ([`Link::revoke_exposed`]) before returning, so a peer that reads late gets an
//! error instead of memory its owner has freed.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::algorithm::{BufId, Region, Schedule, Step};
use crate::error::{Error, OpContext, Result};
use crate::frame::{FrameKind, Header, HEADER_LEN};
use crate::reduce;
use crate::registered::SegmentCache;

mod inbound;
mod outbound;
pub(crate) mod single_copy;
use crate::transport::Link;
use crate::types::{CallSig, DType, ReduceOp};
use inbound::progress_recv;
use outbound::{frame_parts, progress_send, queue_send, writable};
use single_copy::{SingleCopy, DESC_MAX};

/// Largest payload of one frame. Long transfers are cut into segments of this size
/// so a receiver can reduce one while the next is in flight.
pub const SEGMENT_BYTES: usize = 1 << 20;
/// Incoming data is reduced in grains of this size as soon as it has arrived.
const REDUCE_GRAIN: usize = 64 << 10;
/// Receives at least this long, whose destination will not stay in cache anyway,
/// are copied out of shared rings with non-temporal stores: that skips reading each
/// destination line before overwriting it (a quarter of the memory traffic).
const STREAM_RECV_BYTES: usize = 4 << 20;
/// Transfers at least this long go single-copy on links that can read peer memory.
pub const RENDEZVOUS_BYTES: usize = 128 << 10;
/// After spinning, links without a descriptor to poll keep yielding this long
/// before they start to sleep.
const YIELD_PHASE: Duration = Duration::from_millis(2);
/// With more ranks than cores, waiting ranks keep yielding (a peer that needs the
/// core is likely runnable) for up to this long before they sleep.
const LONG_IDLE: Duration = Duration::from_millis(100);
/// How long a rank that fails or closes keeps trying to hand its peers an abort
/// or goodbye frame through full links, all links together.
pub const CONTROL_GRACE: Duration = Duration::from_millis(200);
/// Longest an abort message may be.
const MAX_REASON: usize = 64 << 10;

/// How a rank waits when no link can make progress.
#[derive(Clone, Copy, Debug)]
pub struct WaitPolicy {
    /// Keep polling links without sleeping for this long after the last progress.
    pub spin: Duration,
    /// Yield the CPU between polls while spinning (more ranks than cores).
    pub yield_while_spinning: bool,
}

impl WaitPolicy {
    /// Spin 200 µs on a machine with a core per rank; yield while spinning otherwise.
    pub fn for_ranks(local_ranks: usize) -> WaitPolicy {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        WaitPolicy { spin: Duration::from_micros(200), yield_while_spinning: local_ranks > cores }
    }
}

/// Receive-side framing state of a channel.
enum Rx {
    /// Reading a header; `have` bytes of it are in `hdr`.
    Header { have: usize },
    /// A data header has been read and awaits the receive step it belongs to.
    Ready(Header),
    /// Reading an abort frame's reason.
    Reason { want: usize, buf: Vec<u8> },
    /// Skipping the padding after a payload.
    Pad { left: usize },
    /// The peer said goodbye and closed: fine until something is expected from it.
    Closed,
}

/// A link plus the framing state that survives between operations.
pub struct Channel {
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
    /// Rendezvous frames sent whose ack has not arrived.
    acks_awaited: usize,
    /// Rendezvous reads finished whose ack is still to be sent.
    acks_owed: usize,
    /// The peer's registered segments mapped so far (until their owner frees them).
    peer_segments: SegmentCache,
    /// Whether this call exposed memory on the link ([`Link::expose`]), to revoke.
    exposed: bool,
}

impl Channel {
    /// Wrap a connected link.
    pub fn new(link: Box<dyn Link>) -> Channel {
        Channel {
            single_copy: SingleCopy::for_link(link.as_ref()),
            peek: link.can_peek(),
            forward_grain: if link.can_peek() { outbound::FORWARD_GRAIN } else { usize::MAX },
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
        }
    }

    /// The link's transport kind.
    pub fn kind(&self) -> crate::transport::TransportKind {
        self.link.kind()
    }

    /// Best effort, bounded in time: send a control frame (abort or goodbye), then
    /// close the sending side. Used when this rank fails or closes.
    /// `give_up` is shared by all the channels a rank closes at once, so closing
    /// many full links still takes at most [`CONTROL_GRACE`] in all.
    pub fn send_control_and_close(&mut self, kind: FrameKind, comm_id: u32, epoch: u8, reason: &str, give_up: Instant) {
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
}

/// Raw views of the operation's buffers. The caller guarantees they stay valid and
/// unaliased (except as the in-place rules say) for the whole execution.
pub struct Buffers {
    /// Input base pointer (may equal or point into Output for in-place calls).
    pub input: *const u8,
    /// Input length in bytes.
    pub input_len: usize,
    /// Output base pointer.
    pub output: *mut u8,
    /// Output length in bytes.
    pub output_len: usize,
    /// Executor scratch; resized to the schedule's need.
    pub scratch: Vec<u8>,
}

impl Buffers {
    fn ptr(&mut self, r: &Region) -> Result<*mut u8> {
        let (base, len) = match r.buf {
            BufId::Input => (self.input as *mut u8, self.input_len),
            BufId::Output => (self.output, self.output_len),
            BufId::Scratch => (self.scratch.as_mut_ptr(), self.scratch.len()),
        };
        if r.end() > len {
            return Err(Error::InvalidArgument(format!(
                "schedule region {:?} [{}..{}) exceeds its buffer of {len} bytes",
                r.buf,
                r.offset,
                r.end()
            )));
        }
        // SAFETY: the offset is within the buffer (checked above).
        Ok(unsafe { base.add(r.offset) })
    }
}

/// Everything the executor needs to know about the call.
pub struct CallInfo {
    /// Reporting context (rank, call, sequence number).
    pub ctx: OpContext,
    /// The call's signature, checked against every incoming data frame.
    pub sig: CallSig,
    /// Sequence number carried in outgoing frames.
    pub send_seq: u64,
    /// Sequence number expected in incoming frames.
    pub recv_seq: u64,
    /// Communicator id and epoch, carried and checked.
    pub comm_id: u32,
    /// Communicator epoch.
    pub epoch: u8,
    /// Element type and combining operator for receive-reduce steps.
    pub dtype: DType,
    /// Reduce operator (Avg combines as Sum and is finalised by the caller).
    pub reduce_op: ReduceOp,
    /// No-progress deadline.
    pub timeout: Duration,
    /// How to wait.
    pub wait: WaitPolicy,
    /// Set from another thread to abort the call: checked once per pass of the
    /// transfer loop, which then returns [`Error::Aborted`].
    pub aborted: Arc<AtomicBool>,
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
    /// A forward: the [`Queues::gates`] entry saying how many bytes of `data` are
    /// final (reduced) yet. None: all of them.
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
    /// The [`Queues::gates`] entry this receive-reduce opens for its forward.
    feeds: Option<usize>,
}

/// Per-peer transfer queues, kept between calls so a call allocates nothing.
#[derive(Default)]
pub struct Queues {
    out: Vec<VecDeque<OutMsg>>,
    inq: Vec<VecDeque<InMsg>>,
    /// Per forwarded frame of the round: bytes reduced so far (may go out).
    gates: Vec<usize>,
}

// SAFETY: the queues hold raw pointers only during `execute`, which empties them
// before returning (on success, on error and on panic alike: see `CallEnd`).
unsafe impl Send for Queues {}

/// Run `schedule` over `channels` (indexed by peer rank) with `bufs`.
///
/// # Safety
/// `bufs.input` must be valid for reads of `bufs.input_len` bytes and `bufs.output`
/// for reads and writes of `bufs.output_len` bytes for the whole call, and nothing
/// else may access them meanwhile (input and output may alias only as the in-place
/// layouts of the communicator say). Every region the schedule names is bounds-checked
/// against these lengths; the pointers themselves cannot be.
pub unsafe fn execute(
    schedule: &Schedule,
    channels: &mut [Option<Channel>],
    queues: &mut Queues,
    bufs: &mut Buffers,
    call: &CallInfo,
) -> Result<()> {
    if bufs.scratch.len() < schedule.scratch_bytes {
        bufs.scratch.resize(schedule.scratch_bytes, 0);
    }
    queues.out.resize_with(channels.len(), VecDeque::new);
    queues.inq.resize_with(channels.len(), VecDeque::new);
    let end = CallEnd { channels, queues };
    run_rounds(schedule, end.channels, end.queues, bufs, call)
}

/// Ends a call's hold on its buffers however `execute` leaves it (success, error or
/// panic): revokes what the peers were allowed to read, so a peer that reads late
/// gets an error instead of freed memory, and forgets the queued pointers.
struct CallEnd<'a> {
    channels: &'a mut [Option<Channel>],
    queues: &'a mut Queues,
}

impl Drop for CallEnd<'_> {
    fn drop(&mut self) {
        for ch in self.channels.iter_mut().flatten() {
            if std::mem::take(&mut ch.exposed) {
                ch.link.revoke_exposed();
            }
        }
        self.queues.out.iter_mut().for_each(VecDeque::clear);
        self.queues.inq.iter_mut().for_each(VecDeque::clear);
    }
}

fn run_rounds(
    schedule: &Schedule,
    channels: &mut [Option<Channel>],
    queues: &mut Queues,
    bufs: &mut Buffers,
    call: &CallInfo,
) -> Result<()> {
    for round in &schedule.rounds {
        queues.gates.clear();
        for step in &round.steps {
            match *step {
                Step::Copy { src, dst } => local_copy(bufs, &src, &dst)?,
                Step::Reduce { src, dst } => local_reduce(bufs, &src, &dst, call)?,
                Step::Send { peer, src } => {
                    let base = bufs.ptr(&src)? as *const u8;
                    queue_send(channels, queues, call, peer, base, src.len, None)?;
                }
                Step::Recv { peer, dst } => {
                    link_single_copy(channels, peer, call)?;
                    let base = bufs.ptr(&dst)?;
                    for (off, len) in frames(dst.len) {
                        // SAFETY: off + len <= dst.len, inside the region checked by ptr().
                        let mut m = InMsg::new(unsafe { base.add(off) }, None, len);
                        m.stream = dst.len >= STREAM_RECV_BYTES;
                        queues.inq[peer].push_back(m);
                    }
                }
                Step::RecvReduce { peer, src, dst } => {
                    queue_recv_reduce(channels, queues, bufs, call, peer, (&src, &dst), false)?;
                }
                Step::RecvReduceSend { peer, src, dst, to } => {
                    let first_gate = queues.gates.len();
                    queue_recv_reduce(channels, queues, bufs, call, peer, (&src, &dst), true)?;
                    let base = bufs.ptr(&dst)? as *const u8;
                    queue_send(channels, queues, call, to, base, dst.len, Some(first_gate))?;
                }
            }
        }
        run_transfers(channels, queues, call)?;
    }
    Ok(())
}

/// Queue the frames of a receive-reduce (`dst = src ⊕ received`); with `forward`,
/// each frame opens a gate of [`Queues::gates`] as it is reduced.
fn queue_recv_reduce(
    channels: &[Option<Channel>],
    queues: &mut Queues,
    bufs: &mut Buffers,
    call: &CallInfo,
    peer: usize,
    (src, dst): (&Region, &Region),
    forward: bool,
) -> Result<()> {
    if src.len != dst.len || (src.overlaps(dst) && src != dst) {
        return Err(Error::InvalidArgument(format!("bad receive-reduce regions {src:?} {dst:?}")));
    }
    link_single_copy(channels, peer, call)?;
    let d = bufs.ptr(dst)?;
    let s = bufs.ptr(src)? as *const u8;
    for (off, len) in frames(dst.len) {
        // SAFETY: off + len <= dst.len == src.len, inside the regions checked by ptr().
        let mut m = InMsg::new(unsafe { d.add(off) }, Some(unsafe { s.add(off) }), len);
        if forward {
            m.feeds = Some(queues.gates.len());
            queues.gates.push(0);
        }
        queues.inq[peer].push_back(m);
    }
    Ok(())
}

impl InMsg {
    fn new(dst: *mut u8, src: Option<*const u8>, len: usize) -> InMsg {
        InMsg {
            len,
            dst,
            src,
            got: 0,
            reduced: 0,
            started: false,
            stream: false,
            carry: [0; 8],
            carry_len: 0,
            desc: [0; DESC_MAX],
            desc_got: 0,
            feeds: None,
        }
    }
}

/// Which transfers with `peer` may go single-copy; an error if there is no link.
fn link_single_copy(channels: &[Option<Channel>], peer: usize, call: &CallInfo) -> Result<SingleCopy> {
    match channels.get(peer) {
        Some(Some(ch)) => Ok(ch.single_copy),
        _ => Err(no_link(peer, call)),
    }
}

/// The channel to `peer`; an error if there is no link.
fn channel_mut<'a>(channels: &'a mut [Option<Channel>], peer: usize, call: &CallInfo) -> Result<&'a mut Channel> {
    channels.get_mut(peer).and_then(Option::as_mut).ok_or_else(|| no_link(peer, call))
}

fn no_link(peer: usize, call: &CallInfo) -> Error {
    Error::InvalidArgument(format!("{}: schedule names rank {peer}, which has no link", call.ctx))
}

/// (offset, length) of the frames a transfer of `len` bytes is cut into. Both ends
/// compute the same cut from the length alone; each frame then goes as data or, the
/// sender's choice, as a rendezvous, which the receiver sees from its kind. A
/// zero-length transfer is one empty frame (barrier messages).
fn frames(len: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = len.div_ceil(SEGMENT_BYTES).max(1);
    (0..n).map(move |i| (i * SEGMENT_BYTES, (len - i * SEGMENT_BYTES).min(SEGMENT_BYTES)))
}

fn local_copy(bufs: &mut Buffers, src: &Region, dst: &Region) -> Result<()> {
    let s = bufs.ptr(src)? as *const u8;
    let d = bufs.ptr(dst)?;
    if !std::ptr::eq(s, d) && src.len > 0 {
        // SAFETY: both ranges are inside their buffers; `copy` tolerates overlap.
        unsafe { std::ptr::copy(s, d, src.len.min(dst.len)) };
    }
    Ok(())
}

fn local_reduce(bufs: &mut Buffers, src: &Region, dst: &Region, call: &CallInfo) -> Result<()> {
    let s = bufs.ptr(src)? as *const u8;
    let d = bufs.ptr(dst)?;
    if src.len != dst.len || src.overlaps(dst) {
        return Err(Error::InvalidArgument(format!("bad local reduce regions {src:?} {dst:?}")));
    }
    // SAFETY: disjoint in-bounds ranges of live buffers.
    let (acc, inc) = unsafe { (std::slice::from_raw_parts_mut(d, dst.len), std::slice::from_raw_parts(s, src.len)) };
    reduce::reduce_inplace(call.dtype, call.reduce_op.combiner(), acc, inc)
}

fn peer_error(call: &CallInfo, peer: usize, said_goodbye: bool, e: io::Error) -> Error {
    let detail = if said_goodbye {
        "it closed its communicator".to_string()
    } else if e.kind() == io::ErrorKind::UnexpectedEof {
        "connection closed: the process exited or was killed".to_string()
    } else {
        e.to_string()
    };
    Error::PeerLost { ctx: call.ctx.clone(), peer, detail }
}

/// Drive every queued transfer to completion.
fn run_transfers(channels: &mut [Option<Channel>], queues: &mut Queues, call: &CallInfo) -> Result<()> {
    let Queues { out: outq, inq, gates } = queues;
    // The clock is read only once waiting begins: a transfer that completes on
    // the first passes never pays for it.
    let mut last_progress: Option<Instant> = None;
    let mut sleep = Duration::from_micros(5);
    loop {
        // A plain load: this is the hot loop. Every wait below is bounded (100 ms
        // in poll, 1 ms asleep), so an abort is seen well within a second.
        if call.aborted.load(Ordering::Relaxed) {
            return Err(Error::Aborted { rank: call.ctx.rank, call: Some(call.sig) });
        }
        let mut progressed = false;
        let mut pending = false;
        for peer in 0..channels.len() {
            let Some(ch) = channels[peer].as_mut() else { continue };
            progressed |= progress_send(ch, &mut outq[peer], gates, call)
                .map_err(|e| peer_error(call, peer, ch.said_goodbye, e))?;
            progressed |= progress_recv(ch, peer, &mut inq[peer], gates, call)?;
            pending |= busy(ch, &outq[peer], &inq[peer]);
        }
        if !pending {
            return Ok(());
        }
        if progressed {
            last_progress = None;
            sleep = Duration::from_micros(5);
            continue;
        }
        let now = Instant::now();
        let idle = now - *last_progress.get_or_insert(now);
        if idle >= call.timeout {
            let waiting_on = (0..channels.len())
                .filter(|&p| channels[p].as_ref().is_some_and(|ch| busy(ch, &outq[p], &inq[p])))
                .collect();
            return Err(Error::Timeout { ctx: call.ctx.clone(), timeout: call.timeout, waiting_on });
        }
        if idle < call.wait.spin {
            if call.wait.yield_while_spinning {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        let left = call.timeout - idle;
        if !block_on_fds(channels, outq, inq, gates, left.min(Duration::from_millis(100))) {
            // No descriptors to poll (memory links): yield for a while — cheap when
            // ranks outnumber cores, since a peer is likely runnable — then back off.
            // Oversubscribed, a peer needing this core is likely runnable: keep
            // yielding to it (as Open MPI does) rather than sleeping past its reply.
            // Past LONG_IDLE the peer is computing, not replying: stop burning the core.
            let yielding = if call.wait.yield_while_spinning { LONG_IDLE } else { YIELD_PHASE };
            if idle < call.wait.spin + yielding {
                std::thread::yield_now();
            } else {
                std::thread::sleep(sleep.min(left));
                sleep = (sleep * 2).min(Duration::from_millis(1));
            }
        }
    }
}

/// Block in poll(2) until a link with queued work is ready. Returns false when some
/// link has no descriptor, so the caller must sleep instead.
fn block_on_fds(
    channels: &[Option<Channel>],
    outq: &[VecDeque<OutMsg>],
    inq: &[VecDeque<InMsg>],
    gates: &[usize],
    max: Duration,
) -> bool {
    let mut fds = Vec::with_capacity(channels.len());
    for (peer, ch) in channels.iter().enumerate() {
        let Some(ch) = ch else { continue };
        let Some(fd) = ch.link.poll_fd() else { return false };
        let mut events = 0;
        // A forward waiting for its reduction waits on input, not on the socket.
        if outq[peer].front().is_some_and(|m| writable(m, gates, ch.forward_grain) > m.sent) || ch.acks_owed > 0 {
            events |= libc::POLLOUT;
        }
        // Watch input when a receive or an ack is awaited, or (idle) for an abort
        // or EOF — but not when a complete header already waits for its step.
        if !inq[peer].is_empty() || ch.acks_awaited > 0 || matches!(ch.rx, Rx::Header { .. } | Rx::Reason { .. }) {
            events |= libc::POLLIN;
        }
        if events != 0 {
            fds.push(libc::pollfd { fd, events, revents: 0 });
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

/// Whether a channel still has work in this round.
fn busy(ch: &Channel, out: &VecDeque<OutMsg>, inq: &VecDeque<InMsg>) -> bool {
    !out.is_empty() || !inq.is_empty() || ch.acks_awaited > 0 || ch.acks_owed > 0
}
