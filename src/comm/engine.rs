//! The engine: the state only the rank's current call touches (links, sequence
//! numbers, cached plans), and how one call runs on it.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::algorithm::{self, Algorithm, BufId, PlanRequest, Region, Round, Schedule, Step};
use crate::device::{Device, DeviceBuffer, DevicePtr, PeerProcess};
use crate::error::{Error, OpContext, Result};
use crate::executor::segments::{self, Segments};
use crate::executor::{self, Buffers, CallInfo, MemKind, PeerChannel, WaitPolicy};
use crate::frame::FrameKind;
use crate::recorder::FlightRecorder;
use crate::reduce;
use crate::transport::stream_copy::{self, CallTuner};
use crate::tuner::{AlgoPolicy, Call, LinkClass, LinkPair, Tuner};
use crate::types::{CallSig, DType, OpKind, ReduceOp};

/// What a cached schedule depends on besides the communicator's policy (a new
/// policy empties the caches): op, count, element size, root, whether the
/// signature is agreed in its rounds, and the links it is priced on.
type PlanKey = (OpKind, usize, usize, usize, bool, Pricing);

/// Which links a call's plan is priced on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Pricing {
    /// The communicator's links (host buffers, or device buffers some peer stages).
    Links,
    /// Device buffers every peer copies single-copy, all threads of this process.
    DeviceThreads,
    /// Likewise, with a peer in another process.
    DeviceProcesses,
}
/// How many of the latest plans are compared before the hash map is asked. A
/// training step repeats a few calls (each bucket's all-reduce, a barrier); hashing
/// a key with the map's SipHash cost more than the whole executor of a 4 KiB
/// all-reduce over shared memory (about 500 instructions a call).
const RECENT_PLANS: usize = 4;

/// State that only the rank's current call touches.
pub(crate) struct Engine {
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) channels: Vec<Option<Box<dyn PeerChannel>>>,
    pub(super) comm_id: u32,
    pub(super) epoch: u8,
    pub(super) coll_seq: u64,
    /// The last calls, for a record after a failure (None: `BRAID_TRACE_BUFFER=0`).
    pub(super) recorder: Option<Arc<crate::recorder::FlightRecorder>>,
    /// Every call as trace events (None: no `BRAID_TIMELINE`).
    pub(super) timeline: Option<crate::recorder::timeline::Timeline>,
    /// Calls, bytes and times per op (None: metrics off).
    pub(super) metrics: Option<Arc<crate::recorder::metrics::Metrics>>,
    pub(super) p2p_sent: Vec<u64>,
    pub(super) p2p_received: Vec<u64>,
    pub(super) timeout: Duration,
    /// Whether rooted calls first agree on their signature (`Config::check_roots`).
    check_roots: bool,
    pub(super) wait: WaitPolicy,
    /// Chooses each call's algorithm.
    pub(super) tuner: Tuner,
    /// Host index of every rank as planners take it ([`PlanRequest::hosts`]).
    pub(super) hosts: Vec<usize>,
    /// Hosts whose ranks outnumber their cores (the tuner prices their rounds).
    pub(super) busy_hosts: Vec<bool>,
    pub(super) broken: Option<String>,
    /// Collectives that completed on this rank: what it reports when the survivors
    /// of a failure agree ([`crate::Communicator::agree`]).
    pub(super) completed_calls: u64,
    /// Peers whose links ended under a call ([`Error::PeerLost`]): this rank's
    /// evidence, given to the agreement, that they are gone.
    pub(super) lost_peers: Vec<usize>,
    /// Set by [`crate::Communicator::abort`] from any thread; the executor reads it
    /// once per pass of its transfer loop.
    pub(super) aborted: Arc<executor::CallFlags>,
    pub(super) scratch: Vec<u8>,
    /// The input of the latest in-place all-to-all, copied out of its buffer
    /// (kept, so repeated calls do not allocate).
    pub(super) in_place_copy: Vec<u8>,
    /// Scratch of the last call on device buffers (kept while the device is).
    pub(super) device_scratch: Option<DeviceBuffer>,
    /// The device the communicator is bound to and its single-copy peers.
    pub(super) binding: Option<super::device_binding::DeviceBinding>,
    pub(super) queues: executor::Queues,
    pub(super) plans: HashMap<PlanKey, Arc<Schedule>>,
    /// The plans of the latest distinct calls, most recent first.
    pub(super) recent_plans: [Option<(PlanKey, Arc<Schedule>)>; RECENT_PLANS],
    /// Chooses plain or streaming shared-memory ring writes from call times.
    pub(super) stream_tuner: Option<CallTuner>,
}

impl Engine {
    /// An engine over `channels` (indexed by peer rank) with nothing run yet.
    pub(super) fn new(
        rank: usize,
        world: usize,
        channels: Vec<Option<Box<dyn PeerChannel>>>,
        comm_id: u32,
        cfg: &crate::config::Config,
        wait: WaitPolicy,
        aborted: Arc<executor::CallFlags>,
    ) -> Engine {
        let links = LinkPair {
            single_copy_exchanges: cfg.tuning.cma.then_some(cfg.tuning.rendezvous_bytes),
            ..link_classes(rank, &channels, &vec![0; world])
        };
        Engine {
            rank,
            world,
            channels,
            comm_id,
            epoch: 0,
            coll_seq: 0,
            recorder: new_recorder(rank, world, comm_id, cfg, &aborted),
            timeline: cfg.timeline.as_deref().map(|file| {
                aborted.time_rounds();
                crate::recorder::timeline::Timeline::new(file, comm_id, rank)
            }),
            metrics: (cfg.metrics || cfg.metrics_addr.is_some())
                .then(|| Arc::new(crate::recorder::metrics::Metrics::new(comm_id, rank, world))),
            p2p_sent: vec![0; world],
            p2p_received: vec![0; world],
            timeout: cfg.timeout,
            check_roots: cfg.check_roots,
            wait,
            tuner: Tuner {
                params: algorithm::PlanParams { deterministic: cfg.deterministic, ..Default::default() },
                ..Tuner::new(cfg.algorithms.clone(), links)
            },
            hosts: vec![0; world],
            busy_hosts: vec![wait.yield_while_spinning],
            broken: None,
            completed_calls: 0,
            lost_peers: Vec::new(),
            aborted,
            scratch: Vec::new(),
            in_place_copy: Vec::new(),
            device_scratch: None,
            binding: None,
            queues: executor::Queues::default(),
            plans: HashMap::new(),
            recent_plans: Default::default(),
            stream_tuner: None,
        }
    }

    fn ctx(&self, call: Option<CallSig>, seq: u64) -> OpContext {
        OpContext { rank: self.rank, call, seq }
    }

    /// A new policy for later calls; plans made under the old one are dropped.
    pub(super) fn set_policy(&mut self, policy: AlgoPolicy) {
        self.tuner.policy = policy;
        self.plans.clear();
        self.recent_plans = Default::default();
    }

    /// Reproducible mode on or off for later calls; plans of the other mode go.
    pub(super) fn set_deterministic(&mut self, on: bool) {
        self.tuner.params.deterministic = on;
        self.plans.clear();
        self.recent_plans = Default::default();
    }

    /// The hosts of the ranks and which of them take turns on cores; plans made
    /// for another layout are dropped.
    pub(super) fn set_hosts(&mut self, hosts: Vec<usize>, busy: Vec<bool>) {
        self.tuner.links = LinkPair {
            single_copy_exchanges: self.tuner.links.single_copy_exchanges,
            ..link_classes(self.rank, &self.channels, &hosts)
        };
        self.hosts = hosts;
        self.busy_hosts = busy;
        self.plans.clear();
        self.recent_plans = Default::default();
    }

    /// Whether `sig` agrees on its signature across ranks before it may finish: a
    /// rooted call, with [`crate::Config::check_roots`].
    pub(super) fn agrees(&self, sig: &CallSig) -> bool {
        sig.op.rooted() && self.check_roots && self.world > 1
    }

    /// The plan of `sig` (cached); with `agreed`, with the signature agreed in its
    /// rounds ([`algorithm::with_agreement`]).
    pub(super) fn schedule(&mut self, sig: &CallSig, agreed: bool, pricing: Pricing) -> Result<Arc<Schedule>> {
        let key = (sig.op, sig.count as usize, sig.dtype.size(), sig.root as usize, agreed, pricing);
        // Training loops repeat a few calls: check the latest plans before hashing.
        if let Some(i) = self.recent_plans.iter().position(|e| e.as_ref().is_some_and(|(k, _)| *k == key)) {
            self.recent_to_front(i);
            if let Some((_, s)) = &self.recent_plans[0] {
                return Ok(s.clone());
            }
        }
        let s = match self.plans.get(&key) {
            Some(s) => s.clone(),
            None => {
                let call = Call {
                    op: key.0,
                    count: key.1,
                    elem_size: key.2,
                    root: key.3,
                    hosts: &self.hosts,
                    busy: &self.busy_hosts,
                };
                let device_tuner = match pricing {
                    Pricing::Links => None,
                    Pricing::DeviceThreads => Some(self.tuner.for_device(false)),
                    Pricing::DeviceProcesses => Some(self.tuner.for_device(true)),
                };
                let tuner = device_tuner.as_ref().unwrap_or(&self.tuner);
                let algo = tuner.pick(&call).map_err(|e| Error::InvalidArgument(format!("choosing for {sig}: {e}")))?;
                let req = PlanRequest {
                    op: key.0,
                    rank: self.rank,
                    world: self.world,
                    count: key.1,
                    elem_size: key.2,
                    root: key.3,
                    algorithm: Some(algo),
                    hosts: &self.hosts,
                    blocks: None,
                };
                let mut plan = algorithm::plan_with(&req, &tuner.params)
                    .map_err(|e| Error::InvalidArgument(format!("planning {sig}: {e}")))?;
                if agreed {
                    plan = algorithm::with_agreement(&plan, self.rank, self.world);
                }
                if self.plans.len() > 256 {
                    self.plans.clear();
                }
                let s = Arc::new(plan);
                self.plans.insert(key, s.clone());
                s
            }
        };
        // The least recent entry goes (its plan stays in the map).
        self.recent_to_front(RECENT_PLANS - 1);
        self.recent_plans[0] = Some((key, s.clone()));
        Ok(s)
    }

    /// The links a call on buffers that reach the peers as `peer_copy` says (None:
    /// host buffers, or staged) is priced on: a device's own when every peer copies
    /// single-copy (see [`Tuner::for_device`]).
    pub(super) fn pricing(&self, peer_copy: Option<&[Option<PeerProcess>]>) -> Pricing {
        let Some(peers) = peer_copy else { return Pricing::Links };
        let others = || (0..self.world).filter(|&p| p != self.rank);
        if self.world < 2 || others().any(|p| peers.get(p).is_none_or(|x| x.is_none())) {
            return Pricing::Links;
        }
        if others().any(|p| peers[p] == Some(PeerProcess::Other)) {
            Pricing::DeviceProcesses
        } else {
            Pricing::DeviceThreads
        }
    }

    /// Move recent entry `i` to the front, the ones before it one place back.
    /// Pairwise swaps: for four entries cheaper than the general `rotate_right`.
    fn recent_to_front(&mut self, i: usize) {
        for j in (1..=i).rev() {
            self.recent_plans.swap(j, j - 1);
        }
    }

    /// Run one call. On failure the communicator is broken: every peer is told
    /// why (so no rank waits for a deadline) and later calls fail at once.
    pub(super) fn run(
        &mut self,
        sig: CallSig,
        schedule: &Schedule,
        bufs: &mut Buffers,
        seqs: (u64, u64),
    ) -> Result<()> {
        let recorded = self.recorder.as_ref().map(|r| r.begin(seqs.0, &sig, schedule.rounds.len()));
        let was_broken = self.broken.is_some();
        let started = self.timeline.as_ref().map(|_| {
            self.aborted.with_marks(|_, _| ());
            Instant::now()
        });
        let counted = self.metrics.as_ref().map(|_| Instant::now());
        let result = self.run_recorded(sig, schedule, bufs, seqs);
        if let (Some(m), Some(t0)) = (&self.metrics, counted) {
            m.record(&sig, t0.elapsed(), result.as_ref().err().map(crate::recorder::reason_of));
        }
        if let (Some(t), Some(start)) = (&mut self.timeline, started) {
            let bytes = sig.count.saturating_mul(sig.dtype.size() as u64);
            let end = Instant::now();
            self.aborted
                .with_marks(|rounds, peers| t.call(&sig, seqs.0, bytes, result.is_ok(), (start, end), (rounds, peers)));
        }
        if let (Some(r), Some(index)) = (&self.recorder, recorded) {
            r.end(index, result.as_ref().map(|_| ()));
            // The failure that broke the communicator writes the record; the calls
            // refused after it add nothing a person needs.
            if let Err(e) = &result {
                if !was_broken {
                    r.round_peers(index, schedule);
                    r.dump_logged(crate::recorder::reason_of(e));
                }
            }
        }
        result
    }

    fn run_recorded(&mut self, sig: CallSig, schedule: &Schedule, bufs: &mut Buffers, seqs: (u64, u64)) -> Result<()> {
        self.refuse_if_stopped(sig)?;
        let info = CallInfo {
            ctx: self.ctx(Some(sig), seqs.1),
            sig,
            send_seq: seqs.0,
            recv_seq: seqs.1,
            comm_id: self.comm_id,
            epoch: self.epoch,
            dtype: sig.dtype,
            reduce_op: sig.reduce_op,
            timeout: self.timeout,
            wait: self.wait,
            flags: self.aborted.clone(),
        };
        // SAFETY: `bufs` comes from `collective`/`point_to_point`, whose pointers are
        // the caller's live slices of the checked lengths, borrowed for this whole call.
        let executed = unsafe { executor::execute(schedule, &mut self.channels, &mut self.queues, bufs, &info) };
        let mut result = executed.and_then(|()| {
            if sig.reduce_op == ReduceOp::Avg && sig.op.reduces() {
                if let Some(dev) = &bufs.device {
                    return finalize_on_device(dev.as_ref(), sig, schedule, bufs, self.world);
                }
                for r in &schedule.finalize {
                    // Bounds-checked there (and mapped onto the parts of a segmented call).
                    let base = bufs.ptr(r)?;
                    // SAFETY: in-bounds region of a live buffer; no other view is alive.
                    let s = unsafe { std::slice::from_raw_parts_mut(base, r.len) };
                    reduce::finalize(sig.dtype, sig.reduce_op, s, self.world)?;
                }
            }
            Ok(())
        });
        // A call that completed while abort() was being called still reports the
        // abort: after abort() no call on this rank claims success it may not share.
        if result.is_ok() && self.aborted.load(Ordering::Relaxed) {
            result = Err(Error::Aborted { rank: self.rank, call: Some(sig) });
        }
        if let Err(e) = &result {
            if let Error::PeerLost { peer, .. } = e {
                if !self.lost_peers.contains(peer) {
                    self.lost_peers.push(*peer);
                }
            }
            self.fail(e.to_string());
        }
        result
    }

    /// The error of a call `sig` made after an abort or an earlier failure, if any.
    pub(super) fn refuse_if_stopped(&mut self, sig: CallSig) -> Result<()> {
        if self.aborted.load(Ordering::Relaxed) {
            self.notice_abort();
            return Err(Error::Aborted { rank: self.rank, call: Some(sig) });
        }
        if let Some(why) = &self.broken {
            return Err(Error::Broken(why.clone()));
        }
        Ok(())
    }

    /// Tell every peer why this rank stops, close the links, refuse later calls.
    pub(super) fn fail(&mut self, reason: String) {
        tracing::error!(rank = self.rank, "{reason}");
        // Before the links close: which peers are already gone without a word.
        for (peer, ch) in self.channels.iter_mut().enumerate() {
            if ch.as_mut().is_some_and(|c| c.peer_gone()) && !self.lost_peers.contains(&peer) {
                self.lost_peers.push(peer);
            }
        }
        let give_up = std::time::Instant::now() + executor::CONTROL_GRACE;
        for ch in self.channels.iter_mut().flatten() {
            ch.send_control_and_close(FrameKind::Abort, self.comm_id, self.epoch, &reason, give_up);
        }
        self.broken = Some(reason);
    }

    /// After an abort, make sure the peers have been told (once).
    pub(super) fn notice_abort(&mut self) {
        if self.broken.is_none() && self.aborted.load(Ordering::Relaxed) {
            self.fail(Error::Aborted { rank: self.rank, call: None }.to_string());
            if let Some(r) = &self.recorder {
                r.dump_logged("aborted");
            }
        }
    }

    /// A call unwound (panicked) with the engine in its hands: its queues may hold
    /// pointers into buffers that are gone and its links may be mid-frame, so the
    /// engine is unusable. Peers are told; later calls get [`Error::Broken`].
    pub(super) fn unwound(&mut self, panic: &str) {
        self.queues = executor::Queues::default();
        if self.broken.is_none() {
            let reason = format!("rank {}: a call panicked: {panic}", self.rank);
            self.broken = Some(reason.clone());
            // The link may be what panicked: telling the peers must not unwind again.
            let told = catch_unwind(AssertUnwindSafe(|| self.fail(reason.clone())));
            if told.is_err() {
                self.broken = Some(reason);
            }
        }
    }

    /// Before the data of a rooted call: a dissemination exchange of empty frames
    /// carrying `sig`. A root only sends and a leaf of a reduce only sends, so without
    /// it a rank given another root finishes the call (and the next call is blamed).
    /// Each rank forwards round `k` only after checking round `k - 1`, so every rank
    /// waits on a chain that passes through each other rank's check: a rank that sees
    /// another root fails and its abort reaches every rank still in this call.
    fn agree_on_call(&mut self, sig: CallSig, seq: u64) -> Result<()> {
        if self.world < 2 {
            return Ok(());
        }
        let exchange =
            self.schedule(&CallSig::new(OpKind::Barrier, DType::U8, 0, 0, ReduceOp::Sum), false, Pricing::Links)?;
        // Empty regions of a dangling (not null) pointer, as an empty slice has.
        let empty = std::ptr::NonNull::<u8>::dangling().as_ptr();
        let mut nothing = Buffers {
            input: empty,
            input_len: 0,
            output: empty,
            output_len: 0,
            scratch: Vec::new(),
            scratch_offset: 0,
            kind: MemKind::Host,
            device: None,
            device_scratch: None,
            peer_copy: None,
            segments: None,
        };
        self.run(sig, &exchange, &mut nothing, (seq, seq))
    }

    /// Run a collective on host buffers, or with `device` on that device's buffers
    /// (the pointers are then device addresses).
    pub(super) fn collective(
        &mut self,
        sig: CallSig,
        input: (*const u8, usize),
        output: (*mut u8, usize),
        device: Option<&Arc<dyn Device>>,
    ) -> Result<()> {
        self.collective_on(sig, input, output, device, None)
    }

    /// An in-place all-reduce (`sig`, of `segs.total()` bytes) of the parts `segs`
    /// as one buffer: on the parts themselves where the schedule allows it (see
    /// [`segments`]), else packed into a buffer the engine keeps and unpacked after.
    pub(super) fn all_reduce_segments(&mut self, sig: CallSig, segs: Segments) -> Result<()> {
        let schedule = self.schedule(&sig, self.agrees(&sig), self.pricing(None))?;
        // Across hosts the parts' many short frames cost a send each on the
        // sockets, about what packing costs (the fuser's 1,000 tensors of 1-64 KiB
        // over TCP: 21.4-21.6 ms on the parts, 20.4-20.8 packed); within a host they
        // go through memory (shm: 4.7-5.0 ms on the parts, 13-16 packed;
        // results/fusion-2026-11-29.md). The hosts are agreed, so every rank
        // chooses alike.
        let one_host = self.hosts.iter().all(|&h| h == self.hosts[0]);
        if one_host && segments::runs_on_segments(schedule.algorithm, self.world) {
            let cut = segments::split_schedule(&schedule, &segs);
            let (base, len) = (segs.locate(0, 0).unwrap_or(std::ptr::null_mut()), segs.total());
            return self.collective_on(sig, (base, len), (base, len), None, Some((cut, segs)));
        }
        let mut packed = std::mem::take(&mut self.in_place_copy);
        packed.clear();
        segs.gather_into(&mut packed);
        let len = packed.len();
        let r = self.collective(sig, (packed.as_ptr(), len), (packed.as_mut_ptr(), len), None);
        if r.is_ok() {
            segs.scatter_from(&packed);
        }
        self.in_place_copy = packed;
        r
    }

    /// [`collective`](Self::collective), or with `cut` the schedule (already cut
    /// at the parts' boundaries) of a call on the parts `segs`.
    fn collective_on(
        &mut self,
        sig: CallSig,
        (input, input_len): (*const u8, usize),
        (output, output_len): (*mut u8, usize),
        device: Option<&Arc<dyn Device>>,
        cut: Option<(Schedule, Segments)>,
    ) -> Result<()> {
        // Checked before the call takes a sequence number, as argument errors are.
        let peer_copy = self.peer_copy_for(device)?;
        let seq = self.coll_seq;
        self.coll_seq += 1;
        // Rooted calls agree on their signature: on host buffers in the data's own
        // rounds, on device buffers (whose channels move device memory) before them.
        let check = self.agrees(&sig);
        let planned = self.schedule(&sig, check && device.is_none(), self.pricing(peer_copy.as_deref()))?;
        let (schedule, segments) = match cut {
            Some((s, segs)) => (Arc::new(s), Some(segs)),
            None => (planned, None),
        };
        let sig = sig.with_algorithm(schedule.algorithm).reproducible(self.tuner.params.deterministic);
        if check && device.is_some() {
            self.agree_on_call(sig, seq)?;
        }
        let mut bufs = Buffers {
            input,
            input_len,
            output,
            output_len,
            scratch: std::mem::take(&mut self.scratch),
            scratch_offset: 0,
            kind: if device.is_some() { MemKind::Device } else { MemKind::Host },
            device: device.cloned(),
            device_scratch: if device.is_some() { self.device_scratch.take() } else { None },
            peer_copy,
            segments,
        };
        // Host buffers over shared memory: time large calls for the ring writers'
        // choice of stores (device buffers are staged by other code).
        let timed = match (&mut self.stream_tuner, device) {
            (Some(t), None) => {
                // A call on parts is timed apart: its many short transfers move
                // memory unlike the same algorithm on one buffer.
                let pattern = match bufs.segments {
                    Some(_) => stream_copy::PARTS_PATTERN,
                    None => schedule.algorithm.code() as usize,
                };
                t.begin((sig.count as usize).saturating_mul(sig.dtype.size()), pattern)
            }
            _ => None,
        };
        let r = self.run(sig, &schedule, &mut bufs, (seq, seq));
        if let (Some(mut timed), true) = (timed, r.is_ok()) {
            timed.own_work_done();
            if self.peers_read_everything(CallTuner::drain_allowance(&timed)) {
                if let Some(t) = &mut self.stream_tuner {
                    t.end(timed);
                }
            }
        }
        self.scratch = std::mem::take(&mut bufs.scratch);
        if device.is_some() {
            self.device_scratch = bufs.device_scratch.take();
        }
        if r.is_ok() {
            self.completed_calls += 1;
        }
        settle(r, &bufs)
    }

    /// Wait (spinning, then yielding) until the peers have read all this rank
    /// wrote to them, at most `allowance`; whether they did. Only a timed call
    /// waits (see [`CallTuner`]); the bytes are theirs to read whatever happens.
    fn peers_read_everything(&self, allowance: Duration) -> bool {
        let unread = || self.channels.iter().flatten().any(|c| c.sent_unread());
        let start = Instant::now();
        let mut spins = 0u32;
        while unread() {
            if start.elapsed() > allowance {
                return false;
            }
            spins += 1;
            if spins < 1024 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        true
    }

    /// Send or receive `len` bytes at `buf` (a device address with `device`).
    pub(super) fn point_to_point(
        &mut self,
        sig: CallSig,
        peer: usize,
        (buf, len): (*mut u8, usize),
        device: Option<&Arc<dyn Device>>,
    ) -> Result<()> {
        let peer_copy = self.peer_copy_for(device)?;
        let (step, seqs) = if sig.op == OpKind::Send {
            let s = self.p2p_sent[peer];
            self.p2p_sent[peer] += 1;
            (Step::Send { peer, src: Region::new(BufId::Input, 0, len) }, (s, s))
        } else {
            let s = self.p2p_received[peer];
            self.p2p_received[peer] += 1;
            (Step::Recv { peer, dst: Region::new(BufId::Output, 0, len) }, (s, s))
        };
        let schedule = Schedule {
            algorithm: Algorithm::Direct,
            rounds: vec![Round { steps: vec![step] }],
            scratch_bytes: 0,
            finalize: vec![],
        };
        let mut bufs = Buffers {
            input: buf,
            input_len: len,
            output: buf,
            output_len: len,
            scratch: Vec::new(),
            scratch_offset: 0,
            kind: if device.is_some() { MemKind::Device } else { MemKind::Host },
            device: device.cloned(),
            device_scratch: None,
            peer_copy,
            segments: None,
        };
        let r = self.run(sig, &schedule, &mut bufs, seqs);
        settle(r, &bufs)
    }
}

/// A call on device buffers returns once the device has finished its work: the
/// output is then final for the host and for later work on any stream.
fn settle(r: Result<()>, bufs: &Buffers) -> Result<()> {
    match &bufs.device {
        Some(dev) => {
            let synced = dev.synchronize();
            r.and(synced)
        }
        None => r,
    }
}

/// Divide an average's result regions by the world size on the device.
fn finalize_on_device(dev: &dyn Device, sig: CallSig, schedule: &Schedule, bufs: &Buffers, world: usize) -> Result<()> {
    for r in &schedule.finalize {
        let (base, len) = match (r.buf, &bufs.device_scratch) {
            (BufId::Output, _) => (bufs.output as usize as DevicePtr, bufs.output_len),
            (BufId::Input, _) => (bufs.input as usize as DevicePtr, bufs.input_len),
            (BufId::Scratch, Some(d)) => (d.ptr(), d.len()),
            (BufId::Scratch, None) => (0, 0),
        };
        if r.end() > len {
            return Err(Error::InvalidArgument(format!("finalize region {r:?} out of bounds")));
        }
        // SAFETY: an in-bounds region of the call's device buffers, which the caller
        // keeps for the call; `settle` waits for this work before the call returns.
        unsafe { dev.finalize(base + r.offset as u64, r.len, sig.dtype, sig.reduce_op, world)? };
    }
    Ok(())
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.notice_abort();
        // Dropped while its thread unwinds: the peers are told it panicked, not that
        // it closed in order, and with what message (noted by braid's panic hook).
        if self.broken.is_none() && std::thread::panicking() {
            let what = super::panic_note::take().map(|m| format!(": {m}")).unwrap_or_default();
            let reason = format!("rank {}: its thread panicked while it held the communicator{what}", self.rank);
            // Telling the peers must not unwind again while unwinding.
            let _ = catch_unwind(AssertUnwindSafe(|| self.fail(reason)));
            return;
        }
        if self.broken.is_none() {
            let give_up = std::time::Instant::now() + executor::CONTROL_GRACE;
            for ch in self.channels.iter_mut().flatten() {
                ch.send_control_and_close(FrameKind::Goodbye, self.comm_id, self.epoch, "", give_up);
            }
        }
    }
}

/// The flight recorder `cfg` asks for, watching for signals when it writes records.
fn new_recorder(
    rank: usize,
    world: usize,
    comm_id: u32,
    cfg: &crate::config::Config,
    flags: &Arc<executor::CallFlags>,
) -> Option<Arc<FlightRecorder>> {
    let who = crate::recorder::Identity { rank, world, comm_id, epoch: 0 };
    let recorder = Arc::new(FlightRecorder::new(who, cfg.trace_buffer, cfg.trace_dir.clone(), flags.clone())?);
    crate::recorder::signals::watch(&recorder);
    Some(recorder)
}

/// The link classes a rank prices with: inside its host, the class of a channel to
/// a rank of its host, and between hosts, that of a channel to another host. A
/// class the rank has no channel of takes what other ranks would have by default
/// (shared memory, TCP), so that ranks agree.
fn link_classes(rank: usize, channels: &[Option<Box<dyn PeerChannel>>], hosts: &[usize]) -> LinkPair {
    let host = |r: usize| hosts.get(r).copied().unwrap_or(0);
    let class = |same: bool| {
        channels.iter().enumerate().find_map(|(p, c)| match c {
            Some(c) if (host(p) == host(rank)) == same => Some(LinkClass::of(c.kind())),
            _ => None,
        })
    };
    LinkPair::new(class(true).unwrap_or(LinkClass::SharedMemory), class(false).unwrap_or(LinkClass::Tcp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    fn engine() -> Engine {
        let cfg = crate::config::Config::new(0, 2);
        let aborted = Arc::new(executor::CallFlags::default());
        Engine::new(0, 2, vec![None, None], 1, &cfg, WaitPolicy::for_ranks(2), aborted)
    }

    fn all_reduce(count: u64) -> CallSig {
        CallSig::new(OpKind::AllReduce, DType::F32, count, 0, ReduceOp::Sum)
    }

    fn fresh_plan(e: &Engine, sig: &CallSig) -> Schedule {
        let req = PlanRequest {
            op: sig.op,
            rank: e.rank,
            world: e.world,
            count: sig.count as usize,
            elem_size: sig.dtype.size(),
            root: sig.root as usize,
            algorithm: Some(
                e.tuner
                    .pick(&Call {
                        op: sig.op,
                        count: sig.count as usize,
                        elem_size: sig.dtype.size(),
                        root: sig.root as usize,
                        hosts: &e.hosts,
                        busy: &e.busy_hosts,
                    })
                    .unwrap(),
            ),
            hosts: &e.hosts,
            blocks: None,
        };
        algorithm::plan(&req).unwrap()
    }

    /// Calls cycling through more keys than the recent list holds (and back) get,
    /// every time, the plan their own key asks for, and the same shared plan as the
    /// first time (served by the recent list or the map, never planned again).
    #[test]
    fn recent_plans_serve_each_key_its_own_plan() {
        let mut e = engine();
        let sigs: Vec<CallSig> = (1..=RECENT_PLANS as u64 + 3).map(|i| all_reduce(i * 1000)).collect();
        let first: Vec<Arc<Schedule>> = sigs.iter().map(|s| e.schedule(s, false, Pricing::Links).unwrap()).collect();
        for (s, f) in sigs.iter().zip(&first) {
            assert_eq!(**f, fresh_plan(&e, s));
        }
        // Two keys alternating (an all-reduce and a barrier-sized call), then all of them backwards.
        let order = [0, 1, 0, 1, 0].into_iter().chain((0..sigs.len()).rev()).chain([2, 2, 0]);
        for i in order {
            let got = e.schedule(&sigs[i], false, Pricing::Links).unwrap();
            assert!(Arc::ptr_eq(&got, &first[i]), "call {i} got another key's plan or was planned again");
        }
        let keys: Vec<usize> = e.recent_plans.iter().map(|p| p.as_ref().unwrap().0 .1).collect();
        assert_eq!(keys, vec![1000, 3000, 2000, 4000], "most recent first, each key once");
    }
}
