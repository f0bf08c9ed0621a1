//! The tuner: which algorithm a call runs. Every candidate the policy allows is
//! planned for every rank and priced by the cost model ([`cost`]); the cheapest
//! wins. Planning and pricing are pure functions of the call, the host layout and
//! the model, so every rank that agrees on those picks the same algorithm (and the
//! algorithm travels in each frame's header, so one that did not is an error).
//!
//! The model starts from built-in values ([`CostModel::default`]). A communicator
//! built over a store then runs the start-up [`probe`]: rank 0 reads this host's
//! cache of measured link costs (`BRAID_CACHE_DIR`), or has the classes it lacks
//! measured with the communicator's own send and receive (shared memory between
//! two ranks of a host, the network between two hosts), caches them and publishes
//! the model through the store, so every rank installs the same numbers.
//! [`Tuner::source`] says where they came from; `BRAID_TUNER_PROBE=0` keeps the
//! built-in model, and `BRAID_DEBUG=braid=debug` prints what was measured.
//! In-process communicators keep the built-in model.

mod cache;
pub(crate) mod calibrate;
pub mod cost;
mod measured;
mod policy;
pub mod probe;

pub use cost::{predict, AlgoFar, CostModel, LinkClass, LinkCost, Links, Terms};
pub use policy::AlgoPolicy;
pub use probe::ProbeSource;

use crate::algorithm::{self, Algorithm, PlanParams, PlanRequest, Schedule};
use crate::types::OpKind;

/// Predictions this close (a fraction of the best) count as a tie, which the
/// order of [`algorithm::algorithms_for`] breaks: the model sees rounds and bytes,
/// not how long a segment stays in cache between rounds, nor the executor's fused
/// forwards and single-copy paths.
pub const TIE_MARGIN: f64 = 0.05;

/// One call to price: what `braid explain` and the engine ask about.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The collective.
    pub op: OpKind,
    /// Element count as in [`crate::types::CallSig::count`].
    pub count: usize,
    /// Bytes per element.
    pub elem_size: usize,
    /// Root of rooted ops.
    pub root: usize,
    /// Host index of every rank; its length is the world size.
    pub hosts: &'a [usize],
    /// Hosts whose ranks outnumber their cores (`busy[h]`; empty: none).
    pub busy: &'a [bool],
}

/// A priced candidate.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The terms along its critical path (their sum is the prediction).
    pub terms: Terms,
}

/// The schedules of every rank of `call` under `algorithm`.
pub(crate) fn plan_all(call: &Call<'_>, algorithm: Algorithm, params: &PlanParams) -> Result<Vec<Schedule>, String> {
    // One host needs no layout: the planners then take their single-host shapes.
    let hosts: &[usize] = if call.hosts.iter().all(|&h| h == 0) { &[] } else { call.hosts };
    // A `*v` call is priced as its fixed-size op with the mean block: its sizes
    // differ by rank, the shape of its rounds does not.
    let world = call.hosts.len();
    let (op, count) = match call.op {
        OpKind::AllGatherV => (OpKind::AllGather, call.count / world.max(1)),
        OpKind::ReduceScatterV => (OpKind::ReduceScatter, call.count / world.max(1)),
        OpKind::AllToAllV => (OpKind::AllToAll, call.count / world.max(1)),
        op => (op, call.count),
    };
    let req = PlanRequest {
        op,
        rank: 0,
        world,
        count,
        elem_size: call.elem_size,
        root: call.root,
        algorithm: Some(algorithm),
        hosts,
        blocks: None,
    };
    algorithm::plan_ranks(&req, params)
}

/// Price every algorithm in `allowed` for `call`, cheapest first (ties keep the
/// order of `allowed`, so the choice is the same on every rank).
pub fn rank_candidates(
    call: &Call<'_>,
    allowed: &[Algorithm],
    links: LinkPair,
    model: &CostModel,
    params: &PlanParams,
) -> Result<Vec<Candidate>, String> {
    let links = Links {
        hosts: call.hosts,
        local: links.local,
        remote: links.remote,
        busy: call.busy,
        single_copy_exchanges: if call.op.reduces() { None } else { links.single_copy_exchanges },
    };
    // The per-algorithm factors are fitted to all-reduce calls (`calibrate`), and
    // two all-reduce schedules resemble no other op's of the same name. Direct
    // all-reduce is one-shot (every rank reduces the whole buffer): other ops price
    // direct at the link's own costs (with its factor, a 2-rank reduce-scatter of 64
    // MiB picked direct at 2.03x the ring's time; with its fixed-cost factor, a
    // 4-rank all-gather of 4 KiB picked bruck at 1.25x direct's). The tree's is
    // NCCL's double binary tree, pipelined in segments, where broadcast, reduce,
    // gather and scatter run a binomial tree of whole messages in a few rounds: they
    // drop its fixed-cost factor (a 4-rank broadcast of 16 KiB picked the chain at
    // 1.30x the tree's time) and keep its bandwidth ones (without them, the chain at
    // 16 MiB at 1.32x): tables in results/one-host-2026-11-27.md. Dropping every
    // factor made other picks worse (all-gather on 4 ranks up to 2.1x from the
    // best), and so did dropping doubling's (up to 1.61x): those schedules are the
    // same exchanges as all-reduce's.
    let unfitted;
    let model = if call.op == OpKind::AllReduce || !allowed.iter().any(|a| ALL_REDUCE_ONLY_FACTORS.contains(a)) {
        model
    } else {
        unfitted = {
            let mut m = *model;
            for a in ALL_REDUCE_ONLY_FACTORS {
                if a == Algorithm::Direct {
                    for at in 0..cost::AlgoFar::SIZES.len() {
                        m.algo_far.set_at(a, at, 1.0);
                    }
                }
                m.algo_far.set_latency(a, 1.0);
            }
            m
        };
        &unfitted
    };
    let mut out = Vec::with_capacity(allowed.len());
    for &algorithm in allowed {
        let schedules = plan_all(call, algorithm, params)?;
        out.push(Candidate { algorithm, terms: predict(&schedules, &links, model) });
    }
    out.sort_by(|a, b| a.terms.seconds().total_cmp(&b.terms.seconds()));
    Ok(out)
}

/// Algorithms whose calibrated factors on fixed costs ([`cost::AlgoFar`], fitted to
/// all-reduce) price only all-reduce (direct's bandwidth factors too): their
/// schedules for other ops share little but the name.
const ALL_REDUCE_ONLY_FACTORS: [Algorithm; 2] = [Algorithm::Direct, Algorithm::Tree];

/// The pick among `ranked` (cheapest first, from [`rank_candidates`] over
/// `allowed`): the first of `allowed` within [`TIE_MARGIN`] of the cheapest.
pub fn choose(allowed: &[Algorithm], ranked: &[Candidate]) -> Algorithm {
    let Some(best) = ranked.first() else { return allowed[0] };
    let limit = best.terms.seconds() * (1.0 + TIE_MARGIN);
    let near = |a: &Algorithm| ranked.iter().any(|c| c.algorithm == *a && c.terms.seconds() <= limit);
    allowed.iter().copied().find(near).unwrap_or(best.algorithm)
}

/// The link classes of a communicator: inside a host and between hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkPair {
    /// Inside a host.
    pub local: LinkClass,
    /// Between hosts.
    pub remote: LinkClass,
    /// Transfers inside a host of at least this many bytes that are half of an
    /// exchange of plain data ([`Round::exchanges_with`](crate::algorithm::Round::exchanges_with))
    /// go single-copy in calls that reduce nothing: the receiver reads the sender's
    /// buffer, the sender copies nothing (shared memory between processes with
    /// `BRAID_CMA` on, its default). None: both ends copy every transfer. It comes
    /// from the configuration, not from each link's probe, so that every rank
    /// prices alike.
    pub single_copy_exchanges: Option<usize>,
}

impl LinkPair {
    /// `local` inside a host and `remote` between hosts, every transfer copied at
    /// both ends.
    pub const fn new(local: LinkClass, remote: LinkClass) -> LinkPair {
        LinkPair { local, remote, single_copy_exchanges: None }
    }
}

/// What the engine keeps to choose algorithms: the policy, the model and the links.
#[derive(Clone, Debug)]
pub struct Tuner {
    /// Allowed algorithms per collective.
    pub policy: AlgoPolicy,
    /// Link costs.
    pub model: CostModel,
    /// Link classes.
    pub links: LinkPair,
    /// Where the model's numbers came from (the start-up probe, its cache, or
    /// built in).
    pub source: ProbeSource,
    /// The planners' tunables (reproducible mode among them), for the candidates
    /// it compares and the schedule it picks.
    pub params: PlanParams,
}

impl Tuner {
    /// A tuner with the built-in model.
    pub fn new(policy: AlgoPolicy, links: LinkPair) -> Tuner {
        Tuner {
            policy,
            model: CostModel::default(),
            links,
            source: ProbeSource::Builtin,
            params: PlanParams::default(),
        }
    }

    /// The algorithm for `call`: the only one allowed, or else the first in the
    /// order of [`algorithm::algorithms_for`] (pipelined schedules first)
    /// predicted within [`TIE_MARGIN`] of the cheapest. Errors only for ops without
    /// a schedule (send, receive).
    pub fn pick(&self, call: &Call<'_>) -> Result<Algorithm, String> {
        let allowed = self.policy.allowed(call.op);
        match allowed.as_slice() {
            [] => Err(format!("{} has no collective algorithm", call.op)),
            [only] => Ok(*only),
            _ => {
                let ranked = rank_candidates(call, &allowed, self.links, &self.model, &self.params)?;
                Ok(choose(&tie_order(&allowed, call, self.links), &ranked))
            }
        }
    }
}

/// What one round of single-copy device transfers costs on its own, whatever its
/// bytes, between ranks that share one GPU. Every round the ranks' GPU work
/// alternates: between threads of one process that is a switch of streams (a
/// two-hop ping-pong of 512 KiB copies took 25 us on an H200), between processes
/// it is a switch of CUDA contexts, which the GPU time-slices (301 us on the same
/// H200, 2026-11-27, `scripts/gpu-probe.cu`). The tree's many 512 KiB rounds paid
/// it every time: 3.4 GB/s at 256 MiB between two processes, where the ring's two
/// rounds reached 242.
pub const DEVICE_ROUND_SECONDS: [f64; 2] = [25e-6, 300e-6];
/// Segment of the pipelined schedules (chain, tree) on device buffers: their rounds
/// cost what [`DEVICE_ROUND_SECONDS`] says, so fewer and longer ones.
pub const DEVICE_SEGMENT_BYTES: usize = 8 << 20;
/// Bytes per second one GPU's memory moves for ranks that share it (an H200
/// copies about 2 TB/s; half of that is what its busiest collectives reached).
const DEVICE_BYTES_PER_SECOND: f64 = 1e12;

impl Tuner {
    /// The tuner for calls on device buffers where every peer's device maps this
    /// rank's memory (`processes`: some peer is another process). Every rank of
    /// such a communicator takes the same one for the same call, since a call on
    /// device buffers with one rank and host buffers with another is refused: the
    /// ranks agree on the plan. Its links are [`LinkClass::Cuda`], whose rounds
    /// cost [`DEVICE_ROUND_SECONDS`], and its segments are [`DEVICE_SEGMENT_BYTES`];
    /// the policy and reproducible mode are this tuner's.
    pub fn for_device(&self, processes: bool) -> Tuner {
        let mut model = CostModel::default();
        let per_byte = 1.0 / DEVICE_BYTES_PER_SECOND;
        model.set(
            LinkClass::Cuda,
            LinkCost {
                alpha: DEVICE_ROUND_SECONDS[processes as usize],
                beta: per_byte,
                gamma: per_byte,
                duplex: false,
                per_host: false,
                far: 1.0,
            },
        );
        Tuner {
            policy: self.policy.clone(),
            model,
            links: LinkPair::new(LinkClass::Cuda, LinkClass::Cuda),
            source: ProbeSource::Builtin,
            params: PlanParams { chain_segment_bytes: DEVICE_SEGMENT_BYTES, ..self.params },
        }
    }
}

/// The order in which [`choose`] breaks ties among `allowed` (given in
/// [`algorithm::algorithms_for`]'s order). That order was measured over shared
/// memory on one host, where the tree's and halving-doubling's segments stay in
/// cache between rounds; over a network (or across hosts) the ring's one fused
/// forward beats both, and the ring leads (TCP loopback, 2 ranks, 1 MiB: ring 156
/// µs, halving-doubling 293, tree 309).
pub fn tie_order(allowed: &[Algorithm], call: &Call<'_>, links: LinkPair) -> Vec<Algorithm> {
    let mut order = allowed.to_vec();
    let memory = CostModel::default().cost(links.local).far > 1.0 && call.hosts.iter().all(|&h| h == 0);
    if let (false, Some(ring)) = (memory, order.iter().position(|&a| a == Algorithm::Ring)) {
        order.remove(ring);
        order.insert(0, Algorithm::Ring);
    }
    order
}

/// busbw / algbw for `op` over `n` ranks (nccl-tests' convention).
pub fn bus_factor(op: OpKind, n: usize) -> f64 {
    let n = n.max(1) as f64;
    match op {
        OpKind::AllReduce => 2.0 * (n - 1.0) / n,
        OpKind::AllGather
        | OpKind::ReduceScatter
        | OpKind::AllToAll
        | OpKind::Gather
        | OpKind::Scatter
        | OpKind::AllGatherV
        | OpKind::ReduceScatterV
        | OpKind::AllToAllV => (n - 1.0) / n,
        _ => 1.0,
    }
}

#[cfg(test)]
mod tests;
