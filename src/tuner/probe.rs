//! The start-up probe: measured link costs for the cost model, cached on disk per
//! host and agreed by every rank.
//!
//! A communicator built over a store (not an in-process one) runs this once its
//! links are up, unless `BRAID_TUNER_PROBE=0`. Two classes may be measured: the
//! local one (links between ranks of one host) when some host has two ranks, and
//! the remote one when there are two hosts. Each is measured by one pair of ranks
//! with the communicator's own send and receive:
//!
//! - local: rank 0 and its first peer on its host (else the two lowest ranks of
//!   the first host with two);
//! - remote: rank 0 and the lowest rank of another host.
//!
//! Rank 0 decides, so every rank installs the same numbers and picks the same
//! algorithms. It reads the cache; when every class it needs has a valid entry it
//! publishes the model and nobody measures. Otherwise it names the classes to
//! measure, the pairs measure them (the leader of a pair publishes what it found
//! when it is not rank 0), and rank 0 publishes the model and writes the cache.
//!
//! # Measurements (medians of several repetitions; about 20 ms on shared memory)
//!
//! - `alpha`: half the round trip of an 8-byte message;
//! - `beta`: per byte of a 256 KiB transfer, its round trip less the 8-byte one's;
//! - `gamma` (memory links: the classes whose default has a `far`): per byte of an
//!   f32 sum of two 256 KiB buffers with the executor's reduction kernel, on the
//!   pair's leader;
//! - `far` (memory links): the same sum over 32 x [`CostModel::cache_bytes`]
//!   touched, per byte, over `gamma`, in `[1, 8]` (a local sum: a 32 MiB ping-pong
//!   costs over 100 ms and is too noisy on busy cores);
//! - network classes keep their default `gamma` and `far`; `duplex` and
//!   `per_host` keep their defaults everywhere.
//!
//! Every measured value is kept within `[0.1x, 10x]` of the default; nonsense (zero,
//! negative, NaN) falls back to the default.
//!
//! # Store keys (under the communicator's prefix)
//!
//! - `tuner/member/{rank}`: what rank 0 needs from a measuring rank other than
//!   itself: `fp {host fingerprint}`, and `local {class}` from the local leader;
//! - `tuner/plan`: `cache` (nobody measures) or `probe` and one line per class to
//!   measure (`local`, `remote`), or `error {why}`;
//! - `tuner/measured/{role}`: a leader's measurement (see [`Measured`]), or `error {why}`;
//! - `tuner/model`: the agreed model (the text of `encode_model`), or `error {why}`.
//!
//! # The cache
//!
//! One small text file per class and host (pair of hosts for the remote class) in
//! `BRAID_CACHE_DIR` (default `$XDG_CACHE_HOME/braid`, else `$HOME/.cache/braid`):
//! `tuner-{class}-{hash of key}.txt`, holding a header, `key {key}` and the measured
//! values. The key is the class and the fingerprint of the host(s): CPU model and
//! count, memory, kernel release and braid's version ([`host_fingerprint`]); new
//! hardware or software is a new key, so a miss. Files are written atomically (a
//! temporary file renamed); an unreadable, oversized or malformed file is a miss,
//! and failing to read or write the cache only logs a warning.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use super::cache::{default_cache_dir, host_fingerprint, local_key, read_cache};
pub(crate) use super::cache::{num_hosts, remote_key, write_cache};
use super::cost::{AlgoFar, CostModel, LinkClass, LinkCost};
pub use super::measured::Measured;
use crate::bootstrap::Store;
use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};

/// Where a communicator's link costs came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProbeSource {
    /// The built-in model (probe off, nothing to measure, or an in-process communicator).
    #[default]
    Builtin,
    /// The on-disk cache of an earlier probe on this host.
    Cache,
    /// Measured at start-up (at least one class).
    Measured,
}

impl ProbeSource {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ProbeSource::Builtin => "builtin",
            ProbeSource::Cache => "cache",
            ProbeSource::Measured => "measured",
        }
    }
}

impl fmt::Display for ProbeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The agreed outcome: the model every rank installs and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Probed {
    /// The cost model.
    pub model: CostModel,
    /// Where its numbers came from.
    pub source: ProbeSource,
}

/// What the probe needs of a communicator: point-to-point bytes and link classes.
pub(crate) trait Exchange {
    /// Send `buf` to `peer` (blocking until the communicator has taken it).
    fn send(&self, buf: &[u8], peer: usize) -> Result<()>;
    /// Receive exactly `buf.len()` bytes from `peer`.
    fn recv(&self, buf: &mut [u8], peer: usize) -> Result<()>;
    /// The class of the link to `peer` (None: no link).
    fn class_to(&self, peer: usize) -> Option<LinkClass>;
}

/// One rank's view of the set-up.
pub(crate) struct ProbeSetup<'a> {
    /// This rank.
    pub rank: usize,
    /// Host index of every rank (its length is the world size).
    pub hosts: &'a [usize],
    /// The communicator's scoped store.
    pub store: &'a dyn Store,
    /// Deadline of every wait.
    pub timeout: Duration,
    /// Cache directory (None: no cache).
    pub cache_dir: Option<PathBuf>,
}

/// A class to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Local,
    Remote,
}

impl Role {
    const fn name(self) -> &'static str {
        match self {
            Role::Local => "local",
            Role::Remote => "remote",
        }
    }
}

/// The pairs of ranks that measure each class (leader first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pairs {
    /// Two ranks of one host: rank 0 and its first host peer, else the two lowest
    /// ranks of the first host with two.
    pub local: Option<(usize, usize)>,
    /// Rank 0 and the lowest rank of another host.
    pub remote: Option<(usize, usize)>,
}

impl Pairs {
    /// The pairs of a host layout (`hosts[r]` is rank r's host).
    pub fn of(hosts: &[usize]) -> Pairs {
        let Some(&h0) = hosts.first() else { return Pairs::default() };
        let first_peer = |r: usize| (r + 1..hosts.len()).find(|&p| hosts[p] == hosts[r]).map(|p| (r, p));
        Pairs {
            local: (0..hosts.len()).find_map(first_peer),
            remote: hosts.iter().position(|&h| h != h0).map(|q| (0, q)),
        }
    }

    fn get(&self, role: Role) -> Option<(usize, usize)> {
        match role {
            Role::Local => self.local,
            Role::Remote => self.remote,
        }
    }
}

/// `value` kept within `[0.1x, 10x]` of `default`; the default for nonsense.
pub(crate) fn sane(value: f64, default: f64) -> f64 {
    if !value.is_finite() || value <= 0.0 {
        return default;
    }
    value.clamp(default * 0.1, default * 10.0)
}

/// A measured `far` kept within `[1, 8]`; `default` for nonsense.
pub(crate) fn sane_far(value: f64, default: f64) -> f64 {
    if value.is_finite() && value > 0.0 {
        value.clamp(1.0, 8.0)
    } else {
        default
    }
}

/// A measured network `beta` kept within `[0.01x, 100x]` of `default`; the
/// default for nonsense. Networks differ far more than memory does: the built-in
/// TCP link is 10 Gbit/s, and a 1 Gbit/s one (8.6e-9 s a byte of payload, measured
/// over the emulated hosts) sat just past `sane`'s 10x and was priced at the clamp.
pub(crate) fn sane_wire(value: f64, default: f64) -> f64 {
    if !value.is_finite() || value <= 0.0 {
        return default;
    }
    value.clamp(default * 0.01, default * 100.0)
}

/// The costs of `class` with what was measured (sanitised against the defaults).
pub(crate) fn measured_cost(class: LinkClass, m: &Measured) -> LinkCost {
    let d = CostModel::default().cost(class);
    let beta = if memory_class(class) { sane(m.beta, d.beta) } else { sane_wire(m.beta, d.beta) };
    LinkCost {
        alpha: sane(m.alpha, d.alpha),
        beta,
        gamma: m.gamma.map_or(d.gamma, |g| sane(g, d.gamma)),
        far: m.far.map_or(d.far, |f| sane_far(f, d.far)),
        ..d
    }
}

/// Put what was measured (or cached) for `class` into `model`, sanitised: its
/// costs and, when the entry has one, the wait of a round on a busy host.
pub fn apply(model: &mut CostModel, class: LinkClass, m: &Measured) {
    model.set(class, measured_cost(class, m));
    if let Some(b) = m.busy_round {
        model.busy_round = sane(b, CostModel::default().busy_round);
    }
    if memory_class(class) {
        model.algo_far = m.algo_far;
    }
}

/// Classes a probe over host buffers can measure.
fn probeable(class: LinkClass) -> bool {
    matches!(class, LinkClass::SharedMemory | LinkClass::Tcp | LinkClass::Rdma)
}

// ---------------------------------------------------------------------------
// The agreed model on the store

const MODEL_HEADER: &str = "braid tuner model 1";

/// The text of a model and its source, as published under `tuner/model`
/// (floats in Rust's shortest round-trip form, so every rank parses the same bits).
pub(crate) fn encode_model(p: &Probed) -> String {
    let mut s = format!("{MODEL_HEADER}\nsource {}\n", p.source);
    for class in LinkClass::ALL {
        let c = p.model.cost(class);
        s += &format!(
            "{class} alpha={} beta={} gamma={} far={} duplex={} per_host={}\n",
            c.alpha, c.beta, c.gamma, c.far, c.duplex as u8, c.per_host as u8
        );
    }
    s += &format!(
        "busy_round={} busy_share={} cache_bytes={}",
        p.model.busy_round, p.model.busy_share, p.model.cache_bytes
    );
    for (key, factor) in p.model.algo_far.entries() {
        s += &format!(" {key}={factor}");
    }
    s + "\n"
}

/// The model of [`encode_model`]'s text.
pub(crate) fn decode_model(text: &str) -> std::result::Result<Probed, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MODEL_HEADER) {
        return Err("no model header".into());
    }
    let source = match lines.next().and_then(|l| l.strip_prefix("source ")) {
        Some("builtin") => ProbeSource::Builtin,
        Some("cache") => ProbeSource::Cache,
        Some("measured") => ProbeSource::Measured,
        other => return Err(format!("bad source line {other:?}")),
    };
    let mut model = CostModel::default();
    let num = |v: &str, what: &str| -> std::result::Result<f64, String> {
        v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(|| format!("{what}=`{v}`"))
    };
    let fields = |line: &str| -> std::result::Result<Vec<(String, String)>, String> {
        line.split_whitespace()
            .map(|f| f.split_once('=').map(|(a, b)| (a.to_string(), b.to_string())).ok_or(format!("`{f}`")))
            .collect()
    };
    let mut seen = 0;
    for class in LinkClass::ALL {
        let line = lines.next().ok_or(format!("no line for {class}"))?;
        let rest = line.strip_prefix(class.name()).and_then(|r| r.strip_prefix(' ')).ok_or(format!("not {class}"))?;
        let mut c = model.cost(class);
        for (k, v) in fields(rest)? {
            match k.as_str() {
                "alpha" => c.alpha = num(&v, &k)?,
                "beta" => c.beta = num(&v, &k)?,
                "gamma" => c.gamma = num(&v, &k)?,
                "far" => c.far = num(&v, &k)?,
                "duplex" => c.duplex = v == "1",
                "per_host" => c.per_host = v == "1",
                _ => return Err(format!("unknown field `{k}`")),
            }
            seen += 1;
        }
        model.set(class, c);
    }
    let line = lines.next().ok_or("no busy line")?;
    for (k, v) in fields(line)? {
        if let Some(set) = model.algo_far.set_entry(&k, num(&v, &k).unwrap_or(f64::NAN)) {
            num(&v, &k)?;
            set?;
            continue;
        }
        match k.as_str() {
            "busy_round" => model.busy_round = num(&v, &k)?,
            "busy_share" => model.busy_share = num(&v, &k)?,
            "cache_bytes" => model.cache_bytes = v.parse().map_err(|_| format!("cache_bytes=`{v}`"))?,
            _ => return Err(format!("unknown field `{k}`")),
        }
        seen += 1;
    }
    if seen != 6 * LinkClass::ALL.len() + 3 {
        return Err("missing fields".into());
    }
    Ok(Probed { model, source })
}

// ---------------------------------------------------------------------------
// Measuring

/// Bytes of the latency message.
const TINY: usize = 8;
/// Bytes of the in-cache transfer (and of each buffer of the reduction).
const MID: usize = 256 << 10;

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Round trips of `buf` with `partner` (the leader sends first); the leader's times.
fn round_trips(
    ex: &dyn Exchange,
    partner: usize,
    leader: bool,
    buf: &mut [u8],
    warm: usize,
    reps: usize,
) -> Result<Vec<f64>> {
    let mut times = Vec::with_capacity(reps);
    for i in 0..warm + reps {
        let t = Instant::now();
        if leader {
            ex.send(buf, partner)?;
            ex.recv(buf, partner)?;
        } else {
            ex.recv(buf, partner)?;
            ex.send(buf, partner)?;
        }
        if i >= warm {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(times)
}

/// Seconds per byte of an f32 sum with the executor's kernel: `acc += inc` over
/// `bytes` each (so `2 x bytes` touched), the median of `reps` after one warm-up.
fn reduce_per_byte(bytes: usize, reps: usize) -> f64 {
    // Written, not merely allocated: untouched pages would all read the zero page.
    let mut acc = vec![1u8; bytes];
    let inc = vec![1u8; bytes];
    let times: Vec<f64> = (0..=reps)
        .map(|_| {
            let t = Instant::now();
            let _ = crate::reduce::reduce_inplace(DType::F32, ReduceOp::Sum, &mut acc, &inc);
            t.elapsed().as_secs_f64()
        })
        .skip(1)
        .collect();
    std::hint::black_box(&acc);
    median(times) / bytes as f64
}

/// `gamma`: seconds per byte of an f32 sum of two in-cache buffers.
pub(crate) fn measure_gamma() -> f64 {
    reduce_per_byte(MID, 11)
}

/// `far`: how much slower the same sum runs over `touched` bytes (two buffers of
/// half that) than in cache. Memory bandwidth is what slows copies and reductions
/// alike past the cache, and a local sum measures it steadily (a 32 MiB ping-pong
/// over shared memory took 120-220 ms with round trips of 2 to 20 ms).
pub(crate) fn measure_far(touched: usize, gamma: f64) -> f64 {
    reduce_per_byte(touched / 2, 3) / gamma
}

/// Both ends of a pair run this; the leader returns what it measured (raw, not
/// yet sanitised). The leader of a memory class (whose default has a `far`) then
/// measures `gamma` and `far` on its own.
fn measure_pair(ex: &dyn Exchange, partner: usize, leader: bool, memory: bool) -> Result<Option<Measured>> {
    let mut buf = vec![1u8; MID];
    let small = median(round_trips(ex, partner, leader, &mut buf[..TINY], 20, 31)?);
    let mid = median(round_trips(ex, partner, leader, &mut buf[..MID], 3, 9)?);
    if !leader {
        return Ok(None);
    }
    let beta = (mid - small) / (2.0 * MID as f64);
    let (gamma, far) = if memory {
        let gamma = measure_gamma();
        let touched = 32 * CostModel::default().cache_bytes as usize;
        (Some(gamma), Some(measure_far(touched, gamma)))
    } else {
        (None, None)
    };
    // Noise can make a difference of medians zero or negative (a loaded machine saw
    // beta < 0): it is published as it is, and `measured_cost` puts the default in
    // its place, as for any nonsense.
    Ok(Some(Measured { alpha: small / 2.0, beta, gamma, far, busy_round: None, algo_far: AlgoFar::default() }))
}

/// Whether `class` is a memory link: `gamma` and `far` are measured for it.
fn memory_class(class: LinkClass) -> bool {
    CostModel::default().cost(class).far > 1.0
}

// ---------------------------------------------------------------------------
// Agreeing

const PLAN_KEY: &str = "tuner/plan";
const MODEL_KEY: &str = "tuner/model";
fn member_key(rank: usize) -> String {
    format!("tuner/member/{rank}")
}
fn measured_key(role: Role) -> String {
    format!("tuner/measured/{}", role.name())
}

/// A class to measure or read from the cache.
struct Job {
    role: Role,
    pair: (usize, usize),
    class: LinkClass,
    key: String,
}

/// Annotate `e` with the rank and the step of the probe where it can carry text.
fn in_step(rank: usize, step: &str, e: Error) -> Error {
    let note = |m: String| format!("rank {rank}: tuner probe, {step}: {m}");
    match e {
        Error::Store(m) => Error::Store(note(m)),
        Error::Config(m) => Error::Config(note(m)),
        Error::InvalidArgument(m) => Error::InvalidArgument(note(m)),
        Error::Unsupported(m) => Error::Unsupported(note(m)),
        Error::PeerLost { ctx, peer, detail } => Error::PeerLost { ctx, peer, detail: note(detail) },
        Error::Protocol { ctx, peer, detail } => Error::Protocol { ctx, peer, detail: note(detail) },
        other => {
            tracing::warn!(rank, step, "tuner probe failed: {other}");
            other
        }
    }
}

fn store_err(rank: usize, step: &str, why: impl fmt::Display) -> Error {
    Error::Store(format!("rank {rank}: tuner probe, {step}: {why}"))
}

fn utf8(rank: usize, key: &str, raw: Vec<u8>) -> Result<String> {
    String::from_utf8(raw).map_err(|_| store_err(rank, &format!("reading {key}"), "not UTF-8"))
}

/// Run the probe on one rank and return the model every rank agrees on. Every
/// rank of the communicator calls this once, at the same point of its set-up.
pub(crate) fn agree(s: &ProbeSetup<'_>, ex: &dyn Exchange) -> Result<Probed> {
    let pairs = Pairs::of(s.hosts);
    if pairs.local.is_none() && pairs.remote.is_none() {
        return Ok(Probed { model: CostModel::default(), source: ProbeSource::Builtin });
    }
    let started = Instant::now();
    let probed = if s.rank == 0 {
        lead(s, ex, &pairs).inspect_err(|e| {
            // Tell the others at once rather than let them wait out the deadline.
            let why = format!("error rank 0 failed: {e}");
            let _ = s.store.set(PLAN_KEY, why.as_bytes());
            let _ = s.store.set(MODEL_KEY, why.as_bytes());
        })?
    } else {
        follow(s, ex, &pairs)?
    };
    tracing::debug!(rank = s.rank, source = %probed.source, ms = started.elapsed().as_secs_f64() * 1e3, "tuner probe done");
    Ok(probed)
}

/// Rank 0: find the classes, read the cache, have the rest measured, publish.
fn lead(s: &ProbeSetup<'_>, ex: &dyn Exchange, pairs: &Pairs) -> Result<Probed> {
    let rank = s.rank;
    let fp0 = host_fingerprint();
    let member = |r: usize| -> Result<(String, Option<LinkClass>)> {
        let key = member_key(r);
        let raw = s.store.wait_get(&key, s.timeout).map_err(|e| in_step(rank, &format!("waiting for {key}"), e))?;
        let text = utf8(rank, &key, raw)?;
        let (mut fp, mut class) = (None, None);
        for line in text.lines() {
            if let Some(f) = line.strip_prefix("fp ") {
                fp = Some(f.to_string());
            } else if let Some(c) = line.strip_prefix("local ") {
                class = if c == "none" { None } else { Some(c.parse().map_err(|e| store_err(rank, &key, e))?) };
            }
        }
        Ok((fp.ok_or_else(|| store_err(rank, &key, "no fingerprint"))?, class))
    };
    let default = CostModel::default();
    let mut jobs = Vec::new();
    if let Some((a, b)) = pairs.local {
        let (fp, class) = if a == 0 { (fp0.clone(), ex.class_to(b)) } else { member(a)? };
        if let Some(class) = class.filter(|c| probeable(*c)) {
            let here = s.hosts.iter().filter(|&&h| h == s.hosts[a]).count();
            let key = local_key(class, &fp, here, num_hosts(s.hosts));
            jobs.push(Job { role: Role::Local, pair: (a, b), class, key });
        }
    }
    if let Some((_, q)) = pairs.remote {
        let (fp, _) = member(q)?;
        if let Some(class) = ex.class_to(q).filter(|c| probeable(*c)) {
            // One set of costs per class: where both are one class, the hosts' link measures it.
            jobs.retain(|j| j.class != class);
            jobs.push(Job { role: Role::Remote, pair: (0, q), class, key: remote_key(class, &fp0, &fp) });
        }
    }
    let mut model = default;
    let mut missing = Vec::new();
    for job in jobs.iter() {
        match s.cache_dir.as_deref().and_then(|d| read_cache(d, job.class, &job.key)) {
            Some(m) => apply(&mut model, job.class, &m),
            None => missing.push(job),
        }
    }
    let source = match (jobs.is_empty(), missing.is_empty()) {
        (true, _) => ProbeSource::Builtin,
        (false, true) => ProbeSource::Cache,
        (false, false) => ProbeSource::Measured,
    };
    let publish = |key: &str, value: &str| {
        s.store.set(key, value.as_bytes()).map_err(|e| in_step(rank, &format!("publishing {key}"), e))
    };
    let mut plan = if missing.is_empty() { "cache\n".to_string() } else { "probe\n".to_string() };
    for job in &missing {
        plan += &format!("{}\n", job.role.name());
    }
    publish(PLAN_KEY, &plan)?;
    for job in &missing {
        let step = format!("measuring the {} class ({})", job.role.name(), job.class);
        let m = if job.pair.0 == 0 {
            measure_pair(ex, job.pair.1, true, memory_class(job.class))
                .map_err(|e| in_step(rank, &step, e))?
                .ok_or_else(|| store_err(rank, &step, "the leader measured nothing"))?
        } else {
            let key = measured_key(job.role);
            let text = utf8(rank, &key, s.store.wait_get(&key, s.timeout).map_err(|e| in_step(rank, &step, e))?)?;
            if let Some(why) = text.strip_prefix("error ") {
                return Err(store_err(rank, &step, format!("rank {} reported: {why}", job.pair.0)));
            }
            text.parse::<Measured>().map_err(|e| store_err(rank, &format!("{step}, reading {key}"), e))?
        };
        let cost = measured_cost(job.class, &m);
        let d = default.cost(job.class);
        tracing::debug!(
            class = %job.class,
            alpha_us = cost.alpha * 1e6,
            beta_gbps = 1e-9 / cost.beta,
            gamma_gbps = 1e-9 / cost.gamma,
            far = cost.far,
            default_alpha_us = d.alpha * 1e6,
            default_beta_gbps = 1e-9 / d.beta,
            default_gamma_gbps = 1e-9 / d.gamma,
            default_far = d.far,
            raw = %m,
            "tuner probe measured (GB/s are 1/beta, 1/gamma)"
        );
        model.set(job.class, cost);
        if let Some(dir) = s.cache_dir.as_deref() {
            let kept = Measured {
                alpha: cost.alpha,
                beta: cost.beta,
                gamma: m.gamma.map(|_| cost.gamma),
                far: m.far.map(|_| cost.far),
                busy_round: None,
                algo_far: AlgoFar::default(),
            };
            match write_cache(dir, job.class, &job.key, &kept) {
                Ok(path) => tracing::debug!(path = %path.display(), "tuner cache written"),
                Err(e) => tracing::warn!(dir = %dir.display(), "cannot write the tuner cache ({e}); not caching"),
            }
        }
    }
    let probed = Probed { model, source };
    publish(MODEL_KEY, &encode_model(&probed))?;
    Ok(probed)
}

/// Every other rank: say what rank 0 needs, measure when asked, read the model.
fn follow(s: &ProbeSetup<'_>, ex: &dyn Exchange, pairs: &Pairs) -> Result<Probed> {
    let rank = s.rank;
    let local_leader = pairs.local.is_some_and(|(a, _)| a == rank);
    let in_pair = |role: Role| pairs.get(role).is_some_and(|(a, b)| a == rank || b == rank);
    let remote_partner = pairs.remote.is_some_and(|(_, q)| q == rank);
    if local_leader || remote_partner {
        let mut text = format!("fp {}\n", host_fingerprint());
        if let (true, Some((_, b))) = (local_leader, pairs.local) {
            text += &format!("local {}\n", ex.class_to(b).map_or("none", LinkClass::name));
        }
        let key = member_key(rank);
        s.store.set(&key, text.as_bytes()).map_err(|e| in_step(rank, &format!("publishing {key}"), e))?;
    }
    if in_pair(Role::Local) || in_pair(Role::Remote) {
        let raw = s.store.wait_get(PLAN_KEY, s.timeout).map_err(|e| in_step(rank, "waiting for rank 0's plan", e))?;
        let plan = utf8(rank, PLAN_KEY, raw)?;
        if let Some(why) = plan.strip_prefix("error ") {
            return Err(store_err(rank, "waiting for rank 0's plan", why));
        }
        for line in plan.lines().skip(1) {
            let role = match line {
                "local" => Role::Local,
                "remote" => Role::Remote,
                _ => return Err(store_err(rank, "reading rank 0's plan", format!("bad line `{line}`"))),
            };
            let Some((a, b)) = pairs.get(role).filter(|_| in_pair(role)) else { continue };
            let leader = a == rank;
            let partner = if leader { b } else { a };
            let step = format!("measuring the {} class with rank {partner}", role.name());
            let got = measure_pair(ex, partner, leader, leader && ex.class_to(partner).is_some_and(memory_class))
                .map_err(|e| in_step(rank, &step, e));
            if leader {
                let key = measured_key(role);
                let text = match &got {
                    Ok(Some(m)) => m.to_string(),
                    Ok(None) => "error nothing measured".to_string(),
                    Err(e) => format!("error {e}"),
                };
                s.store.set(&key, text.as_bytes()).map_err(|e| in_step(rank, &format!("publishing {key}"), e))?;
            }
            got?;
        }
    }
    let raw = s.store.wait_get(MODEL_KEY, s.timeout).map_err(|e| in_step(rank, "waiting for rank 0's model", e))?;
    let text = utf8(rank, MODEL_KEY, raw)?;
    if let Some(why) = text.strip_prefix("error ") {
        return Err(store_err(rank, "waiting for rank 0's model", why));
    }
    decode_model(&text).map_err(|e| store_err(rank, "reading rank 0's model", e))
}

#[cfg(test)]
mod tests;
