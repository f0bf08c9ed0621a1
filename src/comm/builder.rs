//! Building a communicator over a store: its name, id, rank claims and links.
//!
//! # Store keys
//!
//! A communicator lives under a prefix of the store:
//! - `braid/{name}` when the builder was given [`CommunicatorBuilder::name`];
//! - `braid/comm{k}` otherwise, where `k` counts the communicators this rank has
//!   built on the same store before (the same `Arc<dyn Store>` object, or the same
//!   store URL). Creating a communicator is collective, so every rank creates them
//!   in the same order and the k-th gets the same prefix everywhere (torch's group
//!   counter follows the same rule). Communicators that only some ranks of a store
//!   create must be named.
//! - a sub-communicator of [`crate::Communicator::split`] lives under
//!   `{parent prefix}/split{n}/c{color}`, `n` counting the parent's splits.
//!
//! Under the prefix:
//! - `claim/{rank}`: each rank adds 1 and must see 1. A second claim of a rank
//!   means another job uses the same store: it fails at once, and a rank whose
//!   claim was taken again fails when its set-up ends.
//! - `nonce`: 16 random bytes (hex) drawn by rank 0 after its claim. The
//!   communicator id carried by every frame is a hash of prefix and nonce, so a
//!   new job on an old store, or a second communicator, never shares an id.
//! - `topo/…`, `shm/…`, `mesh/…`, `rdma/…`: topology probe and link endpoints.
//! - `device_domain/{rank}`: the peer domain of the rank's bound device, or that it
//!   has none, written by every rank after its links are up (see `binding.rs`).
//! - `tuner/…`: the tuner's start-up probe of link costs (see [`crate::tuner::probe`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::origin::{comm_id, Origin, StoreOrigin};
use super::Communicator;
use crate::algorithm::Algorithm;
use crate::bootstrap::{connect_store, PrefixStore, Store};
use crate::config::Config;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::executor::{PeerChannel, WaitPolicy};
use crate::topology;
use crate::transport::{self, ConnectRequest, TransportKind};

/// Bytes of the per-communicator nonce.
const NONCE_LEN: usize = 16;

/// Builds a [`Communicator`] from explicit settings (see [`Config`] for the knobs).
///
/// Ranks meet through a [`Store`]: a URL (`tcp://`, `file://`) for separate
/// processes, or one store object that threads share. Here two threads meet
/// through an in-memory store and link over loopback TCP:
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use braid::bootstrap::{MemStore, Store};
/// use braid::{Communicator, ReduceOp, TransportKind};
/// let store: Arc<dyn Store> = Arc::new(MemStore::new());
/// let ranks: Vec<_> = (0..2)
///     .map(|rank| {
///         let store = store.clone();
///         std::thread::spawn(move || -> braid::Result<f64> {
///             let comm = Communicator::builder(rank, 2)
///                 .store(store)
///                 .transports(vec![TransportKind::Tcp])
///                 .socket_ifname("lo")
///                 .tuner_probe(false) // skip measuring the links: a short job
///                 .timeout(Duration::from_secs(30))
///                 .build()?;
///             let mut x = [rank as f64 + 1.0];
///             comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
///             Ok(x[0])
///         })
///     })
///     .collect();
/// for h in ranks {
///     assert_eq!(h.join().unwrap()?, 3.0);
/// }
/// # Ok::<(), braid::Error>(())
/// ```
pub struct CommunicatorBuilder {
    config: Config,
    store: Option<Arc<dyn Store>>,
    name: Option<String>,
    device: Option<Arc<dyn Device>>,
}

impl CommunicatorBuilder {
    /// Start from a configuration (e.g. `Config::from_env()?`).
    pub fn from_config(config: Config) -> CommunicatorBuilder {
        CommunicatorBuilder { config, store: None, name: None, device: None }
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
    /// Name the communicator: its store keys go under `braid/{name}` instead of the
    /// counted default `braid/comm{k}`. Every rank must pass the same name; needed
    /// when only some of a store's ranks create the communicator.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// Deadline of every blocking wait.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.config.timeout = t;
        self
    }
    /// Thresholds and grains of the byte-stream channels (single-copy threshold,
    /// CMA, forward grain and pass, peer chunk); defaults as measured.
    pub fn tuning(mut self, tuning: crate::config::Tuning) -> Self {
        self.config.tuning = tuning;
        self
    }
    /// Bind this rank to a core (see [`crate::placement`]); the default is
    /// [`BindPolicy::Auto`](crate::placement::BindPolicy::Auto).
    pub fn bind(mut self, policy: crate::placement::BindPolicy) -> Self {
        self.config.bind = policy;
        self
    }
    /// Force an algorithm wherever it applies (None for automatic choice).
    pub fn algorithm(mut self, a: Option<Algorithm>) -> Self {
        self.config.algorithms = a.map_or_else(crate::tuner::AlgoPolicy::auto, crate::tuner::AlgoPolicy::only);
        self
    }

    /// The algorithms each collective may use (`BRAID_ALGO`'s syntax parses into it).
    pub fn algorithms(mut self, policy: crate::tuner::AlgoPolicy) -> Self {
        self.config.algorithms = policy;
        self
    }
    /// Reproducible mode: reducing collectives fold every element in rank order, so
    /// floating-point results are bitwise identical whatever the algorithm, chunk
    /// size or host split (`BRAID_DETERMINISTIC=1`).
    pub fn deterministic(mut self, on: bool) -> Self {
        self.config.deterministic = on;
        self
    }
    /// Rooted calls first agree on their signature (see [`Config::check_roots`]).
    pub fn check_roots(mut self, on: bool) -> Self {
        self.config.check_roots = on;
        self
    }
    /// Whether the tuner measures link costs at start-up (`BRAID_TUNER_PROBE`).
    pub fn tuner_probe(mut self, on: bool) -> Self {
        self.config.tuner_probe = on;
        self
    }
    /// Directory of per-host caches (`BRAID_CACHE_DIR`).
    pub fn cache_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.config.cache_dir = Some(dir.into());
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

    /// Bind the communicator to `device` (as NCCL binds one to a GPU): calls on its
    /// buffers copy straight from device to device with the peers whose devices
    /// map each other's memory (same [`Device::peer_domain`]), and stage through
    /// host memory with the others. Every rank publishes its domain when it builds.
    pub fn device(mut self, device: Arc<dyn Device>) -> Self {
        self.device = Some(device);
        self
    }

    /// Inject `plan`'s fault into this communicator's stream links (tests only; see
    /// [`crate::fault`]).
    #[doc(hidden)]
    pub fn fault_plan(mut self, plan: crate::fault::FaultPlan) -> Self {
        self.config.fault = Some(plan);
        self
    }

    /// Connect to every peer and return the communicator.
    pub fn build(self) -> Result<Communicator> {
        let cfg = self.config;
        if cfg.world_size == 0 || cfg.rank >= cfg.world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is not below world size {}",
                cfg.rank, cfg.world_size
            )));
        }
        let (store, ident) = match self.store {
            Some(s) => {
                let ident = StoreIdent::Object(Arc::downgrade(&s));
                (s, ident)
            }
            None => {
                let url = cfg.store.as_deref().ok_or_else(|| {
                    Error::Config(
                        "no store: set BRAID_STORE (tcp://HOST:PORT or file:///PATH) or pass one to the builder".into(),
                    )
                })?;
                let ident = StoreIdent::Url(url.to_string());
                tracing::debug!(
                    launcher = cfg.launcher,
                    rank = cfg.rank,
                    world = cfg.world_size,
                    store = url,
                    "meeting at the store"
                );
                let store = connect_store(url, cfg.rank == 0, cfg.world_size, cfg.job_key.clone(), cfg.timeout)
                    .map_err(|e| cfg.with_launch(e, url))?;
                (store, ident)
            }
        };
        let prefix = match self.name {
            Some(n) if n.is_empty() => return Err(Error::InvalidArgument("communicator name is empty".into())),
            Some(n) => format!("braid/{n}"),
            None => format!("braid/comm{}", next_index(&ident, cfg.rank)),
        };
        let comm = connect(cfg, store, prefix, ident.label())?;
        super::binding::bind_built(&comm, self.device)?;
        Ok(comm)
    }
}

impl Communicator {
    /// Connect using the environment (`BRAID_RANK`, `BRAID_WORLD_SIZE`, `BRAID_STORE`, ...
    /// or a recognised launcher's variables).
    ///
    /// Not run as a test: it needs a launcher (`braid run`, torchrun, mpirun, srun)
    /// to have set the variables in every rank's process.
    ///
    /// ```no_run
    /// use braid::{Communicator, ReduceOp};
    /// // Started as e.g. `braid run -n 4 ./train`, in each of the four processes:
    /// let comm = Communicator::from_env()?;
    /// let mut loss = [0.25f32];
    /// comm.all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn from_env() -> Result<Communicator> {
        CommunicatorBuilder::from_config(Config::from_env()?).build()
    }

    /// A builder for rank `rank` of `world_size` (see [`CommunicatorBuilder`] for
    /// how communicators sharing a store are told apart, and for an example).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use braid::bootstrap::MemStore;
    /// use braid::Communicator;
    /// // A world of one rank: it meets only itself at the store.
    /// let comm = Communicator::builder(0, 1).store(Arc::new(MemStore::new())).tuner_probe(false).build()?;
    /// assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    /// // Without a store (none given, none in the configuration) it fails at once:
    /// let err = Communicator::builder(0, 2).build().err().unwrap();
    /// assert!(matches!(err, braid::Error::Config(_)), "{err}");
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn builder(rank: usize, world_size: usize) -> CommunicatorBuilder {
        CommunicatorBuilder::from_config(Config::new(rank, world_size))
    }
}

/// Which store a rank's communicator counter belongs to.
enum StoreIdent {
    /// A store object passed to the builder (ranks that are threads share one).
    Object(Weak<dyn Store>),
    /// A store named by URL (each build connects a new client).
    Url(String),
}

impl StoreIdent {
    fn label(&self) -> String {
        match self {
            StoreIdent::Object(w) => format!("{:p} (passed to the builder)", w.as_ptr() as *const ()),
            StoreIdent::Url(u) => crate::bootstrap::redact_store_url(u),
        }
    }
}

/// One rank's count of communicators built on one store.
struct Counter {
    /// The store object it counts for; a dead one means the address was reused.
    object: Option<Weak<dyn Store>>,
    next: u64,
}

/// The index of the next default-named communicator of `rank` on this store.
fn next_index(ident: &StoreIdent, rank: usize) -> u64 {
    static COUNTERS: OnceLock<Mutex<HashMap<(String, usize), Counter>>> = OnceLock::new();
    let mut map = COUNTERS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    // Counters of dropped store objects go: their addresses may be reused.
    map.retain(|_, c| c.object.as_ref().is_none_or(|w| w.strong_count() > 0));
    let (key, object) = match ident {
        StoreIdent::Object(w) => (format!("object@{:p}", w.as_ptr() as *const ()), Some(w.clone())),
        StoreIdent::Url(u) => (format!("url:{u}"), None),
    };
    let c = map.entry((key, rank)).or_insert(Counter { object, next: 0 });
    c.next += 1;
    c.next - 1
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks(2).map(|p| std::str::from_utf8(p).ok().and_then(|s| u8::from_str_radix(s, 16).ok())).collect()
}

fn claim_key(rank: usize) -> String {
    format!("claim/{rank}")
}

/// Claim `rank` under the communicator's prefix: the first claim wins.
fn claim_rank(scoped: &PrefixStore, rank: usize, label: &str) -> Result<()> {
    let n = scoped.add(&claim_key(rank), 1)?;
    if n != 1 {
        return Err(Error::Store(format!(
            "rank {rank} of communicator {} was already claimed: is another job using store {label}?",
            scoped.prefix()
        )));
    }
    Ok(())
}

/// After set-up: fail if another process claimed this rank meanwhile (it failed
/// at once; this rank may have been linked with the other job's ranks).
fn check_claim_kept(scoped: &PrefixStore, rank: usize, label: &str) -> Result<()> {
    let n = scoped.add(&claim_key(rank), 0)?;
    if n != 1 {
        return Err(Error::Store(format!(
            "rank {rank} of communicator {} was claimed {n} times during set-up: is another job using store {label}?",
            scoped.prefix()
        )));
    }
    Ok(())
}

/// Rank 0 draws the nonce and publishes it with its world size; every other rank
/// reads it. Before that, every rank reports the world size it was given
/// (`world/said/{i}`, `i` its order of arrival) and rank 0 reads the first
/// `world` reports: a rank told another size makes rank 0 publish the
/// disagreement instead of the nonce, so every rank fails at once naming both
/// sizes rather than waiting for ranks that will never come (or never be waited for).
fn nonce(scoped: &PrefixStore, cfg: &Config) -> Result<Vec<u8>> {
    let (rank, world) = (cfg.rank, cfg.world_size);
    let arrival = scoped.add("world/arrived", 1)?;
    scoped.set(&format!("world/said/{arrival}"), format!("{rank} {world}").as_bytes())?;
    let differs = |why: &str| {
        Error::Config(format!(
            "rank {rank}: {why}: every rank must be given the same world size (launcher {})",
            cfg.launcher
        ))
    };
    if rank == 0 {
        let deadline = std::time::Instant::now() + cfg.timeout;
        let mut arrived = vec![false; world];
        for i in 1..=world {
            let key = format!("world/said/{i}");
            let raw = match scoped.wait_get(&key, deadline.saturating_duration_since(std::time::Instant::now())) {
                Ok(raw) => raw,
                Err(Error::Timeout { timeout, .. }) => {
                    let waiting_on = (0..world).filter(|r| !arrived[*r]).collect();
                    let ctx = crate::error::OpContext { rank, call: None, seq: 0 };
                    return Err(Error::Timeout { ctx, timeout, waiting_on, chain: Vec::new() });
                }
                Err(e) => return Err(e),
            };
            let said = std::str::from_utf8(&raw)
                .ok()
                .and_then(|t| t.split_once(' '))
                .and_then(|(r, n)| Some((r.parse::<usize>().ok()?, n.parse::<usize>().ok()?)));
            let Some((peer, size)) = said else {
                let what =
                    format!("{}/{key} holds {} bytes that are not \"RANK WORLD_SIZE\"", scoped.prefix(), raw.len());
                return Err(Error::Store(format!("rank {rank}: {what}")));
            };
            if size != world {
                let why = format!("rank {peer} was given world size {size}, rank 0 world size {world}");
                scoped.set("nonce", format!("differs {why}").as_bytes())?;
                return Err(differs(&why));
            }
            if let Some(seen) = arrived.get_mut(peer) {
                *seen = true;
            }
        }
        let n = crate::auth::random_bytes::<NONCE_LEN>();
        scoped.set("nonce", format!("{} {world}", hex(&n)).as_bytes())?;
        return Ok(n.to_vec());
    }
    let raw = scoped.wait_get("nonce", cfg.timeout)?;
    let text = String::from_utf8_lossy(&raw);
    if let Some(why) = text.strip_prefix("differs ") {
        return Err(differs(why));
    }
    let (n, size) = text.split_once(' ').unwrap_or((&text, ""));
    match size.parse::<usize>() {
        Ok(size) if size != world => {
            return Err(differs(&format!("rank 0 was given world size {size}, rank {rank} world size {world}")));
        }
        _ => {}
    }
    unhex(n.as_bytes()).filter(|n| n.len() == NONCE_LEN && size.parse::<usize>().is_ok()).ok_or_else(|| {
        Error::Store(format!(
            "rank {rank}: {}/nonce holds {} bytes that are not {NONCE_LEN} hex-encoded bytes and a world size",
            scoped.prefix(),
            raw.len()
        ))
    })
}

/// RDMA links a pair only when both ends can run it (a rank may lack the device
/// or the feature while its peer has them): every rank publishes whether it can
/// under `rdma/usable/{rank}`, and a peer chosen for rdma that cannot gets the next
/// allowed transport (tcp), both ends deciding alike. Fails with
/// [`Error::Unsupported`] when no other allowed transport reaches such a peer.
fn agree_on_rdma(
    store: &PrefixStore,
    cfg: &Config,
    topo: &topology::Topology,
    mut kinds: Vec<Option<TransportKind>>,
    rdma_here: bool,
) -> Result<Vec<Option<TransportKind>>> {
    let rank = cfg.rank;
    store.set(&format!("rdma/usable/{rank}"), if rdma_here { b"1" } else { b"0" })?;
    for (peer, kind) in kinds.iter_mut().enumerate() {
        if *kind != Some(TransportKind::Rdma) {
            continue;
        }
        if store.wait_get(&format!("rdma/usable/{peer}"), cfg.timeout)? == b"1" {
            continue;
        }
        let next = topology::fallback_from_rdma(topo, rank, peer, cfg.transports.as_deref());
        tracing::debug!(rank, peer, fallback = next.map(|k| k.name()), "the peer cannot run rdma");
        *kind = Some(next.ok_or_else(|| {
            Error::Unsupported(format!(
                "rank {rank}: rank {peer} cannot run the rdma transport (no device, or built without \
                 `--features rdma`), and no other allowed transport reaches it"
            ))
        })?);
    }
    Ok(kinds)
}

/// Claim the rank, agree on the id, probe the topology and link every peer of
/// the communicator under `prefix` of `store`.
pub(super) fn connect(cfg: Config, store: Arc<dyn Store>, prefix: String, label: String) -> Result<Communicator> {
    let scoped = PrefixStore::new(prefix.clone(), store.clone());
    claim_rank(&scoped, cfg.rank, &label)?;
    let nonce = nonce(&scoped, &cfg)?;
    let comm_id = comm_id(&prefix, &nonce);
    tracing::debug!(rank = cfg.rank, prefix, comm_id = format!("{comm_id:#x}"), "communicator set-up");
    // Which peers share this host is probed, not guessed; each peer then gets
    // the first allowed transport that can reach it (shared memory, RDMA, TCP).
    let topo = topology::discover(cfg.rank, cfg.world_size, &scoped, "topo", cfg.timeout)?;
    // Bound before any link exists, so every buffer and ring this rank touches
    // first is allocated on its core's memory node.
    let launched = cfg.launcher != "code";
    let launcher_local = cfg.local_rank.zip(cfg.local_size);
    crate::placement::apply(cfg.bind, launched, cfg.rank, (topo.local_rank, topo.local_size), launcher_local);
    let kinds = topology::choose_transports(&topo, cfg.rank, cfg.transports.as_deref())?;
    let rdma_here = TransportKind::Rdma.available().is_ok();
    let kinds = agree_on_rdma(&scoped, &cfg, &topo, kinds, rdma_here)?;
    let wanted = |k: TransportKind| kinds.iter().map(|t| *t == Some(k)).collect::<Vec<bool>>();
    let mut channels: Vec<Option<Box<dyn PeerChannel>>> = (0..cfg.world_size).map(|_| None).collect();
    let stream_switch = crate::transport::stream_copy::TunerSwitch::default();
    let exchange_switch = crate::transport::stream_copy::TunerSwitch::default();
    for kind in topology::TRANSPORT_PREFERENCE {
        let peers = wanted(kind);
        if !peers.iter().any(|b| *b) {
            continue;
        }
        let req = ConnectRequest {
            rank: cfg.rank,
            world: cfg.world_size,
            peers,
            store: &scoped,
            comm_id,
            local_ranks: topo.local_size,
            local_cpus: topo.local_cpus,
            stream_switch: stream_switch.clone(),
            exchange_switch: exchange_switch.clone(),
            config: &cfg,
        };
        for (p, c) in transport::connect(kind, &req)?.into_iter().enumerate() {
            if c.is_some() {
                channels[p] = c;
            }
        }
    }
    check_claim_kept(&scoped, cfg.rank, &label)?;
    // From the CPUs the host's ranks had before binding: a rank bound to one core
    // is not oversubscribed when its peers have cores of their own.
    let wait = WaitPolicy::new(topo.local_size, topo.local_cpus, cfg.tuning.spin);
    let mut comm = Communicator::from_channels(cfg.rank, cfg.world_size, channels, comm_id, &cfg, wait);
    comm.serve_metrics(&cfg)?;
    comm.core.shared.lock_engine().set_hosts(topo.host_of.clone(), topo.oversubscribed_hosts());
    if kinds.contains(&Some(TransportKind::Shm)) {
        // Channels read the exchange switch only where CMA works between these
        // processes and `BRAID_CMA=auto`; the tuner times exchanges only in the
        // calls whose channels read it.
        let tuner = crate::transport::stream_copy::CallTuner::new(stream_switch).with_exchanges(exchange_switch);
        comm.core.shared.set_stream_tuner(tuner);
    }
    if cfg.tuner_probe {
        install_probed_model(&comm, &cfg, &scoped, &topo.host_of)?;
    }
    comm.origin = Origin::Store(Box::new(StoreOrigin { store, prefix, cfg, label }));
    Ok(comm)
}

/// The communicator's own send and receive, for the tuner's probe.
struct ProbeExchange<'a>(&'a Communicator);

impl crate::tuner::probe::Exchange for ProbeExchange<'_> {
    fn send(&self, buf: &[u8], peer: usize) -> Result<()> {
        self.0.send_bytes(buf, crate::types::DType::U8, peer)
    }
    fn recv(&self, buf: &mut [u8], peer: usize) -> Result<()> {
        self.0.recv_bytes(buf, crate::types::DType::U8, peer)
    }
    fn class_to(&self, peer: usize) -> Option<crate::tuner::LinkClass> {
        self.0.transports().get(peer).copied().flatten().map(crate::tuner::LinkClass::of)
    }
}

/// Agree on the tuner's link costs (cached or measured, see
/// [`crate::tuner::probe`]) and install them in this rank's tuner.
fn install_probed_model(comm: &Communicator, cfg: &Config, scoped: &PrefixStore, hosts: &[usize]) -> Result<()> {
    let setup = crate::tuner::probe::ProbeSetup {
        rank: cfg.rank,
        hosts,
        store: scoped,
        timeout: cfg.timeout,
        cache_dir: cfg.cache_dir.clone().or_else(crate::tuner::probe::default_cache_dir),
    };
    let probed = crate::tuner::probe::agree(&setup, &ProbeExchange(comm))?;
    install_model(comm, probed.model, probed.source);
    let local = comm.transports().iter().flatten().next().map(|k| crate::tuner::LinkClass::of(*k));
    let one_host = hosts.iter().all(|&h| h == 0);
    if let (Some(class), true, crate::tuner::ProbeSource::Measured) = (local, one_host, probed.source) {
        if class == crate::tuner::LinkClass::SharedMemory {
            calibrate(comm, cfg, class, &setup)?;
        }
    }
    Ok(())
}

pub(super) fn install_model(comm: &Communicator, model: crate::tuner::CostModel, source: crate::tuner::ProbeSource) {
    let mut e = comm.core.shared.lock_engine();
    e.tuner.model = model;
    e.tuner.source = source;
    // Plans priced with the old model go.
    e.plans.clear();
    e.recent_plans = Default::default();
}

/// Passes of the calibration's small calls (4 and 256 KiB), each a block of
/// [`SMALL_CALLS`] timed calls of every algorithm in turn.
const SMALL_PASSES: usize = 3;
/// Timed calls of each algorithm in a pass.
const SMALL_CALLS: usize = 15;

/// Fit the links of a one-host world to its ring all-reduce (see
/// [`crate::tuner::calibrate`]): every rank times the same calls and takes the
/// slowest rank's medians, so all install the same costs; rank 0 caches them.
fn calibrate(
    comm: &Communicator,
    cfg: &Config,
    class: crate::tuner::LinkClass,
    setup: &crate::tuner::probe::ProbeSetup,
) -> Result<()> {
    use crate::tuner::calibrate::{
        fit, ring_fits_itself, timed_at_huge, tiny_bytes, worth_timing, Times, FAR_BYTES, HUGE_CALLS, NEAR_BYTES,
        TIMED_ALGORITHMS,
    };
    use crate::tuner::cost::AlgoFar;
    // The slowest rank's times of `reps` calls of `bytes` after `warm` untimed ones, sorted.
    // The data and the buffer of every timed call, grown to the largest size timed
    // so far instead of allocated and filled for each size and algorithm.
    let buffers = std::cell::RefCell::new((Vec::<f32>::new(), Vec::<f32>::new()));
    let time = |bytes: usize, warm: usize, reps: usize| -> Result<Vec<f64>> {
        // Each call starts from freshly written data, as a training step's gradients
        // do (and `braid perf`'s calls): a buffer reduced over and over stays in a
        // state of the caches no real call sees, and priced big calls ~1.5x too fast.
        let n = bytes / 4;
        let mut guard = buffers.borrow_mut();
        let (fresh, buf) = &mut *guard;
        if fresh.len() < n {
            fresh.resize(n, 1.0);
            buf.resize(n, 0.0);
        }
        let mut times = Vec::with_capacity(reps);
        for i in 0..warm + reps {
            buf[..n].copy_from_slice(&fresh[..n]);
            comm.barrier()?;
            let t = std::time::Instant::now();
            comm.all_reduce_in_place(&mut buf[..n], crate::types::ReduceOp::Sum)?;
            if i >= warm {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        comm.all_reduce_in_place(&mut times, crate::types::ReduceOp::Max)?;
        times.sort_by(f64::total_cmp);
        Ok(times)
    };
    let median = |bytes: usize, warm: usize, reps: usize| time(bytes, warm, reps).map(|t| t[t.len() / 2]);
    let world = comm.world_size();
    let (model, busy) = {
        let e = comm.core.shared.lock_engine();
        (e.tuner.model, e.busy_hosts.first().copied().unwrap_or(false))
    };
    comm.set_deterministic(false);
    comm.set_algorithm(Some(Algorithm::Ring));
    // Warm-ups long enough for the copy policy's first trials to settle.
    let started = std::time::Instant::now();
    let mut phases = [0.0f64; 3];
    let timed = (|| {
        let mut t = Times {
            tiny: 0.0,
            near: 0.0,
            far: median(FAR_BYTES, 8, 7)?,
            algos: [[0.0; TIMED_ALGORITHMS.len()]; AlgoFar::SIZES.len()],
            algos_tiny: [0.0; TIMED_ALGORITHMS.len()],
        };
        phases[0] = started.elapsed().as_secs_f64();
        let timed = TIMED_ALGORITHMS.map(|a| worth_timing(a, &model, class, world, busy));
        // Small calls are short enough that a moment of other work on the cores moves
        // one algorithm's median and not another's, and a pick between them with it
        // (4 ranks on 2 cores: one cold start in six priced the tree below
        // halving-doubling at 256 KiB, where it takes 1.4x as long). So at 4 and 256
        // KiB the ring and the others take turns, in passes, each pass a block of
        // calls of each; the ring's medians fit the links, the others' their factors.
        let turns: Vec<Option<usize>> = std::iter::once(None)
            .chain(
                (0..TIMED_ALGORITHMS.len()).filter(|&i| timed[i] && TIMED_ALGORITHMS[i] != Algorithm::Ring).map(Some),
            )
            .collect();
        for bytes in [tiny_bytes(world), NEAR_BYTES] {
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); turns.len()];
            for pass in 0..SMALL_PASSES {
                for (turn, &i) in turns.iter().enumerate() {
                    comm.set_algorithm(Some(i.map_or(Algorithm::Ring, |i| TIMED_ALGORITHMS[i])));
                    // The first pass starts past each algorithm's first trials of
                    // both kinds of store (see `stream_copy::PATTERNS`).
                    let warm = match (pass, i) {
                        (0, None) => 30,
                        (0, Some(_)) => 10,
                        _ => 1,
                    };
                    samples[turn].extend(time(bytes, warm, SMALL_CALLS)?);
                }
            }
            for (&i, mut times) in turns.iter().zip(samples) {
                times.sort_by(f64::total_cmp);
                let m = times[times.len() / 2];
                match (i, bytes == NEAR_BYTES) {
                    (None, false) => t.tiny = m,
                    (None, true) => t.near = m,
                    (Some(i), false) => t.algos_tiny[i] = m,
                    (Some(i), true) => t.algos[AlgoFar::NEAR][i] = m,
                }
            }
        }
        for (i, a) in TIMED_ALGORITHMS.iter().enumerate().filter(|&(i, _)| timed[i]) {
            comm.set_algorithm(Some(*a));
            // Past the ring writers' first trials of both kinds of store, which
            // each algorithm makes for itself (see `stream_copy::PATTERNS`).
            for (at, &bytes) in AlgoFar::SIZES.iter().enumerate().take(AlgoFar::HUGE).skip(AlgoFar::NEAR + 1) {
                if ring_fits_itself(*a, at) {
                    continue;
                }
                t.algos[at][i] = median(bytes, 8, 3)?;
            }
        }
        // The largest size where the model fitted so far says it is cheap enough.
        let so_far = fit(&model, class, world, busy, t);
        let mut fitted = model;
        fitted.set(class, so_far.cost);
        fitted.busy_round = so_far.busy_round;
        fitted.algo_far = so_far.algo_far;
        phases[1] = started.elapsed().as_secs_f64();
        let huge = timed_at_huge(&fitted, class, world, busy, timed);
        for (i, a) in TIMED_ALGORITHMS.iter().enumerate().filter(|&(i, _)| huge[i]) {
            comm.set_algorithm(Some(*a));
            t.algos[AlgoFar::HUGE][i] = time(AlgoFar::SIZES[AlgoFar::HUGE], 1, HUGE_CALLS - 1)?[0];
        }
        phases[2] = started.elapsed().as_secs_f64();
        Ok(t)
    })();
    comm.set_algorithms(cfg.algorithms.clone());
    comm.set_deterministic(cfg.deterministic);
    let times: Times = timed?;
    let mut model = model;
    let fitted = fit(&model, class, world, busy, times);
    let cost = fitted.cost;
    model.set(class, cost);
    model.busy_round = fitted.busy_round;
    model.algo_far = fitted.algo_far;
    tracing::debug!(
        rank = cfg.rank,
        tiny_us = times.tiny * 1e6,
        near_us = times.near * 1e6,
        far_us = times.far * 1e6,
        alpha_us = cost.alpha * 1e6,
        busy_round_us = fitted.busy_round * 1e6,
        beta_gbps = 1.0 / cost.beta / 1e9,
        gamma_gbps = 1.0 / cost.gamma / 1e9,
        far = cost.far,
        algo_far = ?fitted.algo_far,
        ring_16_mib_s = phases[0],
        algorithms_s = phases[1] - phases[0],
        largest_s = phases[2] - phases[1],
        "tuner calibrated {class} links to ring all-reduce (and the other algorithms past the cache)"
    );
    install_model(comm, model, crate::tuner::ProbeSource::Measured);
    if let (0, Some(dir)) = (cfg.rank, setup.cache_dir.as_deref()) {
        use crate::tuner::probe;
        let key = probe::local_key(class, &probe::host_fingerprint(), world, 1);
        let m = probe::Measured {
            alpha: cost.alpha,
            beta: cost.beta,
            gamma: Some(cost.gamma),
            far: Some(cost.far),
            busy_round: busy.then_some(fitted.busy_round),
            algo_far: fitted.algo_far,
        };
        if let Err(e) = probe::write_cache(dir, class, &key, &m) {
            tracing::warn!("tuner: cannot cache the calibration in {}: {e}", dir.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::MemStore;

    #[test]
    fn counters_are_per_store_object_and_rank_and_restart_for_a_new_object() {
        let a: Arc<dyn Store> = Arc::new(MemStore::new());
        let b: Arc<dyn Store> = Arc::new(MemStore::new());
        let ia = StoreIdent::Object(Arc::downgrade(&a));
        let ib = StoreIdent::Object(Arc::downgrade(&b));
        assert_eq!((next_index(&ia, 0), next_index(&ia, 0), next_index(&ia, 1)), (0, 1, 0));
        assert_eq!(next_index(&ib, 0), 0);
        let url = StoreIdent::Url("tcp://counter-test:1".into());
        assert_eq!((next_index(&url, 3), next_index(&url, 3)), (0, 1));
        drop(ia);
        drop(a);
        // A store allocated after `a` died (possibly at its address) starts again at 0.
        let c: Arc<dyn Store> = Arc::new(MemStore::new());
        assert_eq!(next_index(&StoreIdent::Object(Arc::downgrade(&c)), 0), 0);
    }

    #[test]
    fn ids_differ_by_prefix_and_nonce_and_the_nonce_round_trips() {
        assert_ne!(comm_id("braid/comm0", &[1; 16]), comm_id("braid/comm0", &[2; 16]));
        assert_ne!(comm_id("braid/comm0", &[1; 16]), comm_id("braid/comm1", &[1; 16]));
        assert_eq!(comm_id("braid/x", &[7; 16]), comm_id("braid/x", &[7; 16]));
        let n = [0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(hex(&n).as_bytes()).unwrap(), n);
        assert_eq!(unhex(b"zz"), None);
        assert_eq!(unhex(b"abc"), None);
    }

    #[test]
    fn rdma_links_a_pair_only_when_both_ends_can_run_it() {
        use TransportKind::{Rdma, Shm, Tcp};
        let mem: Arc<dyn Store> = Arc::new(MemStore::new());
        let scoped = PrefixStore::new("braid/comm0", mem);
        let topo = topology::Topology::from_labels(0, &[0, 0, 1, 2]);
        // Ranks 2 and 3 published first: 2 can run rdma, 3 cannot.
        scoped.set("rdma/usable/2", b"1").unwrap();
        scoped.set("rdma/usable/3", b"0").unwrap();
        let mut cfg = Config::new(0, 4);
        cfg.timeout = Duration::from_secs(5);
        let kinds = vec![None, Some(Shm), Some(Rdma), Some(Rdma)];
        let agreed = agree_on_rdma(&scoped, &cfg, &topo, kinds.clone(), true).unwrap();
        assert_eq!(agreed, vec![None, Some(Shm), Some(Rdma), Some(Tcp)]);
        assert_eq!(scoped.get("rdma/usable/0").unwrap().as_deref(), Some(&b"1"[..]), "this rank said it can");
        cfg.transports = Some(vec![Rdma, Shm]);
        let e = agree_on_rdma(&scoped, &cfg, &topo, kinds, true).unwrap_err().to_string();
        assert!(e.contains("rank 0: rank 3 cannot run the rdma transport"), "{e}");
        // A rank that cannot run rdma never chose it, and says so for its peers.
        cfg.rank = 1;
        assert_eq!(agree_on_rdma(&scoped, &cfg, &topo, vec![Some(Shm), None], false).unwrap()[0], Some(Shm));
        assert_eq!(scoped.get("rdma/usable/1").unwrap().as_deref(), Some(&b"0"[..]));
    }

    #[test]
    fn a_second_claim_of_a_rank_names_the_rank_the_communicator_and_the_store() {
        let mem: Arc<dyn Store> = Arc::new(MemStore::new());
        let scoped = PrefixStore::new("braid/comm0", mem);
        claim_rank(&scoped, 1, "tcp://h:1").unwrap();
        check_claim_kept(&scoped, 1, "tcp://h:1").unwrap();
        let e = claim_rank(&scoped, 1, "tcp://h:1").unwrap_err().to_string();
        assert!(e.contains("rank 1 of communicator braid/comm0 was already claimed"), "{e}");
        assert!(e.contains("store tcp://h:1"), "{e}");
        let e = check_claim_kept(&scoped, 1, "tcp://h:1").unwrap_err().to_string();
        assert!(e.contains("claimed 2 times"), "{e}");
    }
}
