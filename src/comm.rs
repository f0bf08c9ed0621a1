//! The communicator: the collective API on top of the executor.
//!
//! Calls run in the order they were issued on this rank, whether synchronous (on
//! the calling thread) or asynchronous (on one worker thread per communicator):
//! each call takes a ticket when issued and runs when its turn comes, so async
//! work overlaps the caller's computation without reordering the collectives that
//! every rank must issue in the same order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::algorithm::{self, Algorithm, BufId, PlanRequest, Region, Round, Schedule, Step};
use crate::bootstrap::{connect_store, PrefixStore, Store};
use crate::config::Config;
use crate::error::{Error, OpContext, Result};
use crate::executor::{self, Buffers, CallInfo, Channel, WaitPolicy};
use crate::frame::FrameKind;
use crate::reduce;
use crate::topology;
use crate::transport::loopback::LoopbackLink;
use crate::transport::shm::{self, connect_shm, ShmOptions};
use crate::transport::tcp::{connect_mesh, MeshOptions};
use crate::transport::{Link, TransportKind};
use crate::types::{CallSig, DType, Element, OpKind, ReduceOp};

/// What a cached schedule depends on: op, count, element size, root, algorithm.
type PlanKey = (OpKind, usize, usize, usize, Option<Algorithm>);

/// State that only the rank's current call touches.
pub(crate) struct Engine {
    rank: usize,
    world: usize,
    channels: Vec<Option<Channel>>,
    comm_id: u32,
    epoch: u8,
    coll_seq: u64,
    p2p_sent: Vec<u64>,
    p2p_received: Vec<u64>,
    timeout: Duration,
    wait: WaitPolicy,
    algorithm: Option<Algorithm>,
    broken: Option<String>,
    scratch: Vec<u8>,
    queues: executor::Queues,
    plans: HashMap<PlanKey, Arc<Schedule>>,
    last_plan: Option<(PlanKey, Arc<Schedule>)>,
}

impl Engine {
    fn ctx(&self, call: Option<CallSig>, seq: u64) -> OpContext {
        OpContext { rank: self.rank, call, seq }
    }

    fn schedule(&mut self, sig: &CallSig, algo: Option<Algorithm>) -> Result<Arc<Schedule>> {
        let req = PlanRequest {
            op: sig.op,
            rank: self.rank,
            world: self.world,
            count: sig.count as usize,
            elem_size: sig.dtype.size(),
            root: sig.root as usize,
            algorithm: algo.filter(|a| algorithm::algorithms_for(sig.op).contains(a)),
        };
        let key = (req.op, req.count, req.elem_size, req.root, req.algorithm);
        // Training loops repeat one call: check the last plan before hashing.
        if let Some((k, s)) = &self.last_plan {
            if *k == key {
                return Ok(s.clone());
            }
        }
        if let Some(s) = self.plans.get(&key) {
            self.last_plan = Some((key, s.clone()));
            return Ok(s.clone());
        }
        let s = Arc::new(algorithm::plan(&req).map_err(|e| Error::InvalidArgument(format!("planning {sig}: {e}")))?);
        if self.plans.len() > 256 {
            self.plans.clear();
        }
        self.plans.insert(key, s.clone());
        self.last_plan = Some((key, s.clone()));
        Ok(s)
    }

    /// Run one call. On failure the communicator is broken: every peer is told
    /// why (so no rank waits for a deadline) and later calls fail at once.
    fn run(&mut self, sig: CallSig, schedule: &Schedule, bufs: &mut Buffers, seqs: (u64, u64)) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::Broken(why.clone()));
        }
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
        };
        let result = executor::execute(schedule, &mut self.channels, &mut self.queues, bufs, &info).and_then(|()| {
            if sig.reduce_op == ReduceOp::Avg && sig.op.reduces() {
                for r in &schedule.finalize {
                    let (base, len) = match r.buf {
                        BufId::Output => (bufs.output, bufs.output_len),
                        BufId::Input => (bufs.input as *mut u8, bufs.input_len),
                        BufId::Scratch => (bufs.scratch.as_mut_ptr(), bufs.scratch.len()),
                    };
                    if r.end() > len {
                        return Err(Error::InvalidArgument(format!("finalize region {r:?} out of bounds")));
                    }
                    // SAFETY: in-bounds region of a live buffer; no other view is alive.
                    let s = unsafe { std::slice::from_raw_parts_mut(base.add(r.offset), r.len) };
                    reduce::finalize(sig.dtype, sig.reduce_op, s, self.world)?;
                }
            }
            Ok(())
        });
        if let Err(e) = &result {
            self.fail(e.to_string());
        }
        result
    }

    fn fail(&mut self, reason: String) {
        tracing::error!(rank = self.rank, "{reason}");
        for ch in self.channels.iter_mut().flatten() {
            ch.send_control_and_close(FrameKind::Abort, self.comm_id, self.epoch, &reason);
        }
        self.broken = Some(reason);
    }

    fn collective(
        &mut self,
        sig: CallSig,
        input: *const u8,
        input_len: usize,
        output: *mut u8,
        output_len: usize,
    ) -> Result<()> {
        let seq = self.coll_seq;
        self.coll_seq += 1;
        let schedule = self.schedule(&sig, self.algorithm)?;
        let mut bufs = Buffers { input, input_len, output, output_len, scratch: std::mem::take(&mut self.scratch) };
        let r = self.run(sig, &schedule, &mut bufs, (seq, seq));
        self.scratch = bufs.scratch;
        r
    }

    fn point_to_point(&mut self, sig: CallSig, peer: usize, buf: *mut u8, len: usize) -> Result<()> {
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
        let mut bufs = Buffers { input: buf, input_len: len, output: buf, output_len: len, scratch: Vec::new() };
        self.run(sig, &schedule, &mut bufs, seqs)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.broken.is_none() {
            for ch in self.channels.iter_mut().flatten() {
                ch.send_control_and_close(FrameKind::Goodbye, self.comm_id, self.epoch, "");
            }
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Issue-order ticketing shared by sync callers and the async worker.
struct Shared {
    engine: Mutex<Engine>,
    next_ticket: AtomicU64,
    /// (ticket now being served, threads waiting for their turn).
    serving: Mutex<(u64, usize)>,
    turn: Condvar,
}

impl Shared {
    fn take_ticket(&self) -> u64 {
        self.next_ticket.fetch_add(1, Ordering::SeqCst)
    }

    /// Wait for `ticket`'s turn, run `f` on the engine, pass the turn on. Every
    /// ticket taken must come through here exactly once, or later calls would wait
    /// for it forever.
    fn in_turn<R>(&self, ticket: u64, f: impl FnOnce(&mut Engine) -> R) -> R {
        let mut serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        while serving.0 != ticket {
            serving.1 += 1;
            serving = self.turn.wait(serving).unwrap_or_else(|e| e.into_inner());
            serving.1 -= 1;
        }
        drop(serving);
        let r = {
            let mut engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut engine)
        };
        let waiting = {
            let mut serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
            serving.0 += 1;
            serving.1
        };
        // Waking costs a system call: only when a thread waits for its turn.
        if waiting > 0 {
            self.turn.notify_all();
        }
        r
    }
}

/// A handle on an asynchronous call: `wait` for its result, or `test` whether it is done.
pub struct Work<R> {
    rx: mpsc::Receiver<Result<R>>,
    done: Option<Result<R>>,
}

impl<R> Work<R> {
    /// Whether the call has finished (successfully or not). Never blocks.
    pub fn test(&mut self) -> bool {
        if self.done.is_none() {
            if let Ok(r) = self.rx.try_recv() {
                self.done = Some(r);
            }
        }
        self.done.is_some()
    }

    /// Block until the call finishes and return its result (the buffers it owned).
    pub fn wait(mut self) -> Result<R> {
        match self.done.take() {
            Some(r) => r,
            None => self.rx.recv().unwrap_or_else(|_| Err(Error::Broken("the communicator's worker stopped".into()))),
        }
    }
}

/// What sync calls and async jobs share: identity, ticketing and the engine.
struct Core {
    rank: usize,
    world: usize,
    shared: Shared,
}

/// A validated call, ready for the engine.
struct Prepared {
    sig: CallSig,
    input: *const u8,
    input_len: usize,
    output: *mut u8,
    output_len: usize,
}

impl Core {
    fn arg(&self, msg: String) -> Error {
        Error::InvalidArgument(format!("rank {}: {msg}", self.rank))
    }

    fn check_rank(&self, what: &str, r: usize) -> Result<()> {
        if r >= self.world {
            return Err(self.arg(format!("{what} {r} is not a rank of this {}-rank communicator", self.world)));
        }
        Ok(())
    }

    fn block(&self, len: usize) -> Result<usize> {
        if len % self.world != 0 {
            return Err(self.arg(format!("buffer of {len} elements does not split into {} equal blocks", self.world)));
        }
        Ok(len / self.world)
    }

    /// Check sizes and work out the buffer layout (in-place aliasing included).
    fn prepare(&self, sig: CallSig, input: Option<&[u8]>, output: &mut [u8]) -> Result<Prepared> {
        if matches!(sig.op, OpKind::Send | OpKind::Recv) {
            return Err(self.arg("use send/recv for point-to-point calls".into()));
        }
        if sig.op.rooted() {
            self.check_rank("root", sig.root as usize)?;
        }
        let count = usize::try_from(sig.count).map_err(|_| self.arg("count too large".into()))?;
        let req = PlanRequest {
            op: sig.op,
            rank: self.rank,
            world: self.world,
            count,
            elem_size: sig.dtype.size(),
            root: sig.root as usize,
            algorithm: None,
        };
        let (in_bytes, out_bytes) = (req.input_bytes(), req.output_bytes());
        let is_root = sig.root as usize == self.rank;
        let base = output.as_mut_ptr();
        let out_len = output.len();
        match input {
            Some(inp) => {
                // Non-roots of a broadcast have no input; non-roots of a reduce no output.
                let has_input = sig.op != OpKind::Broadcast || is_root;
                let has_output = sig.op != OpKind::Reduce || is_root;
                if has_input && inp.len() != in_bytes {
                    return Err(self.arg(format!("{sig}: input has {} bytes, expected {in_bytes}", inp.len())));
                }
                if has_output && out_len != out_bytes {
                    return Err(self.arg(format!("{sig}: output has {out_len} bytes, expected {out_bytes}")));
                }
                Ok(Prepared { sig, input: inp.as_ptr(), input_len: inp.len(), output: base, output_len: out_len })
            }
            None => {
                let need = in_bytes.max(out_bytes);
                if out_len != need {
                    return Err(self.arg(format!("{sig}: in-place buffer has {out_len} bytes, expected {need}")));
                }
                let block = count * sig.dtype.size();
                // SAFETY (both adds): block `rank` lies inside the buffer, whose length was checked.
                Ok(match sig.op {
                    OpKind::AllGather => Prepared {
                        sig,
                        input: unsafe { base.add(self.rank * block) },
                        input_len: block,
                        output: base,
                        output_len: need,
                    },
                    OpKind::ReduceScatter => Prepared {
                        sig,
                        input: base,
                        input_len: need,
                        output: unsafe { base.add(self.rank * block) },
                        output_len: block,
                    },
                    _ => Prepared { sig, input: base, input_len: need, output: base, output_len: need },
                })
            }
        }
    }

    /// Run a collective at `ticket` (the byte form behind every typed call).
    fn collective_at(&self, ticket: u64, sig: CallSig, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        let sig = CallSig::new(sig.op, sig.dtype, sig.count, sig.root, sig.reduce_op);
        if sig.op == OpKind::AllToAll && input.is_none() {
            // Every block is both read and overwritten: work from a copy.
            let copy = output.to_vec();
            return self.collective_at(ticket, sig, Some(&copy), output);
        }
        let prepared = self.prepare(sig, input, output);
        self.shared.in_turn(ticket, |e| {
            let p = prepared?;
            e.collective(p.sig, p.input, p.input_len, p.output, p.output_len)
        })
    }

    fn p2p_at(&self, ticket: u64, op: OpKind, ptr: *mut u8, len: usize, dtype: DType, peer: usize) -> Result<()> {
        let checked = self.check_rank("peer", peer).and_then(|()| {
            if peer == self.rank {
                return Err(self.arg(format!("{op} to itself")));
            }
            if len % dtype.size() != 0 {
                return Err(self.arg(format!("{op}: {len} bytes is not a whole number of {dtype}")));
            }
            Ok(CallSig::new(op, dtype, (len / dtype.size()) as u64, peer as u32, ReduceOp::Sum))
        });
        self.shared.in_turn(ticket, |e| e.point_to_point(checked?, peer, ptr, len))
    }
}

/// A group of ranks that run collectives together.
///
/// Every rank must issue the same collectives in the same order; a rank that
/// issues a different call gets [`Error::Mismatch`] naming both calls, and its
/// peers learn why from an abort frame instead of waiting for a deadline.
pub struct Communicator {
    core: Arc<Core>,
    /// The rendezvous store, kept for the communicator's life: when this rank
    /// hosts it, dropping it would stop the server under ranks still setting up.
    _store: Option<Arc<dyn Store>>,
    transports: Vec<Option<TransportKind>>,
    worker: Mutex<Option<(mpsc::Sender<Job>, JoinHandle<()>)>>,
}

/// Builds a [`Communicator`] from explicit settings (see [`Config`] for the knobs).
pub struct CommunicatorBuilder {
    config: Config,
    store: Option<Arc<dyn Store>>,
}

impl CommunicatorBuilder {
    /// Start from a configuration (e.g. `Config::from_env()?`).
    pub fn from_config(config: Config) -> CommunicatorBuilder {
        CommunicatorBuilder { config, store: None }
    }
    /// Use this store for rendezvous instead of `config.store`.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }
    /// Store URL (`tcp://HOST:PORT`, `file:///PATH`).
    pub fn store_url(mut self, url: impl Into<String>) -> Self {
        self.config.store = Some(url.into());
        self
    }
    /// Deadline of every blocking wait.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.config.timeout = t;
        self
    }
    /// Force an algorithm (None for automatic choice).
    pub fn algorithm(mut self, a: Option<Algorithm>) -> Self {
        self.config.algorithm = a;
        self
    }
    /// Restrict the transports peers may use (e.g. `[TransportKind::Tcp]`).
    pub fn transports(mut self, allowed: Vec<TransportKind>) -> Self {
        self.config.transports = Some(allowed);
        self
    }
    /// TCP interface filter (NCCL syntax).
    pub fn socket_ifname(mut self, spec: impl Into<String>) -> Self {
        self.config.socket_ifname = Some(spec.into());
        self
    }

    /// Connect to every peer and return the communicator.
    pub fn build(self) -> Result<Communicator> {
        let cfg = self.config;
        let store = match self.store {
            Some(s) => s,
            None => {
                let url = cfg.store.as_deref().ok_or_else(|| {
                    Error::Config(
                        "no store: set BRAID_STORE (tcp://HOST:PORT or file:///PATH) or pass one to the builder".into(),
                    )
                })?;
                connect_store(url, cfg.rank == 0, cfg.job_key.clone(), cfg.timeout)?
            }
        };
        let prefix = "braid/comm0".to_string();
        let comm_id = fnv32(prefix.as_bytes());
        let scoped = PrefixStore::new(prefix, store.clone());
        // Which peers share this host is probed, not guessed; each peer then gets
        // the first allowed transport that can reach it (shared memory, then TCP).
        let topo = topology::discover(cfg.rank, cfg.world_size, &scoped, "topo", cfg.timeout)?;
        let kinds = topology::choose_transports(&topo, cfg.rank, cfg.transports.as_deref())?;
        let wanted = |k: TransportKind| kinds.iter().map(|t| *t == Some(k)).collect::<Vec<bool>>();
        let mut links: Vec<Option<Box<dyn Link>>> = (0..cfg.world_size).map(|_| None).collect();
        let shm_peers = wanted(TransportKind::Shm);
        if shm_peers.iter().any(|b| *b) {
            let mut opts = ShmOptions::new(cfg.rank, cfg.world_size, "shm");
            opts.peers = shm_peers;
            opts.timeout = cfg.timeout;
            opts.ring_bytes = cfg.shm_ring_bytes.unwrap_or_else(|| shm::default_ring_bytes(topo.local_size));
            opts.cma = crate::executor::single_copy::cma_for_plain_buffers();
            opts.key = cfg.job_key.clone();
            for (p, l) in connect_shm(&opts, &scoped)?.into_iter().enumerate() {
                if let Some(l) = l {
                    links[p] = Some(Box::new(l));
                }
            }
        }
        let tcp_peers = wanted(TransportKind::Tcp);
        if tcp_peers.iter().any(|b| *b) {
            let mut opts = MeshOptions::new(cfg.rank, cfg.world_size, "mesh");
            opts.ifname = cfg.socket_ifname.clone();
            opts.timeout = cfg.timeout;
            opts.comm_id = comm_id as u64;
            opts.peers = Some(tcp_peers);
            opts.key = cfg.job_key.clone();
            for (p, l) in connect_mesh(&opts, &scoped)?.into_iter().enumerate() {
                if let Some(l) = l {
                    links[p] = Some(Box::new(l));
                }
            }
        }
        let wait = WaitPolicy::for_ranks(topo.local_size);
        let mut comm = Communicator::from_links(cfg.rank, cfg.world_size, links, comm_id, &cfg, wait);
        comm._store = Some(store);
        Ok(comm)
    }
}

/// 32-bit FNV-1a: a stable communicator id from its store namespace.
fn fnv32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| (h ^ *b as u32).wrapping_mul(0x0100_0193))
}

impl Communicator {
    /// Connect using the environment (`BRAID_RANK`, `BRAID_WORLD_SIZE`, `BRAID_STORE`, ...
    /// or a recognised launcher's variables).
    pub fn from_env() -> Result<Communicator> {
        CommunicatorBuilder::from_config(Config::from_env()?).build()
    }

    /// A builder for rank `rank` of `world_size`.
    pub fn builder(rank: usize, world_size: usize) -> CommunicatorBuilder {
        CommunicatorBuilder::from_config(Config::new(rank, world_size))
    }

    /// `world_size` communicators whose ranks are threads of this process, joined by
    /// in-memory links. Move each into its own thread.
    pub fn in_process(world_size: usize) -> Result<Vec<Communicator>> {
        Communicator::in_process_with(Config::new(0, world_size.max(1)))
    }

    /// Like [`Communicator::in_process`], with the timeout and algorithm of `cfg`
    /// (its world size gives the number of ranks).
    pub fn in_process_with(cfg: Config) -> Result<Vec<Communicator>> {
        let world = cfg.world_size;
        if world == 0 {
            return Err(Error::InvalidArgument("world size must be at least 1".into()));
        }
        // Distinct ids keep frames of two in-process groups apart; not global state
        // that affects behaviour.
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let comm_id = fnv32(&NEXT_ID.fetch_add(1, Ordering::Relaxed).to_le_bytes()) ^ std::process::id();
        let wait = WaitPolicy::for_ranks(world);
        Ok(LoopbackLink::mesh(world)
            .into_iter()
            .enumerate()
            .map(|(rank, row)| {
                let links = row.into_iter().map(|l| l.map(|l| Box::new(l) as Box<dyn Link>)).collect();
                Communicator::from_links(rank, world, links, comm_id, &cfg, wait)
            })
            .collect())
    }

    /// A communicator over already-connected links (`links[p]` reaches rank `p`).
    pub fn from_links(
        rank: usize,
        world: usize,
        links: Vec<Option<Box<dyn Link>>>,
        comm_id: u32,
        cfg: &Config,
        wait: WaitPolicy,
    ) -> Communicator {
        let transports = links.iter().map(|l| l.as_ref().map(|l| l.kind())).collect();
        let engine = Engine {
            rank,
            world,
            channels: links.into_iter().map(|l| l.map(Channel::new)).collect(),
            comm_id,
            epoch: 0,
            coll_seq: 0,
            p2p_sent: vec![0; world],
            p2p_received: vec![0; world],
            timeout: cfg.timeout,
            wait,
            algorithm: cfg.algorithm,
            broken: None,
            scratch: Vec::new(),
            queues: executor::Queues::default(),
            plans: HashMap::new(),
            last_plan: None,
        };
        let shared = Shared {
            engine: Mutex::new(engine),
            next_ticket: AtomicU64::new(0),
            serving: Mutex::new((0, 0)),
            turn: Condvar::new(),
        };
        Communicator {
            core: Arc::new(Core { rank, world, shared }),
            _store: None,
            transports,
            worker: Mutex::new(None),
        }
    }

    /// This rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.core.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.core.world
    }

    /// The transport used to reach each peer (None at this rank's own index).
    pub fn transports(&self) -> &[Option<TransportKind>] {
        &self.transports
    }

    /// Force an algorithm for later calls (None: automatic). Every rank must agree.
    pub fn set_algorithm(&self, a: Option<Algorithm>) {
        self.core.shared.engine.lock().unwrap_or_else(|e| e.into_inner()).algorithm = a;
    }

    /// The schedule this rank would run for `sig`, without running it.
    pub fn plan(&self, sig: &CallSig) -> Result<Arc<Schedule>> {
        let mut e = self.core.shared.engine.lock().unwrap_or_else(|e| e.into_inner());
        let a = e.algorithm;
        e.schedule(sig, a)
    }

    /// The byte-buffer form of every collective: `sig` says what to run, `input` is
    /// None for in-place calls (the data is then in `output`), lengths are in bytes.
    /// In-place layouts follow NCCL: all-gather finds this rank's block at
    /// `rank * count` of the buffer; reduce-scatter leaves its result there.
    pub fn collective_bytes(&self, sig: CallSig, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        self.core.collective_at(self.core.shared.take_ticket(), sig, input, output)
    }

    /// Send `buf` (bytes of `dtype`) to `peer`; matched by that peer's `recv_bytes`.
    pub fn send_bytes(&self, buf: &[u8], dtype: DType, peer: usize) -> Result<()> {
        let t = self.core.shared.take_ticket();
        self.core.p2p_at(t, OpKind::Send, buf.as_ptr() as *mut u8, buf.len(), dtype, peer)
    }

    /// Receive into `buf` (bytes of `dtype`) from `peer`.
    pub fn recv_bytes(&self, buf: &mut [u8], dtype: DType, peer: usize) -> Result<()> {
        let t = self.core.shared.take_ticket();
        self.core.p2p_at(t, OpKind::Recv, buf.as_mut_ptr(), buf.len(), dtype, peer)
    }

    fn typed<T: Element>(
        &self,
        op: OpKind,
        count: usize,
        root: usize,
        rop: ReduceOp,
        input: Option<&[T]>,
        out: &mut [T],
    ) -> Result<()> {
        let sig = CallSig::new(op, T::DTYPE, count as u64, root as u32, rop);
        self.collective_bytes(sig, input.map(bytemuck::cast_slice), bytemuck::cast_slice_mut(out))
    }

    /// Reduce `input` across ranks into `output` on every rank.
    pub fn all_reduce<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> Result<()> {
        self.typed(OpKind::AllReduce, input.len(), 0, op, Some(input), output)
    }
    /// Reduce `buf` across ranks in place.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.typed(OpKind::AllReduce, buf.len(), 0, op, None, buf)
    }
    /// Broadcast `buf` from `root` to every rank, in place.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.typed(OpKind::Broadcast, buf.len(), root, ReduceOp::Sum, None, buf)
    }
    /// Broadcast root's `input` into every rank's `output` (`input` is read only at the root).
    pub fn broadcast_out_of_place<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        self.typed(OpKind::Broadcast, output.len(), root, ReduceOp::Sum, Some(input), output)
    }
    /// Gather every rank's `input` into `output` (`world_size * input.len()`), in rank order.
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.typed(OpKind::AllGather, input.len(), 0, ReduceOp::Sum, Some(input), output)
    }
    /// All-gather in place: this rank's block is already at block `rank` of `buf`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let c = self.core.block(buf.len())?;
        self.typed(OpKind::AllGather, c, 0, ReduceOp::Sum, None, buf)
    }
    /// Reduce `input` (`world_size * output.len()` elements) and leave block `rank` in `output`.
    pub fn reduce_scatter<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> Result<()> {
        self.typed(OpKind::ReduceScatter, output.len(), 0, op, Some(input), output)
    }
    /// Reduce-scatter in place: the result lands at block `rank` of `buf`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let c = self.core.block(buf.len())?;
        self.typed(OpKind::ReduceScatter, c, 0, op, None, buf)
    }
    /// Reduce `input` across ranks into `output` at `root` (other ranks may pass an empty output).
    pub fn reduce<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.typed(OpKind::Reduce, input.len(), root, op, Some(input), output)
    }
    /// Reduce in place: the root's `buf` receives the result; other ranks' stay unchanged.
    pub fn reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.typed(OpKind::Reduce, buf.len(), root, op, None, buf)
    }
    /// Send block `j` of `input` to rank `j`; receive rank `j`'s block `rank` into block `j` of `output`.
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let c = self.core.block(input.len())?;
        self.typed(OpKind::AllToAll, c, 0, ReduceOp::Sum, Some(input), output)
    }
    /// All-to-all in place.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let c = self.core.block(buf.len())?;
        self.typed(OpKind::AllToAll, c, 0, ReduceOp::Sum, None, buf)
    }
    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.collective_bytes(CallSig::new(OpKind::Barrier, DType::U8, 0, 0, ReduceOp::Sum), None, &mut [])
    }
    /// Send `buf` to `peer`.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.send_bytes(bytemuck::cast_slice(buf), T::DTYPE, peer)
    }
    /// Receive `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.recv_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, peer)
    }

    /// Take the next ticket now (issue order) and run `job` with it on the worker thread.
    fn spawn<R: Send + 'static>(&self, job: impl FnOnce(&Core, u64) -> Result<R> + Send + 'static) -> Work<R> {
        let (tx, rx) = mpsc::channel();
        let ticket = self.core.shared.take_ticket();
        let core = self.core.clone();
        let boxed: Job = Box::new(move || {
            let _ = tx.send(job(&core, ticket));
        });
        let mut w = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            let (jtx, jrx) = mpsc::channel::<Job>();
            match std::thread::Builder::new()
                .name(format!("braid-work-{}", self.rank()))
                .spawn(move || jrx.into_iter().for_each(|job| job()))
            {
                Ok(handle) => *w = Some((jtx, handle)),
                Err(e) => {
                    // Run in place so the ticket is still consumed.
                    tracing::warn!("cannot start the async worker ({e}); running the call synchronously");
                    boxed();
                    return Work { rx, done: None };
                }
            }
        }
        if let Some((sender, _)) = w.as_ref() {
            if let Err(mpsc::SendError(job)) = sender.send(boxed) {
                job();
            }
        }
        Work { rx, done: None }
    }

    fn typed_async<T: Element>(&self, op: OpKind, rop: ReduceOp, root: usize, mut buf: Vec<T>) -> Work<Vec<T>> {
        self.spawn(move |core, t| {
            let count = match op {
                OpKind::AllGather | OpKind::ReduceScatter => core.block(buf.len())?,
                _ => buf.len(),
            };
            let sig = CallSig::new(op, T::DTYPE, count as u64, root as u32, rop);
            core.collective_at(t, sig, None, bytemuck::cast_slice_mut(&mut buf)).map(|()| buf)
        })
    }

    /// Asynchronous in-place all-reduce of an owned buffer.
    pub fn all_reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        self.typed_async(OpKind::AllReduce, op, 0, buf)
    }
    /// Asynchronous in-place broadcast of an owned buffer.
    pub fn broadcast_async<T: Element>(&self, buf: Vec<T>, root: usize) -> Work<Vec<T>> {
        self.typed_async(OpKind::Broadcast, ReduceOp::Sum, root, buf)
    }
    /// Asynchronous in-place all-gather (this rank's block at block `rank` of `buf`).
    pub fn all_gather_async<T: Element>(&self, buf: Vec<T>) -> Work<Vec<T>> {
        self.typed_async(OpKind::AllGather, ReduceOp::Sum, 0, buf)
    }
    /// Asynchronous in-place reduce-scatter (result at block `rank` of `buf`).
    pub fn reduce_scatter_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        self.typed_async(OpKind::ReduceScatter, op, 0, buf)
    }
    /// Asynchronous barrier.
    pub fn barrier_async(&self) -> Work<()> {
        self.spawn(|core, t| {
            core.collective_at(t, CallSig::new(OpKind::Barrier, DType::U8, 0, 0, ReduceOp::Sum), None, &mut [])
        })
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Finish queued async work first: its tickets precede nothing else.
        if let Some((sender, handle)) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            drop(sender);
            let _ = handle.join();
        }
    }
}
