//! Double binary tree all-reduce (NCCL's "tree" algorithm): two binary trees over
//! the same ranks, each reducing half of the buffer up to its root and broadcasting
//! the result back down, both pipelined in segments of
//! [`PlanParams::chain_segment_bytes`] and running in the same rounds.
//!
//! **Shape.** Both trees are the in-order binary tree on positions `1..=n`: position
//! `p` sits at height `trailing_zeros(p)`, so the odd positions are exactly the
//! leaves and the even ones are interior; the root is the largest power of two
//! `P <= n`, and the depth is `D = log2 P = floor(log2 n)`, the least any binary
//! tree on `n` nodes can have. A single tree makes about half the ranks leaves,
//! which then send and receive each byte once while the interior ranks move it
//! three times; the second tree is laid so that the ranks swap roles:
//! - tree A puts rank `r` at position `r + 1` (interior: the odd ranks);
//! - tree B, for even `n`, mirrors A (rank `r` at position `n - r`): the even ranks
//!   are interior;
//! - tree B, for odd `n`, shifts A by one (rank `r` takes the place of rank `r - 1`,
//!   so rank `r` is at position `(r - 1) mod n + 1`), since mirroring would keep the
//!   parity: the even ranks from 2 up are interior, rank 0 is a leaf in both trees.
//!
//! So every rank is interior in at most one tree, and sends at most
//! `3/2 + 1/2 = 2` buffers (its interior half up once and down to two children,
//! its leaf half up once); the two roots differ, so no rank carries both roots'
//! load. Tree A handles half 0 of the buffer, tree B half 1.
//!
//! **Timing.** Rounds are aligned across ranks by depth: a node at depth `d` sends its
//! partial of segment `k` up in round `up = k + D - d` and receives the finished
//! segment from its parent in round `k + D + d - 1`, forwarding it to its children in
//! round `k + D + d`. Reduce and broadcast of different segments thus overlap, and
//! `S` segments take `S + 2D - 1` rounds. An interior node receives from its first
//! child with `RecvReduce` (its Input ⊕ child into Output) and from its second child
//! into one segment of Scratch in round `up - 1`, folds that Scratch into Output with
//! a local `Reduce` at the start of round `up` (local steps precede transfers, so the
//! next segment may land in the same Scratch in that round), and sends in `up`.
//! In any round a node at depth `d >= 1` touches four different segments of its half
//! (`up`-receive, `up`-send, down-receive, down-send are `2d >= 2` apart), so no
//! transfer races another; the halves are disjoint, so the trees never race either.
//! Input is read only by the step that first writes that Output segment (or, at a
//! leaf, by a send rounds before the broadcast lands), which keeps in-place calls
//! safe.

use super::builder::{chunk, Builder};
use super::{Algorithm, BufId, PlanParams, PlanRequest, Region, Schedule};

/// The in-order binary tree on positions `1..=n` (see the module docs).
#[derive(Clone, Copy)]
struct Shape {
    n: usize,
}

impl Shape {
    /// The largest power of two `<= n`.
    fn root(self) -> usize {
        1 << self.n.ilog2()
    }

    /// Depth of the deepest node: the left spine `P, P/2, ..., 1`.
    fn depth(self) -> usize {
        self.n.ilog2() as usize
    }

    /// Left and right child of `p`. The left subtree covers `(p - b, p)`, always in
    /// range; the right one covers `(p, p + b) ∩ [1, n]`, whose root is the position
    /// with the largest low bit there, `p + h` for the largest power of two
    /// `h <= min(b / 2, n - p)`.
    fn children(self, p: usize) -> [Option<usize>; 2] {
        let half = lowbit(p) / 2;
        if half == 0 {
            return [None, None];
        }
        let room = half.min(self.n - p);
        let right = (room > 0).then(|| p + (1 << room.ilog2()));
        [Some(p - half), right]
    }

    /// Parent of `p`: `p + b` when `p` is a left child (`p / b ≡ 1 mod 4`) and that
    /// exists, else `p - b`, of which `p` is then the right child.
    fn parent(self, p: usize) -> Option<usize> {
        if p == self.root() {
            return None;
        }
        let b = lowbit(p);
        Some(if (p / b) % 4 == 1 && p + b <= self.n { p + b } else { p - b })
    }

    /// Distance from the root. Each step up at least doubles the low bit, so this
    /// is at most [`Shape::depth`].
    fn depth_of(self, mut p: usize) -> usize {
        let mut d = 0;
        while let Some(q) = self.parent(p) {
            p = q;
            d += 1;
        }
        d
    }
}

fn lowbit(p: usize) -> usize {
    p & p.wrapping_neg()
}

/// Position of `rank` in tree `t` (0 = A, 1 = B) of `n` ranks.
fn position(t: usize, n: usize, rank: usize) -> usize {
    match t {
        0 => rank + 1,
        _ if n.is_multiple_of(2) => n - rank,
        _ => (rank + n - 1) % n + 1,
    }
}

/// The rank at position `p` of tree `t` (inverse of [`position`]).
fn rank_at(t: usize, n: usize, p: usize) -> usize {
    match t {
        0 => p - 1,
        _ if n.is_multiple_of(2) => n - p,
        _ => p % n,
    }
}

/// One rank's place in one tree, in ranks.
struct Node {
    parent: Option<usize>,
    /// First child (reduced straight into Output), then second (via Scratch).
    children: Vec<usize>,
    depth: usize,
}

impl Node {
    fn of(t: usize, n: usize, rank: usize) -> Node {
        let shape = Shape { n };
        let p = position(t, n, rank);
        Node {
            parent: shape.parent(p).map(|q| rank_at(t, n, q)),
            children: shape.children(p).into_iter().flatten().map(|c| rank_at(t, n, c)).collect(),
            depth: shape.depth_of(p),
        }
    }
}

/// Double binary tree all-reduce; `S + 2 floor(log2 n) - 1` rounds for `S` segments
/// in the larger half, one round for `n = 1`.
pub fn all_reduce(req: &PlanRequest<'_>, params: &PlanParams) -> Schedule {
    let (n, rank, es) = (req.world, req.rank, req.elem_size);
    let total = req.count * es;
    let whole = |buf| Region::new(buf, 0, total);
    let mut b = Builder::new();
    if n == 1 {
        b.copy(0, whole(BufId::Input), whole(BufId::Output));
        return b.finish(Algorithm::Tree, 0, vec![whole(BufId::Output)]);
    }
    // At least one element per segment, whatever the tunable says.
    let seg = (params.chain_segment_bytes / es).max(1) * es;
    let depth = Shape { n }.depth();
    let mut scratch = 0;
    // Tree A first on every rank, so that when two ranks are adjacent in both trees
    // their messages of one round pair up in the same order on both sides.
    for t in 0..2 {
        let (start, len) = chunk(req.count, 2, t);
        let (off, len) = (start * es, len * es);
        let region = |buf, k: usize| Region::new(buf, off + k * seg, seg.min(len - k * seg));
        let node = Node::of(t, n, rank);
        let d = node.depth;
        for k in 0..len.div_ceil(seg) {
            let (input, output) = (region(BufId::Input, k), region(BufId::Output, k));
            // Interior nodes are shallower than D, so up >= 1.
            let up = k + depth - d;
            if let Some(&first) = node.children.first() {
                b.recv_reduce(up - 1, first, input, output);
            }
            if let Some(&second) = node.children.get(1) {
                // Every rank is interior in at most one tree, so one slot at offset
                // 0 serves both trees.
                let slot = Region::new(BufId::Scratch, 0, output.len);
                b.recv(up - 1, second, slot);
                b.reduce(up, slot, output);
                scratch = scratch.max(slot.len);
            }
            if let Some(parent) = node.parent {
                b.send(up, parent, if node.children.is_empty() { input } else { output });
                b.recv(k + depth + d - 1, parent, output);
            }
            for &c in &node.children {
                b.send(k + depth + d, c, output);
            }
        }
    }
    b.finish(Algorithm::Tree, scratch, vec![whole(BufId::Output)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::check::check;
    use crate::algorithm::{plan_with, Step};
    use crate::types::OpKind;

    fn params(seg: usize) -> PlanParams {
        PlanParams { chain_segment_bytes: seg, ..PlanParams::default() }
    }

    fn plan_rank(n: usize, rank: usize, count: usize, es: usize, p: &PlanParams) -> Schedule {
        let req = PlanRequest {
            op: OpKind::AllReduce,
            rank,
            world: n,
            count,
            elem_size: es,
            root: 0,
            algorithm: Some(Algorithm::Tree),
            hosts: &[],
            blocks: None,
        };
        plan_with(&req, p).unwrap()
    }

    fn sweep(worlds: impl Iterator<Item = usize>, elem_sizes: &[usize]) {
        for n in worlds {
            for count in super::super::tests::counts(n) {
                for &es in elem_sizes {
                    for seg in [8, 512 * 1024] {
                        if let Err(e) = check(OpKind::AllReduce, n, count, es, 0, Some(Algorithm::Tree), &params(seg)) {
                            panic!("count={count} es={es} seg={seg}: {e}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn checker_sweep_bytes() {
        sweep((1..=64).chain([65, 100, 128]), &[1]);
    }

    #[test]
    fn checker_sweep_wide_elements() {
        sweep((1..=9).chain([16, 17, 31]), &[4, 8]);
    }

    #[test]
    fn shape_is_a_spanning_tree_of_least_depth() {
        for n in 1..=300 {
            let s = Shape { n };
            assert_eq!(s.parent(s.root()), None);
            let mut max_depth = 0;
            for p in 1..=n {
                for c in s.children(p).into_iter().flatten() {
                    assert!((1..=n).contains(&c), "n={n} p={p} child {c}");
                    assert_eq!(s.parent(c), Some(p), "n={n} child {c} of {p}");
                }
                if let Some(q) = s.parent(p) {
                    assert!(s.children(q).contains(&Some(p)), "n={n} {p} not a child of its parent {q}");
                }
                // Leaves are exactly the odd positions.
                assert_eq!(s.children(p) == [None, None], p % 2 == 1, "n={n} p={p}");
                max_depth = max_depth.max(s.depth_of(p));
            }
            // A binary tree of depth D holds at most 2^(D+1) - 1 nodes.
            assert_eq!(max_depth, s.depth(), "n={n}");
            assert!(n < (1 << (s.depth() + 1)));
        }
    }

    #[test]
    fn trees_are_complementary() {
        for n in 1..=300 {
            let nodes: Vec<[Node; 2]> = (0..n).map(|r| [Node::of(0, n, r), Node::of(1, n, r)]).collect();
            for t in 0..2 {
                for r in 0..n {
                    assert_eq!(position(t, n, rank_at(t, n, r + 1)), r + 1);
                }
            }
            let roots: Vec<usize> = (0..2)
                .map(|t| (0..n).filter(|&r| nodes[r][t].parent.is_none()).collect::<Vec<_>>())
                .map(|v| v[0])
                .collect();
            if n >= 2 {
                assert_ne!(roots[0], roots[1], "n={n}");
            }
            for (r, nd) in nodes.iter().enumerate() {
                let interior = nd.iter().filter(|x| !x.children.is_empty()).count();
                // Even n: each rank interior in exactly one tree. Odd n: all but rank
                // 0, which is a leaf in both.
                let want = usize::from(n >= 2 && (n % 2 == 0 || r != 0));
                assert_eq!(interior, want, "n={n} rank {r}");
            }
        }
    }

    /// Segments of the larger half.
    fn segments(count: usize, es: usize, seg: usize) -> usize {
        (chunk(count, 2, 0).1 * es).div_ceil(seg)
    }

    #[test]
    fn rounds_pipeline_segments() {
        let (count, es, seg) = (4000, 4, 64);
        let s = segments(count, es, seg);
        assert_eq!(s, 125);
        for n in [2usize, 3, 4, 5, 7, 8, 16, 31, 64, 100, 128] {
            let d = n.ilog2() as usize;
            let rounds = (0..n).map(|r| plan_rank(n, r, count, es, &params(seg)).rounds.len()).max().unwrap();
            assert_eq!(rounds, s + 2 * d - 1, "n={n}");
            assert!(rounds < s + 2 * (d + 1), "n={n}: not pipelined");
        }
        // One segment: up and down the tree once.
        for n in [2usize, 5, 8, 9] {
            let rounds = (0..n).map(|r| plan_rank(n, r, 10, 4, &PlanParams::default()).rounds.len()).max().unwrap();
            assert_eq!(rounds, 2 * n.ilog2() as usize, "n={n}");
        }
        assert_eq!(plan_rank(1, 0, 10, 4, &params(8)).rounds.len(), 1);
        // Many segments in flight, checked end to end.
        for n in [5, 16, 31] {
            check(OpKind::AllReduce, n, 1000, 4, 0, Some(Algorithm::Tree), &params(16)).unwrap();
        }
    }

    #[test]
    fn reduce_and_broadcast_overlap() {
        // In the steady state an interior non-root node receives from a child, sends
        // to its parent, receives from its parent and sends to a child, all in one round.
        let (n, count, es, seg) = (16, 4000, 4, 64);
        for r in 0..n {
            let node = Node::of(0, n, r);
            let Some(parent) = node.parent else { continue };
            if node.children.is_empty() {
                continue;
            }
            let sched = plan_rank(n, r, count, es, &params(seg));
            let round = &sched.rounds[60].steps;
            let has = |f: &dyn Fn(&Step) -> bool| round.iter().any(f);
            let c = node.children[0];
            assert!(has(&|s| matches!(*s, Step::RecvReduce { peer, .. } if peer == c)), "rank {r}");
            assert!(has(&|s| matches!(*s, Step::Send { peer, .. } if peer == parent)), "rank {r}");
            assert!(has(&|s| matches!(*s, Step::Recv { peer, .. } if peer == parent)), "rank {r}");
            assert!(has(&|s| matches!(*s, Step::Send { peer, .. } if peer == c)), "rank {r}");
        }
    }

    #[test]
    fn bytes_sent_per_rank() {
        for n in 2..=40 {
            for (count, es, seg) in [(1000, 4, 64), (97, 8, 512 * 1024), (3, 1, 8)] {
                let total = count * es;
                let mut all = 0;
                for r in 0..n {
                    let sched = plan_rank(n, r, count, es, &params(seg));
                    // Each half once up unless root, once down per child.
                    let want: usize = (0..2)
                        .map(|t| {
                            let nd = Node::of(t, n, r);
                            chunk(count, 2, t).1 * es * (usize::from(nd.parent.is_some()) + nd.children.len())
                        })
                        .sum();
                    let sent = sched.bytes_sent();
                    assert_eq!(sent, want, "n={n} rank {r} count={count}");
                    // Interior in one tree at most: 3 halves + 1 half.
                    assert!(sent <= 2 * total + es, "n={n} rank {r} sends {sent} of {total}");
                    assert!(sched.scratch_bytes <= seg.min(total), "n={n} rank {r}");
                    all += sent;
                }
                // Every non-root receives each half once up and once down.
                assert_eq!(all, 2 * (n - 1) * total, "n={n} count={count}");
            }
        }
    }
}
