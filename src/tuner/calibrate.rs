//! Fitting the links inside a host to the collective the model prices.
//!
//! A ping-pong over shared memory measures one message at a time, with a call's
//! fixed costs and a rendezvous on each; an all-reduce streams both directions and
//! reduces as it goes, and the model's memory-link numbers (which count sent,
//! received and reduced bytes one after another) describe that streaming, not the
//! ping-pong: on the 2-core VM the ping-pong gave 15-25 GB/s where ring all-reduce
//! times fit 48 GB/s, and the host's speed itself changes from one boot to the
//! next by more than half. So a communicator whose ranks all share one host times
//! the ring all-reduce it is about to run, at a size in cache and one far beyond,
//! and scales `beta` and `gamma` to the first and fits `far` to the second. Every
//! rank times the same calls and takes the slowest rank's median, so every rank
//! computes the same fit without another exchange.

use crate::algorithm::{Algorithm, PlanParams};
use crate::types::OpKind;

use super::cost::{predict, AlgoFar, CostModel, LinkClass, LinkCost, Links};
use super::{plan_all, Call};

/// Bytes of the latency calibration all-reduce: 4 KiB, the smallest size the
/// tuner's picks hinge on. Smaller calls take a faster path through the links
/// (2 ranks: 0.9 µs for 8 bytes against 2.2 for 4 KiB, of which the model's
/// bandwidth terms explain 0.2), so a fit to them priced small calls too cheaply
/// per message and favoured the ring's extra steps over a direct exchange.
pub fn tiny_bytes(_world: usize) -> usize {
    4096
}

/// Bytes of the in-cache calibration all-reduce.
pub const NEAR_BYTES: usize = 256 << 10;
/// Bytes of the out-of-cache one (with input and output, 32 MiB touched per rank).
pub const FAR_BYTES: usize = 16 << 20;

/// The model's terms for a ring all-reduce of `bytes` f32 over `world` ranks of one
/// host whose links are `class`.
fn ring_terms(model: &CostModel, class: LinkClass, world: usize, busy: bool, bytes: usize) -> super::Terms {
    terms_of(Algorithm::Ring, model, class, world, busy, bytes)
}

/// The same for any all-reduce `algorithm`.
fn terms_of(
    algorithm: Algorithm,
    model: &CostModel,
    class: LinkClass,
    world: usize,
    busy: bool,
    bytes: usize,
) -> super::Terms {
    let hosts = vec![0; world];
    let busy = [busy];
    let call = Call { op: OpKind::AllReduce, count: bytes / 4, elem_size: 4, root: 0, hosts: &hosts, busy: &busy };
    let schedules = plan_all(&call, algorithm, &PlanParams::default()).expect("every all-reduce algorithm plans");
    let links = Links { hosts: &[], local: class, remote: LinkClass::Tcp, busy: &busy, single_copy_exchanges: None };
    predict(&schedules, &links, model)
}

/// The all-reduce algorithms a one-host calibration times at the sizes of
/// [`AlgoFar::SIZES`] to fit their factors. The ring too, but only where its own
/// fit leaves it free ([`ring_fits_itself`]); hierarchical is the ring on one host
/// and takes the ring's factors.
pub const TIMED_ALGORITHMS: [Algorithm; 5] =
    [Algorithm::Tree, Algorithm::HalvingDoubling, Algorithm::Direct, Algorithm::Doubling, Algorithm::Ring];

/// Whether the factor of `algorithm` at size `at` of [`AlgoFar::SIZES`] is 1 by
/// construction: the link's costs are fitted to the ring at [`NEAR_BYTES`] and
/// [`FAR_BYTES`], so it is not timed again there.
pub fn ring_fits_itself(algorithm: Algorithm, at: usize) -> bool {
    algorithm == Algorithm::Ring && (at == AlgoFar::NEAR || at == AlgoFar::FAR)
}

/// An algorithm predicted more than this many times the ring's time at
/// [`FAR_BYTES`] is not timed (its factor stays 1): nothing would pick it there, and
/// the calibration's cost must not grow with the world (direct sends `world - 1`
/// whole buffers a rank: 4 ranks on 2 cores took 43 ms a call against the ring's 14).
pub const MAX_TIMED_RATIO: f64 = 4.0;

/// Whether a calibration on one host of `world` ranks times `algorithm`: predicted
/// with `model` at [`FAR_BYTES`], it is within [`MAX_TIMED_RATIO`] of the ring.
pub fn worth_timing(algorithm: Algorithm, model: &CostModel, class: LinkClass, world: usize, busy: bool) -> bool {
    let at = |a| terms_of(a, model, class, world, busy, FAR_BYTES).seconds();
    at(algorithm) <= MAX_TIMED_RATIO * at(Algorithm::Ring)
}

/// Seconds of calls a calibration may spend timing the [`TIMED_ALGORITHMS`] at
/// [`AlgoFar::HUGE`], as the model predicts them: whole-buffer exchanges fall off a
/// last level of cache there (2 ranks: doubling took 322 µs per MiB at 16 MiB and
/// 557 at 64 MiB, the ring 197 and 225), but at 4 ranks on 2 cores one call of each
/// algorithm takes 44-174 ms, and a start-up must stay short. With the copies of
/// fresh data before each call, the calls take about twice what is predicted.
pub const HUGE_BUDGET: f64 = 0.15;
/// The order in which algorithms get [`HUGE_BUDGET`]: the whole-buffer exchanges
/// first, whose steps past the cache the model's ramp does not follow; the tree and
/// halving-doubling stream like the ring, whose ramp it fits.
const HUGE_ORDER: [Algorithm; 5] =
    [Algorithm::Doubling, Algorithm::Direct, Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree];
/// Calls of an algorithm at [`AlgoFar::HUGE`]: one whose page faults and first
/// store trial go untimed, then one call with each kind of store (see
/// `stream_copy`), of which the faster counts, being the kind the calls settle on.
pub const HUGE_CALLS: usize = 3;

/// Which of the [`TIMED_ALGORITHMS`] (those `timed` at the other sizes) a calibration
/// also times at [`AlgoFar::HUGE`]: in [`HUGE_ORDER`], each whose calls `model`
/// predicts to fit in what is left of [`HUGE_BUDGET`].
pub fn timed_at_huge(
    model: &CostModel,
    class: LinkClass,
    world: usize,
    busy: bool,
    timed: [bool; TIMED_ALGORITHMS.len()],
) -> [bool; TIMED_ALGORITHMS.len()] {
    let mut left = HUGE_BUDGET;
    let mut out = [false; TIMED_ALGORITHMS.len()];
    for a in HUGE_ORDER {
        let i = TIMED_ALGORITHMS.iter().position(|&t| t == a).expect("every timed algorithm has a turn");
        let cost = HUGE_CALLS as f64 * terms_of(a, model, class, world, busy, AlgoFar::SIZES[AlgoFar::HUGE]).seconds();
        if timed[i] && cost <= left {
            left -= cost;
            out[i] = true;
        }
    }
    out
}

/// What a calibration fits: the class's costs and, on a host whose ranks
/// outnumber its cores, the cost of a round there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fitted {
    /// The class's costs.
    pub cost: LinkCost,
    /// [`CostModel::busy_round`].
    pub busy_round: f64,
    /// [`CostModel::algo_far`].
    pub algo_far: AlgoFar,
}

/// Ring all-reduce times measured on one host of `world` ranks: `tiny` seconds for
/// [`tiny_bytes`], `near` for [`NEAR_BYTES`], `far` for [`FAR_BYTES`]; and the
/// times of the [`TIMED_ALGORITHMS`] at each of [`AlgoFar::SIZES`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Times {
    /// Latency-bound call.
    pub tiny: f64,
    /// In cache.
    pub near: f64,
    /// Far past the cache.
    pub far: f64,
    /// The other algorithms, `algos[at][k]` for [`TIMED_ALGORITHMS`]`[k]` at
    /// [`AlgoFar::SIZES`]`[at]` (not positive: not timed).
    pub algos: [[f64; TIMED_ALGORITHMS.len()]; AlgoFar::SIZES.len()],
    /// The other algorithms at [`tiny_bytes`] (not positive: not timed; the ring's
    /// is `tiny`).
    pub algos_tiny: [f64; TIMED_ALGORITHMS.len()],
}

// The ring's own fits and the factors' sizes agree where they meet.
const _: () = assert!(AlgoFar::SIZES[AlgoFar::NEAR] == NEAR_BYTES && AlgoFar::SIZES[AlgoFar::FAR] == FAR_BYTES);

/// The largest `x` in `[lo, hi]` whose prediction stays below `target`
/// (`predicted` grows with `x`), by bisection.
fn solve(mut lo: f64, mut hi: f64, target: f64, predicted: impl Fn(f64) -> f64) -> f64 {
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if predicted(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The factor `f` that makes `fixed + f x scaled` equal `target`, within
/// [`AlgoFar::BOUNDS`]; None when `scaled` is not positive (nothing to scale).
fn linear_factor(target: f64, fixed: f64, scaled: f64) -> Option<f64> {
    let (lo, hi) = AlgoFar::BOUNDS;
    (scaled > 0.0).then(|| ((target - fixed) / scaled).clamp(lo, hi))
}

/// Alternations of the fixed-cost and bandwidth fits.
const FIT_ROUNDS: usize = 8;

/// `class`'s costs fitted to ring all-reduce `times` on one host of `world` ranks,
/// starting from the built-in ones, one parameter per time: the fixed cost of a
/// round from `tiny` (`alpha`, or on a `busy` host the round's wait for a core,
/// `busy_round`); `beta` and `gamma` scaled together from `near`; `far` (1 to 8)
/// from `far`. Times that are not positive leave their parameter as it was.
pub fn fit(model: &CostModel, class: LinkClass, world: usize, busy: bool, times: Times) -> Fitted {
    let mut m = *model;
    // Every factor is fitted afresh below, on top of the ring's costs.
    m.algo_far = AlgoFar::default();
    // From the built-in ratio of beta to gamma, which was fitted to ring and direct
    // all-reduce together: scaling it keeps the algorithms' relative prices (a probed
    // gamma, a local sum in cache, is far faster than the reductions that stream from
    // memory, and priced direct at a third of its time).
    let builtin = CostModel::default().cost(class);
    let mut cost = LinkCost { beta: builtin.beta, gamma: builtin.gamma, far: builtin.far, ..m.cost(class) };
    m.set(class, cost);
    let ok = |t: f64| t.is_finite() && t > 0.0;
    let terms = |m: &CostModel, bytes: usize| ring_terms(m, class, world, busy, bytes);
    if busy {
        // The probe's ping-pong on a busy host already waited for cores, which is
        // what `busy_round` stands for: the message itself costs what it costs on an
        // idle host, and the wait goes to `busy_round` alone.
        cost.alpha = builtin.alpha;
        m.set(class, cost);
    }
    // The 4 KiB call moves some bytes and the 256 KiB one pays some fixed costs, so
    // each fit depends on the other: a few alternations settle both.
    for _ in 0..FIT_ROUNDS {
        if ok(times.tiny) {
            if busy {
                let base = m;
                m.busy_round = solve(0.0, 1e-3, times.tiny, |b| {
                    let mut t = base;
                    t.busy_round = b;
                    terms(&t, tiny_bytes(world)).seconds()
                });
            } else {
                let base = m;
                cost.alpha = solve(1e-8, 1e-4, times.tiny, |a| {
                    let mut t = base;
                    t.set(class, LinkCost { alpha: a, ..cost });
                    terms(&t, tiny_bytes(world)).seconds()
                });
                m.set(class, cost);
            }
        }
        let t = terms(&m, NEAR_BYTES);
        let moving = t.beta_s + t.gamma_s;
        if ok(times.near) && moving > 0.0 {
            // What the fixed costs do not explain is bandwidth (at least a fifth of it,
            // however large the fixed costs were predicted).
            let scale = (times.near - t.alpha_s).max(0.2 * times.near) / moving;
            cost.beta *= scale;
            cost.gamma *= scale;
            m.set(class, cost);
        }
    }
    if ok(times.far) {
        let base = m;
        cost.far = solve(1.0, 8.0, times.far, |f| {
            let mut t = base;
            t.set(class, LinkCost { far: f, ..cost });
            terms(&t, FAR_BYTES).seconds()
        });
    }
    // Within the bounds the probe keeps any measurement in (see `probe::sane`):
    // a fit to a moment of heavy load must not price links absurdly.
    let sane = super::probe::sane;
    let cost = LinkCost {
        alpha: sane(cost.alpha, builtin.alpha),
        beta: sane(cost.beta, builtin.beta),
        gamma: sane(cost.gamma, builtin.gamma),
        ..cost
    };
    m.set(class, cost);
    m.busy_round = sane(m.busy_round, CostModel::default().busy_round);
    // Each other algorithm's factor at each size, on top of the ring's fit as
    // installed: a call of one of the sizes is priced by that size's factor alone.
    // Not timed at the largest size, it keeps the factor of the one before.
    // The factor on fixed costs, from the 4 KiB call, weighs a little on the calls
    // in cache and their factor on the 4 KiB one: a few alternations settle both.
    // A prediction is linear in each factor (the factors scale the critical path's
    // terms once it is found), so each is solved from one prediction without it.
    for _ in 0..FIT_ROUNDS {
        for (&a, &t) in TIMED_ALGORITHMS.iter().zip(&times.algos_tiny) {
            if ok(t) && a != Algorithm::Ring {
                let mut without = m;
                without.algo_far.set_latency(a, 1.0);
                let p = terms_of(a, &without, class, world, busy, tiny_bytes(world));
                if let Some(f) = linear_factor(t, p.beta_s + p.gamma_s, p.alpha_s) {
                    m.algo_far.set_latency(a, f);
                }
            }
        }
        for (at, times_at) in times.algos.iter().enumerate() {
            for (&a, &t) in TIMED_ALGORITHMS.iter().zip(times_at) {
                if at == AlgoFar::HUGE && !ok(t) {
                    m.algo_far.set_at(a, at, m.algo_far.get_at(a, AlgoFar::FAR));
                } else if ok(t) {
                    let mut without = m;
                    without.algo_far.set_at(a, at, 1.0);
                    let p = terms_of(a, &without, class, world, busy, AlgoFar::SIZES[at]);
                    if let Some(f) = linear_factor(t, p.alpha_s, p.beta_s + p.gamma_s) {
                        m.algo_far.set_at(a, at, f);
                    }
                }
            }
        }
    }
    Fitted { cost, busy_round: m.busy_round, algo_far: m.algo_far }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Times the model itself predicts with known costs are fitted back to them.
    #[test]
    fn recovers_the_costs_behind_predicted_times() {
        let base = CostModel::default();
        let class = LinkClass::SharedMemory;
        for (world, busy) in [(2, false), (4, true), (3, false)] {
            let mut truth = base;
            if busy {
                truth.busy_round = 7e-6;
            }
            let c = base.cost(class);
            let alpha = if busy { c.alpha } else { 0.8e-6 };
            truth.set(class, LinkCost { alpha, beta: c.beta * 1.7, gamma: c.gamma * 1.7, far: 2.2, ..c });
            // Columns: tree, halving-doubling, direct, doubling, ring (1 where its
            // own fit decides).
            let factors = [
                [1.25, 0.8, 1.0, 1.6, 1.0],
                [0.7, 1.1, 2.4, 1.9, 0.8],
                [0.6, 1.3, 2.0, 0.45, 1.0],
                [0.9, 1.7, 3.0, 0.5, 1.3],
            ];
            for (at, row) in factors.iter().enumerate() {
                for (&a, &f) in TIMED_ALGORITHMS.iter().zip(row) {
                    truth.algo_far.set_at(a, at, f);
                }
            }
            let latency = [1.4, 0.9, 1.0, 2.1, 1.0];
            for (&a, &f) in TIMED_ALGORITHMS.iter().zip(&latency) {
                truth.algo_far.set_latency(a, f);
            }
            let at = |bytes| ring_terms(&truth, class, world, busy, bytes).seconds();
            let mut algos = AlgoFar::SIZES
                .map(|bytes| TIMED_ALGORITHMS.map(|a| terms_of(a, &truth, class, world, busy, bytes).seconds()));
            for (at, row) in algos.iter_mut().enumerate() {
                for (&a, t) in TIMED_ALGORITHMS.iter().zip(row) {
                    if ring_fits_itself(a, at) {
                        *t = 0.0;
                    }
                }
            }
            let mut algos_tiny =
                TIMED_ALGORITHMS.map(|a| terms_of(a, &truth, class, world, busy, tiny_bytes(world)).seconds());
            algos_tiny[4] = 0.0; // the ring's is `tiny`
            let times =
                Times { tiny: at(tiny_bytes(world)), near: at(NEAR_BYTES), far: at(FAR_BYTES), algos, algos_tiny };
            let got = fit(&base, class, world, busy, times);
            for (&a, &f) in TIMED_ALGORITHMS.iter().zip(&latency) {
                let g = got.algo_far.get_latency(a);
                assert!((g / f - 1.0).abs() < 1e-3, "world {world}: {a} latency factor {g} vs {f}");
            }
            for (i, row) in factors.iter().enumerate() {
                for (&a, &f) in TIMED_ALGORITHMS.iter().zip(row) {
                    let g = got.algo_far.get_at(a, i);
                    assert!((g / f - 1.0).abs() < 1e-3, "world {world}: {a} factor at size {i} {g} vs {f}");
                }
            }
            assert_eq!(got.algo_far.get(Algorithm::Ring), 1.0, "the ring is what the costs are fitted to");
            let want = truth.cost(class);
            let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-3;
            assert!(close(got.cost.alpha, want.alpha), "world {world}: alpha {} vs {}", got.cost.alpha, want.alpha);
            assert!(close(got.busy_round, truth.busy_round), "world {world}: busy_round {}", got.busy_round);
            assert!(close(got.cost.beta, want.beta), "world {world}: beta {} vs {}", got.cost.beta, want.beta);
            assert!(close(got.cost.gamma, want.gamma), "world {world}: gamma");
            assert!((got.cost.far - 2.2).abs() < 1e-3, "world {world}: far {}", got.cost.far);
        }
    }

    /// Small worlds time every algorithm; large ones skip what sends whole buffers to
    /// every rank, whose calls would make the start-up grow with the world.
    #[test]
    fn calibration_times_only_algorithms_near_the_ring() {
        let m = CostModel::default();
        let class = LinkClass::SharedMemory;
        for a in TIMED_ALGORITHMS {
            assert!(worth_timing(a, &m, class, 2, false), "{a} at 2 ranks");
        }
        assert!(!worth_timing(Algorithm::Direct, &m, class, 16, false), "direct at 16 ranks");
        assert!(worth_timing(Algorithm::Tree, &m, class, 16, false), "tree at 16 ranks");
    }

    /// Not timed at the largest size, an algorithm keeps its factor from the size
    /// before; the budget goes to the whole-buffer exchanges first, and leaves some
    /// out at 16 ranks.
    #[test]
    fn the_largest_size_is_timed_within_its_budget() {
        let base = CostModel::default();
        let class = LinkClass::SharedMemory;
        let mut algos = [[0.0; 5]; 4];
        for (at, &bytes) in AlgoFar::SIZES.iter().enumerate().take(AlgoFar::HUGE) {
            algos[at] = TIMED_ALGORITHMS.map(|a| 1.5 * terms_of(a, &base, class, 2, false, bytes).seconds());
        }
        let at = |bytes| ring_terms(&base, class, 2, false, bytes).seconds();
        let times =
            Times { tiny: at(tiny_bytes(2)), near: at(NEAR_BYTES), far: at(FAR_BYTES), algos, algos_tiny: [0.0; 5] };
        let got = fit(&base, class, 2, false, times);
        for a in TIMED_ALGORITHMS {
            assert_eq!(got.algo_far.get_at(a, AlgoFar::HUGE), got.algo_far.get(a), "{a}");
        }
        // TIMED_ALGORITHMS: tree, halving-doubling, direct, doubling, ring; the
        // budget goes to doubling and direct first.
        let two = timed_at_huge(&base, class, 2, false, [true; 5]);
        assert!(two[2] && two[3], "{two:?}");
        let some = timed_at_huge(&base, class, 2, false, [true, true, false, false, false]);
        assert!(!some[2] && !some[3] && !some[4], "only what was timed at the other sizes: {some:?}");
        let sixteen = timed_at_huge(&base, class, 16, false, [true; 5]);
        assert!(sixteen.iter().any(|&t| !t), "the budget leaves some out at 16 ranks: {sixteen:?}");
        let spent: f64 = TIMED_ALGORITHMS
            .iter()
            .zip(&sixteen)
            .filter(|(_, &t)| t)
            .map(|(&a, _)| {
                HUGE_CALLS as f64 * terms_of(a, &base, class, 16, false, AlgoFar::SIZES[AlgoFar::HUGE]).seconds()
            })
            .sum();
        assert!(spent <= HUGE_BUDGET, "{spent}");
    }

    /// An algorithm's factor prices only calls inside one host over memory links,
    /// and only past the cache: in cache it is 1, far past it the whole factor.
    #[test]
    fn algorithm_factors_apply_past_the_cache_inside_one_host() {
        let base = CostModel::default();
        let mut model = base;
        model.algo_far.set(Algorithm::Tree, 0.5);
        let class = LinkClass::SharedMemory;
        let tree = |m: &CostModel, bytes| terms_of(Algorithm::Tree, m, class, 2, false, bytes);
        let small = 64 << 10;
        assert_eq!(tree(&model, small), tree(&base, small), "in cache");
        // The in-cache factor prices calls in cache and fades out past it.
        let mut near = base;
        near.algo_far.set_near(Algorithm::Tree, 2.0);
        let (with, without) = (tree(&near, small), tree(&base, small));
        assert_eq!(with.alpha_s, without.alpha_s);
        assert!((with.beta_s / without.beta_s - 2.0).abs() < 1e-12, "{} vs {}", with.beta_s, without.beta_s);
        assert_eq!(tree(&near, 64 << 20), tree(&base, 64 << 20), "far past the cache");
        let quarter = tree(&near, 1 << 20).beta_s / tree(&base, 1 << 20).beta_s;
        assert!((quarter - 2f64.powf(0.5)).abs() < 1e-9, "halfway to 4 MiB in octaves: {quarter}");
        let (with, without) = (tree(&model, 16 << 20), tree(&base, 16 << 20));
        assert_eq!(with.alpha_s, without.alpha_s);
        assert!((with.beta_s / without.beta_s - 0.5).abs() < 1e-12, "{} vs {}", with.beta_s, without.beta_s);
        // Past the largest size, its factor stays.
        model.algo_far.set_at(Algorithm::Tree, AlgoFar::HUGE, 0.25);
        let far_out = tree(&model, 256 << 20).beta_s / tree(&base, 256 << 20).beta_s;
        assert!((far_out - 0.25).abs() < 1e-12, "{far_out}");
        let mid = tree(&model, 8 << 20).beta_s / tree(&base, 8 << 20).beta_s;
        assert!((mid - 0.5f64.sqrt()).abs() < 1e-9, "geometric between the sizes: {mid}");
        // Across hosts the wire decides: the factor does not apply.
        let hosts = [0, 0, 1, 1];
        let call = Call { op: OpKind::AllReduce, count: 16 << 20, elem_size: 4, root: 0, hosts: &hosts, busy: &[] };
        let s = plan_all(&call, Algorithm::Tree, &PlanParams::default()).unwrap();
        let links =
            Links { hosts: &hosts, local: class, remote: LinkClass::Tcp, busy: &[], single_copy_exchanges: None };
        assert_eq!(predict(&s, &links, &model), predict(&s, &links, &base));
    }

    /// Nonsense times leave the costs alone; huge fixed costs cannot make them negative.
    #[test]
    fn nonsense_keeps_the_model() {
        let base = CostModel::default();
        let class = LinkClass::SharedMemory;
        let c = base.cost(class);
        let got = fit(
            &base,
            class,
            2,
            false,
            Times {
                tiny: f64::NAN,
                near: -1.0,
                far: 0.0,
                algos: [
                    [f64::NAN, 0.0, -1.0, f64::INFINITY, 0.0],
                    [0.0, f64::NEG_INFINITY, f64::NAN, -2.0, f64::NAN],
                    [-0.0, f64::NAN, 0.0, f64::INFINITY, -1.0],
                    [f64::NAN; 5],
                ],
                algos_tiny: [f64::NAN, -1.0, 0.0, f64::INFINITY, 1.0],
            },
        );
        assert_eq!(got.cost, c);
        assert_eq!(got.busy_round, base.busy_round);
        assert_eq!(got.algo_far, AlgoFar::default());
        let tiny = fit(
            &base,
            class,
            4,
            true,
            Times { tiny: 1e-9, near: 1e-9, far: 1e-9, algos: [[1e-9; 5]; 4], algos_tiny: [1e-9; 5] },
        );
        assert!((tiny.algo_far.get_latency(Algorithm::Tree) / AlgoFar::BOUNDS.0 - 1.0).abs() < 1e-9);
        assert!((tiny.algo_far.get(Algorithm::Tree) / AlgoFar::BOUNDS.0 - 1.0).abs() < 1e-9, "clamped, not absurd");
        assert!((tiny.algo_far.get_near(Algorithm::Tree) / AlgoFar::BOUNDS.0 - 1.0).abs() < 1e-9, "clamped too");
        assert!(tiny.cost.far >= 1.0);
        // Clamped to a tenth of the built-in values, like any probed number.
        assert!((tiny.cost.beta / (c.beta * 0.1) - 1.0).abs() < 1e-9, "{}", tiny.cost.beta);
        assert!((tiny.cost.gamma / (c.gamma * 0.1) - 1.0).abs() < 1e-9);
        assert!((tiny.busy_round / (base.busy_round * 0.1) - 1.0).abs() < 1e-9, "{}", tiny.busy_round);
    }
}
