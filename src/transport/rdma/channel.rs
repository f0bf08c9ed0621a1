//! [`RdmaChannel`]: the [`PeerChannel`] of the verbs transport. It drives the
//! [`Protocol`] with an adapter ([`Nic`]): completions go into the protocol, the
//! protocol's actions become work requests — each chunk a gather list of its
//! header (staged in registered memory, one stride per slot of the peer's ring)
//! and its data (in a registration of the send buffer, from the cache).
//!
//! Generic over the adapter so it runs here on a software one (the tests); over
//! real hardware it is `RdmaChannel<verbs::VerbsNic>` (feature `rdma`).

use std::time::{Duration, Instant};

use super::nic::{Completion, Nic, Sge};
use super::protocol::{Action, Protocol, WriteData, MAX_REASON};
use super::regcache::{RegCache, Registrar};
use crate::error::{Error, OpContext, Result};
use crate::executor::channel::{MemRegion, PeerChannel, Readiness, Reduction};
use crate::executor::{CallInfo, WaitPolicy, CONTROL_GRACE};
use crate::frame::{FrameKind, HEADER_LEN};
use crate::transport::TransportKind;
use crate::types::{CallSig, DType, OpKind, ReduceOp};

/// Bytes of staging per slot of the peer's ring: a header and an abort reason.
pub const STAGE_STRIDE: usize = (HEADER_LEN + MAX_REASON).next_multiple_of(64);
/// Registrations of send buffers kept at most (entries, bytes).
const CACHE_ENTRIES: usize = 256;
const CACHE_BYTES: usize = 4 << 30;

/// A cache line, so slots (and the payloads 40 bytes into them) stay aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Memory an adapter may access, in whole 64-byte-aligned lines. The heap block
/// does not move when the `Pinned` does.
pub struct Pinned {
    mem: Box<[Line]>,
}

impl Pinned {
    /// Zeroed memory of at least `bytes` bytes.
    pub fn new(bytes: usize) -> Pinned {
        Pinned { mem: vec![Line([0; 64]); bytes.div_ceil(64)].into_boxed_slice() }
    }
    /// First byte.
    pub fn ptr(&mut self) -> *mut u8 {
        self.mem.as_mut_ptr().cast()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len() * 64
    }
}

/// Registers send buffers through the adapter, for the cache.
struct NicRegistrar<'a, N: Nic>(&'a mut N);

impl<N: Nic> Registrar for NicRegistrar<'_, N> {
    type Mr = N::Mr;
    fn register(&mut self, addr: usize, len: usize) -> std::result::Result<N::Mr, String> {
        // SAFETY: the cache registers only ranges covering regions of the current
        // call (live until end_call) rounded out to whole pages of the same
        // mappings, for local reads; registrations of plain memory are dropped at
        // the end of the call (see regcache), once no write reads them (end_call
        // waits), before the memory can be freed.
        unsafe { self.0.register(addr, len) }
    }
    fn deregister(&mut self, mr: N::Mr) {
        drop(mr);
    }
}

/// What the channel was given when its queue pair connected.
pub struct Setup<N: Nic> {
    /// This rank.
    pub rank: usize,
    /// The peer.
    pub peer: usize,
    /// The adapter's queue pair to the peer, connected.
    pub nic: N,
    /// The protocol (its initial receives already posted).
    pub proto: Protocol,
    /// This rank's receive ring for the peer, and its registration (remote write).
    pub ring: Pinned,
    /// The ring's registration.
    pub ring_mr: N::Mr,
    /// Header staging, `STAGE_STRIDE` per slot of the peer's ring.
    pub stage: Pinned,
    /// The staging's registration (local).
    pub stage_mr: N::Mr,
    /// Address of the peer's ring for this rank.
    pub remote_ring: u64,
    /// Its remote key.
    pub remote_rkey: u32,
}

/// One peer's verbs channel.
pub struct RdmaChannel<N: Nic> {
    rank: usize,
    peer: usize,
    proto: Protocol,
    /// Before the registrations and buffers below, so it stops (drops) first.
    nic: N,
    _ring_mr: N::Mr,
    ring: Pinned,
    stage_mr: N::Mr,
    stage: Pinned,
    remote_ring: u64,
    remote_rkey: u32,
    cache: RegCache<N::Mr>,
    /// Cache entries pinned by this call's sends.
    pins: Vec<u64>,
    /// Cache entries pinned by the sends of an ended call whose writes the adapter
    /// did not report done even after the queue pair was halted (it reports
    /// flushed writes at once, so this stays empty unless the adapter misbehaves):
    /// kept registered, the pages pinned, while the adapter may still read them;
    /// released at a later call's end once those writes are over, or on drop.
    held: Vec<u64>,
    actions: Vec<Action>,
    completions: Vec<Completion>,
    /// The first failure of the queue pair (a work request that failed or could
    /// not be posted). An error only once this rank needs the peer: a peer that
    /// finished and closed first fails the credits still owed to it, harmlessly.
    broken: Option<String>,
}

// SAFETY: the adapter and registrations are Send (trait bounds); the raw pointers
// of posted requests inside the protocol are forgotten in end_call before the
// executor returns.
unsafe impl<N: Nic> Send for RdmaChannel<N> {}

impl<N: Nic> Drop for RdmaChannel<N> {
    fn drop(&mut self) {
        self.cache.clear(&mut NicRegistrar(&mut self.nic));
    }
}

fn segment_of(addr: usize, len: usize) -> Option<String> {
    crate::registered::lookup(addr, len).map(|(name, _)| name)
}

impl<N: Nic> RdmaChannel<N> {
    /// A channel over a connected queue pair.
    pub fn new(s: Setup<N>) -> RdmaChannel<N> {
        assert!(s.ring.len() >= s.proto.spec().ring_bytes() && s.stage.len() >= s.proto.spec().slots * STAGE_STRIDE);
        RdmaChannel {
            rank: s.rank,
            peer: s.peer,
            proto: s.proto,
            nic: s.nic,
            _ring_mr: s.ring_mr,
            ring: s.ring,
            stage_mr: s.stage_mr,
            stage: s.stage,
            remote_ring: s.remote_ring,
            remote_rkey: s.remote_rkey,
            cache: RegCache::new(CACHE_ENTRIES, CACHE_BYTES),
            pins: Vec::new(),
            held: Vec::new(),
            actions: Vec::new(),
            completions: Vec::new(),
            broken: None,
        }
    }

    fn fail(&self, call: &CallInfo, what: &str, e: impl std::fmt::Display) -> Error {
        let detail = if self.proto.said_goodbye() {
            format!("it closed its communicator (rdma {what}: {e})")
        } else {
            format!("rdma {what}: {e}")
        };
        Error::PeerLost { ctx: call.ctx.clone(), peer: self.peer, detail }
    }

    /// Take completions off the queue and hand them to the protocol. Every
    /// completion taken is handed over, even after one is refused (the first error
    /// is returned): a write's completion says the adapter is done with its memory,
    /// which [`end_call`](PeerChannel::end_call) waits for.
    fn poll(&mut self, call: &CallInfo) -> Result<bool> {
        let mut completions = std::mem::take(&mut self.completions);
        let mut result = self.nic.poll(&mut completions).map_err(|e| self.fail(call, "ibv_poll_cq", e));
        let polled = !completions.is_empty();
        for c in completions.drain(..) {
            let step = match c {
                Completion::Recv { imm, byte_len } => self.proto.on_arrival(imm, byte_len, self.peer, call),
                Completion::Sent { wr_id } => self.proto.on_send_complete(wr_id, self.peer, call),
                Completion::Failed { wr_id, status } => {
                    let what = if wr_id == 0 { "receive completion" } else { "write completion" };
                    self.broken.get_or_insert(format!("{what}: {status}"));
                    if wr_id != 0 {
                        // A failed write is over too: the adapter no longer reads its
                        // memory. The queue pair is broken, so nothing more is owed.
                        let _ = self.proto.on_send_complete(wr_id, self.peer, call);
                    }
                    Ok(())
                }
            };
            result = result.and(step);
        }
        self.completions = completions;
        result.map(|()| polled)
    }

    /// What completions and errors outside a call are checked against: no call,
    /// the communicator `comm_id` at `epoch`, the deadline `give_up`.
    fn outside_call(&self, comm_id: u32, epoch: u8, give_up: Instant) -> CallInfo {
        let sig = CallSig::new(OpKind::Barrier, DType::U8, 0, 0, ReduceOp::Sum);
        CallInfo {
            ctx: OpContext { rank: self.rank, call: None, seq: 0 },
            sig,
            send_seq: 0,
            recv_seq: 0,
            comm_id,
            epoch,
            dtype: DType::U8,
            reduce_op: ReduceOp::Sum,
            timeout: give_up.saturating_duration_since(Instant::now()),
            wait: WaitPolicy::for_ranks(1),
            flags: Default::default(),
        }
    }

    /// Poll until no write of this rank is in flight, or `give_up`.
    fn wait_writes(&mut self, call: &CallInfo, give_up: Instant) {
        while self.proto.writes_in_flight() && Instant::now() < give_up {
            // What the peer sent meanwhile may be refused (the call is over); the
            // completions of this rank's writes are taken all the same.
            if !matches!(self.poll(call), Ok(true)) {
                std::thread::yield_now();
            }
        }
    }

    /// The call ended with writes of it in flight (it failed): they read its send
    /// buffers through registrations of this call. Dropping those under them is a
    /// local protection error that breaks the queue pair, and the abort or goodbye
    /// queued behind would never reach the peer, which would then wait out its
    /// whole timeout; and the buffers are the caller's again once the call returns.
    /// So wait for the writes (the peer's adapter completes them without its CPU:
    /// its receives for them are posted), and if they do not complete within
    /// `grace`, halt the queue pair so that they complete flushed. Returns whether
    /// the adapter is done with every write.
    fn settle_writes(&mut self, grace: Duration) -> bool {
        let call = self.outside_call(0, 0, Instant::now() + grace);
        self.wait_writes(&call, Instant::now() + grace);
        if !self.proto.writes_in_flight() {
            return true;
        }
        tracing::warn!(
            rank = self.rank,
            peer = self.peer,
            "rdma writes to the peer still in flight {grace:?} after the call ended: stopping the queue pair"
        );
        if let Err(e) = self.nic.halt() {
            self.broken.get_or_insert(format!("ibv_modify_qp(ERR): {e}"));
        }
        self.broken.get_or_insert_with(|| "stopped with writes in flight after a failed call".into());
        self.wait_writes(&call, Instant::now() + grace);
        !self.proto.writes_in_flight()
    }

    /// The adapter behind this channel (tests forge writes through it).
    #[cfg(test)]
    pub(crate) fn nic_mut(&mut self) -> &mut N {
        &mut self.nic
    }

    /// This rank's receive ring for the peer.
    #[cfg(test)]
    pub(crate) fn ring_bytes(&mut self) -> &[u8] {
        let len = self.proto.spec().ring_bytes();
        // SAFETY: the channel's own memory, at least `len` bytes (checked in `new`).
        unsafe { std::slice::from_raw_parts(self.ring.ptr() as *const u8, len) }
    }

    /// Carry out what the protocol asked for.
    fn perform(&mut self, call: &CallInfo) -> Result<()> {
        let stride = self.proto.spec().slot_stride() as u64;
        let mut actions = std::mem::take(&mut self.actions);
        let mut result = Ok(());
        for a in actions.drain(..) {
            if result.is_err() {
                break;
            }
            result = self.perform_one(a, stride, call);
        }
        self.actions = actions;
        result
    }

    /// Post what an action says; a post that fails breaks the queue pair.
    fn perform_one(&mut self, a: Action, stride: u64, call: &CallInfo) -> Result<()> {
        let posted = match a {
            Action::PostRecvs(n) => self.nic.post_recvs(n).map_err(|e| format!("ibv_post_recv: {e}")),
            Action::Credit { wr_id, imm } => {
                // SAFETY: no gather entries; the target is the start of the peer's ring.
                unsafe { self.nic.post_write(wr_id, &[], imm, self.remote_ring, self.remote_rkey) }
                    .map_err(|e| format!("ibv_post_send (credit): {e}"))
            }
            Action::Write { wr_id, slot, header, data, imm } => {
                let extra = match &data {
                    WriteData::Bytes(b) => &b[..b.len().min(STAGE_STRIDE - HEADER_LEN)],
                    WriteData::Region { .. } => &[],
                };
                let staged = HEADER_LEN + extra.len();
                assert!(slot < self.proto.spec().slots, "the protocol names slots of the ring");
                // SAFETY: slot < slots, so [slot * STAGE_STRIDE, + staged) lies in the
                // staging (checked in `new`); no write of this slot is in flight (the
                // protocol reuses a slot only after its completion), so the adapter
                // is not reading it.
                let stage =
                    unsafe { std::slice::from_raw_parts_mut(self.stage.ptr().add(slot * STAGE_STRIDE), staged) };
                stage[..HEADER_LEN].copy_from_slice(&header);
                stage[HEADER_LEN..].copy_from_slice(extra);
                let mut sges =
                    [Sge { addr: stage.as_ptr() as u64, len: staged as u32, lkey: N::lkey(&self.stage_mr) }; 2];
                let mut n = 1;
                if let WriteData::Region { addr, len } = data {
                    if len > 0 {
                        let Some(mr) = self.cache.find(addr as usize, len) else {
                            return Err(self.fail(call, "write", "a send buffer that is not registered"));
                        };
                        sges[1] = Sge { addr: addr as u64, len: len as u32, lkey: N::lkey(mr) };
                        n = 2;
                    }
                }
                let remote = self.remote_ring + slot as u64 * stride;
                // SAFETY: the staging entry is in the staging registration; the data
                // entry is in a registration pinned until end_call, of a region the
                // executor keeps alive for the call and does not change once it is
                // sent; `remote` is slot `slot` of the peer's ring, which holds a
                // header and a payload of up to the slot size (protocol).
                unsafe { self.nic.post_write(wr_id, &sges[..n], imm, remote, self.remote_rkey) }
                    .map_err(|e| format!("ibv_post_send (write): {e}"))
            }
        };
        if let Err(why) = posted {
            self.broken.get_or_insert(why);
        }
        Ok(())
    }
}

impl<N: Nic> PeerChannel for RdmaChannel<N> {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn post_send(&mut self, src: MemRegion, first_gate: Option<usize>, call: &CallInfo) -> Result<()> {
        self.proto.check_peer_aborted(self.peer, call)?;
        self.proto.post_send(src, first_gate, call)?;
        if src.len > 0 {
            let seg = segment_of(src.ptr as usize, src.len);
            let mut reg = NicRegistrar(&mut self.nic);
            let (id, _) =
                self.cache.acquire(&mut reg, src.ptr as usize, src.len, seg.as_deref()).map_err(|why| Error::Io {
                    what: format!("{}: rdma registration of a send to rank {}", call.ctx, self.peer),
                    source: std::io::Error::other(why),
                })?;
            self.pins.push(id);
        }
        Ok(())
    }

    fn post_recv(
        &mut self,
        dst: MemRegion,
        reduce: Option<Reduction>,
        forward: Option<&mut Vec<usize>>,
        call: &CallInfo,
    ) -> Result<()> {
        self.proto.check_peer_aborted(self.peer, call)?;
        self.proto.post_recv(dst, reduce, forward, self.peer, call)
    }

    fn progress(&mut self, peer: usize, gates: &mut [usize], call: &CallInfo) -> Result<bool> {
        debug_assert_eq!(peer, self.peer);
        let polled = self.poll(call)?;
        let len = self.proto.spec().ring_bytes();
        // SAFETY: the ring is this channel's own memory, at least `len` bytes
        // (checked in `new`). The peer writes only slots it holds credits for,
        // which the protocol does not read; a peer that writes elsewhere can change
        // bytes under the protocol's reads of plain `u8`s, each validated before use.
        let ring = unsafe { std::slice::from_raw_parts(self.ring.ptr() as *const u8, len) };
        let moved = self.proto.progress(ring, gates, self.peer, call, &mut self.actions)?;
        self.perform(call)?;
        // What already landed has been taken; if more is needed, the peer is lost.
        if let Some(why) = &self.broken {
            if self.proto.busy() {
                return Err(self.fail(call, "queue pair", why));
            }
        }
        Ok(polled | moved)
    }

    fn busy(&self) -> bool {
        self.proto.busy()
    }

    fn readiness(&self, _gates: &[usize]) -> Readiness {
        Readiness::NoFd
    }

    fn send_control_and_close(&mut self, kind: FrameKind, comm_id: u32, epoch: u8, reason: &str, give_up: Instant) {
        // Completions are checked against a call; this one names the close.
        let call = self.outside_call(comm_id, epoch, give_up);
        // Wait (bounded) for a credit, then for the control chunk's completion.
        while Instant::now() < give_up {
            if let Some(a) = self.proto.control(kind, comm_id, epoch, reason) {
                self.actions.push(a);
                if self.perform(&call).is_err() {
                    return;
                }
                break;
            }
            if self.poll(&call).is_err() {
                return;
            }
            std::thread::yield_now();
        }
        while Instant::now() < give_up && self.proto.writes_in_flight() && self.poll(&call).is_ok() {
            std::thread::yield_now();
        }
    }

    fn end_call(&mut self) {
        self.proto.end_call();
        // Only a failed call ends with writes in flight: a send is done once its
        // writes complete. So the wait is off the path of calls that succeed.
        let done = !self.proto.writes_in_flight() || self.settle_writes(CONTROL_GRACE);
        let mut reg = NicRegistrar(&mut self.nic);
        if done {
            for id in self.pins.drain(..).chain(self.held.drain(..)) {
                self.cache.release(&mut reg, id);
            }
        } else {
            self.held.append(&mut self.pins);
        }
        self.cache.end_call(&mut reg, segment_of);
    }
}
