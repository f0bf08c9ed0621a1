//! The executor: the one place a [`Schedule`] meets the peers.
//!
//! It turns each round's steps into requests on per-peer channels (the
//! [`PeerChannel`] trait of [`channel`]: post a send, post a receive with an
//! optional reduction, progress, completions), drives all transfers of a round
//! without blocking, and waits — spinning briefly, then blocking in `poll(2)` on
//! the descriptors the channels name, or yielding and sleeping — under a deadline
//! that restarts whenever anything moves. The abort flag, the no-progress timeout
//! and the mapping of failures to errors live here, whatever carries the bytes.
//!
//! A [`Step::RecvReduceSend`] posts its receive-reduce and its forward together:
//! the receive opens a gate per piece (a counter of final bytes in a slice the
//! executor owns for the round) and the forward, possibly on another channel,
//! sends each piece only as far as its gate says.
//!
//! A call on device buffers wraps each peer's channel for the call: in a
//! [`peer_copy::PeerCopyChannel`] (the peer's device reads this one's memory
//! directly) for the peers [`Buffers::peer_copy`] marks, in a
//! [`staged::StagedChannel`] (through host staging buffers) for the others. In
//! the round that posts a call's last receive from a peer, the executor says so
//! ([`PeerChannel::last_receives_posted`]): a single-copy channel then closes the
//! peer's mappings before its last acknowledgement, which the peer's call waits for.
//!
//! The channel today is [`StreamChannel`] over the byte-stream links (framing,
//! single copy, zero-copy reduction out of shared rings: see [`stream`]); CUDA and
//! RDMA channels will implement the same trait. A call that ends however it ends
//! calls [`PeerChannel::end_call`] on every channel, which revokes what the peers
//! were allowed to read of this call's buffers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::algorithm::{BufId, Region, Round, Schedule, Step};
use crate::device::{Device, DeviceBuffer, DevicePtr, PeerProcess};
use crate::error::{Error, Result};
use crate::reduce;

pub mod any_source;
pub mod call;
mod call_maps;
pub mod channel;
pub mod group;
pub mod peer_copy;
pub mod segments;
pub mod staged;
pub mod stream;
pub mod wait_chain;
pub mod wait_slot;
pub use crate::error::{ChainEnd, WaitChain};
pub(crate) use call::peer_error;
pub use call::{CallFlags, CallInfo, PeerMark, RoundMark, WaitPolicy, CONTROL_GRACE};
use channel::block_on_fds;
pub use channel::{Channels, MemKind, MemRegion, PeerChannel, Reduction, SEGMENT_BYTES};
pub use stream::StreamChannel;

/// Idle passes of a spinning rank between two reads of the clock.
const PASSES_PER_CLOCK_READ: u32 = 16;
/// After spinning, links without a descriptor to poll keep yielding this long
/// before they start to sleep.
const YIELD_PHASE: Duration = Duration::from_millis(2);
/// With more ranks than cores, waiting ranks keep yielding (a peer that needs the
/// core is likely runnable) for up to this long before they sleep.
const LONG_IDLE: Duration = Duration::from_millis(100);
/// A rank moving data answers questions about its waits (see [`wait_chain`]) at
/// least every this many passes of the transfer loop, and on every idle clock read.
const PASSES_PER_ANSWER: u32 = 256;
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
    /// Executor scratch (host memory); resized to the schedule's need.
    pub scratch: Vec<u8>,
    /// Where this call's host scratch starts inside `scratch` (set by
    /// [`execute`], see [`alias_free_offset`]; callers pass 0).
    pub scratch_offset: usize,
    /// Where input and output live.
    pub kind: MemKind,
    /// The device of a call on device buffers (`kind` is then [`MemKind::Device`]
    /// and `input`/`output` are device addresses).
    pub device: Option<Arc<dyn Device>>,
    /// Scratch on that device, kept between calls; replaced when too small or of
    /// another device.
    pub device_scratch: Option<DeviceBuffer>,
    /// For a call on device buffers: the peers (by rank) whose devices map this
    /// device's memory and the other way round, reached by single-copy device
    /// transfers ([`peer_copy::PeerCopyChannel`]); every other peer is staged
    /// through host memory. Both ends of a pair must agree (the communicator
    /// decides from its bound devices). Each marked peer says where it runs, as
    /// the communicator established it (only a peer of this process may name
    /// addresses of it). None: stage everything.
    pub peer_copy: Option<Arc<[Option<PeerProcess>]>>,
    /// Input and output as separate host allocations laid end to end (an in-place
    /// call: both name them, and `input`/`output` only give their total length).
    /// The schedule must have been cut at their boundaries
    /// ([`segments::split_schedule`]): a region that crosses one is refused.
    pub segments: Option<segments::Segments>,
}

/// Slack the host scratch is allocated with, from which [`alias_free_offset`]
/// picks where it starts.
const SCRATCH_SLACK: usize = 4096;

/// Where in its slack the host scratch should start (a multiple of 512 below
/// [`SCRATCH_SLACK`]) so that it is as far as can be, modulo 4 KiB, from the
/// starts of the call's buffers. A loop that reads one buffer while storing to
/// another whose address agrees in the low 12 bits stalls on the CPU's false
/// store-to-load dependences ("4K aliasing"): a 2-rank 4 KiB direct all-reduce's
/// fold of Input into Scratch took 2.9 µs with the two 16 bytes apart modulo
/// 4096 and 0.5 µs otherwise (`braid perf`, timeline of rank 1, 2026-11-29).
fn alias_free_offset(scratch: usize, buffers: &[usize]) -> usize {
    let distance = |a: usize, b: usize| {
        let d = a.wrapping_sub(b) % 4096;
        d.min(4096 - d)
    };
    (0..SCRATCH_SLACK / 512)
        .map(|k| k * 512)
        .max_by_key(|&off| (buffers.iter().map(|&b| distance(scratch + off, b)).min().unwrap_or(0), usize::MAX - off))
        .unwrap_or(0)
}

impl Buffers {
    /// The bounds-checked region `r`, with its memory kind.
    fn region(&mut self, r: &Region) -> Result<MemRegion> {
        let kind = if r.buf == BufId::Scratch && self.device.is_none() { MemKind::Host } else { self.kind };
        Ok(MemRegion { ptr: self.ptr(r)?, len: r.len, kind })
    }

    /// The start of region `r`, bounds-checked: a host pointer, or for a call on
    /// device buffers a device address (in a pointer's clothing).
    pub(crate) fn ptr(&mut self, r: &Region) -> Result<*mut u8> {
        if let (Some(segs), BufId::Input | BufId::Output) = (&self.segments, r.buf) {
            return segs.locate(r.offset, r.len).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "schedule region {:?} [{}..{}) is not inside one of the {} parts of {} bytes",
                    r.buf,
                    r.offset,
                    r.end(),
                    segs.count(),
                    segs.total()
                ))
            });
        }
        let (base, len) = match r.buf {
            BufId::Input => (self.input as *mut u8, self.input_len),
            BufId::Output => (self.output, self.output_len),
            BufId::Scratch => match (&self.device, &self.device_scratch) {
                (Some(_), Some(d)) => (d.ptr() as usize as *mut u8, d.len()),
                (Some(_), None) => (std::ptr::null_mut(), 0),
                (None, _) => {
                    let off = self.scratch_offset.min(self.scratch.len());
                    // SAFETY: off <= len: inside the scratch vector (or one past its end).
                    (unsafe { self.scratch.as_mut_ptr().add(off) }, self.scratch.len() - off)
                }
            },
        };
        if r.end() > len {
            return Err(Error::InvalidArgument(format!(
                "schedule region {:?} [{}..{}) exceeds its buffer of {len} bytes",
                r.buf,
                r.offset,
                r.end()
            )));
        }
        // Wrapping: a device address is not a pointer into this process's memory.
        Ok(base.wrapping_add(r.offset))
    }
}

/// Executor state kept between calls so a call allocates nothing: the round's
/// forward gates (bytes of each forwarded piece reduced so far, may go out), and
/// for a call with single-copy peers the last round receiving from each peer.
#[derive(Default)]
pub struct Queues {
    gates: Vec<usize>,
    last_receive: Vec<Option<usize>>,
}

/// Run `schedule` over `channels` (indexed by peer rank) with `bufs`.
///
/// # Safety
/// `bufs.input` must be valid for reads of `bufs.input_len` bytes and `bufs.output`
/// for reads and writes of `bufs.output_len` bytes for the whole call, and nothing
/// else may access them meanwhile (input and output may alias only as the in-place
/// layouts of the communicator say). With `bufs.segments`, the same holds for every
/// part instead (the parts of one call never overlap). Every region the schedule
/// names is bounds-checked against these lengths (or found inside one part); the
/// pointers themselves cannot be.
pub unsafe fn execute(
    schedule: &Schedule,
    channels: &mut Channels,
    queues: &mut Queues,
    bufs: &mut Buffers,
    call: &CallInfo,
) -> Result<()> {
    let Some(device) = bufs.device.clone() else {
        // With slack, so the scratch can start where it does not alias the
        // call's buffers (see `alias_free_offset`).
        let need = if schedule.scratch_bytes > 0 { schedule.scratch_bytes + SCRATCH_SLACK } else { 0 };
        if bufs.scratch.len() < need {
            bufs.scratch.resize(need, 0);
        }
        // Once per call, not per region: the pointers do not move during it.
        bufs.scratch_offset = if need > 0 {
            alias_free_offset(bufs.scratch.as_ptr() as usize, &[bufs.input as usize, bufs.output as usize])
        } else {
            0
        };
        let end = CallEnd { channels };
        return run_rounds(schedule, end.channels, queues, bufs, call);
    };
    if bufs.kind != MemKind::Device {
        return Err(Error::InvalidArgument(format!("{}: a call with a device on host buffers", call.ctx)));
    }
    let fits = |d: &DeviceBuffer| d.len() >= schedule.scratch_bytes && Arc::ptr_eq(d.device(), &device);
    if schedule.scratch_bytes > 0 && !bufs.device_scratch.as_ref().is_some_and(fits) {
        bufs.device_scratch = None;
        bufs.device_scratch = Some(DeviceBuffer::new(&device, schedule.scratch_bytes)?);
    }
    let end = CallEnd { channels };
    // Each peer's channel, for this call: single-copy device transfers with the
    // peers whose devices map this one's memory, staging through the device's host
    // buffers with the others. Dropped before `end` (declared after it), so the
    // device is synchronized and the staging buffers and control slots are
    // withdrawn before the inner channels end the call.
    let single_copy = |p: usize| bufs.peer_copy.as_ref().and_then(|m| m.get(p).copied().flatten());
    let mut staged: Vec<Option<Box<dyn PeerChannel + '_>>> = end
        .channels
        .iter_mut()
        .enumerate()
        .map(|(p, ch)| {
            ch.as_mut().map(|c| {
                if let Some(process) = single_copy(p) {
                    Box::new(peer_copy::PeerCopyChannel::new(c.as_mut(), device.clone(), process))
                        as Box<dyn PeerChannel>
                } else {
                    Box::new(staged::StagedChannel::new(c.as_mut(), device.clone())) as Box<dyn PeerChannel>
                }
            })
        })
        .collect();
    run_rounds(schedule, &mut staged, queues, bufs, call)
}

/// Ends a call's hold on its buffers however `execute` leaves it (success, error or
/// panic): every channel revokes what the peers were allowed to read, so a peer that
/// reads late gets an error instead of freed memory, and forgets the posted pointers.
struct CallEnd<'a, 'c> {
    channels: &'a mut Channels<'c>,
}

impl Drop for CallEnd<'_, '_> {
    fn drop(&mut self) {
        for ch in self.channels.iter_mut().flatten() {
            ch.end_call();
        }
    }
}

/// Whether a send of `len` bytes to `peer` in `round` is half of an exchange of
/// plain copies ([`Round::exchanges_with`]) in a call that reduces nothing. A
/// reducing call's sends carry what its reduction just wrote, which its ring
/// forwards while still in cache: there a single copy measured slower (2 ranks, 16
/// MiB all-reduce: 6.1 against 7.0 GB/s).
fn plain_exchange(op: crate::types::OpKind, round: &Round, peer: usize, len: usize) -> bool {
    !op.reduces() && round.exchanges_with(peer, len)
}

fn run_rounds(
    schedule: &Schedule,
    channels: &mut Channels,
    queues: &mut Queues,
    bufs: &mut Buffers,
    call: &CallInfo,
) -> Result<()> {
    let Queues { gates, last_receive } = queues;
    // A single-copy channel holds the peer's memory mapped; it must let go before
    // the peer's call can end (see PeerChannel::last_receives_posted).
    let tell_last = bufs.device.is_some() && bufs.peer_copy.as_ref().is_some_and(|m| m.iter().any(Option::is_some));
    if tell_last {
        last_receive_rounds(schedule, channels.len(), last_receive);
    }
    for (index, round) in schedule.rounds.iter().enumerate() {
        call.flags.set_round(index);
        gates.clear();
        for step in &round.steps {
            match *step {
                Step::Copy { src, dst } => local_copy(bufs, &src, &dst)?,
                Step::Reduce { src, dst } => local_reduce(bufs, &src, &dst, call)?,
                Step::Send { peer, src } => {
                    let src = bufs.region(&src)?;
                    let exchange = plain_exchange(call.sig.op, round, peer, src.len);
                    let ch = channel_mut(channels, peer, call)?;
                    ch.next_send_is_exchange(exchange);
                    ch.post_send(src, None, call)?;
                }
                Step::Recv { peer, dst } => {
                    let dst = bufs.region(&dst)?;
                    channel_mut(channels, peer, call)?.post_recv(dst, None, None, call)?;
                }
                Step::RecvReduce { peer, src, dst } => {
                    let (dst, reduction) = recv_reduce_regions(bufs, call, &src, &dst)?;
                    channel_mut(channels, peer, call)?.post_recv(dst, Some(reduction), None, call)?;
                }
                Step::RecvReduceSend { peer, src, dst, to } => {
                    let first_gate = gates.len();
                    let (dst, reduction) = recv_reduce_regions(bufs, call, &src, &dst)?;
                    channel_mut(channels, peer, call)?.post_recv(dst, Some(reduction), Some(&mut *gates), call)?;
                    channel_mut(channels, to, call)?.post_send(dst, Some(first_gate), call)?;
                }
            }
        }
        if tell_last {
            for (peer, ch) in channels.iter_mut().enumerate() {
                if let (Some(ch), Some(&Some(last))) = (ch.as_mut(), last_receive.get(peer)) {
                    if last == index {
                        ch.last_receives_posted();
                    }
                }
            }
        }
        run_transfers(channels, gates, call)?;
    }
    Ok(())
}

/// For each of `peers` ranks, the last round of `schedule` with a receive from
/// it (None: no round receives from it), into `out`.
fn last_receive_rounds(schedule: &Schedule, peers: usize, out: &mut Vec<Option<usize>>) {
    out.clear();
    out.resize(peers, None);
    for (index, round) in schedule.rounds.iter().enumerate() {
        for step in &round.steps {
            let from = match *step {
                Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } | Step::RecvReduceSend { peer, .. } => peer,
                Step::Copy { .. } | Step::Reduce { .. } | Step::Send { .. } => continue,
            };
            if let Some(slot) = out.get_mut(from) {
                *slot = Some(index);
            }
        }
    }
}

/// The destination and reduction of a receive-reduce (`dst = src ⊕ received`).
fn recv_reduce_regions(
    bufs: &mut Buffers,
    call: &CallInfo,
    src: &Region,
    dst: &Region,
) -> Result<(MemRegion, Reduction)> {
    if src.len != dst.len || (src.overlaps(dst) && src != dst) {
        return Err(Error::InvalidArgument(format!("bad receive-reduce regions {src:?} {dst:?}")));
    }
    let d = bufs.region(dst)?;
    let s = bufs.region(src)?;
    Ok((d, Reduction { src: s, op: call.reduce_op.combiner(), dtype: call.dtype }))
}

/// The channel to `peer`; an error if there is no link.
fn channel_mut<'a>(channels: &'a mut Channels, peer: usize, call: &CallInfo) -> Result<&'a mut dyn PeerChannel> {
    match channels.get_mut(peer) {
        Some(Some(ch)) => Ok(ch.as_mut()),
        _ => Err(no_link(peer, call)),
    }
}

fn no_link(peer: usize, call: &CallInfo) -> Error {
    Error::InvalidArgument(format!("{}: schedule names rank {peer}, which has no link", call.ctx))
}

fn local_copy(bufs: &mut Buffers, src: &Region, dst: &Region) -> Result<()> {
    let s = bufs.ptr(src)? as *const u8;
    let d = bufs.ptr(dst)?;
    if let Some(dev) = &bufs.device {
        // SAFETY: both ranges are inside the call's device buffers (checked above),
        // which the caller keeps for the call; the call synchronizes before it ends.
        return unsafe { dev.copy_on_device(d as usize as DevicePtr, s as usize as DevicePtr, src.len.min(dst.len)) };
    }
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
    if let Some(dev) = &bufs.device {
        let (d, s) = (d as usize as DevicePtr, s as usize as DevicePtr);
        // SAFETY: disjoint ranges inside the call's device buffers (checked above).
        return unsafe { dev.reduce(d, d, s, dst.len, call.dtype, call.reduce_op.combiner()) };
    }
    // SAFETY: disjoint in-bounds ranges of live buffers.
    let (acc, inc) = unsafe { (std::slice::from_raw_parts_mut(d, dst.len), std::slice::from_raw_parts(s, src.len)) };
    reduce::reduce_inplace(call.dtype, call.reduce_op.combiner(), acc, inc)
}

/// Drive every posted transfer to completion.
fn run_transfers(channels: &mut Channels, gates: &mut [usize], call: &CallInfo) -> Result<()> {
    // The clock is read only once waiting begins: a transfer that completes on
    // the first passes never pays for it.
    let mut last_progress: Option<Instant> = None;
    let mut sleep = Duration::from_micros(5);
    // The first idle passes do not read the clock either: most small transfers
    // complete within them, and a clock read delays noticing the peer's data.
    let mut spinning_passes = PASSES_PER_CLOCK_READ;
    let mut passes_to_answer = PASSES_PER_ANSWER;
    // Whether the recorder heard whom this wait is for (once per wait, when it
    // stops spinning: the moment a hang becomes visible).
    let mut told_recorder = false;
    // With a timeline: the peers whose transfers of this round are still open, to
    // time when each completes (nothing allocated otherwise).
    let marking = call.flags.marking();
    let mut open: Vec<bool> = match marking {
        true => channels.iter().map(|c| c.as_ref().is_some_and(|c| c.busy())).collect(),
        false => Vec::new(),
    };
    loop {
        // A plain load: this is the hot loop. Every wait below is bounded (100 ms
        // in poll, 1 ms asleep), so an abort is seen well within a second.
        if call.flags.load(Ordering::Relaxed) {
            return Err(Error::Aborted { rank: call.ctx.rank, call: Some(call.sig) });
        }
        let mut progressed = false;
        let mut pending = false;
        for (peer, ch) in channels.iter_mut().enumerate() {
            let Some(ch) = ch.as_mut() else { continue };
            progressed |= ch.progress(peer, gates, call)?;
            let busy = ch.busy();
            pending |= busy;
            if marking && !busy && open[peer] {
                open[peer] = false;
                call.flags.mark_peer_done(peer);
            }
        }
        if !pending {
            return Ok(());
        }
        if progressed {
            last_progress = None;
            spinning_passes = 0;
            sleep = Duration::from_micros(5);
            passes_to_answer -= 1;
            if passes_to_answer == 0 {
                passes_to_answer = PASSES_PER_ANSWER;
                wait_chain::answer_queries(channels, call);
            }
            continue;
        }
        // Spinning, the clock is read only every few passes: a pass is a few tens
        // of nanoseconds and a clock read in a VM costs as much.
        if spinning_passes > 0 {
            spinning_passes -= 1;
            std::hint::spin_loop();
            continue;
        }
        let now = Instant::now();
        let idle = now - *last_progress.get_or_insert(now);
        wait_chain::answer_queries(channels, call);
        if idle >= call.timeout {
            let waiting_on = wait_chain::busy_ranks(channels);
            return match wait_chain::investigate(channels, gates, call, &waiting_on)? {
                wait_chain::Verdict::Finished => Ok(()),
                wait_chain::Verdict::Chains(chain) => {
                    Err(Error::Timeout { ctx: call.ctx.clone(), timeout: call.timeout, waiting_on, chain })
                }
            };
        }
        if !told_recorder && idle >= call.wait.spin {
            told_recorder = true;
            call.flags.set_waiting(&wait_chain::busy_ranks(channels));
        }
        if idle < call.wait.spin {
            if call.wait.yield_while_spinning {
                std::thread::yield_now();
            } else {
                spinning_passes = PASSES_PER_CLOCK_READ;
            }
            continue;
        }
        let left = call.timeout - idle;
        if !block_on_fds(channels, gates, left.min(Duration::from_millis(100))) {
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

#[cfg(test)]
mod exchange_tests {
    use super::plain_exchange;
    use crate::algorithm::{BufId, Region, Round, Step};
    use crate::types::OpKind;

    fn round(steps: Vec<Step>) -> Round {
        Round { steps }
    }

    #[test]
    fn a_send_is_an_exchange_only_beside_a_like_receive_from_the_same_peer_in_a_copying_call() {
        let send = |peer, len| Step::Send { peer, src: Region::new(BufId::Output, 0, len) };
        let recv = |peer, len| Step::Recv { peer, dst: Region::new(BufId::Output, len, len) };
        let both = round(vec![send(1, 1 << 20), recv(1, 1 << 20)]);
        assert!(plain_exchange(OpKind::AllGather, &both, 1, 1 << 20));
        assert!(plain_exchange(OpKind::AllToAll, &both, 1, 1 << 20));
        // A reducing call's sends are left to the ring's forwards.
        assert!(!plain_exchange(OpKind::AllReduce, &both, 1, 1 << 20));
        // Another peer, an empty frame (the root check's) or a short reply is no exchange.
        assert!(!plain_exchange(OpKind::AllGather, &round(vec![send(1, 1 << 20), recv(2, 1 << 20)]), 1, 1 << 20));
        assert!(!plain_exchange(OpKind::Broadcast, &round(vec![send(1, 1 << 20), recv(1, 0)]), 1, 1 << 20));
        assert!(!plain_exchange(OpKind::Broadcast, &round(vec![send(1, 1 << 20), recv(1, 1000)]), 1, 1 << 20));
        assert!(!plain_exchange(OpKind::Broadcast, &round(vec![send(1, 1 << 20)]), 1, 1 << 20));
    }
}

#[cfg(test)]
mod scratch_tests {
    use super::{alias_free_offset, SCRATCH_SLACK};

    fn distance(a: usize, b: usize) -> usize {
        let d = a.wrapping_sub(b) % 4096;
        d.min(4096 - d)
    }

    #[test]
    fn the_scratch_starts_far_from_the_buffers_modulo_4_kib() {
        // The case measured: scratch and a buffer 16 bytes apart modulo 4096.
        let off = alias_free_offset(0x10_0100, &[0x7f00_0110, 0x7f00_0110]);
        assert!(off < SCRATCH_SLACK && off.is_multiple_of(512), "{off}");
        assert!(distance(0x10_0100 + off, 0x7f00_0110) >= 1024, "{off}");
        // Two buffers: the start keeps at least 1 KiB from both, whatever they are.
        for (scratch, a, b) in [(0x1000, 0x1000, 0x1800), (0x2010, 0x3020, 0x5a40), (0x40, 0x7c0, 0xc40)] {
            let off = alias_free_offset(scratch, &[a, b]);
            let worst = distance(scratch + off, a).min(distance(scratch + off, b));
            assert!(worst >= 1024, "scratch {scratch:#x}, buffers {a:#x} {b:#x}: offset {off}, {worst} bytes away");
        }
        // Already far: the first such offset, 0.
        assert_eq!(alias_free_offset(0x800, &[0x0]), 0);
    }
}
