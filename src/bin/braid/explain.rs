//! `braid explain` and `braid simulate`: the tuner's cost model, without running.
//!
//! Both plan every rank of a call for each candidate algorithm and price the
//! schedules with [`braid::tuner`], exactly as a communicator does before its first
//! call of a kind: `explain` prints each candidate's terms and the pick for one
//! size; `simulate` predicts busbw over a sweep of sizes, for clusters larger than
//! the machine at hand.

use std::io::Write;

use braid::algorithm::{Algorithm, PlanParams};
use braid::tuner::{
    bus_factor, choose, probe, rank_candidates, tie_order, AlgoPolicy, Call, CostModel, LinkClass, LinkCost, LinkPair,
    TIE_MARGIN,
};
use braid::{DType, OpKind};
use clap::Args;

use braid::config::parse_size;

use crate::perf::parse_op;

/// The cluster and links both commands price on.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Collective.
    #[arg(long, default_value = "all-reduce", value_parser = parse_op)]
    pub op: OpKind,
    /// Number of ranks.
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// Number of hosts; ranks fill them in consecutive blocks, as evenly as they can.
    #[arg(long, default_value_t = 1)]
    pub hosts: usize,
    /// Class of the links between hosts (with one host: of the links inside it):
    /// `inproc`, `shm`, `tcp`, `rdma`, `cuda`.
    #[arg(long)]
    pub link: Option<LinkClass>,
    /// Class of the links inside a host.
    #[arg(long, default_value = "shm")]
    pub local_link: LinkClass,
    /// Bandwidth of the `--link` class in Gbit/s (default: the built-in model's).
    #[arg(long)]
    pub gbps: Option<f64>,
    /// Latency of one message over the `--link` class, in microseconds.
    #[arg(long)]
    pub latency_us: Option<f64>,
    /// Element type.
    #[arg(short = 'd', long, default_value = "f32")]
    pub dtype: DType,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long, default_value_t = 0)]
    pub root: usize,
    /// Every host runs more ranks than it has cores (each round then waits for a
    /// peer to be scheduled).
    #[arg(long)]
    pub oversubscribed: bool,
    /// Candidates, in `BRAID_ALGO`'s syntax (default: every algorithm of the op).
    #[arg(long, default_value = "auto")]
    pub algo: AlgoPolicy,
    /// Price the links inside a host with this host's probed costs (the cache the
    /// start-up probe writes, in `BRAID_CACHE_DIR` or the default place) instead of
    /// the built-in ones; an error when nothing was probed here yet.
    #[arg(long)]
    pub probed: bool,
    /// Reproducible mode (`BRAID_DETERMINISTIC`): price the rank-order forms.
    #[arg(long)]
    pub reproducible: bool,
}

/// `braid explain`.
#[derive(Args, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Message size (as `braid perf` counts it: bytes of the buffer per rank).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub bytes: usize,
}

/// `braid simulate`.
#[derive(Args, Debug)]
pub struct SimulateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Smallest size.
    #[arg(short = 'b', long, default_value = "4K", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size.
    #[arg(short = 'e', long, default_value = "256M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiply the size by this factor between steps.
    #[arg(short = 'f', long, default_value_t = 4.0)]
    pub factor: f64,
}

/// What both commands derive from [`ModelArgs`].
struct Setup {
    hosts: Vec<usize>,
    busy: Vec<bool>,
    links: LinkPair,
    model: CostModel,
    candidates: Vec<Algorithm>,
    params: PlanParams,
}

fn setup(m: &ModelArgs) -> Result<Setup, String> {
    if m.ranks == 0 || m.hosts == 0 || m.hosts > m.ranks {
        return Err(format!("need 1 <= --hosts ({}) <= --ranks ({})", m.hosts, m.ranks));
    }
    if m.op.rooted() && m.root >= m.ranks {
        return Err(format!("--root {} is not below --ranks {}", m.root, m.ranks));
    }
    let hosts: Vec<usize> = (0..m.ranks).map(|r| r * m.hosts / m.ranks).collect();
    let default_remote = if m.hosts > 1 { LinkClass::Tcp } else { m.local_link };
    let link = m.link.unwrap_or(default_remote);
    // With one host, --link names the links inside it.
    let mut links = if m.hosts > 1 { LinkPair::new(m.local_link, link) } else { LinkPair::new(link, LinkClass::Tcp) };
    // Ranks are processes: exchanges over shared memory go single-copy as the
    // environment's `BRAID_CMA` and `BRAID_RENDEZVOUS_BYTES` say, as in a job.
    let tuning = braid::config::Tuning::from_lookup(&|k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
    links.single_copy_exchanges = tuning.cma.then_some(tuning.rendezvous_bytes);
    let mut model = CostModel::default();
    if m.probed {
        let local = links.local;
        let dir = probe::default_cache_dir().ok_or("--probed: no cache directory (set BRAID_CACHE_DIR or HOME)")?;
        let on_first = hosts.iter().filter(|&&h| h == 0).count();
        let key = probe::local_key(local, &probe::host_fingerprint(), on_first, m.hosts);
        let measured = probe::read_cache(&dir, local, &key).ok_or_else(|| {
            format!(
                "--probed: no probe of {local} links for {on_first} ranks a host on {} hosts in {} (run such a job once)",
                m.hosts,
                dir.display()
            )
        })?;
        probe::apply(&mut model, local, &measured);
    }
    let mut cost: LinkCost = model.cost(link);
    if let Some(g) = m.gbps {
        if !(g > 0.0 && g.is_finite()) {
            return Err(format!("--gbps {g} must be positive"));
        }
        cost.beta = 8.0 / (g * 1e9);
    }
    if let Some(l) = m.latency_us {
        if !(l >= 0.0 && l.is_finite()) {
            return Err(format!("--latency-us {l} must not be negative"));
        }
        cost.alpha = l * 1e-6;
    }
    model.set(link, cost);
    let candidates = m.algo.allowed(m.op);
    if candidates.is_empty() {
        return Err(format!("{} has no algorithm to price", m.op));
    }
    let params = PlanParams { deterministic: m.reproducible, ..PlanParams::default() };
    Ok(Setup { hosts, busy: vec![m.oversubscribed; m.hosts], links, model, candidates, params })
}

fn describe(m: &ModelArgs, s: &Setup) -> String {
    let mut per_host = vec![0usize; m.hosts];
    s.hosts.iter().for_each(|&h| per_host[h] += 1);
    let layout: Vec<String> = per_host.iter().map(|c| c.to_string()).collect();
    let cost = |c: LinkClass| {
        let k = s.model.cost(c);
        format!("{c} ({:.2} us, {:.2} GB/s)", k.alpha * 1e6, 1.0 / k.beta / 1e9)
    };
    if m.hosts > 1 {
        let shown = if layout.len() > 8 { format!("{} each", layout[0]) } else { layout.join("+") };
        format!(
            "{} ranks on {} hosts ({shown}); inside hosts {}, between {}",
            m.ranks,
            m.hosts,
            cost(s.links.local),
            cost(s.links.remote)
        )
    } else {
        format!("{} ranks on one host; links {}", m.ranks, cost(s.links.local))
    }
}

fn call<'a>(m: &ModelArgs, s: &'a Setup, bytes: usize) -> Call<'a> {
    Call {
        op: m.op,
        count: bytes / m.dtype.size(),
        elem_size: m.dtype.size(),
        root: m.root,
        hosts: &s.hosts,
        busy: &s.busy,
    }
}

pub fn explain(a: ExplainArgs) -> i32 {
    let m = &a.model;
    let s = match setup(m) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("braid explain: {e}");
            return 2;
        }
    };
    let c = call(m, &s, a.bytes);
    let ranked = match rank_candidates(&c, &s.candidates, s.links, &s.model, &s.params) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("braid explain: {e}");
            return 1;
        }
    };
    println!(
        "# braid explain: {} of {} bytes ({} x {}), {}",
        m.op,
        c.count * c.elem_size,
        c.count,
        m.dtype,
        describe(m, &s)
    );
    println!("# predicted = alpha x steps + beta x bytes on the wire + gamma x bytes reduced, along the critical path");
    println!(
        "# {:<17} {:>13} {:>7} {:>10} {:>12} {:>10} {:>12} {:>10}",
        "algorithm", "predicted(us)", "steps", "alpha(us)", "wire(bytes)", "beta(us)", "reduced", "gamma(us)"
    );
    for cand in &ranked {
        let t = &cand.terms;
        println!(
            "  {:<17} {:>13.2} {:>7} {:>10.2} {:>12} {:>10.2} {:>12} {:>10.2}",
            cand.algorithm.name(),
            t.seconds() * 1e6,
            t.steps,
            t.alpha_s * 1e6,
            t.wire_bytes,
            t.beta_s * 1e6,
            t.reduced_bytes,
            t.gamma_s * 1e6
        );
    }
    let order = tie_order(&s.candidates, &c, s.links);
    println!(
        "pick: {} (the first of {} within {:.0}% of the cheapest)",
        choose(&order, &ranked),
        order.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
        TIE_MARGIN * 100.0
    );
    0
}

pub fn simulate(a: SimulateArgs) -> i32 {
    let m = &a.model;
    let s = match setup(m) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("braid simulate: {e}");
            return 2;
        }
    };
    if a.factor <= 1.0 && a.min_bytes != a.max_bytes {
        eprintln!("braid simulate: --factor must be greater than 1");
        return 2;
    }
    println!("# braid simulate: {} {}, busbw in GB/s predicted by the cost model", m.op, describe(m, &s));
    let mut head = format!("# {:>12}", "size");
    for alg in &s.candidates {
        head += &format!(" {:>16}", alg.name());
    }
    head += &format!(" {:>16} {:>13}", "pick", "pick time(us)");
    println!("{head}");
    let mut size = a.min_bytes.max(m.dtype.size());
    while size <= a.max_bytes {
        let c = call(m, &s, size);
        let ranked = match rank_candidates(&c, &s.candidates, s.links, &s.model, &s.params) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("braid simulate: {e}");
                return 1;
            }
        };
        let bytes = (c.count * c.elem_size) as f64;
        let busbw = |secs: f64| if secs > 0.0 { bytes / secs / 1e9 * bus_factor(m.op, m.ranks) } else { 0.0 };
        let mut line = format!("  {:>12}", c.count * c.elem_size);
        for alg in &s.candidates {
            let t = ranked.iter().find(|r| r.algorithm == *alg).map_or(0.0, |r| r.terms.seconds());
            line += &format!(" {:>16.3}", busbw(t));
        }
        let pick = choose(&tie_order(&s.candidates, &c, s.links), &ranked);
        let pick_time = ranked.iter().find(|r| r.algorithm == pick).map_or(0.0, |r| r.terms.seconds());
        line += &format!(" {:>16} {:>13.2}", pick.name(), pick_time * 1e6);
        println!("{line}");
        let _ = std::io::stdout().flush();
        let next = (size as f64 * a.factor) as usize;
        if next <= size {
            break;
        }
        size = next;
    }
    0
}
