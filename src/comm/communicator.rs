//! The communicator and the handle of its asynchronous calls: the public API
//! of a rank, with its synchronous calls and the worker thread that runs its
//! asynchronous ones in issue order (module docs in `mod.rs`). The other files
//! of `comm` add `impl Communicator` blocks; `mod.rs` re-exports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use super::calls::Core;
use super::engine::{Engine, Pricing};
use super::origin::{InProcGroup, Origin};
use super::panic_note;
use super::turn::Shared;
use crate::algorithm::{Algorithm, Schedule};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::executor::{PeerChannel, StreamChannel, WaitPolicy};
use crate::transport::loopback::LoopbackLink;
use crate::transport::{Link, TransportKind};
use crate::tuner::AlgoPolicy;
use crate::types::{CallSig, DType, Element, OpKind, ReduceOp};

type Job = Box<dyn FnOnce() + Send>;

/// A handle on an asynchronous call: `wait` for its result, or `test` whether it is done.
pub struct Work<R> {
    pub(super) rx: mpsc::Receiver<Result<R>>,
    pub(super) done: Option<Result<R>>,
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
            None => self.rx.recv().unwrap_or_else(|_| Err(worker_stopped())),
        }
    }

    /// Block until the call finishes or `timeout` passes, whichever comes first.
    ///
    /// `Ok(Some(r))`: it finished with `r`; `Ok(None)`: it still runs (the Work stays
    /// pending: test it, wait again, or `wait`); `Err(e)`: it failed with `e`. Once
    /// this has returned the result (or the error), the Work is spent: a later
    /// `wait` or `wait_timeout` is [`Error::InvalidArgument`], and `test` says done.
    /// A zero timeout only looks, as [`Work::test`] does.
    pub fn wait_timeout(&mut self, timeout: std::time::Duration) -> Result<Option<R>> {
        if self.done.is_none() {
            match self.rx.recv_timeout(timeout) {
                Ok(r) => self.done = Some(r),
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(None),
                Err(mpsc::RecvTimeoutError::Disconnected) => self.done = Some(Err(worker_stopped())),
            }
        }
        let spent = Err(Error::InvalidArgument("this work's result was already returned by wait_timeout".into()));
        match self.done.replace(spent) {
            Some(r) => r.map(Some),
            None => unreachable!("set above"),
        }
    }
}

/// The error of a Work whose job was dropped unrun (the worker thread ended).
fn worker_stopped() -> Error {
    Error::Broken("the communicator's worker stopped".into())
}

/// A group of ranks that run collectives together.
///
/// Every rank must issue the same collectives in the same order; a rank that
/// issues a different call gets [`Error::Mismatch`] naming both calls, and its
/// peers learn why from an abort frame instead of waiting for a deadline.
///
/// Three ranks as threads of this process, each adding its own values into the
/// sum every rank receives:
///
/// ```
/// use braid::{Communicator, ReduceOp};
/// let comms = Communicator::in_process(3)?;
/// let sums = std::thread::scope(|s| {
///     let ranks: Vec<_> = comms
///         .iter()
///         .map(|c| {
///             s.spawn(move || {
///                 let grads = [c.rank() as f32 + 1.0; 4];
///                 let mut sum = [0f32; 4];
///                 c.all_reduce(&grads, &mut sum, ReduceOp::Sum).map(|()| sum)
///             })
///         })
///         .collect();
///     ranks.into_iter().map(|h| h.join().unwrap()).collect::<braid::Result<Vec<_>>>()
/// })?;
/// assert_eq!(sums, vec![[6.0; 4]; 3]); // 1 + 2 + 3 on every rank
/// # Ok::<(), braid::Error>(())
/// ```
pub struct Communicator {
    pub(super) core: Arc<Core>,
    /// How it was made: what [`Communicator::split`] builds children from. Holds
    /// the rendezvous store for the communicator's life: when this rank hosts it,
    /// dropping it would stop the server under ranks still setting up.
    pub(super) origin: Origin,
    /// Splits and dups so far (names each child's store namespace).
    pub(super) splits: AtomicU64,
    /// Agreements so far ([`Communicator::agree`]; names each one's store keys).
    pub(super) agreements: AtomicU64,
    /// `new_group` calls so far, by rank list: only the listed ranks count them.
    pub(super) groups: Mutex<std::collections::HashMap<Vec<usize>, u64>>,
    comm_id: u32,
    transports: Vec<Option<TransportKind>>,
    worker: Mutex<Option<(mpsc::Sender<Job>, JoinHandle<()>)>>,
    /// The worker thread's niceness ([`crate::config::Tuning::worker_nice`]).
    worker_nice: i32,
}

impl Communicator {
    /// `world_size` communicators whose ranks are threads of this process, joined by
    /// in-memory links. Move each into its own thread (or share it with one, as
    /// here: the calls take `&self`).
    ///
    /// ```
    /// use braid::{Communicator, ReduceOp};
    /// let comms = Communicator::in_process(4)?;
    /// assert_eq!(comms.iter().map(|c| c.rank()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    /// assert!(comms.iter().all(|c| c.world_size() == 4));
    /// std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|c| s.spawn(move || -> braid::Result<()> {
    ///             let mut top = [c.rank() as i32];
    ///             c.all_reduce_in_place(&mut top, ReduceOp::Max)?;
    ///             assert_eq!(top, [3]);
    ///             Ok(())
    ///         }))
    ///         .collect();
    ///     ranks.into_iter().try_for_each(|h| h.join().unwrap())
    /// })?;
    /// # Ok::<(), braid::Error>(())
    /// ```
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
        // Distinct prefixes keep frames of two in-process groups apart; the nonce
        // keeps them apart from another process's groups.
        static NEXT_GROUP: AtomicU64 = AtomicU64::new(0);
        let prefix = format!("inproc/{}", NEXT_GROUP.fetch_add(1, Ordering::Relaxed));
        let group = Arc::new(InProcGroup::new(
            prefix,
            crate::auth::random_bytes::<16>(),
            cfg.clone(),
            Arc::new(crate::bootstrap::MemStore::new()),
        ));
        let wait = WaitPolicy::for_ranks(world).with_spin(cfg.tuning.spin);
        LoopbackLink::mesh(world)
            .into_iter()
            .enumerate()
            .map(|(rank, row)| {
                let fault = cfg.fault.as_ref();
                let links = row
                    .into_iter()
                    .map(|l| l.map(|l| crate::transport::fault::wrap(fault, rank, Box::new(l))))
                    .collect();
                let mut comm = Communicator::from_links(rank, world, links, group.id(), &cfg, wait);
                comm.serve_metrics(&cfg)?;
                comm.origin = Origin::InProcess(group.clone());
                Ok(comm)
            })
            .collect()
    }

    /// Like [`Communicator::in_process_with`], with the ranks planned as if spread
    /// over hosts: `host_labels[r]` names rank r's host (equal labels, same host).
    /// The links stay in-memory; planners and the tuner follow the layout, which is
    /// how hierarchical schedules run on one machine (replicas grouped by socket or
    /// device, or a test of a multi-host layout).
    pub fn in_process_on_hosts(cfg: Config, host_labels: &[usize]) -> Result<Vec<Communicator>> {
        if host_labels.len() != cfg.world_size {
            return Err(Error::InvalidArgument(format!(
                "{} host labels for a world of {}",
                host_labels.len(),
                cfg.world_size
            )));
        }
        let comms = Communicator::in_process_with(cfg)?;
        let topo = crate::topology::Topology::from_labels(0, host_labels);
        for c in &comms {
            let mut e = c.core.shared.lock_engine();
            // Threads of one machine: every host is as busy as the machine is.
            let busy = vec![e.busy_hosts.first().copied().unwrap_or(false); topo.num_hosts()];
            e.set_hosts(topo.host_of.clone(), busy);
        }
        Ok(comms)
    }

    /// A communicator over already-connected links (`links[p]` reaches rank `p`).
    pub(crate) fn from_links(
        rank: usize,
        world: usize,
        links: Vec<Option<Box<dyn Link>>>,
        comm_id: u32,
        cfg: &Config,
        wait: WaitPolicy,
    ) -> Communicator {
        let channels = links
            .into_iter()
            .map(|l| l.map(|l| Box::new(StreamChannel::with_tuning(l, cfg.tuning)) as Box<dyn PeerChannel>))
            .collect();
        Communicator::from_channels(rank, world, channels, comm_id, cfg, wait)
    }

    /// A communicator over already-connected channels (`channels[p]` reaches rank
    /// `p`): stream channels over links, or channels of other kinds (verbs).
    pub(crate) fn from_channels(
        rank: usize,
        world: usize,
        channels: Vec<Option<Box<dyn PeerChannel>>>,
        comm_id: u32,
        cfg: &Config,
        wait: WaitPolicy,
    ) -> Communicator {
        let transports = channels.iter().map(|c| c.as_ref().map(|c| c.kind())).collect();
        let aborted = Arc::new(crate::executor::CallFlags::default());
        panic_note::install();
        let engine = Engine::new(rank, world, channels, comm_id, cfg, wait, aborted.clone());
        Communicator {
            core: Arc::new(Core { rank, world, shared: Shared::new(engine, aborted) }),
            origin: Origin::Links,
            splits: AtomicU64::new(0),
            agreements: AtomicU64::new(0),
            groups: Mutex::new(std::collections::HashMap::new()),
            comm_id,
            transports,
            worker: Mutex::new(None),
            worker_nice: cfg.tuning.worker_nice,
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

    /// Ranks of this communicator on this rank's host, itself included (as the
    /// communicator placed them: every rank of an in-process group).
    pub fn local_ranks(&self) -> usize {
        let e = self.core.shared.lock_engine();
        let me = e.hosts.get(self.rank()).copied();
        e.hosts.iter().filter(|&&h| Some(h) == me).count().max(1)
    }

    /// The deadline of every wait of this communicator (`BRAID_TIMEOUT`). Waits for
    /// a call in progress on another thread to finish.
    pub fn timeout(&self) -> std::time::Duration {
        self.core.shared.lock_engine().timeout
    }

    /// The transport used to reach each peer (None at this rank's own index).
    pub fn transports(&self) -> &[Option<TransportKind>] {
        &self.transports
    }

    /// The id every frame of this communicator carries (a hash of its store
    /// namespace and a nonce drawn by rank 0; distinct for every communicator).
    pub fn id(&self) -> u32 {
        self.comm_id
    }

    /// Abort this communicator, from any thread, also while calls are in flight
    /// or queued: each of them, and every later call, returns
    /// [`Error::Aborted`] — the one in flight within its executor's next pass
    /// (well under a second on every transport) — and the peers are sent an
    /// abort frame after everything this rank sent them, so their calls that still
    /// need this rank fail with [`Error::PeerAborted`] instead of waiting for a
    /// deadline, while a call this rank already served completes. Never blocks on
    /// the call in flight. Cannot be undone.
    pub fn abort(&self) {
        self.core.shared.abort();
    }

    /// This rank's flight record: its last calls (`BRAID_TRACE_BUFFER` of them),
    /// where each got to and how each failed, as one JSON object (fields in
    /// [`crate::recorder::FlightRecorder::to_json`]; `braid doctor` reads a
    /// directory of them). Safe to call from another thread while a call hangs.
    /// None when the recorder is off (`BRAID_TRACE_BUFFER=0`).
    pub fn flight_record(&self) -> Option<String> {
        self.core.shared.recorder.as_ref().map(|r| r.to_json("on demand"))
    }

    /// What this rank counted so far, per op: calls, failures, bytes, time and bus
    /// bandwidth histograms, and failures by kind. None when metrics are off (they
    /// are on with `BRAID_METRICS=1`, `BRAID_METRICS_ADDR` or [`Config::metrics`]).
    /// Reads atomics: safe from any thread, also while a call runs.
    pub fn stats(&self) -> Option<crate::recorder::metrics::Stats> {
        self.core.shared.metrics.as_ref().map(|m| m.snapshot())
    }

    /// Whether this communicator writes a timeline (`BRAID_TIMELINE`): layers above
    /// it time their work for [`Communicator::timeline_span`] only then.
    pub fn timeline_on(&self) -> bool {
        self.core.shared.timeline_on
    }

    /// Add a span of work above the collectives (a fusion bucket, a strategy step)
    /// from `start` to `end` to this rank's timeline, in category `cat`, with one
    /// numeric argument. Nothing when the timeline is off. Waits for a call running
    /// on another thread to end.
    pub fn timeline_span(
        &self,
        name: &str,
        cat: &str,
        (start, end): (std::time::Instant, std::time::Instant),
        arg: Option<(&str, u64)>,
    ) {
        if self.core.shared.timeline_on {
            if let Some(t) = self.core.shared.lock_engine().timeline.as_mut() {
                t.span(name, cat, (start, end), arg);
            }
        }
    }

    /// With `cfg.metrics_addr`, serve this communicator's counters to Prometheus
    /// (see [`crate::recorder::exporter`]).
    pub(crate) fn serve_metrics(&self, cfg: &Config) -> Result<()> {
        if let (Some(addr), Some(m)) = (&cfg.metrics_addr, &self.core.shared.metrics) {
            crate::recorder::exporter::register(addr, cfg.local_rank.unwrap_or(0), m)?;
        }
        Ok(())
    }

    /// Write this rank's flight record into `dir`, or else into `BRAID_TRACE_DIR`,
    /// as `braid-<comm>-e<epoch>-rank<r>.json` (replacing an earlier one whole):
    /// the file's path.
    pub fn dump_flight_record(&self, dir: Option<&std::path::Path>) -> Result<std::path::PathBuf> {
        let Some(r) = self.core.shared.recorder.as_ref() else {
            return Err(Error::Unsupported("the flight recorder is off (BRAID_TRACE_BUFFER=0)".into()));
        };
        let Some(dir) = dir.or(r.dir()) else {
            return Err(Error::InvalidArgument(
                "no directory for the flight record: pass one or set BRAID_TRACE_DIR".into(),
            ));
        };
        r.dump_to(dir, "on demand")
            .map_err(|source| Error::Io { what: format!("writing the flight record into {}", dir.display()), source })
    }

    /// Close this communicator and report whether every rank closed it in order:
    /// what dropping it cannot report.
    ///
    /// Collective: every rank calls `destroy`, in the same order relative to its
    /// other calls on this communicator (as MPI's `MPI_Comm_free`). Queued async
    /// work finishes first; then the ranks confirm to each other that each reached
    /// its close (a barrier, under the communicator's timeout) and say goodbye.
    /// The error names the peer that did not: one that exited or was killed, one
    /// that aborted, one that dropped its communicator instead, or one that did not
    /// come within the timeout.
    ///
    /// A communicator that was aborted, or broken by a failed call, closes without
    /// the exchange and returns `Ok`: its failure has been reported already.
    pub fn destroy(self) -> Result<()> {
        self.finish_async();
        let settled = self.is_aborted() || self.core.shared.lock_engine().broken.is_some();
        let confirmed = if settled { Ok(()) } else { self.barrier() };
        drop(self);
        confirmed
    }

    /// Run the queued async work to its end and stop the worker thread.
    fn finish_async(&self) {
        if let Some((sender, handle)) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            drop(sender);
            let _ = handle.join();
        }
    }

    /// Whether [`Communicator::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.core.shared.is_aborted()
    }

    /// Force an algorithm for later calls wherever it applies (None: automatic).
    /// Every rank must agree (a rank that does not fails its next call naming both).
    pub fn set_algorithm(&self, a: Option<Algorithm>) {
        self.set_algorithms(a.map_or_else(AlgoPolicy::auto, AlgoPolicy::only));
    }

    /// The algorithms later calls may use (as `BRAID_ALGO`). Every rank must agree.
    pub fn set_algorithms(&self, policy: AlgoPolicy) {
        self.core.shared.lock_engine().set_policy(policy);
    }

    /// Reproducible mode for later calls (as `BRAID_DETERMINISTIC`): reducing
    /// collectives fold every element in rank order. Every rank must agree (a rank
    /// that does not fails its next reducing call naming both modes).
    pub fn set_deterministic(&self, on: bool) {
        self.core.shared.lock_engine().set_deterministic(on);
    }

    /// The schedule this rank would run for `sig` on host buffers, without running it.
    pub fn plan(&self, sig: &CallSig) -> Result<Arc<Schedule>> {
        let mut engine = self.core.shared.lock_engine();
        let agreed = engine.agrees(sig);
        engine.schedule(sig, agreed, Pricing::Links)
    }

    /// The schedule this rank would run for `sig` on buffers of `device`, without
    /// running it: between peers that all copy single-copy, one priced on the
    /// device's links (see [`crate::tuner::Tuner::for_device`]).
    pub fn plan_device(&self, sig: &CallSig, device: &Arc<dyn crate::device::Device>) -> Result<Arc<Schedule>> {
        let mut engine = self.core.shared.lock_engine();
        let peer_copy = engine.peer_copy_for(Some(device))?;
        let pricing = engine.pricing(peer_copy.as_deref());
        // Device calls agree on a rooted signature before their rounds, not in them.
        engine.schedule(sig, false, pricing)
    }

    /// The tuner's view of this communicator: its policy, cost model and link
    /// classes, the host of every rank, and which hosts take turns on cores (what
    /// the communicator prices its calls with).
    pub fn tuner(&self) -> (crate::tuner::Tuner, Vec<usize>, Vec<bool>) {
        let e = self.core.shared.lock_engine();
        (e.tuner.clone(), e.hosts.clone(), e.busy_hosts.clone())
    }

    /// The byte-buffer form of every collective: `sig` says what to run, `input` is
    /// None for in-place calls (the data is then in `output`), lengths are in bytes.
    /// In-place layouts follow NCCL: all-gather finds this rank's block at
    /// `rank * count` of the buffer; reduce-scatter leaves its result there.
    pub fn collective_bytes(&self, sig: CallSig, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        self.core.collective_at(self.core.shared.take_ticket(), sig, input, output)
    }

    /// One in-place all-reduce of `parts` (bytes of `dtype`) taken as a single
    /// buffer laid end to end: every rank passes parts of the same lengths in the
    /// same order. On one host, where the chosen algorithm allows it (the ring,
    /// halving-doubling, the 2-rank tree) the data moves straight between the parts,
    /// with no packing into one buffer; otherwise they are packed and unpacked
    /// around the call. This is how the fuser all-reduces a bucket of separately
    /// allocated tensors.
    pub fn all_reduce_parts(&self, parts: &mut [&mut [u8]], dtype: DType, op: ReduceOp) -> Result<()> {
        self.core.all_reduce_parts_at(self.core.shared.take_ticket(), (dtype, op), parts)
    }

    /// Send `buf` (bytes of `dtype`) to `peer`; matched by that peer's `recv_bytes`.
    pub fn send_bytes(&self, buf: &[u8], dtype: DType, peer: usize) -> Result<()> {
        let t = self.core.shared.take_ticket();
        self.core.p2p_at(t, OpKind::Send, (buf.as_ptr() as *mut u8, buf.len()), dtype, peer, None)
    }

    /// Receive into `buf` (bytes of `dtype`) from `peer`.
    pub fn recv_bytes(&self, buf: &mut [u8], dtype: DType, peer: usize) -> Result<()> {
        let t = self.core.shared.take_ticket();
        self.core.p2p_at(t, OpKind::Recv, (buf.as_mut_ptr(), buf.len()), dtype, peer, None)
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
    ///
    /// ```
    /// use braid::{Communicator, ReduceOp};
    /// let comms = Communicator::in_process(3)?;
    /// std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|c| s.spawn(move || -> braid::Result<()> {
    ///             // Rank r holds [10r, 10r + 1, 10r + 2].
    ///             let input: Vec<i64> = (0..3).map(|i| 10 * c.rank() as i64 + i).collect();
    ///             let mut output = [0i64; 3];
    ///             c.all_reduce(&input, &mut output, ReduceOp::Sum)?;
    ///             assert_eq!(output, [30, 33, 36]); // 10 * (0 + 1 + 2) + 3i
    ///             Ok(())
    ///         }))
    ///         .collect();
    ///     ranks.into_iter().try_for_each(|h| h.join().unwrap())
    /// })?;
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn all_reduce<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> Result<()> {
        self.typed(OpKind::AllReduce, input.len(), 0, op, Some(input), output)
    }
    /// Reduce `buf` across ranks in place.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.typed(OpKind::AllReduce, buf.len(), 0, op, None, buf)
    }
    /// Broadcast `buf` from `root` to every rank, in place.
    ///
    /// ```
    /// use braid::Communicator;
    /// let comms = Communicator::in_process(3)?;
    /// std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|c| s.spawn(move || -> braid::Result<()> {
    ///             let mut weights = if c.rank() == 1 { [7.0f64, 8.0, 9.0] } else { [0.0; 3] };
    ///             c.broadcast(&mut weights, 1)?;
    ///             assert_eq!(weights, [7.0, 8.0, 9.0]);
    ///             Ok(())
    ///         }))
    ///         .collect();
    ///     ranks.into_iter().try_for_each(|h| h.join().unwrap())
    /// })?;
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.typed(OpKind::Broadcast, buf.len(), root, ReduceOp::Sum, None, buf)
    }
    /// Broadcast root's `input` into every rank's `output` (`input` is read only at the root).
    pub fn broadcast_out_of_place<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        self.typed(OpKind::Broadcast, output.len(), root, ReduceOp::Sum, Some(input), output)
    }
    /// Gather every rank's `input` into `output` (`world_size * input.len()`), in rank order.
    ///
    /// ```
    /// use braid::Communicator;
    /// let comms = Communicator::in_process(3)?;
    /// std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|c| s.spawn(move || -> braid::Result<()> {
    ///             let mut all = [0u8; 6];
    ///             c.all_gather(&[c.rank() as u8; 2], &mut all)?;
    ///             assert_eq!(all, [0, 0, 1, 1, 2, 2]);
    ///             Ok(())
    ///         }))
    ///         .collect();
    ///     ranks.into_iter().try_for_each(|h| h.join().unwrap())
    /// })?;
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.typed(OpKind::AllGather, input.len(), 0, ReduceOp::Sum, Some(input), output)
    }
    /// All-gather in place: this rank's block is already at block `rank` of `buf`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let c = self.core.block(buf.len())?;
        self.typed(OpKind::AllGather, c, 0, ReduceOp::Sum, None, buf)
    }
    /// Reduce `input` (`world_size * output.len()` elements) and leave block `rank` in `output`.
    ///
    /// ```
    /// use braid::{Communicator, ReduceOp};
    /// let comms = Communicator::in_process(3)?;
    /// std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|c| s.spawn(move || -> braid::Result<()> {
    ///             // Every rank holds [0, 1, ..., 5]: three blocks of two.
    ///             let input: Vec<f32> = (0..6).map(|i| i as f32).collect();
    ///             let mut mine = [0f32; 2];
    ///             c.reduce_scatter(&input, &mut mine, ReduceOp::Sum)?;
    ///             let first = 2.0 * c.rank() as f32;
    ///             assert_eq!(mine, [3.0 * first, 3.0 * (first + 1.0)]);
    ///             Ok(())
    ///         }))
    ///         .collect();
    ///     ranks.into_iter().try_for_each(|h| h.join().unwrap())
    /// })?;
    /// # Ok::<(), braid::Error>(())
    /// ```
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
    /// Gather every rank's `input` into `output` (`world_size * input.len()`
    /// elements, in rank order) at `root`; other ranks may pass an empty output.
    pub fn gather<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        self.typed(OpKind::Gather, input.len(), root, ReduceOp::Sum, Some(input), output)
    }
    /// Gather in place: at `root`, `buf` holds `world_size` blocks with the root's
    /// own already at block `root`; elsewhere `buf` is the rank's block.
    pub fn gather_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let c = if root == self.rank() { self.core.block(buf.len())? } else { buf.len() };
        self.typed(OpKind::Gather, c, root, ReduceOp::Sum, None, buf)
    }
    /// Scatter `root`'s `input` (`world_size * output.len()` elements): rank `j`'s
    /// `output` receives block `j`. Other ranks may pass an empty input.
    pub fn scatter<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        self.typed(OpKind::Scatter, output.len(), root, ReduceOp::Sum, Some(input), output)
    }
    /// Scatter in place: at `root`, `buf` holds `world_size` blocks and keeps its
    /// own at block `root`; elsewhere `buf` receives the rank's block.
    pub fn scatter_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let c = if root == self.rank() { self.core.block(buf.len())? } else { buf.len() };
        self.typed(OpKind::Scatter, c, root, ReduceOp::Sum, None, buf)
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
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use braid::Communicator;
    /// let comms = Communicator::in_process(4)?;
    /// let arrived = &AtomicUsize::new(0);
    /// std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|c| s.spawn(move || -> braid::Result<()> {
    ///             arrived.fetch_add(1, Ordering::SeqCst);
    ///             c.barrier()?;
    ///             // No rank gets past the barrier before all four reached it.
    ///             assert_eq!(arrived.load(Ordering::SeqCst), 4);
    ///             Ok(())
    ///         }))
    ///         .collect();
    ///     ranks.into_iter().try_for_each(|h| h.join().unwrap())
    /// })?;
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn barrier(&self) -> Result<()> {
        self.collective_bytes(CallSig::new(OpKind::Barrier, DType::U8, 0, 0, ReduceOp::Sum), None, &mut [])
    }
    /// Send `buf` to `peer`, which receives it with [`Communicator::recv`] (the
    /// same element type and length).
    ///
    /// A ping-pong: rank 0 sends, rank 1 answers with the values doubled.
    ///
    /// ```
    /// use braid::Communicator;
    /// let comms = Communicator::in_process(2)?;
    /// std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|c| s.spawn(move || -> braid::Result<()> {
    ///             let mut buf = [0i32; 3];
    ///             if c.rank() == 0 {
    ///                 c.send(&[1i32, 2, 3], 1)?;
    ///                 c.recv(&mut buf, 1)?;
    ///                 assert_eq!(buf, [2, 4, 6]);
    ///             } else {
    ///                 c.recv(&mut buf, 0)?;
    ///                 c.send(&buf.map(|x| 2 * x), 0)?;
    ///             }
    ///             Ok(())
    ///         }))
    ///         .collect();
    ///     ranks.into_iter().try_for_each(|h| h.join().unwrap())
    /// })?;
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.send_bytes(bytemuck::cast_slice(buf), T::DTYPE, peer)
    }
    /// Receive `buf.len()` elements from `peer` (see [`Communicator::send`]).
    ///
    /// ```
    /// use braid::Communicator;
    /// let comms = Communicator::in_process(2)?;
    /// std::thread::scope(|s| {
    ///     let (zero, one) = (&comms[0], &comms[1]);
    ///     let sender = s.spawn(move || zero.send(&[0.5f32, 1.5], 1));
    ///     let mut got = [0f32; 2];
    ///     one.recv(&mut got, 0)?;
    ///     assert_eq!(got, [0.5, 1.5]);
    ///     sender.join().unwrap()
    /// })?;
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.recv_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, peer)
    }

    /// Take the next ticket now (issue order) and run `job` with it on the worker thread.
    pub(super) fn spawn<R: Send + 'static>(
        &self,
        job: impl FnOnce(&Core, u64) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let (tx, rx) = mpsc::channel();
        let ticket = self.core.shared.take_ticket();
        let core = self.core.clone();
        let boxed: Job = Box::new(move || {
            // A panic stays in its call (the turn has passed on and the engine is
            // broken): the worker must live on to run the jobs queued behind it,
            // whose tickets later calls wait for.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&core, ticket)));
            let _ = tx.send(r.unwrap_or_else(|payload| {
                let why = core.shared.lock_engine().broken.clone();
                let text = panic_note::payload_text(payload.as_ref());
                Err(Error::Broken(why.unwrap_or_else(|| format!("rank {}: an async call panicked: {text}", core.rank))))
            }));
        });
        let mut w = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            let (jtx, jrx) = mpsc::channel::<Job>();
            let nice = self.worker_nice;
            match std::thread::Builder::new().name(format!("braid-work-{}", self.rank())).spawn(move || {
                crate::placement::set_thread_nice(nice);
                jrx.into_iter().for_each(|job| job())
            }) {
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
    /// Asynchronous in-place [`Communicator::collective_bytes`] on an owned byte
    /// buffer (`sig.dtype` elements, any alignment): the form mixed-dtype callers
    /// such as [`crate::fusion::Fuser`] build on. Runs in issue order like every call.
    pub fn collective_bytes_async(&self, sig: CallSig, mut buf: Vec<u8>) -> Work<Vec<u8>> {
        self.spawn(move |core, t| core.collective_at(t, sig, None, &mut buf).map(|()| buf))
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
        self.finish_async();
    }
}
