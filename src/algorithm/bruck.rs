//! All-gather in logarithmic rounds: Bruck's algorithm (any world size) and
//! recursive doubling (power-of-two worlds, folded otherwise).
//!
//! In both, what a rank holds doubles every round (1, 2, 4, ... blocks), so a
//! latency-bound call (small blocks, many ranks) takes `O(log n)` message latencies
//! where a ring takes `n - 1`, while on a power of two each rank still sends only
//! `n - 1` blocks, as the ring does. Bruck needs no power of two: in its last round a
//! rank sends just the blocks its receiver still lacks. Recursive doubling pairs
//! ranks `v XOR 2^k`, which keeps every exchange symmetric (each pair swaps equal
//! amounts) but has to fold the ranks beyond a power of two, at two extra rounds.
//!
//! Every received block lands straight at its final place in Output (block `q` at
//! `q * count * elem_size`). Bruck's textbook form works in a rotated order and
//! rotates at the end; here a cyclic range of blocks simply travels as at most two
//! contiguous pieces, which both sides cut at the same place, so no final copy is
//! needed. Every rank first copies its Input into its own Output block (skipped by
//! the executor in place, where Input is that block).

use super::builder::Builder;
use super::halving_doubling::Fold;
use super::{Algorithm, BufId, PlanRequest, Region, Schedule};

/// Bruck all-gather: in round `k` (distance `d = 2^k`) rank `q` holds blocks
/// `q..q + d` (mod `n`), sends the first `min(d, n - d)` of them to `q - d` and
/// receives as many, blocks `q + d..`, from `q + d`.
///
/// Rounds: `ceil(log2 n)` for every `n`. Bytes sent per rank: `(n - 1) * count *
/// elem_size`, the minimum. Scratch: none. A round sends and receives at most two
/// contiguous pieces each way (where the cyclic range wraps past block `n - 1`).
/// What a round receives never overlaps what it sends, since `d + min(d, n - d) <= n`.
pub fn all_gather(req: &PlanRequest<'_>) -> Schedule {
    let (n, rank, bytes) = (req.world, req.rank, req.count * req.elem_size);
    let mut b = Builder::new();
    b.copy(0, Region::new(BufId::Input, 0, bytes), Region::new(BufId::Output, rank * bytes, bytes));
    // Blocks `start..start + len` (mod n) as at most two contiguous pieces, in the
    // order sender and receiver agree on.
    let pieces = |start: usize, len: usize| {
        let head = len.min(n - start);
        [(start, head), (0, len - head)].map(|(at, blocks)| Region::new(BufId::Output, at * bytes, blocks * bytes))
    };
    let mut d = 1;
    let mut t = 0;
    while d < n {
        let len = d.min(n - d);
        let (to, from) = ((rank + n - d) % n, (rank + d) % n);
        for piece in pieces(rank, len) {
            b.send(t, to, piece);
        }
        for piece in pieces(from, len) {
            b.recv(t, from, piece);
        }
        d *= 2;
        t += 1;
    }
    b.finish(Algorithm::Bruck, 0, Vec::new())
}

/// Recursive-doubling all-gather: in round `k` every rank swaps all the blocks it
/// holds with virtual rank `v XOR 2^k`, doubling what it holds.
///
/// Rounds: `log2 n` for a power of two, else `floor(log2 n) + 2`: a non-power of two
/// is [`Fold`]ed, each folded rank handing its block to its neighbour first and
/// receiving all the others from it last. Bytes sent per rank: `(n - 1) * count *
/// elem_size` for a power of two; with the fold a rank that absorbed a neighbour
/// also sends it the `n - 1` blocks it lacks. Scratch: none.
///
/// A virtual rank `v` carries the blocks of real ranks `first(v)..first(v + 1)`,
/// so the aligned range of virtual ranks it holds after each round is one
/// contiguous run of blocks: one send and one receive per round.
pub fn all_gather_doubling(req: &PlanRequest<'_>) -> Schedule {
    let (n, rank, bytes) = (req.world, req.rank, req.count * req.elem_size);
    let blocks = |lo: usize, hi: usize| Region::new(BufId::Output, lo * bytes, (hi - lo) * bytes);
    let mut b = Builder::new();
    b.copy(0, Region::new(BufId::Input, 0, bytes), blocks(rank, rank + 1));
    if n == 1 {
        return b.finish(Algorithm::Doubling, 0, Vec::new());
    }
    let f = Fold::new(n);
    let (t0, levels) = (f.start(), f.levels);
    let unfold = t0 + levels;
    let Some(v) = f.virt(rank) else {
        b.send(0, rank + 1, Region::new(BufId::Input, 0, bytes));
        b.recv(unfold, rank + 1, blocks(0, rank));
        b.recv(unfold, rank + 1, blocks(rank + 1, n));
        return b.finish(Algorithm::Doubling, 0, Vec::new());
    };
    if v < f.r {
        b.recv(0, rank - 1, blocks(rank - 1, rank));
    }
    let mut lo = v;
    for k in 0..levels {
        let size = 1 << k;
        let peer = f.real(v ^ size);
        let theirs = lo ^ size;
        b.send(t0 + k, peer, blocks(f.first(lo), f.first(lo + size)));
        b.recv(t0 + k, peer, blocks(f.first(theirs), f.first(theirs + size)));
        lo = lo.min(theirs);
    }
    if v < f.r {
        b.send(unfold, rank - 1, blocks(0, rank - 1));
        b.send(unfold, rank - 1, blocks(rank, n));
    }
    b.finish(Algorithm::Doubling, 0, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::super::check::check;
    use super::super::{plan, PlanParams, Step};
    use super::*;
    use crate::types::OpKind;

    use super::super::tests::counts;

    fn sweep(alg: Algorithm) {
        let wide = (1..=64).chain([65, 100, 128, 130]).map(|n| (n, 1));
        let narrow = (1..=9).chain([16, 17, 31, 64]).flat_map(|n| [(n, 4), (n, 8)]);
        for (n, es) in wide.chain(narrow) {
            for count in counts(n) {
                if let Err(e) = check(OpKind::AllGather, n, count, es, 0, Some(alg), &PlanParams::default()) {
                    panic!("count={count} es={es}: {e}");
                }
            }
        }
    }

    fn plan_rank(alg: Algorithm, world: usize, rank: usize, count: usize) -> Schedule {
        let req = PlanRequest {
            op: OpKind::AllGather,
            rank,
            world,
            count,
            elem_size: 4,
            root: 0,
            algorithm: Some(alg),
            hosts: &[],
            blocks: None,
        };
        plan(&req).unwrap()
    }

    /// The distinct peers of each round.
    fn peers(s: &Schedule) -> Vec<Vec<usize>> {
        s.rounds
            .iter()
            .map(|r| {
                let mut p: Vec<usize> = r.steps.iter().filter_map(Step::peer).collect();
                p.dedup();
                p
            })
            .collect()
    }

    fn sent_per_round(s: &Schedule) -> Vec<usize> {
        let sent = |x: &Step| if let Step::Send { src, .. } = x { src.len } else { 0 };
        s.rounds.iter().map(|r| r.steps.iter().map(sent).sum()).collect()
    }

    #[test]
    fn bruck_all_worlds() {
        sweep(Algorithm::Bruck);
    }

    #[test]
    fn doubling_all_worlds() {
        sweep(Algorithm::Doubling);
    }

    #[test]
    fn bruck_takes_ceil_log2_rounds_at_power_of_two_distances() {
        for n in (2usize..=40).chain([63, 64, 65, 100, 130]) {
            let rounds = n.next_power_of_two().ilog2() as usize;
            for rank in 0..n {
                let s = plan_rank(Algorithm::Bruck, n, rank, 3);
                assert_eq!(s.rounds.len(), rounds, "n={n}");
                // Each rank sends every block but its receiver's own exactly once.
                assert_eq!(s.bytes_sent(), (n - 1) * 12, "n={n} rank {rank}");
                assert_eq!(s.scratch_bytes, 0);
                for (k, round) in s.rounds.iter().enumerate() {
                    let d = 1 << k;
                    for step in &round.steps {
                        match *step {
                            Step::Send { peer, .. } => assert_eq!(peer, (rank + n - d) % n, "n={n} round {k}"),
                            Step::Recv { peer, .. } => assert_eq!(peer, (rank + d) % n, "n={n} round {k}"),
                            Step::Copy { .. } => assert_eq!(k, 0),
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                    let pieces = round.steps.iter().filter(|x| matches!(x, Step::Send { .. })).count();
                    assert!((1..=2).contains(&pieces), "n={n} round {k}: {pieces} sends");
                }
            }
        }
    }

    #[test]
    fn doubling_swaps_with_xor_partners_and_doubles_each_round() {
        for n in [2usize, 4, 8, 16, 32, 64, 128] {
            let levels = n.ilog2() as usize;
            for rank in 0..n {
                let s = plan_rank(Algorithm::Doubling, n, rank, 5);
                assert_eq!(s.rounds.len(), levels, "n={n}");
                assert_eq!(s.bytes_sent(), (n - 1) * 20, "n={n}");
                let want: Vec<Vec<usize>> = (0..levels).map(|k| vec![rank ^ (1 << k)]).collect();
                assert_eq!(peers(&s), want, "n={n} rank {rank}");
                assert_eq!(sent_per_round(&s), (0..levels).map(|k| 20 << k).collect::<Vec<_>>(), "n={n}");
            }
        }
        // Folded worlds: one round to fold and one to unfold. A folded rank only
        // sends its own block; its neighbour sends it the n - 1 others at the end.
        for n in [3usize, 5, 6, 7, 12, 100, 130] {
            let (levels, r) = (n.ilog2() as usize, n - (1 << n.ilog2()));
            for rank in 0..n {
                let s = plan_rank(Algorithm::Doubling, n, rank, 5);
                let p = peers(&s);
                if rank < 2 * r {
                    let neighbour = rank ^ 1;
                    assert_eq!(s.rounds.len(), levels + 2, "n={n} rank {rank}");
                    assert_eq!((p[0].clone(), p[levels + 1].clone()), (vec![neighbour], vec![neighbour]));
                    // The unfold round: rank 2i + 1 sends all but block 2i.
                    let last = if rank % 2 == 0 { 0 } else { (n - 1) * 20 };
                    assert_eq!(sent_per_round(&s)[levels + 1], last, "n={n} rank {rank}");
                    if rank % 2 == 0 {
                        assert_eq!(s.bytes_sent(), 20, "n={n} rank {rank}");
                    }
                } else {
                    assert!(p[0].is_empty() && s.rounds.len() == levels + 1, "n={n} rank {rank}: {p:?}");
                }
            }
        }
    }
}
