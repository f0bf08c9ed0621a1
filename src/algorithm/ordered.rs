//! Reproducible forms of the reducing collectives ([`PlanParams::deterministic`]).
//!
//! Floating-point reduction is not associative, so the bits of a sum depend on the
//! order its terms were combined in: a ring adds each chunk starting from a different
//! rank, a tree adds subtrees, hierarchical adds host partials, and all of them change
//! with the world's host split. In reproducible mode every element is folded in one
//! fixed order, `((x_0 ⊕ x_1) ⊕ x_2) ⊕ ... ⊕ x_{n-1}` over ranks, whatever the
//! algorithm, segment size or host layout, so results depend only on the world size
//! and the inputs.
//!
//! Folding in rank order needs every rank's raw operand at the rank that folds, so
//! the reduction phase of every algorithm becomes a rank-ordered reduce-scatter:
//! rank `j` receives element chunk `j` raw from every peer (one round, the same
//! bytes on the wire as a ring's reduce-scatter, `(n - 1) / n` of the buffer per
//! rank) and folds them in rank order. What follows keeps the algorithm's own
//! data movement where it has one that only copies:
//!
//! - all-reduce: `direct` and `doubling` (small messages) fold whole buffers on every
//!   rank as direct does; `ring`, `tree` and `halving-doubling` circulate the folded
//!   chunks on the (host-ordered) ring; `hierarchical` gathers them across hosts per
//!   lane and then inside each host.
//! - reduce-scatter: the ordered reduce-scatter itself, for every algorithm.
//! - reduce: the ordered reduce-scatter, then every rank sends its chunk to the root.
//!
//! The cost is the reduce-scatter's `n - 1` simultaneous transfers instead of a
//! ring's `n - 1` rounds, and for hierarchical that raw chunks cross between hosts
//! instead of host partials (reported in the closing note of issue 18).

use super::builder::{chunk, Builder};
use super::direct::{self, fold_in_rank_order, slot};
use super::ring::{all_gather_rounds, Ring};
use super::{hierarchical, Algorithm, BufId, PlanRequest, Region, Schedule};
use crate::types::OpKind;

/// Whether `op` reduces, and so has a reproducible form.
pub(super) fn applies(op: OpKind) -> bool {
    matches!(op, OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce)
}

/// The reproducible form of `req` under `alg` (an algorithm that implements `op`).
pub(super) fn plan(req: &PlanRequest<'_>, alg: Algorithm) -> Schedule {
    let mut s = match req.op {
        OpKind::AllReduce => all_reduce(req, alg),
        OpKind::ReduceScatter => direct::reduce_scatter(req),
        OpKind::Reduce => reduce(req),
        _ => unreachable!("only reducing ops have a reproducible form"),
    };
    s.algorithm = alg;
    s
}

/// Byte region of element chunk `j` of `n` in `buf`.
fn chunk_region(req: &PlanRequest, buf: BufId, j: usize) -> Region {
    let (start, len) = chunk(req.count, req.world, j);
    Region::new(buf, start * req.elem_size, len * req.elem_size)
}

/// Rounds 0 and 1: rank `r` sends Input chunk `p` to every peer `p` and receives its
/// own chunk raw from each into a Scratch slot (round 0), then folds them in rank
/// order into `out` (local steps of round 1). Returns the scratch bytes used.
///
/// In place, Input chunk `p` is only read in round 0 and `out` (Output chunk `r`,
/// which is Input chunk `r`) is written in round 1 by the fold, which reads its own
/// operand before overwriting it.
fn ordered_reduce_scatter(b: &mut Builder, req: &PlanRequest, out: Region) -> usize {
    let (n, r) = (req.world, req.rank);
    let slot_bytes = chunk_region(req, BufId::Input, 0).len;
    let mine = chunk_region(req, BufId::Input, r);
    let scratch = |p: usize| Region::new(BufId::Scratch, slot(r, p) * slot_bytes, mine.len);
    for p in (0..n).filter(|&p| p != r) {
        b.send(0, p, chunk_region(req, BufId::Input, p));
        b.recv(0, p, scratch(p));
    }
    let t = usize::from(n > 1);
    fold_in_rank_order(b, t, r, n, |p| if p == r { mine } else { scratch(p) }, out);
    (n - 1) * slot_bytes
}

/// Reproducible all-reduce (see the module docs).
fn all_reduce(req: &PlanRequest<'_>, alg: Algorithm) -> Schedule {
    if req.world == 1 || matches!(alg, Algorithm::Direct | Algorithm::Doubling) {
        return direct::all_reduce(req);
    }
    let whole = Region::new(BufId::Output, 0, req.count * req.elem_size);
    let mut b = Builder::new();
    let scratch = ordered_reduce_scatter(&mut b, req, chunk_region(req, BufId::Output, req.rank));
    // The folds are local steps of round 1, which run before its transfers: the
    // gather starts in the same round.
    let output = |q: usize| chunk_region(req, BufId::Output, q);
    if alg == Algorithm::Hierarchical && !hierarchical::is_flat(req) {
        hierarchical::all_gather_blocks(&mut b, 1, req, output);
    } else {
        let order = req.ring_order();
        all_gather_rounds(&mut b, 1, Ring::new(&order, req.rank), 0, |j| output(order[j]), false);
    }
    b.finish(alg, scratch, vec![whole])
}

/// Reproducible reduce: the ordered reduce-scatter, then every rank's folded chunk
/// goes to the root (the root folds its own chunk straight into Output; the others
/// fold into Scratch past the receive slots).
fn reduce(req: &PlanRequest<'_>) -> Schedule {
    let (n, r, root) = (req.world, req.rank, req.root);
    let whole = Region::new(BufId::Output, 0, req.count * req.elem_size);
    let mut b = Builder::new();
    if n == 1 {
        b.copy(0, Region::new(BufId::Input, 0, whole.len), whole);
        return b.finish(Algorithm::Direct, 0, vec![whole]);
    }
    let slots = (n - 1) * chunk_region(req, BufId::Input, 0).len;
    let mine = chunk_region(req, BufId::Output, r);
    let out = if r == root { mine } else { Region::new(BufId::Scratch, slots, mine.len) };
    let used = ordered_reduce_scatter(&mut b, req, out);
    if r == root {
        for p in (0..n).filter(|&p| p != root) {
            b.recv(1, p, chunk_region(req, BufId::Output, p));
        }
        b.finish(Algorithm::Direct, used, vec![whole])
    } else {
        b.send(1, root, out);
        b.finish(Algorithm::Direct, used + out.len, Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::{check_on, check_schedules_with};
    use super::super::tests::counts;
    use super::super::{algorithms_for, plan_ranks, PlanParams};
    use super::*;

    const OPS: [OpKind; 3] = [OpKind::AllReduce, OpKind::ReduceScatter, OpKind::Reduce];

    fn reproducible(seg: usize) -> PlanParams {
        PlanParams { deterministic: true, chain_segment_bytes: seg, ..PlanParams::default() }
    }

    /// Every algorithm of every reducing op, on one host and split over hosts, folds
    /// in rank order (the checker rejects any other reduction) and gives the op's
    /// result, in and out of place.
    #[test]
    fn every_algorithm_folds_in_rank_order() {
        let mut layouts: Vec<Vec<usize>> = (1..=9).chain([12, 16]).map(|n| vec![0; n]).collect();
        layouts.extend([vec![0, 0, 1, 1], vec![0, 1, 0, 1], vec![0, 0, 0, 1, 1, 2], vec![0, 1, 1, 1, 2, 0, 2]]);
        for hosts in &layouts {
            let n = hosts.len();
            for op in OPS {
                for &alg in algorithms_for(op) {
                    for count in counts(n) {
                        for root in [0, n / 2, n - 1] {
                            for seg in [4, 1 << 20] {
                                check_on(op, hosts, count, 4, root, Some(alg), &reproducible(seg))
                                    .unwrap_or_else(|e| panic!("{op} {alg} hosts={hosts:?} count={count}: {e}"));
                            }
                        }
                    }
                }
            }
        }
    }

    /// The order check bites: the usual ring adds chunks starting at different ranks.
    #[test]
    fn ring_without_reproducible_mode_fails_the_order_check() {
        let hosts = [0; 3];
        let req = PlanRequest {
            op: OpKind::AllReduce,
            rank: 0,
            world: 3,
            count: 6,
            elem_size: 4,
            root: 0,
            algorithm: Some(Algorithm::Ring),
            hosts: &hosts,
            blocks: None,
        };
        let scheds = plan_ranks(&req, &PlanParams::default()).unwrap();
        check_schedules_with(OpKind::AllReduce, 6, 4, 0, &scheds, false).unwrap();
        let err = check_schedules_with(OpKind::AllReduce, 6, 4, 0, &scheds, true).unwrap_err();
        assert!(err.contains("out of rank order"), "{err}");
    }

    /// Larger worlds (the array and vector rank sets of the checker): the reproducible
    /// forms stay correct and ordered.
    #[test]
    fn large_worlds() {
        let p = reproducible(1 << 20);
        for n in [63, 64, 65, 130, 257] {
            let hosts: Vec<usize> = (0..n).map(|r| r / 8).collect();
            for op in OPS {
                for alg in [Algorithm::Ring, Algorithm::Hierarchical] {
                    if algorithms_for(op).contains(&alg) {
                        // Reduce-scatter's count is per rank: its buffers are n times larger.
                        let count = if op == OpKind::ReduceScatter { 1 } else { n + 3 };
                        check_on(op, &hosts, count, 4, n - 1, Some(alg), &p)
                            .unwrap_or_else(|e| panic!("{op} {alg} n={n}: {e}"));
                    }
                }
            }
        }
    }
}
