//! The cost model: the predicted time of one call, read off the schedules of all its
//! ranks. No I/O and no clock, like the planners it reads.
//!
//! Every step is charged by the class of link it crosses: `alpha` per message,
//! `beta` per byte on the wire and `gamma` per byte reduced (or copied locally).
//! Rounds are the synchronisation points of a schedule (a message sent in round `t`
//! is received in round `t`), so a rank starts round `t` once it and every peer it
//! talks to in that round finished round `t - 1`; the call ends when the last rank
//! does. The terms are summed along that critical path, which is what
//! `braid explain` prints: a ring's `2(n-1)` latencies, a tree's long pipelines and a
//! hierarchical schedule's slow cross-host phase all show up where they are paid.
//!
//! What the model leaves out, on purpose: pipelining inside one transfer (the
//! executor overlaps the pieces of a long message, which a larger `beta` absorbs)
//! and memory contention between ranks of one host (only links that a host shares,
//! a NIC, divide their bandwidth among the ranks using them in the same round, each
//! direction apart, fairly: a transfer waits for the bytes of the others up to its
//! own).

use std::fmt;
use std::str::FromStr;

use crate::algorithm::{Algorithm, Round, Schedule, Step};
use crate::transport::TransportKind;

/// A class of links, each with its own costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkClass {
    /// Threads of one process (in-memory rings).
    InProcess,
    /// Processes of one host (shared-memory rings, single copy).
    SharedMemory,
    /// TCP sockets (between hosts, or on one host when nothing faster is allowed).
    Tcp,
    /// RDMA verbs.
    Rdma,
    /// GPU memory (CUDA).
    Cuda,
}

impl LinkClass {
    /// Every class, in the order of [`CostModel`]'s table.
    pub const ALL: [LinkClass; 5] =
        [LinkClass::InProcess, LinkClass::SharedMemory, LinkClass::Tcp, LinkClass::Rdma, LinkClass::Cuda];

    /// Name as `braid explain --link` takes it.
    pub const fn name(self) -> &'static str {
        match self {
            LinkClass::InProcess => "inproc",
            LinkClass::SharedMemory => "shm",
            LinkClass::Tcp => "tcp",
            LinkClass::Rdma => "rdma",
            LinkClass::Cuda => "cuda",
        }
    }

    /// The class of a transport's links.
    pub const fn of(kind: TransportKind) -> LinkClass {
        match kind {
            TransportKind::InProcess => LinkClass::InProcess,
            TransportKind::Shm => LinkClass::SharedMemory,
            TransportKind::Tcp => LinkClass::Tcp,
            TransportKind::Rdma => LinkClass::Rdma,
            TransportKind::Cuda => LinkClass::Cuda,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for LinkClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LinkClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.to_ascii_lowercase();
        LinkClass::ALL.iter().copied().find(|c| c.name() == s).ok_or_else(|| {
            let names: Vec<&str> = LinkClass::ALL.iter().map(|c| c.name()).collect();
            format!("unknown link class `{s}` (expected {})", names.join(", "))
        })
    }
}

/// The costs of one link class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Seconds per message (the fixed cost of a transfer step).
    pub alpha: f64,
    /// Seconds per byte moved (1 / bandwidth).
    pub beta: f64,
    /// Seconds per byte reduced on arrival (or copied locally).
    pub gamma: f64,
    /// Sending and receiving overlap (a NIC's two directions). Memory links are not
    /// duplex: the CPU that copies in is the one that copies out.
    pub duplex: bool,
    /// One link per host that its ranks share (a NIC): ranks of a host that cross it
    /// in the same direction in the same round divide that direction's bandwidth.
    pub per_host: bool,
    /// How much slower `beta` and `gamma` get once a call's data no longer fits in
    /// cache: 1 at [`CostModel::cache_bytes`] per rank and below, this factor from
    /// 32 times that up, geometric in between. Memory links have it; a network's
    /// wire is slower than either.
    pub far: f64,
}

/// Per-algorithm factors on the bandwidth terms of a call inside one host, by call
/// size (1: as the link's costs say). The memory links' costs are fitted to the
/// ring, but algorithms touch memory differently: once the data outgrows the cache,
/// the double binary tree reduces and forwards small segments while they are still
/// in cache, and whole-buffer exchanges keep a scratch copy of everything and fall
/// off each level of cache at smaller calls than the ring (2 ranks: direct took 245
/// µs per MiB at 1 MiB and 472 at 4 MiB, the ring 131 and 181); in cache, on a host
/// whose ranks share cores, the ring's fused forwards keep both cores busy where a
/// halving-doubling round waits for whole halves. So a one-host calibration times
/// each all-reduce algorithm at the sizes of [`AlgoFar::SIZES`] and keeps how far
/// each is from its prediction there, like NCCL's per-algorithm bandwidth tables,
/// measured instead of built in. Between two sizes the factor moves geometrically
/// (by octaves of the call); below the first and above the last it stays.
///
/// Each algorithm also has a factor on its fixed costs (the `alpha` terms, with the
/// waits for a core on a busy host), timed at 4 KiB: on 4 ranks sharing 2 cores, a
/// round of a whole-buffer exchange cost about twice what a ring's round does, and
/// the ring's fit alone priced doubling at 16 KiB below halving-doubling, which ran
/// in 12.6 µs against doubling's 13-18.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlgoFar {
    bandwidth: [[f64; Algorithm::ALL.len()]; AlgoFar::SIZES.len()],
    latency: [f64; Algorithm::ALL.len()],
}

impl Default for AlgoFar {
    fn default() -> Self {
        AlgoFar { bandwidth: [[1.0; Algorithm::ALL.len()]; AlgoFar::SIZES.len()], latency: [1.0; Algorithm::ALL.len()] }
    }
}

impl AlgoFar {
    /// Smallest and largest factor kept: a measurement outside is noise or a stall.
    pub const BOUNDS: (f64, f64) = (0.2, 5.0);
    /// Call sizes (bytes per rank) the factors are measured at: in cache, past it, far
    /// past it, and (where timing it is cheap enough) farther still.
    pub const SIZES: [usize; 4] = [256 << 10, 4 << 20, 16 << 20, 64 << 20];
    /// Field-name prefixes of the factors at each size in cache and model text
    /// (`near.tree=1.2`, `mid.tree=0.9`, `algo.tree=0.7`, `huge.tree=0.8`).
    const PREFIXES: [&'static str; 4] = ["near.", "mid.", "algo.", "huge."];
    /// Field-name prefix of the factors on fixed costs (`lat.doubling=1.7`).
    const LATENCY_PREFIX: &'static str = "lat.";
    /// Index of the in-cache size in [`AlgoFar::SIZES`].
    pub const NEAR: usize = 0;
    /// Index of the size just past the cache.
    pub const MID: usize = 1;
    /// Index of the size far past it.
    pub const FAR: usize = 2;
    /// Index of the largest size.
    pub const HUGE: usize = 3;

    fn index(a: Algorithm) -> usize {
        a.code() as usize - 1
    }
    fn sane(factor: f64) -> f64 {
        let (lo, hi) = Self::BOUNDS;
        if factor.is_finite() && factor > 0.0 {
            factor.clamp(lo, hi)
        } else {
            1.0
        }
    }
    /// The factor of `a` at size `at` (an index of [`AlgoFar::SIZES`]).
    pub fn get_at(&self, a: Algorithm, at: usize) -> f64 {
        self.bandwidth[at][Self::index(a)]
    }
    /// Set the factor of `a` at size `at`, kept within [`AlgoFar::BOUNDS`] (1 for nonsense).
    pub fn set_at(&mut self, a: Algorithm, at: usize, factor: f64) {
        self.bandwidth[at][Self::index(a)] = Self::sane(factor);
    }
    /// The factor of `a` on fixed costs.
    pub fn get_latency(&self, a: Algorithm) -> f64 {
        self.latency[Self::index(a)]
    }
    /// Set the factor of `a` on fixed costs, kept like [`AlgoFar::set_at`]'s.
    pub fn set_latency(&mut self, a: Algorithm, factor: f64) {
        self.latency[Self::index(a)] = Self::sane(factor);
    }
    /// The factor of `a` far past the cache.
    pub fn get(&self, a: Algorithm) -> f64 {
        self.get_at(a, Self::FAR)
    }
    /// Set the factor of `a` far past the cache.
    pub fn set(&mut self, a: Algorithm, factor: f64) {
        self.set_at(a, Self::FAR, factor);
    }
    /// The factor of `a` in cache.
    pub fn get_near(&self, a: Algorithm) -> f64 {
        self.get_at(a, Self::NEAR)
    }
    /// Set the factor of `a` in cache.
    pub fn set_near(&mut self, a: Algorithm, factor: f64) {
        self.set_at(a, Self::NEAR, factor);
    }
    /// The factor of `a` for a call of `bytes` per rank.
    pub fn factor(&self, a: Algorithm, bytes: usize) -> f64 {
        let octave = |b: usize| (b.max(1) as f64).log2();
        let x = octave(bytes);
        let last = Self::SIZES.len() - 1;
        if x <= octave(Self::SIZES[0]) {
            return self.get_at(a, 0);
        }
        for i in 0..last {
            let (lo, hi) = (octave(Self::SIZES[i]), octave(Self::SIZES[i + 1]));
            if x <= hi {
                let t = (x - lo) / (hi - lo);
                return self.get_at(a, i).powf(1.0 - t) * self.get_at(a, i + 1).powf(t);
            }
        }
        self.get_at(a, last)
    }
    /// The factors that are not 1, as text fields (`near.tree`, `mid.tree`,
    /// `algo.tree`) with their values.
    pub fn entries(&self) -> impl Iterator<Item = (String, f64)> + '_ {
        let latency =
            Algorithm::ALL.iter().map(move |&a| (format!("{}{a}", Self::LATENCY_PREFIX), self.get_latency(a)));
        (0..Self::SIZES.len())
            .flat_map(move |at| {
                Algorithm::ALL.iter().map(move |&a| (format!("{}{a}", Self::PREFIXES[at]), self.get_at(a, at)))
            })
            .chain(latency)
            .filter(|&(_, f)| f != 1.0)
    }
    /// Set the factor a text field of [`AlgoFar::entries`] names. None: `key` names no
    /// factor; an error: it names an algorithm that does not exist.
    pub fn set_entry(&mut self, key: &str, value: f64) -> Option<Result<(), String>> {
        let parse = |name: &str| name.parse::<Algorithm>().map_err(|e| e.to_string());
        if let Some(name) = key.strip_prefix(Self::LATENCY_PREFIX) {
            return Some(parse(name).map(|a| self.set_latency(a, value)));
        }
        let (at, name) = Self::PREFIXES.iter().enumerate().find_map(|(i, p)| key.strip_prefix(p).map(|n| (i, n)))?;
        Some(parse(name).map(|a| self.set_at(a, at, value)))
    }
}

/// Costs of every link class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    costs: [LinkCost; 5],
    /// Seconds a round with transfers costs on a host whose ranks outnumber its
    /// cores: the peers of a round take turns on the cores, so every round waits
    /// for a peer to be scheduled, however few messages it has.
    pub busy_round: f64,
    /// How much slower copies and reductions run on such a host, whose ranks share
    /// cores (two ranks a core, the usual case of oversubscribing).
    pub busy_share: f64,
    /// Bytes per rank (input, output and scratch) up to which a call's data stays
    /// in cache.
    pub cache_bytes: u64,
    /// Per-algorithm factors inside one host (see [`AlgoFar`]).
    pub algo_far: AlgoFar,
}

impl Default for CostModel {
    /// Built-in values: memory links fitted to `braid perf --algo all` on a 2-core
    /// VM (2 ranks, shared memory: ring against direct all-reduce from 4 KiB to 64
    /// MiB gives beta, gamma, and how much both slow down past the cache); TCP and
    /// RDMA assumed for a 10 Gbit/s network and a 100 Gbit/s HCA. A probe at
    /// start-up replaces the classes it can measure (see [`super::probe`]: the
    /// local class of a store-built communicator whose hosts hold two ranks, and
    /// the remote class when it spans two hosts), each measured value kept within
    /// `[0.1x, 10x]` of these.
    fn default() -> Self {
        let gbps = |g: f64| 8.0 / (g * 1e9);
        let memory =
            LinkCost { alpha: 0.45e-6, beta: 1.0 / 48e9, gamma: 1.0 / 41e9, duplex: false, per_host: false, far: 3.5 };
        CostModel {
            costs: [
                LinkCost { alpha: 0.35e-6, ..memory },
                memory,
                LinkCost { alpha: 25e-6, beta: gbps(10.0), gamma: 1.0 / 10e9, duplex: true, per_host: true, far: 1.0 },
                LinkCost { alpha: 3e-6, beta: gbps(100.0), gamma: 1.0 / 10e9, duplex: true, per_host: true, far: 1.0 },
                LinkCost {
                    alpha: 10e-6,
                    beta: 1.0 / 20e9,
                    gamma: 1.0 / 200e9,
                    duplex: true,
                    per_host: false,
                    far: 1.0,
                },
            ],
            busy_round: 13e-6,
            busy_share: 2.0,
            cache_bytes: 1 << 20,
            algo_far: AlgoFar::default(),
        }
    }
}

impl CostModel {
    /// The costs of `class`.
    pub fn cost(&self, class: LinkClass) -> LinkCost {
        self.costs[class.index()]
    }
    /// Replace the costs of `class`.
    pub fn set(&mut self, class: LinkClass, cost: LinkCost) {
        self.costs[class.index()] = cost;
    }

    /// How much slower than in cache `cost` moves a call touching `bytes` per rank.
    fn slowdown(&self, cost: &LinkCost, bytes: u64) -> f64 {
        if cost.far <= 1.0 {
            return 1.0;
        }
        cost.far.powf(self.past_cache(bytes))
    }

    /// How far past the cache a call touching `bytes` per rank is: 0 in cache, 1
    /// from 32 times the cache up, by octaves in between.
    fn past_cache(&self, bytes: u64) -> f64 {
        if bytes <= self.cache_bytes {
            return 0.0;
        }
        ((bytes as f64) / (self.cache_bytes.max(1) as f64)).log2().min(5.0) / 5.0
    }
}

/// Which class links two ranks: `local` within a host, `remote` across hosts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Links<'a> {
    /// Host index of every rank (empty: one host).
    pub hosts: &'a [usize],
    /// Class of links inside a host.
    pub local: LinkClass,
    /// Class of links between hosts.
    pub remote: LinkClass,
    /// Hosts whose ranks outnumber their cores (`busy[h]`; empty: none).
    pub busy: &'a [bool],
    /// Sends inside a host over shared memory of at least this many bytes that are
    /// half of an exchange ([`Round::exchanges_with`]) cost the sender no copy: the
    /// receiver reads its buffer (see [`super::LinkPair::single_copy_exchanges`];
    /// None for calls that reduce).
    pub single_copy_exchanges: Option<usize>,
}

impl Links<'_> {
    fn host(&self, r: usize) -> usize {
        self.hosts.get(r).copied().unwrap_or(0)
    }
    fn busy(&self, r: usize) -> bool {
        self.busy.get(self.host(r)).copied().unwrap_or(false)
    }
    /// Whether a send of `len` bytes to `p` over `class` in `round` is read by the
    /// receiver out of the sender's buffer, which then copies nothing.
    fn pulled(&self, class: LinkClass, round: &Round, p: usize, len: u64) -> bool {
        class == LinkClass::SharedMemory
            && self.single_copy_exchanges.is_some_and(|from| len >= from as u64)
            && round.exchanges_with(p, len as usize)
    }
    fn class(&self, a: usize, b: usize) -> LinkClass {
        if self.host(a) == self.host(b) {
            self.local
        } else {
            self.remote
        }
    }
}

/// The terms of a prediction along its critical path.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Terms {
    /// Messages on the path (the `steps` of `alpha x steps`).
    pub steps: usize,
    /// Bytes on the wire along the path.
    pub wire_bytes: u64,
    /// Bytes reduced or copied along the path.
    pub reduced_bytes: u64,
    /// Seconds of `alpha x steps`.
    pub alpha_s: f64,
    /// Seconds of `beta x bytes`.
    pub beta_s: f64,
    /// Seconds of `gamma x bytes reduced`.
    pub gamma_s: f64,
}

impl Terms {
    /// Predicted seconds: the sum of the three terms.
    pub fn seconds(&self) -> f64 {
        self.alpha_s + self.beta_s + self.gamma_s
    }
    fn add(&mut self, o: &Terms) {
        self.steps += o.steps;
        self.wire_bytes += o.wire_bytes;
        self.reduced_bytes += o.reduced_bytes;
        self.alpha_s += o.alpha_s;
        self.beta_s += o.beta_s;
        self.gamma_s += o.gamma_s;
    }
}

/// Per-class tallies of one rank's round.
#[derive(Clone, Copy, Default)]
struct Tally {
    msgs: usize,
    sent: u64,
    received: u64,
    reduced: u64,
}

/// Predict the time of one call from the schedules of all its ranks
/// (`schedules[r]` is rank r's). Returns the terms along the critical path; their
/// sum is the prediction.
pub fn predict(schedules: &[Schedule], links: &Links<'_>, model: &CostModel) -> Terms {
    let n = schedules.len();
    let rounds = schedules.iter().map(|s| s.rounds.len()).max().unwrap_or(0);
    // Path to the end of each rank's latest round.
    let mut done: Vec<Terms> = vec![Terms::default(); n];
    let mut next: Vec<Terms> = vec![Terms::default(); n];
    let hosts = links.hosts.iter().max().map_or(1, |m| m + 1);
    // Bytes each rank sends (`.0`) and receives (`.1`) across hosts in the round,
    // and per host the nonzero ones of each direction: a NIC's two directions are
    // shared apart, among the few ranks that cross in a round.
    let mut crossing = vec![(0u64, 0u64); n];
    let mut nics: Vec<(Vec<u64>, Vec<u64>)> = vec![Default::default(); hosts];
    let mut tallies = vec![[Tally::default(); 5]; n];
    // What each rank's call touches: its largest buffer and its scratch; on a host
    // whose ranks share cores, as much again for each rank sharing its core's cache
    // (4 ranks on 2 cores: a 1 MiB ring all-reduce took 1.6x the time that scaling
    // up from 256 KiB in cache predicts, where 2 ranks took what it predicts).
    let touched: Vec<u64> = schedules
        .iter()
        .enumerate()
        .map(|(r, s)| {
            let own = (data_bytes(s) + s.scratch_bytes) as u64;
            if links.busy(r) {
                (own as f64 * model.busy_share) as u64
            } else {
                own
            }
        })
        .collect();
    for t in 0..rounds {
        crossing.iter_mut().for_each(|c| *c = (0, 0));
        nics.iter_mut().for_each(|(o, i)| {
            o.clear();
            i.clear();
        });
        for (r, s) in schedules.iter().enumerate() {
            let tally = &mut tallies[r];
            *tally = [Tally::default(); 5];
            let Some(round) = s.rounds.get(t) else { continue };
            let (mut sends_out, mut receives_in) = (0, 0);
            let across = |p: usize| links.host(r) != links.host(p);
            for step in &round.steps {
                // The receiving half of a step goes by the link it arrives on, the
                // sending half by the link it leaves on: a ring's forward to the
                // next host receives inside the host and sends across.
                let (from, to, len) = match *step {
                    Step::Send { peer, src } => (None, Some(peer), src.len as u64),
                    Step::Recv { peer, dst } | Step::RecvReduce { peer, dst, .. } => (Some(peer), None, dst.len as u64),
                    Step::RecvReduceSend { peer, dst, to, .. } => (Some(peer), Some(to), dst.len as u64),
                    Step::Copy { .. } | Step::Reduce { .. } => continue,
                };
                if let Some(p) = from {
                    receives_in += if across(p) { len } else { 0 };
                    let k = &mut tally[links.class(r, p).index()];
                    k.msgs += 1;
                    k.received += len;
                    if !matches!(step, Step::Recv { .. }) {
                        k.reduced += len;
                    }
                }
                if let Some(p) = to {
                    sends_out += if across(p) { len } else { 0 };
                    let class = links.class(r, p);
                    let k = &mut tally[class.index()];
                    // A fused forward is one step on one link class.
                    if from.is_none_or(|q| links.class(r, q) != class) {
                        k.msgs += 1;
                    }
                    if !links.pulled(class, round, p, len) {
                        k.sent += len;
                    }
                }
            }
            crossing[r] = (sends_out, receives_in);
            let nic = &mut nics[links.host(r)];
            if sends_out > 0 {
                nic.0.push(sends_out);
            }
            if receives_in > 0 {
                nic.1.push(receives_in);
            }
        }
        for (r, s) in schedules.iter().enumerate() {
            let Some(round) = s.rounds.get(t) else {
                next[r] = done[r];
                continue;
            };
            // Starts once it and every peer of the round have finished the last one.
            let mut from = r;
            for p in round.steps.iter().filter_map(Step::peer) {
                if done[p].seconds() > done[from].seconds() {
                    from = p;
                }
            }
            let mut path = done[from];
            let busy = links.busy(r);
            // Through a shared NIC a transfer ends once every transfer of the host in
            // the same direction has moved as many bytes as it, or finished (fair
            // sharing): the largest waits for the host's total.
            let (outs, ins) = &nics[links.host(r)];
            let (mine_out, mine_in) = crossing[r];
            let through = |all: &[u64], mine: u64| all.iter().map(|&x| x.min(mine)).sum::<u64>() - mine;
            let extra = (through(outs, mine_out), through(ins, mine_in));
            let mut terms = round_terms(round.steps.as_slice(), &tallies[r], extra, (touched[r], busy), links, model);
            if busy && round.steps.iter().any(|s| s.peer().is_some()) {
                terms.alpha_s += model.busy_round;
            }
            path.add(&terms);
            next[r] = path;
        }
        std::mem::swap(&mut done, &mut next);
    }
    let mut path = done.into_iter().fold(Terms::default(), |a, b| if b.seconds() > a.seconds() { b } else { a });
    let one_host = links.hosts.iter().all(|&h| h == 0);
    let memory = matches!(links.local, LinkClass::InProcess | LinkClass::SharedMemory);
    if let (true, true, Some(s)) = (one_host, memory, schedules.first()) {
        let size = schedules.iter().map(data_bytes).max().unwrap_or(0);
        // On one host, hierarchical runs the ring's schedules.
        let algorithm = if s.algorithm == Algorithm::Hierarchical { Algorithm::Ring } else { s.algorithm };
        let f = model.algo_far.factor(algorithm, size);
        path.beta_s *= f;
        path.gamma_s *= f;
        path.alpha_s *= model.algo_far.get_latency(algorithm);
    }
    path
}

/// The terms of one rank's round: local work, then the slowest class of its
/// concurrent transfers. `shared` is what the other ranks of its host add to its
/// own bytes through their NIC, out and in (see `predict`); `busy`, whether its
/// host's ranks share cores, which slows what the cores do (copies, reductions,
/// memory links), not what a NIC does.
fn round_terms(
    steps: &[Step],
    tally: &[Tally; 5],
    shared: (u64, u64),
    (touched, busy): (u64, bool),
    links: &Links<'_>,
    model: &CostModel,
) -> Terms {
    let cores = if busy { model.busy_share } else { 1.0 };
    let local = model.cost(links.local);
    let local_gamma = local.gamma * model.slowdown(&local, touched) * cores;
    let mut t = Terms::default();
    for s in steps {
        if let Step::Copy { dst, .. } | Step::Reduce { dst, .. } = s {
            t.reduced_bytes += dst.len as u64;
            t.gamma_s += dst.len as f64 * local_gamma;
        }
    }
    let mut slowest = Terms::default();
    for class in LinkClass::ALL {
        let k = &tally[class.index()];
        if k.msgs == 0 {
            continue;
        }
        let c = model.cost(class);
        let (sent, received) = if c.per_host && class == links.remote {
            (k.sent + shared.0, k.received + shared.1)
        } else {
            (k.sent, k.received)
        };
        let moved = (if c.duplex { sent.max(received) } else { sent + received }) as f64;
        let slow = model.slowdown(&c, touched);
        let wire_cores = if c.duplex { 1.0 } else { cores };
        let this = Terms {
            steps: k.msgs,
            wire_bytes: k.sent + k.received,
            reduced_bytes: k.reduced,
            alpha_s: k.msgs as f64 * c.alpha,
            beta_s: moved * c.beta * slow * wire_cores,
            gamma_s: k.reduced as f64 * c.gamma * slow * cores,
        };
        if this.seconds() > slowest.seconds() {
            slowest = this;
        }
    }
    t.add(&slowest);
    t
}

/// Bytes of the larger of a rank's caller buffers, as far as its steps reach.
fn data_bytes(s: &Schedule) -> usize {
    use crate::algorithm::BufId;
    let mut end = [0usize; 2];
    for step in s.rounds.iter().flat_map(|r| &r.steps) {
        let regions = match *step {
            Step::Send { src, .. } => [Some(src), None],
            Step::Recv { dst, .. } => [Some(dst), None],
            Step::RecvReduce { src, dst, .. } | Step::RecvReduceSend { src, dst, .. } => [Some(src), Some(dst)],
            Step::Reduce { src, dst } | Step::Copy { src, dst } => [Some(src), Some(dst)],
        };
        for r in regions.into_iter().flatten() {
            match r.buf {
                BufId::Input => end[0] = end[0].max(r.end()),
                BufId::Output => end[1] = end[1].max(r.end()),
                BufId::Scratch => {}
            }
        }
    }
    end[0].max(end[1])
}
