//! One typed configuration, read once from the environment (or built in code).
//!
//! Every variable braid reads, with its default and meaning, is one table in
//! [`environment`], from which `docs/environment.md` is generated (a test fails
//! when the page, the table or the code drift apart). Defaults live in
//! [`defaults`], which the layers below read without reading this module.
//!
//! When `BRAID_RANK` is absent, launchers are recognised: torchrun (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`; with
//! `TORCHELASTIC_USE_AGENT_STORE=True` every rank joins the agent's torch store there,
//! keyed by `TORCHELASTIC_RUN_ID` and `TORCHELASTIC_RESTART_COUNT`), Open MPI
//! (`OMPI_COMM_WORLD_*`), MPICH and Intel MPI (`PMI_RANK`, `PMI_SIZE`,
//! `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`), Slurm (`SLURM_PROCID`, `SLURM_NTASKS`,
//! `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`)
//! and TensorFlow's `TF_CONFIG` (cluster spec and task; ranks in the order `ps`,
//! `chief`, `worker`, rank 0's address hosting the store; feature `tf-config`).
//!
//! Without `BRAID_STORE`, mpirun and srun derive one (the store URL says which):
//! `pmix:NAMESPACE` when PMIx's variables are set (rank 0 publishes its store through
//! PMIx, `bootstrap::pmix`; `BRAID_PMIX_LIBRARY` names the library if not
//! `libpmix.so.2`), `local:ID` for Open MPI on one host without PMIx (a private store
//! keyed by the job id), `slurm://HOST:PORT` for srun without PMIx (the nodelist's
//! first host, a reserved or derived port, `bootstrap::slurm`). Open MPI
//! across hosts and MPICH without PMIx fail at once, naming the `BRAID_STORE` to pass.

use std::time::Duration;

use crate::error::{Error, Result};

pub mod defaults;
pub mod environment;
use crate::transport::TransportKind;
use defaults::flag;
pub use defaults::{parse_duration, parse_size, StreamPolicy, Tuning, DEFAULT_TIMEOUT};

/// Everything a communicator needs to know before it connects.
///
/// Read from the environment with [`Config::from_env`], or built in code: start
/// from [`Config::new`] and set the fields that differ from the defaults.
///
/// ```
/// use std::time::Duration;
/// use braid::{Communicator, Config, ReduceOp};
/// let mut cfg = Config::new(0, 2);
/// cfg.timeout = Duration::from_secs(5);
/// cfg.deterministic = true;
/// assert_eq!((cfg.world_size, cfg.launcher, cfg.store.as_deref()), (2, "code", None));
/// // In-process ranks take their count, timeout and modes from it:
/// let comms = Communicator::in_process_with(cfg)?;
/// assert_eq!(comms[1].timeout(), Duration::from_secs(5));
/// std::thread::scope(|s| {
///     let ranks: Vec<_> = comms
///         .iter()
///         .map(|c| s.spawn(move || c.all_reduce_in_place(&mut [0.1f32, 0.2], ReduceOp::Sum)))
///         .collect();
///     ranks.into_iter().try_for_each(|h| h.join().unwrap())
/// })?;
/// # Ok::<(), braid::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank among the ranks of this host, when a launcher says so.
    pub local_rank: Option<usize>,
    /// How many ranks share this host, when a launcher says so (placement binds a
    /// rank that probed as alone by it, see [`crate::placement`]).
    pub local_size: Option<usize>,
    /// Store URL (`tcp://HOST:PORT`, `torch://HOST:PORT[?prefix=P]`, `file:///PATH`).
    pub store: Option<String>,
    /// Algorithms each collective may use; the tuner picks among them.
    pub algorithms: crate::tuner::AlgoPolicy,
    /// Reproducible mode (`BRAID_DETERMINISTIC`): reducing collectives fold every
    /// element in rank order, so results are bitwise identical whatever the
    /// algorithm, chunk size or host split.
    pub deterministic: bool,
    /// Rooted calls agree on their signature across ranks (`BRAID_CHECK_ROOTS`,
    /// default on): a rank given another root fails in the call itself instead of
    /// finishing it and having its next call blamed. The exchange runs in the call's
    /// own rounds (see `algorithm::with_agreement`): a 1 KiB broadcast on 4 ranks
    /// over shm costs about 1.15x the unchecked one, a 1 KiB gather 1.4x (its
    /// non-roots must now hear from every rank), 256 KiB and up within noise.
    pub check_roots: bool,
    /// Measure link costs at start-up for the tuner (`BRAID_TUNER_PROBE`, default on;
    /// results are cached on disk per host).
    pub tuner_probe: bool,
    /// Where per-host caches (the tuner's probe) live (`BRAID_CACHE_DIR`; default
    /// `$XDG_CACHE_HOME/braid` or `$HOME/.cache/braid`).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Calls the flight recorder keeps (`BRAID_TRACE_BUFFER`, default
    /// [`crate::recorder::DEFAULT_CALLS`]; 0: no recorder).
    pub trace_buffer: usize,
    /// Where flight records are written when a call fails, on abort and on
    /// SIGUSR1 and the fatal signals (`BRAID_TRACE_DIR`; None: not written, only returned on demand).
    pub trace_dir: Option<std::path::PathBuf>,
    /// Where the timeline goes (`BRAID_TIMELINE`; None: no timeline), one file per
    /// rank and communicator named after it ([`crate::recorder::timeline`]).
    pub timeline: Option<std::path::PathBuf>,
    /// Count calls per op ([`crate::Communicator::stats`]; `BRAID_METRICS`, or set
    /// by `BRAID_METRICS_ADDR`).
    pub metrics: bool,
    /// Serve the counts to Prometheus here (`BRAID_METRICS_ADDR`, `HOST:PORT`, the
    /// port offset by the local rank; see [`crate::recorder::exporter`]); turns the
    /// counting on.
    pub metrics_addr: Option<String>,
    /// Allowed transports, None for all.
    pub transports: Option<Vec<TransportKind>>,
    /// TCP interface filter in NCCL syntax.
    pub socket_ifname: Option<String>,
    /// Address family TCP links listen on (`BRAID_SOCKET_FAMILY`), None for either.
    pub socket_family: Option<crate::transport::ifaces::AddrFamily>,
    /// Deadline for every blocking wait.
    pub timeout: Duration,
    /// Log filter.
    pub debug: Option<String>,
    /// Shared job secret, proven in the handshake of every link and of the TCP store.
    pub job_key: crate::auth::JobKey,
    /// Ring bytes per direction of shared-memory links, None for the default.
    pub shm_ring_bytes: Option<usize>,
    /// RDMA device name and port to use (`BRAID_IB_HCA`), None for the first device, port 1.
    pub ib_hca: Option<(String, u8)>,
    /// GID index for RoCE (`BRAID_IB_GID_INDEX`).
    pub ib_gid_index: u8,
    /// Whether local ranks are bound to cores (`BRAID_BIND`; see [`crate::placement`]).
    pub bind: crate::placement::BindPolicy,
    /// Thresholds and grain sizes of the byte-stream channels.
    pub tuning: Tuning,
    /// Which launcher the identity came from (`braid`, `torchrun`, `mpi`, `slurm`, `tf_config`, `code`).
    pub launcher: &'static str,
    /// A fault to inject into this communicator's stream links (tests only; see
    /// [`crate::fault`]). None, the default, wraps no link.
    #[doc(hidden)]
    pub fault: Option<crate::fault::FaultPlan>,
}

impl Config {
    /// A configuration for `rank` of `world_size` with every other knob at its default.
    pub fn new(rank: usize, world_size: usize) -> Config {
        Config {
            rank,
            world_size,
            local_rank: None,
            local_size: None,
            store: None,
            algorithms: crate::tuner::AlgoPolicy::auto(),
            deterministic: false,
            check_roots: true,
            tuner_probe: true,
            cache_dir: None,
            trace_buffer: crate::recorder::DEFAULT_CALLS,
            trace_dir: None,
            timeline: None,
            metrics: false,
            metrics_addr: None,
            transports: None,
            socket_ifname: None,
            socket_family: None,
            timeout: DEFAULT_TIMEOUT,
            debug: None,
            job_key: crate::auth::JobKey::none(),
            shm_ring_bytes: None,
            ib_hca: None,
            ib_gid_index: 0,
            bind: crate::placement::BindPolicy::Auto,
            tuning: Tuning::default(),
            launcher: "code",
            fault: None,
        }
    }

    /// Read the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Whether a launcher's rank variable is set: a configuration error is then the
    /// job's to report, not a sign that nothing launched this process.
    pub fn launcher_present(get: impl Fn(&str) -> Option<String>) -> bool {
        ["BRAID_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "TF_CONFIG"]
            .iter()
            .any(|v| get(v).is_some_and(|s| !s.trim().is_empty()))
    }

    /// Read configuration through `get` (the environment, or a map in tests).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::time::Duration;
    /// use braid::Config;
    /// let vars = HashMap::from([
    ///     ("BRAID_RANK", "1"),
    ///     ("BRAID_WORLD_SIZE", "4"),
    ///     ("BRAID_STORE", "tcp://10.0.0.1:29500"),
    ///     ("BRAID_TIMEOUT", "30s"),
    /// ]);
    /// let cfg = Config::from_lookup(|k| vars.get(k).map(|v| v.to_string()))?;
    /// assert_eq!((cfg.rank, cfg.world_size, cfg.launcher), (1, 4, "braid"));
    /// assert_eq!(cfg.store.as_deref(), Some("tcp://10.0.0.1:29500"));
    /// assert_eq!(cfg.timeout, Duration::from_secs(30));
    /// // torchrun's variables when BRAID_RANK is absent; a rank past the world fails:
    /// let torch = HashMap::from([("RANK", "4"), ("WORLD_SIZE", "4")]);
    /// assert!(Config::from_lookup(|k| torch.get(k).map(|v| v.to_string())).is_err());
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let num = |name: &str| -> Result<Option<usize>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| Error::Config(format!("{name}=`{v}` is not a non-negative integer"))),
            }
        };
        // Slurm's count is only a hint for placement: a value that is not a plain
        // number (Slurm writes lists such as `2(x3)` in its other counts) is ignored.
        let hint = |name: &str| get(name).and_then(|v| v.trim().parse::<usize>().ok());
        // How the store was found, when a launcher's variables derived it (debug log).
        let mut how = None;
        let mut derived = |d: crate::bootstrap::mpi::Derived| {
            how = Some(d.how);
            Some(d.store)
        };
        let slurm_rank = num("SLURM_PROCID")?;
        let (rank, world, (local, local_size), store, launcher) = if let Some(rank) = num("BRAID_RANK")? {
            let world = num("BRAID_WORLD_SIZE")?
                .ok_or_else(|| Error::Config("BRAID_RANK is set but BRAID_WORLD_SIZE is not".into()))?;
            (rank, world, (num("BRAID_LOCAL_RANK")?, num("BRAID_LOCAL_WORLD_SIZE")?), get("BRAID_STORE"), "braid")
        } else if let Some(rank) = num("RANK")? {
            let world = num("WORLD_SIZE")?.ok_or_else(|| Error::Config("RANK is set but WORLD_SIZE is not".into()))?;
            let store = match get("BRAID_STORE") {
                Some(s) => Some(s),
                None => crate::bootstrap::torch_store::torchrun_store_url(&get)?,
            };
            (rank, world, (num("LOCAL_RANK")?, num("LOCAL_WORLD_SIZE")?), store, "torchrun")
        } else if let Some(rank) = num("OMPI_COMM_WORLD_RANK")? {
            let world = num("OMPI_COMM_WORLD_SIZE")?
                .ok_or_else(|| Error::Config("OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not".into()))?;
            let local = (num("OMPI_COMM_WORLD_LOCAL_RANK")?, num("OMPI_COMM_WORLD_LOCAL_SIZE")?);
            let store = match get("BRAID_STORE") {
                Some(s) => Some(s),
                None => derived(crate::bootstrap::mpi::ompi_store(&get, rank, world, local.1)?),
            };
            (rank, world, local, store, "mpi")
        } else if let Some(rank) = num("PMI_RANK")?.filter(|&r| slurm_rank != Some(r)) {
            // MPICH and Intel MPI (Hydra). Under srun --mpi=pmi2 the ranks agree with
            // Slurm's and the Slurm branch below derives more.
            let world = num("PMI_SIZE")?.ok_or_else(|| Error::Config("PMI_RANK is set but PMI_SIZE is not".into()))?;
            let store = match get("BRAID_STORE") {
                Some(s) => Some(s),
                None => derived(crate::bootstrap::mpi::mpich_store(&get, rank)?),
            };
            (rank, world, (num("MPI_LOCALRANKID")?, num("MPI_LOCALNRANKS")?), store, "mpi")
        } else if let Some(rank) = slurm_rank {
            let world = num("SLURM_NTASKS")?
                .ok_or_else(|| Error::Config("SLURM_PROCID is set but SLURM_NTASKS is not".into()))?;
            let store = match get("BRAID_STORE") {
                Some(s) => Some(s),
                None => derived(crate::bootstrap::slurm::slurm_store(&get, rank)?),
            };
            (rank, world, (num("SLURM_LOCALID")?, hint("SLURM_NTASKS_PER_NODE")), store, "slurm")
        } else if let Some(spec) = get("TF_CONFIG").filter(|s| !s.trim().is_empty()) {
            let t = crate::bootstrap::tf_config::parse(&spec)?;
            let local = (Some(t.local_rank), Some(t.local_size));
            (t.rank, t.world, local, get("BRAID_STORE").or(Some(t.store)), "tf_config")
        } else {
            return Err(Error::Config(
                "no rank in the environment: set BRAID_RANK and BRAID_WORLD_SIZE, or start under `braid run`, torchrun, mpirun, mpiexec, srun or with TF_CONFIG".into(),
            ));
        };
        if world == 0 || rank >= world {
            return Err(Error::Config(format!("rank {rank} is not below world size {world}")));
        }
        let mut cfg = Config::new(rank, world);
        cfg.local_rank = local;
        cfg.local_size = local_size.filter(|&n| n > 0);
        cfg.store = store;
        cfg.launcher = launcher;
        if let Some(a) = get("BRAID_ALGO") {
            cfg.algorithms = a.parse().map_err(|e| Error::Config(format!("BRAID_ALGO: {e}")))?;
        }
        cfg.deterministic = flag(&get, "BRAID_DETERMINISTIC")?.unwrap_or(false);
        cfg.check_roots = flag(&get, "BRAID_CHECK_ROOTS")?.unwrap_or(true);
        cfg.tuner_probe = flag(&get, "BRAID_TUNER_PROBE")?.unwrap_or(true);
        cfg.cache_dir = get("BRAID_CACHE_DIR").filter(|s| !s.is_empty()).map(std::path::PathBuf::from);
        if let Some(n) = get("BRAID_TRACE_BUFFER").filter(|s| !s.trim().is_empty()) {
            cfg.trace_buffer = n.trim().parse().ok().filter(|&n| n <= crate::recorder::MAX_CALLS).ok_or_else(|| {
                Error::Config(format!(
                    "BRAID_TRACE_BUFFER: `{n}` is not a number of calls from 0 to {}",
                    crate::recorder::MAX_CALLS
                ))
            })?;
        }
        cfg.trace_dir = get("BRAID_TRACE_DIR").filter(|s| !s.is_empty()).map(std::path::PathBuf::from);
        cfg.timeline = get("BRAID_TIMELINE").filter(|s| !s.is_empty()).map(std::path::PathBuf::from);
        cfg.metrics_addr = get("BRAID_METRICS_ADDR").filter(|s| !s.trim().is_empty());
        cfg.metrics = cfg.metrics_addr.is_some() || flag(&get, "BRAID_METRICS")?.unwrap_or(false);
        if let Some(t) = get("BRAID_TRANSPORTS") {
            let list = t
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty() && !s.eq_ignore_ascii_case("auto"))
                .map(|s| s.parse().map_err(|e| Error::Config(format!("BRAID_TRANSPORTS: {e}"))))
                .collect::<Result<Vec<TransportKind>>>()?;
            if !list.is_empty() {
                cfg.transports = Some(list);
            }
        }
        cfg.socket_ifname = get("BRAID_SOCKET_IFNAME").filter(|s| !s.is_empty());
        if let Some(f) = get("BRAID_SOCKET_FAMILY").filter(|s| !s.trim().is_empty()) {
            cfg.socket_family = Some(f.parse().map_err(|e| Error::Config(format!("BRAID_SOCKET_FAMILY: {e}")))?);
        }
        cfg.tuning = Tuning::from_lookup(&get)?;
        if let Some(b) = get("BRAID_BIND") {
            cfg.bind = b.parse().map_err(|e| Error::Config(format!("BRAID_BIND: {e}")))?;
        }
        if let Some(spec) = get("BRAID_IB_HCA").filter(|s| !s.is_empty()) {
            cfg.ib_hca = Some(parse_hca(&spec)?);
        }
        if let Some(g) = get("BRAID_IB_GID_INDEX").filter(|s| !s.is_empty()) {
            cfg.ib_gid_index = g
                .trim()
                .parse()
                .map_err(|_| Error::Config(format!("BRAID_IB_GID_INDEX: `{g}` is not a GID index (0-255)")))?;
        }
        if let Some(t) = get("BRAID_SHM_RING_BYTES") {
            let n = parse_size(&t).map_err(|e| Error::Config(format!("BRAID_SHM_RING_BYTES: {e}")))?;
            if !(4096..=1 << 30).contains(&n) || n % 4096 != 0 {
                return Err(Error::Config(format!(
                    "BRAID_SHM_RING_BYTES: {n} is not a multiple of 4096 between 4K and 1G"
                )));
            }
            cfg.shm_ring_bytes = Some(n);
        }
        if let Some(t) = get("BRAID_TIMEOUT") {
            cfg.timeout = parse_duration(&t).map_err(|e| Error::Config(format!("BRAID_TIMEOUT: {e}")))?;
        }
        cfg.debug = get("BRAID_DEBUG").filter(|s| !s.is_empty());
        cfg.job_key = crate::auth::JobKey::from_text(&get("BRAID_JOB_KEY").unwrap_or_default());
        tracing::debug!(
            launcher,
            rank,
            world,
            store = cfg.store.as_deref().unwrap_or("none"),
            how = how.as_deref().unwrap_or("as given"),
            "launcher detected"
        );
        Ok(cfg)
    }
}

impl Config {
    /// `e` with where the settings came from in front (the launcher, the rank and world
    /// it gave, the store URL), so a failure to meet says what was derived; nothing is
    /// added for a communicator configured in code, whose caller knows.
    pub(crate) fn with_launch(&self, e: Error, url: &str) -> Error {
        if self.launcher == "code" {
            return e;
        }
        let url = crate::bootstrap::redact_store_url(url);
        let what = format!("launcher {}: rank {} of {}, store {url}", self.launcher, self.rank, self.world_size);
        match e {
            Error::Config(m) => Error::Config(format!("{what}: {m}")),
            Error::Store(m) => Error::Store(format!("{what}: {m}")),
            Error::Io { what: w, source } => Error::Io { what: format!("{what}: {w}"), source },
            other => other,
        }
    }
}

/// `name` or `name:port` (port 1-255; default 1).
fn parse_hca(spec: &str) -> Result<(String, u8)> {
    let bad = || Error::Config(format!("BRAID_IB_HCA: `{spec}` is not `name` or `name:port` (port 1-255)"));
    match spec.split_once(':') {
        Some((n, p)) => match p.parse::<u8>() {
            Ok(port) if port > 0 && !n.is_empty() => Ok((n.to_string(), port)),
            _ => Err(bad()),
        },
        None => Ok((spec.to_string(), 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("3 days").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("16M").unwrap(), 16 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn braid_env() {
        let c = cfg(&[
            ("BRAID_RANK", "2"),
            ("BRAID_WORLD_SIZE", "4"),
            ("BRAID_STORE", "tcp://h:1"),
            ("BRAID_TIMEOUT", "250ms"),
            ("BRAID_ALGO", "ring"),
            ("BRAID_TRANSPORTS", "tcp"),
        ])
        .unwrap();
        assert_eq!((c.rank, c.world_size, c.launcher), (2, 4, "braid"));
        assert_eq!(c.store.as_deref(), Some("tcp://h:1"));
        assert_eq!(c.timeout, Duration::from_millis(250));
        assert_eq!(c.algorithms, crate::tuner::AlgoPolicy::only(crate::algorithm::Algorithm::Ring));
        assert_eq!(c.transports, Some(vec![TransportKind::Tcp]));
    }

    #[test]
    fn socket_family_is_read() {
        use crate::transport::ifaces::AddrFamily;
        let base = [("BRAID_RANK", "0"), ("BRAID_WORLD_SIZE", "1")];
        assert_eq!(cfg(&base).unwrap().socket_family, None);
        for (text, fam) in
            [("AF_INET", AddrFamily::V4), ("4", AddrFamily::V4), ("AF_INET6", AddrFamily::V6), ("6", AddrFamily::V6)]
        {
            let c = cfg(&[base[0], base[1], ("BRAID_SOCKET_FAMILY", text)]).unwrap();
            assert_eq!(c.socket_family, Some(fam), "{text}");
        }
        let err = cfg(&[base[0], base[1], ("BRAID_SOCKET_FAMILY", "AF_UNIX")]).unwrap_err().to_string();
        assert!(err.contains("BRAID_SOCKET_FAMILY") && err.contains("af_unix"), "{err}");
    }

    #[test]
    fn launchers() {
        let t =
            cfg(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")]).unwrap();
        assert_eq!((t.rank, t.launcher), (1, "torchrun"));
        assert_eq!(t.store.as_deref(), Some("tcp://10.0.0.1:29500"));
        let m = cfg(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("BRAID_STORE", "tcp://h:1"),
        ])
        .unwrap();
        assert_eq!((m.rank, m.world_size, m.local_rank, m.local_size, m.launcher), (3, 8, Some(1), None, "mpi"));
        let s = cfg(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("BRAID_STORE", "tcp://h:1")]).unwrap();
        assert_eq!((s.launcher, s.local_size, s.store.as_deref()), ("slurm", None, Some("tcp://h:1")));
        let tf = r#"{"cluster": {"worker": ["10.0.0.2:2222", "10.0.0.3:2222"], "chief": ["10.0.0.1:2222"]},
                     "task": {"type": "worker", "index": 1}}"#;
        let t = cfg(&[("TF_CONFIG", tf)]);
        if cfg!(feature = "tf-config") {
            let t = t.unwrap();
            assert_eq!(
                (t.rank, t.world_size, t.local_rank, t.local_size, t.launcher),
                (2, 3, Some(0), Some(1), "tf_config")
            );
            assert_eq!(t.store.as_deref(), Some("tcp://10.0.0.1:2222"));
            // BRAID_STORE still wins.
            let t = cfg(&[("TF_CONFIG", tf), ("BRAID_STORE", "file:///tmp/s")]).unwrap();
            assert_eq!(t.store.as_deref(), Some("file:///tmp/s"));
        } else {
            assert!(t.unwrap_err().to_string().contains("tf-config"));
        }
    }

    #[test]
    fn launchers_local_sizes_are_read_for_placement() {
        let local = |vars: &[(&str, &str)]| cfg(vars).map(|c| (c.local_rank, c.local_size));
        let braid = [("BRAID_RANK", "2"), ("BRAID_WORLD_SIZE", "4"), ("BRAID_LOCAL_RANK", "2")];
        assert_eq!(
            local(&[braid[0], braid[1], braid[2], ("BRAID_LOCAL_WORLD_SIZE", "4")]).unwrap(),
            (Some(2), Some(4))
        );
        assert!(local(&[braid[0], braid[1], ("BRAID_LOCAL_WORLD_SIZE", "four")]).is_err());
        let torch = [("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4")];
        assert_eq!(local(&torch).unwrap(), (Some(1), Some(4)));
        let mpi = [("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "8"), ("OMPI_COMM_WORLD_LOCAL_RANK", "3")];
        let store = ("BRAID_STORE", "tcp://h:1");
        assert_eq!(
            local(&[mpi[0], mpi[1], mpi[2], ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"), store]).unwrap(),
            (Some(3), Some(4))
        );
        let slurm = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "1"), store];
        assert_eq!(
            local(&[slurm[0], slurm[1], slurm[2], slurm[3], ("SLURM_NTASKS_PER_NODE", "2")]).unwrap(),
            (Some(1), Some(2))
        );
        // Slurm's hint in another shape is ignored, and a size of 0 says nothing.
        assert_eq!(
            local(&[slurm[0], slurm[1], slurm[2], slurm[3], ("SLURM_NTASKS_PER_NODE", "2(x2)")]).unwrap(),
            (Some(1), None)
        );
        assert_eq!(
            local(&[slurm[0], slurm[1], slurm[2], slurm[3], ("SLURM_NTASKS_PER_NODE", "0")]).unwrap(),
            (Some(1), None)
        );
    }

    #[test]
    fn mpirun_and_srun_derive_a_store_when_braid_store_is_absent() {
        let ompi = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_MCA_ess_base_jobid", "77")];
        let one_host = cfg(&[ompi[0], ompi[1], ompi[2], ("OMPI_COMM_WORLD_LOCAL_SIZE", "4")]).unwrap();
        assert_eq!((one_host.launcher, one_host.store.as_deref()), ("mpi", Some("local:ompi-77")));
        let pmix = cfg(&[ompi[0], ompi[1], ompi[2], ("PMIX_NAMESPACE", "77"), ("PMIX_RANK", "1")]).unwrap();
        assert_eq!(pmix.store.as_deref(), Some("pmix:77"));
        let e = cfg(&[ompi[0], ompi[1], ompi[2], ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")]).unwrap_err().to_string();
        assert!(e.contains("-x BRAID_STORE=tcp://HOST:PORT"), "{e}");
        // BRAID_STORE always wins.
        let given =
            cfg(&[ompi[0], ompi[1], ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"), ("BRAID_STORE", "tcp://h:1")]).unwrap();
        assert_eq!(given.store.as_deref(), Some("tcp://h:1"));
        let slurm = cfg(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_STEP_NODELIST", "node[01-02]"),
            ("SLURM_STEP_RESV_PORTS", "12000-12001"),
        ])
        .unwrap();
        assert_eq!((slurm.rank, slurm.launcher, slurm.store.as_deref()), (2, "slurm", Some("slurm://node01:12000")));
    }

    #[test]
    fn mpich_and_intel_mpi_ranks_are_recognised() {
        let pmi = [("PMI_RANK", "2"), ("PMI_SIZE", "3"), ("MPI_LOCALRANKID", "0"), ("MPI_LOCALNRANKS", "1")];
        let c = cfg(&[pmi[0], pmi[1], pmi[2], pmi[3], ("BRAID_STORE", "tcp://h:1")]).unwrap();
        assert_eq!((c.rank, c.world_size, c.local_rank, c.local_size, c.launcher), (2, 3, Some(0), Some(1), "mpi"));
        let e = cfg(&pmi).unwrap_err().to_string();
        assert!(e.contains("PMI_RANK") && e.contains("-genv BRAID_STORE"), "{e}");
        assert!(cfg(&[pmi[0]]).unwrap_err().to_string().contains("PMI_SIZE"));
        // srun --mpi=pmi2 sets both; Slurm's branch, which derives the store, wins.
        let both = cfg(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_JOB_ID", "5"),
        ])
        .unwrap();
        assert_eq!(both.launcher, "slurm");
    }

    #[test]
    fn bad_env_is_a_clear_error() {
        assert!(cfg(&[]).unwrap_err().to_string().contains("BRAID_RANK"));
        assert!(cfg(&[("BRAID_RANK", "4"), ("BRAID_WORLD_SIZE", "4")]).unwrap_err().to_string().contains("below"));
        assert!(cfg(&[("BRAID_RANK", "x"), ("BRAID_WORLD_SIZE", "4")]).is_err());
        assert!(cfg(&[("BRAID_RANK", "0"), ("BRAID_WORLD_SIZE", "1"), ("BRAID_ALGO", "magic")]).is_err());
    }

    #[test]
    fn tuning_comes_from_the_environment_or_says_which_variable_is_wrong() {
        let base = [("BRAID_RANK", "0"), ("BRAID_WORLD_SIZE", "1")];
        assert_eq!(cfg(&base).unwrap().tuning, Tuning::default());
        let t = cfg(&[
            base[0],
            base[1],
            ("BRAID_RENDEZVOUS_BYTES", "1M"),
            ("BRAID_CMA", "1"),
            ("BRAID_FORWARD_GRAIN", "4K"),
            ("BRAID_FORWARD_PASS_BYTES", "64K"),
            ("BRAID_PEER_CHUNK", "256K"),
            ("BRAID_STREAM_RECV_BYTES", "8M"),
            ("BRAID_SPIN", "5ms"),
            ("BRAID_WORKER_NICE", "-3"),
            ("BRAID_NT_STORES", "off"),
        ])
        .unwrap()
        .tuning;
        let want = Tuning {
            rendezvous_bytes: 1 << 20,
            cma: true,
            cma_exchanges_only: false,
            cma_exchanges_timed: false,
            stream_recv_bytes: 8 << 20,
            forward_grain: 4096,
            forward_pass_bytes: 65536,
            peer_chunk: 262144,
            spin: Duration::from_millis(5),
            worker_nice: -3,
            nt_stores: StreamPolicy::Off,
        };
        assert_eq!(t, want);
        let cma = |v: &'static str| {
            let t = cfg(&[base[0], base[1], ("BRAID_CMA", v)]).unwrap().tuning;
            (t.cma, t.cma_exchanges_only, t.cma_exchanges_timed)
        };
        // Exchanges, timed, by default (`auto` says so); `exchange` always in
        // exchanges, `0` is off, `1` everywhere.
        let d = Tuning::default();
        assert_eq!((d.cma, d.cma_exchanges_only, d.cma_exchanges_timed), (true, true, true));
        assert_eq!(cma("AUTO"), (true, true, true));
        assert_eq!(cma(""), (true, true, true));
        assert_eq!(cma("Exchange"), (true, true, false));
        assert_eq!(cma("0"), (false, false, false));
        assert_eq!(cma("on"), (true, false, false));
        for (k, v) in [
            ("BRAID_RENDEZVOUS_BYTES", "lots"),
            ("BRAID_CMA", "maybe"),
            ("BRAID_FORWARD_GRAIN", "0"),
            ("BRAID_PEER_CHUNK", "2G"),
            ("BRAID_SPIN", "soon"),
            ("BRAID_SPIN", "1h"),
            ("BRAID_WORKER_NICE", "20"),
            ("BRAID_WORKER_NICE", "low"),
            ("BRAID_NT_STORES", "sometimes"),
        ] {
            let e = cfg(&[base[0], base[1], (k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{k}={v}: {e}");
        }
    }

    #[test]
    fn rdma_device_variables_parse_or_say_why() {
        let base = [("BRAID_RANK", "0"), ("BRAID_WORLD_SIZE", "1")];
        let with = |k: &'static str, v: &'static str| cfg(&[base[0], base[1], (k, v)]);
        assert_eq!(with("BRAID_IB_HCA", "mlx5_1").unwrap().ib_hca, Some(("mlx5_1".into(), 1)));
        assert_eq!(with("BRAID_IB_HCA", "mlx5_0:2").unwrap().ib_hca, Some(("mlx5_0".into(), 2)));
        assert_eq!(with("BRAID_IB_GID_INDEX", "3").unwrap().ib_gid_index, 3);
        assert_eq!(cfg(&base).unwrap().ib_hca, None);
        for bad in ["mlx5_0:x", "mlx5_0:0", ":1", "mlx5_0:300"] {
            let e = with("BRAID_IB_HCA", bad).unwrap_err().to_string();
            assert!(e.contains("BRAID_IB_HCA") && e.contains(bad), "{bad}: {e}");
        }
        let e = with("BRAID_IB_GID_INDEX", "-1").unwrap_err().to_string();
        assert!(e.contains("BRAID_IB_GID_INDEX"), "{e}");
    }
}
