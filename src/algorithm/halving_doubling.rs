//! Recursive doubling and halving: all-reduce by recursive doubling (small
//! messages), all-reduce by Rabenseifner's halving-then-doubling (large messages),
//! and reduce-scatter by recursive halving.
//!
//! All three pair ranks `v` and `v XOR 2^k`, so they run in `log2 n` rounds on a
//! power-of-two world. Any other world of `n = p + r` ranks (`p` the largest power
//! of two `<= n`) is first [`Fold`]ed onto `p` ranks: each of the first `r` even
//! ranks hands its data to the odd rank after it and sits out, and gets its result
//! back in one last round. Pairing neighbours keeps the fold traffic between ranks
//! that are likely on the same host, and it makes the blocks of every surviving
//! rank contiguous (see [`Fold::first`]), so a range of survivors always owns one
//! contiguous byte range. The price is two extra rounds, and the folded ranks' data
//! crossing one extra link.
//!
//! Every element is combined along the same binary tree on every rank, and the
//! reduce kernels are commutative bitwise (`crate::reduce`), so all ranks end with
//! bitwise-identical results although each puts its own operand on the left.

use super::builder::{chunk, Builder};
use super::{Algorithm, BufId, PlanRequest, Region, Schedule};

/// How a world of `n` ranks maps onto the `p = 2^levels` ranks that run the
/// power-of-two algorithm: rank `2i` (for `i < r`) is folded into rank `2i + 1`,
/// which becomes virtual rank `i`; every rank `q >= 2r` becomes virtual rank `q - r`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fold {
    /// Ranks that run the power-of-two algorithm.
    pub(super) p: usize,
    /// Folded ranks, `n - p`.
    pub(super) r: usize,
    /// `log2 p`.
    pub(super) levels: usize,
}

impl Fold {
    pub(super) fn new(n: usize) -> Fold {
        assert!(n > 0, "a world has at least one rank");
        let p = 1 << n.ilog2();
        Fold { p, r: n - p, levels: n.ilog2() as usize }
    }

    /// Rounds before the power-of-two part starts: one to fold, if anyone folds.
    pub(super) fn start(&self) -> usize {
        usize::from(self.r > 0)
    }

    /// Virtual rank of `rank`, None for a folded rank.
    pub(super) fn virt(&self, rank: usize) -> Option<usize> {
        if rank >= 2 * self.r {
            Some(rank - self.r)
        } else {
            (rank % 2 == 1).then_some(rank / 2)
        }
    }

    /// Real rank of virtual rank `v`.
    pub(super) fn real(&self, v: usize) -> usize {
        if v < self.r {
            2 * v + 1
        } else {
            v + self.r
        }
    }

    /// First real rank whose data virtual rank `v` carries (`first(p) == n`):
    /// ranks `first(v)..first(v + 1)` are `v`'s own and, if it absorbed one, the
    /// folded rank before it. Monotone, so virtual ranks `lo..hi` carry the
    /// contiguous real ranks `first(lo)..first(hi)`.
    pub(super) fn first(&self, v: usize) -> usize {
        (2 * v).min(v + self.r)
    }
}

/// Recursive-doubling all-reduce: in round `k` every rank exchanges its whole
/// partial result with virtual rank `v XOR 2^k` and reduces what it receives.
///
/// Rounds: `log2 n` for a power of two, else `floor(log2 n) + 2` (fold and unfold).
/// Bytes sent per rank: `log2 p` times the buffer (plus one buffer for ranks in the
/// fold). Scratch: one buffer.
///
/// A round cannot receive-reduce into the bytes it sends, so the partial ping-pongs
/// between Output and Scratch, arranged backwards from the last round so that the
/// last one lands in Output. When the first partial would be in Output, the
/// unfolded ranks send their Input as it is rather than copying it there, and in
/// place nothing is written to Output before the round that reads it as Input.
pub fn all_reduce_doubling(req: &PlanRequest<'_>) -> Schedule {
    let (n, rank, bytes) = (req.world, req.rank, req.count * req.elem_size);
    let input = Region::new(BufId::Input, 0, bytes);
    let output = Region::new(BufId::Output, 0, bytes);
    let scratch = Region::new(BufId::Scratch, 0, bytes);
    let mut b = Builder::new();
    if n == 1 {
        b.copy(0, input, output);
        return b.finish(Algorithm::Doubling, 0, vec![output]);
    }
    let f = Fold::new(n);
    let (t0, levels) = (f.start(), f.levels);
    let unfold = t0 + levels;
    let Some(v) = f.virt(rank) else {
        b.send(0, rank + 1, input);
        b.recv(unfold, rank + 1, output);
        return b.finish(Algorithm::Doubling, 0, vec![output]);
    };
    // Where the partial lives before doubling round `k` (`k == levels`: the result).
    let at = |k: usize| if (levels - k).is_multiple_of(2) { output } else { scratch };
    let mut cur = at(0);
    if v < f.r {
        b.recv_reduce(0, rank - 1, input, at(0));
    } else if at(0) == output {
        cur = input;
    } else {
        b.copy(t0, input, scratch);
    }
    for k in 0..levels {
        let peer = f.real(v ^ (1 << k));
        b.send(t0 + k, peer, cur);
        b.recv_reduce(t0 + k, peer, cur, at(k + 1));
        cur = at(k + 1);
    }
    if v < f.r {
        b.send(unfold, rank - 1, output);
    }
    b.finish(Algorithm::Doubling, bytes, vec![output])
}

/// Rabenseifner's all-reduce: a recursive-halving reduce-scatter over `p` element
/// chunks (virtual rank `v` ends owning chunk `v`), then a recursive-doubling
/// all-gather of the chunks.
///
/// Rounds: `2 log2 n` for a power of two, else `2 floor(log2 n) + 2`. Bytes sent per
/// rank: about `2 (p - 1) / p` of the buffer (plus one buffer for ranks in the fold),
/// which is bandwidth-optimal like the ring, in logarithmic rather than linear
/// rounds. Scratch: none.
///
/// Each halving round sends the half of its range it gives up and receive-reduces
/// the half it keeps, straight into Output: the two halves are disjoint, so nothing
/// needs staging. The first round reads Input, later ones Output; in place the kept
/// half is reduced onto itself. Chunks come from [`chunk`], so odd counts and
/// counts below `p` work (empty chunks are skipped by both sides alike).
pub fn all_reduce(req: &PlanRequest<'_>) -> Schedule {
    let (n, rank, es, c) = (req.world, req.rank, req.elem_size, req.count);
    let input = Region::new(BufId::Input, 0, c * es);
    let output = Region::new(BufId::Output, 0, c * es);
    let mut b = Builder::new();
    if n == 1 {
        b.copy(0, input, output);
        return b.finish(Algorithm::HalvingDoubling, 0, vec![output]);
    }
    let f = Fold::new(n);
    let (t0, levels, p) = (f.start(), f.levels, f.p);
    let unfold = t0 + 2 * levels;
    // Chunks `lo..hi` as one region.
    let chunks = |buf, lo: usize, hi: usize| {
        let (start, end) = (chunk(c, p, lo).0, chunk(c, p, hi).0);
        Region::new(buf, start * es, (end - start) * es)
    };
    let Some(v) = f.virt(rank) else {
        b.send(0, rank + 1, input);
        b.recv(unfold, rank + 1, output);
        return b.finish(Algorithm::HalvingDoubling, 0, vec![output]);
    };
    let mut src = BufId::Input;
    if v < f.r {
        b.recv_reduce(0, rank - 1, input, output);
        src = BufId::Output;
    }
    let (mut lo, mut hi) = (0, p);
    for k in 0..levels {
        let half = p >> (k + 1);
        let peer = f.real(v ^ half);
        let mid = lo + half;
        let (keep, give) = if v & half == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        b.send(t0 + k, peer, chunks(src, give.0, give.1));
        b.recv_reduce(t0 + k, peer, chunks(src, keep.0, keep.1), chunks(BufId::Output, keep.0, keep.1));
        src = BufId::Output;
        (lo, hi) = keep;
    }
    debug_assert_eq!((lo, hi), (v, v + 1));
    for k in 0..levels {
        let size = 1 << k;
        let peer = f.real(v ^ size);
        let theirs = lo ^ size;
        b.send(t0 + levels + k, peer, chunks(BufId::Output, lo, lo + size));
        b.recv(t0 + levels + k, peer, chunks(BufId::Output, theirs, theirs + size));
        lo = lo.min(theirs);
    }
    if v < f.r {
        b.send(unfold, rank - 1, output);
    }
    b.finish(Algorithm::HalvingDoubling, 0, vec![output])
}

/// Recursive-halving reduce-scatter: rank `q` ends with block `q` (`count`
/// elements) of the reduced `count * n`-element Input.
///
/// In round `k` a rank keeps the half of its current range of virtual ranks that
/// holds its own, sends the other half to virtual rank `v XOR p / 2^(k+1)`, and
/// receive-reduces the half it keeps. With the fold, virtual rank `v` carries the
/// blocks of real ranks `first(v)..first(v + 1)`, so every range is contiguous.
///
/// Rounds: `log2 n` for a power of two, else `floor(log2 n) + 2`. Bytes sent per
/// rank: `(n - 1) * count * elem_size` for a power of two (as the ring). Scratch: the
/// half of the blocks a rank keeps after the first round (none for `n <= 2`); a rank
/// that absorbs a folded one keeps all `n` blocks, since the fold reduces them all.
///
/// Partials never touch Output until the last round, which receive-reduces the
/// rank's own block there; in place, Output is Input block `q`, and that block is
/// read by the first round only, or by that very last step (reduced onto itself).
pub fn reduce_scatter(req: &PlanRequest<'_>) -> Schedule {
    let (n, rank, bytes) = (req.world, req.rank, req.count * req.elem_size);
    let output = Region::new(BufId::Output, 0, bytes);
    // Blocks `lo..hi` of `buf`, whose first block is `base`.
    let blocks = |buf, base: usize, lo: usize, hi: usize| Region::new(buf, (lo - base) * bytes, (hi - lo) * bytes);
    let mut b = Builder::new();
    if n == 1 {
        b.copy(0, blocks(BufId::Input, 0, 0, 1), output);
        return b.finish(Algorithm::HalvingDoubling, 0, vec![output]);
    }
    let f = Fold::new(n);
    let (t0, levels, p) = (f.start(), f.levels, f.p);
    let unfold = t0 + levels;
    let Some(v) = f.virt(rank) else {
        b.send(0, rank + 1, blocks(BufId::Input, 0, 0, n));
        b.recv(unfold, rank + 1, output);
        return b.finish(Algorithm::HalvingDoubling, 0, vec![output]);
    };
    // The block ranges that carry virtual ranks `lo..hi`: one run, except that the
    // last round splits a rank that absorbed a folded one into its two blocks, one
    // for each destination. Both sides of a transfer compute the same runs.
    let runs = |lo: usize, hi: usize| -> Vec<(usize, usize)> {
        let (a, e) = (f.first(lo), f.first(hi));
        if hi == lo + 1 && e == a + 2 {
            vec![(a, a + 1), (a + 1, e)]
        } else {
            vec![(a, e)]
        }
    };
    // `(buffer, first block)` of the current partials and of where they go next.
    let (mut cur, part, scratch_bytes) = if v < f.r {
        b.recv_reduce(0, rank - 1, blocks(BufId::Input, 0, 0, n), blocks(BufId::Scratch, 0, 0, n));
        ((BufId::Scratch, 0), (BufId::Scratch, 0), n * bytes)
    } else {
        // Only the first round's kept half needs room.
        let (lo, hi) = if v < p / 2 { (0, p / 2) } else { (p / 2, p) };
        let (a, e) = (f.first(lo), f.first(hi));
        let room = if levels > 1 { (e - a) * bytes } else { 0 };
        ((BufId::Input, 0), (BufId::Scratch, a), room)
    };
    let (mut lo, mut hi) = (0, p);
    for k in 0..levels {
        let t = t0 + k;
        let half = p >> (k + 1);
        let peer = f.real(v ^ half);
        let mid = lo + half;
        let (keep, give) = if v & half == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        for (a, e) in runs(give.0, give.1) {
            b.send(t, peer, blocks(cur.0, cur.1, a, e));
        }
        for (a, e) in runs(keep.0, keep.1) {
            let dst = if k + 1 == levels && a == rank { output } else { blocks(part.0, part.1, a, e) };
            b.recv_reduce(t, peer, blocks(cur.0, cur.1, a, e), dst);
        }
        cur = part;
        (lo, hi) = keep;
    }
    if v < f.r {
        b.send(unfold, rank - 1, blocks(part.0, part.1, rank - 1, rank));
    }
    b.finish(Algorithm::HalvingDoubling, scratch_bytes, vec![output])
}

#[cfg(test)]
mod tests {
    use super::super::check::check;
    use super::super::{plan, PlanParams, Step};
    use super::*;
    use crate::types::OpKind;

    use super::super::tests::counts;

    fn sweep(op: OpKind, alg: Algorithm) {
        let wide = (1..=64).chain([65, 100, 128, 130]).map(|n| (n, 1));
        let narrow = (1..=9).chain([16, 17, 31, 64]).flat_map(|n| [(n, 4), (n, 8)]);
        for (n, es) in wide.chain(narrow) {
            for count in counts(n) {
                if let Err(e) = check(op, n, count, es, 0, Some(alg), &PlanParams::default()) {
                    panic!("count={count} es={es}: {e}");
                }
            }
        }
    }

    fn plan_rank(op: OpKind, alg: Algorithm, world: usize, rank: usize, count: usize) -> Schedule {
        let req = PlanRequest {
            op,
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

    /// Every peer a rank exchanges with, in round order.
    fn peers(s: &Schedule) -> Vec<Vec<usize>> {
        s.rounds.iter().map(|r| r.steps.iter().filter_map(Step::peer).collect()).collect()
    }

    /// A folded world of `n` ranks adds exactly the fold and the unfold round to the
    /// `rounds` of the power-of-two part: each folded rank sends its whole Input
    /// (`input_bytes`) to its neighbour first and hears back from it last, and only
    /// the neighbours that absorbed one talk to folded ranks.
    fn check_fold(op: OpKind, alg: Algorithm, n: usize, count: usize, rounds: usize, input_bytes: usize) {
        let f = Fold::new(n);
        assert!(f.r > 0, "n={n} is a power of two");
        for rank in 0..n {
            let s = plan_rank(op, alg, n, rank, count);
            let p = peers(&s);
            match f.virt(rank) {
                None => {
                    assert_eq!(s.rounds.len(), rounds + 2, "n={n} rank {rank}");
                    assert_eq!(s.bytes_sent(), input_bytes, "n={n} rank {rank}");
                    assert!(p[1..=rounds].iter().all(Vec::is_empty), "n={n} rank {rank}: {p:?}");
                    assert_eq!((p[0][0], p[rounds + 1][0]), (rank + 1, rank + 1), "n={n} rank {rank}");
                }
                Some(v) => {
                    let folded = |q: &usize| *q < 2 * f.r && q.is_multiple_of(2);
                    let outer: Vec<usize> = [0, rounds + 1].into_iter().filter(|&t| t < p.len()).collect();
                    assert!(
                        (1..=rounds).all(|t| !p[t].iter().any(folded)),
                        "n={n} rank {rank} talks to a folded rank in the power-of-two part: {p:?}"
                    );
                    if v < f.r {
                        assert_eq!(s.rounds.len(), rounds + 2, "n={n} rank {rank}");
                        assert!(outer.iter().all(|&t| p[t].iter().all(|&q| q == rank - 1)), "n={n} rank {rank}");
                    } else {
                        assert!(s.rounds.len() <= rounds + 1, "n={n} rank {rank}");
                        assert!(p[0].is_empty(), "n={n} rank {rank}");
                    }
                }
            }
        }
    }

    #[test]
    fn fold_maps_ranks_onto_a_power_of_two() {
        for n in 1..=130 {
            let f = Fold::new(n);
            assert!(f.p.is_power_of_two() && f.p <= n && n < 2 * f.p && f.p == 1 << f.levels);
            let virt: Vec<usize> = (0..n).filter_map(|q| f.virt(q)).collect();
            assert_eq!(virt, (0..f.p).collect::<Vec<_>>(), "n={n}");
            for v in 0..f.p {
                assert_eq!(f.virt(f.real(v)), Some(v));
                assert!(f.first(v) < f.first(v + 1) && f.first(v + 1) - f.first(v) <= 2);
                assert!((f.first(v)..f.first(v + 1)).contains(&f.real(v)));
            }
            assert_eq!((f.first(0), f.first(f.p)), (0, n));
        }
    }

    #[test]
    fn doubling_all_reduce_all_worlds() {
        sweep(OpKind::AllReduce, Algorithm::Doubling);
    }

    #[test]
    fn rabenseifner_all_reduce_all_worlds() {
        sweep(OpKind::AllReduce, Algorithm::HalvingDoubling);
    }

    #[test]
    fn halving_reduce_scatter_all_worlds() {
        sweep(OpKind::ReduceScatter, Algorithm::HalvingDoubling);
    }

    #[test]
    fn doubling_all_reduce_exchanges_whole_buffer_with_xor_partners() {
        for n in [2usize, 4, 8, 16, 32, 64] {
            let levels = n.ilog2() as usize;
            for rank in 0..n {
                let s = plan_rank(OpKind::AllReduce, Algorithm::Doubling, n, rank, 1000);
                assert_eq!(s.rounds.len(), levels, "n={n}");
                assert_eq!(s.bytes_sent(), levels * 4000, "n={n}: the whole buffer every round");
                let want: Vec<Vec<usize>> = (0..levels).map(|k| vec![rank ^ (1 << k); 2]).collect();
                assert_eq!(peers(&s), want, "n={n} rank {rank}");
                assert_eq!(s.scratch_bytes, 4000);
            }
        }
        for n in [3usize, 5, 6, 7, 12, 100] {
            check_fold(OpKind::AllReduce, Algorithm::Doubling, n, 10, n.ilog2() as usize, 40);
        }
    }

    #[test]
    fn rabenseifner_rounds_and_bytes() {
        for n in [2usize, 4, 8, 16, 32, 64] {
            for count in [n, 10 * n + 3, 1000] {
                for rank in 0..n {
                    let s = plan_rank(OpKind::AllReduce, Algorithm::HalvingDoubling, n, rank, count);
                    assert_eq!(s.rounds.len(), 2 * n.ilog2() as usize, "n={n} count={count}");
                    assert_eq!(s.scratch_bytes, 0);
                    // 2(n-1)/n of the buffer, give or take one element per chunk sent.
                    let ideal = 2.0 * (n - 1) as f64 / n as f64 * (count * 4) as f64;
                    let slack = (2 * (n - 1) * 4) as f64;
                    let sent = s.bytes_sent() as f64;
                    assert!((sent - ideal).abs() <= slack, "n={n} count={count} sent {sent} ideal {ideal}");
                    // Halving: partners at distance n/2, n/4, ..., 1; doubling back up.
                    let want: Vec<usize> = (0..n.ilog2()).rev().chain(0..n.ilog2()).map(|k| rank ^ (1 << k)).collect();
                    let got: Vec<usize> = peers(&s).iter().map(|p| p[0]).collect();
                    assert_eq!(got, want, "n={n} rank {rank}");
                }
            }
        }
        for n in [3usize, 6, 12, 100] {
            check_fold(OpKind::AllReduce, Algorithm::HalvingDoubling, n, 1000, 2 * n.ilog2() as usize, 4000);
        }
    }

    #[test]
    fn halving_reduce_scatter_rounds_and_bytes() {
        for n in [2usize, 4, 8, 16, 64] {
            for rank in 0..n {
                let s = plan_rank(OpKind::ReduceScatter, Algorithm::HalvingDoubling, n, rank, 100);
                assert_eq!(s.rounds.len(), n.ilog2() as usize, "n={n}");
                // Halves of n/2, n/4, ..., 1 blocks of 400 bytes: (n-1) blocks, as the ring.
                assert_eq!(s.bytes_sent(), (n - 1) * 400, "n={n}");
                let expect_scratch = if n > 2 { n / 2 * 400 } else { 0 };
                assert_eq!(s.scratch_bytes, expect_scratch, "n={n}");
                let sends: Vec<usize> = s
                    .rounds
                    .iter()
                    .map(|r| r.steps.iter().filter(|x| matches!(x, Step::Send { .. })).map(|_| 1).sum())
                    .collect();
                assert_eq!(sends, vec![1; n.ilog2() as usize], "one contiguous send per round");
            }
        }
        for n in [3usize, 5, 7, 100] {
            check_fold(OpKind::ReduceScatter, Algorithm::HalvingDoubling, n, 100, n.ilog2() as usize, n * 400);
        }
    }
}
