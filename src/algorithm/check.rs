//! Schedule checker: proves, without any I/O, that the schedules of all ranks of one
//! call together implement the collective.
//!
//! It plans every rank and then checks
//! 1. every step on its own: regions element-aligned and inside their buffers, peers
//!    in the world and not the rank itself, operand lengths equal, no zero-length
//!    data transfer (barrier excepted), no write to the caller's Input, local steps
//!    before transfers, and `finalize` covering exactly the result (so `Avg` divides
//!    every result element once);
//! 2. by symbolic execution, once with separate buffers and once with the in-place
//!    aliasing the executor applies: every element holds its origin index and the
//!    set of ranks whose inputs were combined into it. Within each round the local
//!    steps run in order, then the transfers, which must not touch bytes that another
//!    transfer of the round writes — except a receive into exactly the bytes a send
//!    to the same peer reads, when what it receives is that peer's forward
//!    ([`Step::RecvReduceSend`]) of that very send (causally after it); sends,
//!    forwards and receives of each ordered pair of ranks must match one to one, in
//!    order and length, within the round (a forward exists once its receive-reduce
//!    has run, so a cycle of forwards is reported); a reduction must
//!    combine the same element of disjoint rank sets. At the end each rank's Output
//!    must hold exactly what the op defines (for barrier: every rank has heard,
//!    transitively, from every other).
//!
//! Errors name the op, algorithm, world size, rank, round and step.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use super::{plan_ranks, Algorithm, BufId, PlanParams, PlanRequest, Region, Schedule, Step};
use crate::types::OpKind;

/// Plan every rank of a `world`-rank call and check the schedules together (see the
/// module docs for what is verified). `algorithm` None checks the default choice.
pub fn check(
    op: OpKind,
    world: usize,
    count: usize,
    elem_size: usize,
    root: usize,
    algorithm: Option<Algorithm>,
    params: &PlanParams,
) -> Result<(), String> {
    check_on(op, &vec![0; world], count, elem_size, root, algorithm, params)
}

/// [`check`] for ranks spread over hosts: `hosts[r]` is rank r's host index (hosts
/// numbered by their lowest rank), and the world size is `hosts.len()`.
pub fn check_on(
    op: OpKind,
    hosts: &[usize],
    count: usize,
    elem_size: usize,
    root: usize,
    algorithm: Option<Algorithm>,
    params: &PlanParams,
) -> Result<(), String> {
    let world = hosts.len();
    if world == 0 {
        return Err(format!("{op}: world size must be at least 1"));
    }
    let req = PlanRequest { op, rank: 0, world, count, elem_size, root, algorithm, hosts, blocks: None };
    let schedules = plan_ranks(&req, params).map_err(|e| format!("{op} world={world} {e}"))?;
    let ordered = params.deterministic && super::ordered::applies(op);
    check_schedules_with(op, count, elem_size, root, &schedules, ordered)
}

/// Check the schedules of all ranks of one call (`schedules[r]` is rank `r`'s), as
/// [`check`] does after planning. Public so that hand-made or tuned schedules can be
/// verified too.
pub fn check_schedules(
    op: OpKind,
    count: usize,
    elem_size: usize,
    root: usize,
    schedules: &[Schedule],
) -> Result<(), String> {
    check_schedules_with(op, count, elem_size, root, schedules, false)
}

/// [`check_schedules`], and with `ordered` also that every reduction folds in rank
/// order: it combines the partial of ranks `0..k` with rank `k`'s input, so each
/// element ends as `((x_0 ⊕ x_1) ⊕ ...) ⊕ x_{n-1}` (what reproducible mode promises).
pub fn check_schedules_with(
    op: OpKind,
    count: usize,
    elem_size: usize,
    root: usize,
    schedules: &[Schedule],
    ordered: bool,
) -> Result<(), String> {
    let world = schedules.len();
    if world == 0 || elem_size == 0 {
        return Err(format!("{op}: need at least one schedule and a non-zero element size"));
    }
    if op.rooted() && root >= world {
        return Err(format!("{op}: root {root} outside world of {world}"));
    }
    if count.saturating_mul(world) >= UNDEF as usize {
        return Err(format!("{op}: {count} elements x {world} ranks is too large to check"));
    }
    let alg = schedules[0].algorithm;
    if let Some(r) = schedules.iter().position(|s| s.algorithm != alg) {
        return Err(format!("{op} world={world}: rank 0 runs {alg} but rank {r} runs {}", schedules[r].algorithm));
    }
    let c = Checker { op, alg, world, count, es: elem_size, root, scheds: schedules, ordered, agreed: false };
    c.run()
}

/// [`check`] for a rooted call planned with its signature agreed in its own rounds
/// ([`super::with_agreement`]): the op's result as usual, empty agreement frames
/// allowed, and every rank must leave having heard, transitively, from every other
/// (so a rank given another root is seen by all).
pub fn check_agreed(
    op: OpKind,
    world: usize,
    count: usize,
    elem_size: usize,
    root: usize,
    algorithm: Option<Algorithm>,
    params: &PlanParams,
) -> Result<(), String> {
    check_agreed_on(op, &vec![0; world], count, elem_size, root, algorithm, params)
}

/// [`check_agreed`] for ranks spread over hosts, as [`check_on`] takes them.
pub fn check_agreed_on(
    op: OpKind,
    hosts: &[usize],
    count: usize,
    elem_size: usize,
    root: usize,
    algorithm: Option<Algorithm>,
    params: &PlanParams,
) -> Result<(), String> {
    let world = hosts.len();
    let req = PlanRequest { op, rank: 0, world, count, elem_size, root, algorithm, hosts, blocks: None };
    let plain = plan_ranks(&req, params).map_err(|e| format!("{op} world={world} {e}"))?;
    let scheds: Vec<Schedule> =
        plain.iter().enumerate().map(|(rank, s)| super::with_agreement(s, rank, world)).collect();
    check_schedules_agreed(op, count, elem_size, root, &scheds, params.deterministic && super::ordered::applies(op))
}

/// [`check_schedules_with`] for schedules that claim to agree on the call's
/// signature (see [`check_agreed`]).
pub fn check_schedules_agreed(
    op: OpKind,
    count: usize,
    elem_size: usize,
    root: usize,
    schedules: &[Schedule],
    ordered: bool,
) -> Result<(), String> {
    let alg = schedules.first().map(|s| s.algorithm).ok_or("need at least one schedule")?;
    let c = Checker {
        op,
        alg,
        world: schedules.len(),
        count,
        es: elem_size,
        root,
        scheds: schedules,
        ordered,
        agreed: true,
    };
    c.run()
}

impl Checker<'_> {
    fn run(&self) -> Result<(), String> {
        let c = self;
        let world = c.world;
        c.static_checks()?;
        for in_place in [false, true] {
            if in_place && c.in_place_alias(0).is_none() {
                continue;
            }
            if world <= 64 {
                c.simulate::<[u64; 1]>(in_place)?;
            } else if world <= 128 {
                c.simulate::<[u64; 2]>(in_place)?;
            } else {
                c.simulate::<Vec<u64>>(in_place)?;
            }
        }
        Ok(())
    }
}

/// A set of ranks as a bitset. Two representations share the code: a fixed array,
/// which is `Copy` and keeps the simulation small and free of allocations for worlds
/// up to 128, and a vector for any world size.
trait RankSet: Clone + PartialEq + fmt::Debug {
    fn zeroed(world: usize) -> Self;
    fn words(&self) -> &[u64];
    fn words_mut(&mut self) -> &mut [u64];

    fn single(world: usize, r: usize) -> Self {
        let mut s = Self::zeroed(world);
        s.words_mut()[r / 64] |= 1 << (r % 64);
        s
    }
    fn full(world: usize) -> Self {
        let mut s = Self::zeroed(world);
        for r in 0..world {
            s.words_mut()[r / 64] |= 1 << (r % 64);
        }
        s
    }
    fn contains(&self, r: usize) -> bool {
        self.words()[r / 64] & (1 << (r % 64)) != 0
    }
    fn is_disjoint(&self, o: &Self) -> bool {
        self.words().iter().zip(o.words()).all(|(a, b)| a & b == 0)
    }
    fn union(&mut self, o: &Self) {
        self.words_mut().iter_mut().zip(o.words()).for_each(|(a, b)| *a |= b);
    }
    /// `{0,3,5}`, or the size for large sets.
    fn show(&self) -> String {
        let n = self.words().iter().map(|w| w.count_ones()).sum::<u32>();
        if n > 8 {
            return format!("{{{n} ranks}}");
        }
        let m: Vec<String> =
            (0..self.words().len() * 64).filter(|&r| self.contains(r)).map(|r| r.to_string()).collect();
        format!("{{{}}}", m.join(","))
    }
}

impl<const N: usize> RankSet for [u64; N] {
    fn zeroed(world: usize) -> Self {
        debug_assert!(world <= 64 * N);
        [0; N]
    }
    fn words(&self) -> &[u64] {
        self
    }
    fn words_mut(&mut self) -> &mut [u64] {
        self
    }
}

impl RankSet for Vec<u64> {
    fn zeroed(world: usize) -> Self {
        vec![0; world.div_ceil(64)]
    }
    fn words(&self) -> &[u64] {
        self
    }
    fn words_mut(&mut self) -> &mut [u64] {
        self
    }
}

/// The symbolic value of one element: which input element it derives from and whose
/// inputs were combined into it. Kept to 16 bytes for small worlds (no `Option`):
/// the simulation copies millions of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Val<S> {
    /// Origin element index, [`UNDEF`] before anything was written.
    idx: u32,
    ranks: S,
}

/// `Val::idx` of an element nothing was written to yet.
const UNDEF: u32 = u32::MAX;

impl<S: RankSet> Val<S> {
    fn new(idx: usize, ranks: S) -> Self {
        Val { idx: idx as u32, ranks }
    }
    fn undef(world: usize) -> Self {
        Val { idx: UNDEF, ranks: S::zeroed(world) }
    }
    fn show(&self) -> String {
        if self.idx == UNDEF {
            "undefined".into()
        } else {
            format!("(element {}, ranks {})", self.idx, self.ranks.show())
        }
    }
}

/// `a ⊕ b` for one element.
fn combine<S: RankSet>(a: &Val<S>, b: &Val<S>) -> Result<Val<S>, String> {
    if a.idx == UNDEF || b.idx == UNDEF {
        Err(format!("reduces an undefined element: {} with {}", a.show(), b.show()))
    } else if a.idx != b.idx {
        Err(format!("mixed elements: {} with {}", a.show(), b.show()))
    } else if !a.ranks.is_disjoint(&b.ranks) {
        Err(format!("element reduced twice: {} with {}", a.show(), b.show()))
    } else {
        let mut ranks = a.ranks.clone();
        ranks.union(&b.ranks);
        Ok(Val { idx: a.idx, ranks })
    }
}

/// Whether `a ⊕ b` is a step of the rank-order fold: one side is ranks `0..k`, the
/// other rank `k` alone (either side: the ops are commutative, bit for bit).
fn folds_in_rank_order<S: RankSet>(a: &S, b: &S) -> bool {
    let prefix_then = |p: &S, q: &S| {
        let k = p.words().iter().map(|w| w.count_ones() as usize).sum::<usize>();
        let q_is_k =
            k < q.words().len() * 64 && q.words().iter().map(|w| w.count_ones()).sum::<u32>() == 1 && q.contains(k);
        q_is_k && (0..k).all(|r| p.contains(r))
    };
    prefix_then(a, b) || prefix_then(b, a)
}

fn buf_index(b: BufId) -> usize {
    match b {
        BufId::Input => 0,
        BufId::Output => 1,
        BufId::Scratch => 2,
    }
}

/// Where the logical buffers of one rank live: `map[buf] = (physical buffer,
/// element offset)`, so that in-place aliasing is just two logical buffers sharing a
/// physical one.
struct Layout {
    map: [(usize, usize); 3],
    phys_len: [usize; 3],
}

/// A region resolved to physical memory, in elements.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Span {
    phys: usize,
    start: usize,
    end: usize,
}

impl Span {
    fn overlaps(&self, o: &Span) -> bool {
        self.phys == o.phys && self.start < o.end && o.start < self.end
    }
}

/// A message in flight: its values and what its sender had heard of.
struct Msg<S> {
    vals: Vec<Val<S>>,
    heard: S,
    step: usize,
    /// For a forward: the (sender, step) of the message its receive-reduce took.
    fwd_of: Option<(usize, usize)>,
}

/// A place in a pair's message order: filled from the start for a send, when its
/// receive-reduce has run for a forward.
struct Slot<S> {
    step: usize,
    msg: Option<Msg<S>>,
}

/// Multiplicative hash for `(sender, receiver)` keys (SipHash showed in profiles;
/// the keys are not attacker-controlled).
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.write_usize(b as usize));
    }
    fn write_usize(&mut self, i: usize) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// Messages in flight in one round, per `(sender, receiver)`, in send order.
/// `matched[r][s]` for receive step `s` of rank `r`: None until it took a message,
/// then that message's forward origin ([`Msg::fwd_of`]).
type Matched = Vec<Vec<Option<Option<(usize, usize)>>>>;

type Queues<S> = HashMap<(usize, usize), VecDeque<Slot<S>>, BuildHasherDefault<PairHasher>>;

struct Checker<'a> {
    op: OpKind,
    alg: Algorithm,
    world: usize,
    count: usize,
    es: usize,
    root: usize,
    scheds: &'a [Schedule],
    /// Reductions must fold in rank order.
    ordered: bool,
    /// Planned with agreement frames ([`check_agreed`]).
    agreed: bool,
}

impl Checker<'_> {
    fn req(&self, rank: usize) -> PlanRequest<'static> {
        PlanRequest {
            op: self.op,
            rank,
            world: self.world,
            count: self.count,
            elem_size: self.es,
            root: self.root,
            algorithm: Some(self.alg),
            hosts: &[],
            blocks: None,
        }
    }

    /// Logical size of `buf` on `rank`, in bytes.
    fn size(&self, rank: usize, buf: BufId) -> usize {
        match buf {
            BufId::Input => self.req(rank).input_bytes(),
            BufId::Output => self.req(rank).output_bytes(),
            BufId::Scratch => self.scheds[rank].scratch_bytes,
        }
    }

    /// Error prefix naming everything needed to find the step.
    fn at(&self, rank: usize, t: usize, s: usize, in_place: bool) -> String {
        let mode = if in_place { " (in place)" } else { "" };
        format!("{} {} world={} rank {rank} round {t} step {s}{mode}", self.op, self.alg, self.world)
    }

    /// The in-place aliasing of `rank`: `(aliased buffer, target buffer, element
    /// offset)`, None for ops without an in-place form. Broadcast and reduce alias
    /// Input and Output on every rank, which is stricter than aliasing them at the
    /// root only: a planner passes only if non-roots never rely on the two differing.
    fn in_place_alias(&self, rank: usize) -> Option<(usize, usize, usize)> {
        match self.op {
            OpKind::AllReduce | OpKind::Broadcast | OpKind::Reduce => Some((0, 1, 0)),
            OpKind::AllGather => Some((0, 1, rank * self.count)),
            OpKind::ReduceScatter => Some((1, 0, rank * self.count)),
            // MPI_IN_PLACE: only the root's buffers alias.
            OpKind::Gather if rank == self.root => Some((0, 1, rank * self.count)),
            OpKind::Scatter if rank == self.root => Some((1, 0, rank * self.count)),
            _ => None,
        }
    }

    fn layout(&self, rank: usize, in_place: bool) -> Layout {
        let mut map = [(0, 0), (1, 0), (2, 0)];
        if in_place {
            if let Some((from, to, off)) = self.in_place_alias(rank) {
                map[from] = (to, off);
            }
        }
        let mut phys_len = [0; 3];
        for b in [BufId::Input, BufId::Output, BufId::Scratch] {
            let (p, off) = map[buf_index(b)];
            phys_len[p] = phys_len[p].max(off + self.size(rank, b) / self.es);
        }
        Layout { map, phys_len }
    }

    fn span(&self, lay: &Layout, r: &Region) -> Span {
        let (phys, off) = lay.map[buf_index(r.buf)];
        let start = off + r.offset / self.es;
        Span { phys, start, end: start + r.len / self.es }
    }

    /// Per-step checks that need no execution, and the finalize regions.
    fn static_checks(&self) -> Result<(), String> {
        for (rank, sched) in self.scheds.iter().enumerate() {
            for (t, round) in sched.rounds.iter().enumerate() {
                let mut seen_transfer = false;
                for (s, step) in round.steps.iter().enumerate() {
                    self.check_step(rank, step, &mut seen_transfer)
                        .map_err(|e| format!("{}: {e}", self.at(rank, t, s, false)))?;
                }
            }
            self.check_finalize(rank, sched)
                .map_err(|e| format!("{} {} world={} rank {rank} finalize: {e}", self.op, self.alg, self.world))?;
        }
        Ok(())
    }

    fn check_region(&self, rank: usize, r: &Region) -> Result<(), String> {
        if !r.offset.is_multiple_of(self.es) || !r.len.is_multiple_of(self.es) {
            return Err(format!("{r:?} is not aligned to {}-byte elements", self.es));
        }
        let size = self.size(rank, r.buf);
        if r.end() > size {
            return Err(format!("{r:?} runs past the end of {:?} ({size} bytes)", r.buf));
        }
        Ok(())
    }

    fn check_step(&self, rank: usize, step: &Step, seen_transfer: &mut bool) -> Result<(), String> {
        let (reads, writes): (Vec<&Region>, Vec<&Region>) = match step {
            Step::Send { src, .. } => (vec![src], vec![]),
            Step::Recv { dst, .. } => (vec![], vec![dst]),
            Step::RecvReduce { src, dst, .. }
            | Step::RecvReduceSend { src, dst, .. }
            | Step::Reduce { src, dst }
            | Step::Copy { src, dst } => (vec![src], vec![dst]),
        };
        if let Step::RecvReduceSend { to, .. } = *step {
            if to >= self.world || to == rank {
                return Err(format!("forward to invalid peer {to}"));
            }
        }
        for r in reads.iter().chain(&writes) {
            self.check_region(rank, r)?;
        }
        if let [src] = reads[..] {
            if let [dst] = writes[..] {
                if src.len != dst.len {
                    return Err(format!("operands differ in length: {src:?} and {dst:?}"));
                }
            }
        }
        if let Some(w) = writes.iter().find(|w| w.buf == BufId::Input && w.len > 0) {
            return Err(format!("writes the caller's Input {w:?}"));
        }
        match step.peer() {
            Some(peer) => {
                *seen_transfer = true;
                if peer >= self.world || peer == rank {
                    return Err(format!("transfer with invalid peer {peer}"));
                }
                let len = reads.iter().chain(&writes).map(|r| r.len).max().unwrap_or(0);
                if len == 0 && self.op != OpKind::Barrier && !self.agreed {
                    return Err("zero-length transfer (ranks with nothing to move must skip it)".into());
                }
            }
            None if *seen_transfer => return Err("local step after a transfer in the same round".into()),
            None => {}
        }
        Ok(())
    }

    /// `finalize` must tile exactly the result: all of Output for all-reduce and
    /// reduce-scatter, the root's Output for reduce, nothing otherwise.
    fn check_finalize(&self, rank: usize, sched: &Schedule) -> Result<(), String> {
        let result = match self.op {
            OpKind::AllReduce | OpKind::ReduceScatter => self.size(rank, BufId::Output),
            OpKind::Reduce if rank == self.root => self.size(rank, BufId::Output),
            _ => 0,
        };
        let mut regs: Vec<&Region> = sched.finalize.iter().filter(|r| r.len > 0).collect();
        regs.sort_by_key(|r| r.offset);
        let mut covered = 0;
        for r in regs {
            self.check_region(rank, r)?;
            if r.buf != BufId::Output || r.offset != covered {
                return Err(format!(
                    "{r:?} is not the next piece of the result (Output bytes 0..{result}, covered 0..{covered})"
                ));
            }
            covered = r.end();
        }
        if covered != result {
            return Err(format!("covers Output bytes 0..{covered}, the result is 0..{result}"));
        }
        Ok(())
    }

    /// Symbolic execution of all ranks together, round by round.
    fn simulate<S: RankSet>(&self, in_place: bool) -> Result<(), String> {
        let n = self.world;
        let lays: Vec<Layout> = (0..n).map(|r| self.layout(r, in_place)).collect();
        let mut mem: Vec<[Vec<Val<S>>; 3]> =
            lays.iter().map(|l| l.phys_len.map(|len| vec![Val::undef(n); len])).collect();
        for (r, m) in mem.iter_mut().enumerate() {
            let (p, off) = lays[r].map[0];
            for i in 0..self.size(r, BufId::Input) / self.es {
                m[p][off + i] = Val::new(i, S::single(n, r));
            }
        }
        let mut heard: Vec<S> = (0..n).map(|r| S::single(n, r)).collect();
        let rounds = self.scheds.iter().map(|s| s.rounds.len()).max().unwrap_or(0);
        let empty = super::Round::default();
        for t in 0..rounds {
            let round = |r: usize| self.scheds[r].rounds.get(t).unwrap_or(&empty);
            // Local steps first, in order.
            for r in 0..n {
                for (s, step) in round(r).steps.iter().enumerate() {
                    self.run_local(&lays[r], &mut mem[r], step)
                        .map_err(|e| format!("{}: {e}", self.at(r, t, s, in_place)))?;
                }
            }
            // Then the transfers, concurrently: first prove they do not race (the
            // one overlap allowed, a receive into exactly the bytes a send to the same
            // peer reads, is proven causal once the messages are matched)...
            for (r, lay) in lays.iter().enumerate() {
                let steps = &round(r).steps;
                self.check_hazards(lay, steps, |a, b| self.same_peer_same_bytes(lay, steps, a, b))
                    .map_err(|(s, e)| format!("{}: {e}", self.at(r, t, s, in_place)))?;
            }
            // ...then run them. Every send's message holds the bytes
            // at the start of the round; a forward's is made when its receive-reduce
            // has run. Receives take, in order, what their peer sent them in this
            // very round, as soon as it exists.
            let mut queues: Queues<S> = HashMap::default();
            for r in 0..n {
                for (s, step) in round(r).steps.iter().enumerate() {
                    match step {
                        Step::Send { peer, src } => {
                            let vals = self.read(&lays[r], &mem[r], src);
                            let msg = Msg { vals, heard: heard[r].clone(), step: s, fwd_of: None };
                            queues.entry((r, *peer)).or_default().push_back(Slot { step: s, msg: Some(msg) });
                        }
                        Step::RecvReduceSend { to, .. } => {
                            queues.entry((r, *to)).or_default().push_back(Slot { step: s, msg: None })
                        }
                        _ => {}
                    }
                }
            }
            let mut matched: Matched = (0..n).map(|r| vec![None; round(r).steps.len()]).collect();
            loop {
                let mut progressed = false;
                for r in 0..n {
                    let mut blocked = vec![false; n];
                    for (s, step) in round(r).steps.iter().enumerate() {
                        let (peer, src, dst, to) = match step {
                            Step::Recv { peer, dst } => (*peer, None, dst, None),
                            Step::RecvReduce { peer, src, dst } => (*peer, Some(src), dst, None),
                            Step::RecvReduceSend { peer, src, dst, to } => (*peer, Some(src), dst, Some(*to)),
                            _ => continue,
                        };
                        if matched[r][s].is_some() || blocked[peer] {
                            continue;
                        }
                        let ready = queues.get(&(peer, r)).and_then(|q| q.front()).is_some_and(|x| x.msg.is_some());
                        if !ready {
                            blocked[peer] = true;
                            continue;
                        }
                        let msg = queues.get_mut(&(peer, r)).and_then(|q| q.pop_front()).and_then(|x| x.msg).unwrap();
                        let at = || self.at(r, t, s, in_place);
                        if msg.vals.len() * self.es != dst.len {
                            return Err(format!(
                                "{}: receives {} bytes from rank {peer}, whose step {} sends {}",
                                at(),
                                dst.len,
                                msg.step,
                                msg.vals.len() * self.es
                            ));
                        }
                        heard[r].union(&msg.heard);
                        matched[r][s] = Some(msg.fwd_of);
                        progressed = true;
                        match src {
                            None => self.write(&lays[r], &mut mem[r], dst, msg.vals),
                            Some(src) => {
                                let ours = self.read(&lays[r], &mem[r], src);
                                self.reduce_into(&lays[r], &mut mem[r], dst, &ours, &msg.vals)
                                    .map_err(|e| format!("{}: {e}", at()))?;
                            }
                        }
                        if let Some(to) = to {
                            let vals = self.read(&lays[r], &mem[r], dst);
                            let fwd = Msg { vals, heard: heard[r].clone(), step: s, fwd_of: Some((peer, msg.step)) };
                            let q = queues.get_mut(&(r, to)).expect("forward slot queued above");
                            q.iter_mut().find(|x| x.step == s).expect("forward slot").msg = Some(fwd);
                        }
                    }
                }
                if !progressed {
                    break;
                }
            }
            for (r, done) in matched.iter().enumerate() {
                for (s, step) in round(r).steps.iter().enumerate() {
                    let (Step::Recv { peer, dst }
                    | Step::RecvReduce { peer, dst, .. }
                    | Step::RecvReduceSend { peer, dst, .. }) = step
                    else {
                        continue;
                    };
                    if done[s].is_none() {
                        let what = if queues.get(&(*peer, r)).is_some_and(|q| !q.is_empty()) {
                            "whose next message to it is a forward that cannot be made (a cycle)"
                        } else {
                            "which sends it no (further) message"
                        };
                        return Err(format!(
                            "{}: receives {} bytes from rank {peer}, {what} in round {t}",
                            self.at(r, t, s, in_place),
                            dst.len
                        ));
                    }
                }
            }
            let mut left: Vec<_> = queues.iter().filter(|(_, q)| !q.is_empty()).collect();
            left.sort_by_key(|(k, _)| **k);
            if let Some(((from, to), q)) = left.first() {
                let slot = &q[0];
                let len = slot.msg.as_ref().map(|m| m.vals.len() * self.es).unwrap_or(0);
                return Err(format!(
                    "{}: sends {len} bytes to rank {to}, which does not receive them in round {t}",
                    self.at(*from, t, slot.step, in_place),
                ));
            }
            // The allowed overlap is safe only if what arrives is the peer's forward
            // of that very send: the peer makes it only after taking the bytes.
            for (r, lay) in lays.iter().enumerate() {
                let steps = &round(r).steps;
                for (send, recv) in (0..steps.len()).flat_map(|a| (0..steps.len()).map(move |b| (a, b))) {
                    if self.same_peer_same_bytes(lay, steps, send, recv) && matched[r][recv] != Some(Some((r, send))) {
                        return Err(format!(
                            "{}: receives into the bytes step {send} sends to the same peer, but not the peer's \
                             forward of them (races with step {send})",
                            self.at(r, t, recv, in_place)
                        ));
                    }
                }
            }
        }
        self.check_result(&lays, &mem, &heard, in_place)
    }

    fn read<S: RankSet>(&self, lay: &Layout, mem: &[Vec<Val<S>>; 3], r: &Region) -> Vec<Val<S>> {
        let sp = self.span(lay, r);
        mem[sp.phys][sp.start..sp.end].to_vec()
    }

    fn write<S: RankSet>(&self, lay: &Layout, mem: &mut [Vec<Val<S>>; 3], r: &Region, vals: Vec<Val<S>>) {
        let sp = self.span(lay, r);
        for (slot, v) in mem[sp.phys][sp.start..sp.end].iter_mut().zip(vals) {
            *slot = v;
        }
    }

    /// `dst[i] = a[i] ⊕ b[i]`.
    fn reduce_into<S: RankSet>(
        &self,
        lay: &Layout,
        mem: &mut [Vec<Val<S>>; 3],
        dst: &Region,
        a: &[Val<S>],
        b: &[Val<S>],
    ) -> Result<(), String> {
        let sp = self.span(lay, dst);
        for (i, slot) in mem[sp.phys][sp.start..sp.end].iter_mut().enumerate() {
            let at = || format!("at {:?} byte {}", dst.buf, dst.offset + i * self.es);
            if self.ordered && !folds_in_rank_order(&a[i].ranks, &b[i].ranks) {
                return Err(format!("out of rank order: {} with {} {}", a[i].show(), b[i].show(), at()));
            }
            *slot = combine(&a[i], &b[i]).map_err(|e| format!("{e} {}", at()))?;
        }
        Ok(())
    }

    fn run_local<S: RankSet>(&self, lay: &Layout, mem: &mut [Vec<Val<S>>; 3], step: &Step) -> Result<(), String> {
        match step {
            Step::Copy { src, dst } => {
                let (a, b) = (self.span(lay, src), self.span(lay, dst));
                // Identical memory is fine (the executor skips it); a partial overlap
                // would depend on the copy direction.
                if a.overlaps(&b) && a != b {
                    return Err(format!("copy between partially overlapping {src:?} and {dst:?}"));
                }
                let vals = self.read(lay, mem, src);
                self.write(lay, mem, dst, vals);
            }
            Step::Reduce { src, dst } => {
                if self.span(lay, src).overlaps(&self.span(lay, dst)) {
                    return Err(format!("reduce operands {src:?} and {dst:?} overlap"));
                }
                let ours = self.read(lay, mem, dst);
                let theirs = self.read(lay, mem, src);
                self.reduce_into(lay, mem, dst, &ours, &theirs)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether step `send` sends, and step `recv` receives, exactly the same non-empty
    /// bytes with the same peer.
    fn same_peer_same_bytes(&self, lay: &Layout, steps: &[Step], send: usize, recv: usize) -> bool {
        match (steps[send], steps[recv]) {
            (Step::Send { peer: a, src }, Step::Recv { peer: b, dst }) => {
                a == b && src.len > 0 && self.span(lay, &src) == self.span(lay, &dst)
            }
            _ => false,
        }
    }

    /// No transfer of a round may read or write bytes that another transfer of the
    /// same round writes (they run concurrently). A RecvReduce may read and write the
    /// same bytes itself, or entirely separate ones.
    fn check_hazards(
        &self,
        lay: &Layout,
        steps: &[Step],
        causal: impl Fn(usize, usize) -> bool,
    ) -> Result<(), (usize, String)> {
        // (step index, bytes read, bytes written): a transfer touches at most one of each.
        let mut acc: Vec<(usize, Option<Span>, Option<Span>)> = Vec::new();
        for (s, step) in steps.iter().enumerate() {
            let (read, write) = match step {
                Step::Send { src, .. } => (Some(self.span(lay, src)), None),
                Step::Recv { dst, .. } => (None, Some(self.span(lay, dst))),
                Step::RecvReduce { src, dst, .. } | Step::RecvReduceSend { src, dst, .. } => {
                    let (a, b) = (self.span(lay, src), self.span(lay, dst));
                    if a.overlaps(&b) && a != b {
                        return Err((s, format!("receive-reduce operands {src:?} and {dst:?} partially overlap")));
                    }
                    (Some(a), Some(b))
                }
                _ => continue,
            };
            acc.push((s, read, write));
        }
        for (i, (s, _, write)) in acc.iter().enumerate() {
            let Some(w) = write else { continue };
            for (s2, read2, write2) in acc.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, x)| x) {
                if read2.iter().chain(write2).any(|x| x.overlaps(w)) && !causal(*s2, *s) {
                    return Err((
                        *s2.max(s),
                        format!("races with step {} of the same round (it writes bytes this one touches)", s2.min(s)),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Compare every rank's final Output (or, for barrier, what it has heard) with
    /// the op's definition.
    fn check_result<S: RankSet>(
        &self,
        lays: &[Layout],
        mem: &[[Vec<Val<S>>; 3]],
        heard: &[S],
        in_place: bool,
    ) -> Result<(), String> {
        let (n, c) = (self.world, self.count);
        let mode = if in_place { " (in place)" } else { "" };
        let all = S::full(n);
        for r in 0..n {
            let prefix = || format!("{} {} world={} rank {r}{mode}", self.op, self.alg, n);
            if self.op == OpKind::Barrier || self.agreed {
                if heard[r] != all {
                    let missing: Vec<usize> = (0..n).filter(|&q| !heard[r].contains(q)).collect();
                    return Err(format!("{}: leaves the call without hearing from ranks {missing:?}", prefix()));
                }
                if self.op == OpKind::Barrier {
                    continue;
                }
            }
            if matches!(self.op, OpKind::Reduce | OpKind::Gather) && r != self.root {
                continue;
            }
            // The Output is `blocks` blocks of `c` elements (one per source rank for
            // all-gather and all-to-all); block `j`, element `i` must hold:
            let (blocks, want): (usize, &dyn Fn(usize, usize) -> Val<S>) = match self.op {
                OpKind::AllReduce | OpKind::Reduce => (1, &|_, i| Val::new(i, all.clone())),
                OpKind::ReduceScatter => (1, &|_, i| Val::new(r * c + i, all.clone())),
                OpKind::Broadcast => (1, &|_, i| Val::new(i, S::single(n, self.root))),
                OpKind::AllGather | OpKind::Gather => (n, &|j, i| Val::new(i, S::single(n, j))),
                OpKind::Scatter => (1, &|_, i| Val::new(r * c + i, S::single(n, self.root))),
                OpKind::AllToAll => (n, &|j, i| Val::new(r * c + i, S::single(n, j))),
                _ => unreachable!("point-to-point ops are not planned"),
            };
            let out = self.read(&lays[r], &mem[r], &Region::new(BufId::Output, 0, self.size(r, BufId::Output)));
            for j in 0..blocks {
                for (i, v) in out[j * c..(j + 1) * c].iter().enumerate() {
                    let want = want(j, i);
                    if *v != want {
                        return Err(format!(
                            "{}: Output element {} ends as {}, expected {}",
                            prefix(),
                            j * c + i,
                            v.show(),
                            want.show()
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
