//! Direct planners: one round in which every rank exchanges its data with every
//! other rank, then (for reducing ops) a local round that folds the received
//! buffers. Lowest latency for small messages; `n - 1` times the traffic of a ring.

use super::builder::Builder;
use super::{Algorithm, BufId, PlanRequest, Region, Schedule};

/// Scratch slot of peer `p` on rank `r`: slots are packed, skipping `r` itself.
pub(super) fn slot(r: usize, p: usize) -> usize {
    if p < r {
        p
    } else {
        p - 1
    }
}

/// Emit `out = src(0) ⊕ src(1) ⊕ ... ⊕ src(n - 1)`, left to right, into round `t`.
///
/// Every rank folds in the same rank order with the accumulator on the left, so all
/// ranks compute bitwise-identical results whatever the reduce op. `src(rank)` is
/// this rank's own data, which may alias `out` (in-place calls); every other
/// `src(p)` is a Scratch slot. Rank 0 accumulates straight in `out` (its first
/// operand is its own data, so the initial copy is a no-op in place). Any other
/// rank must not overwrite `out` before reading its own data, so it accumulates in
/// rank 0's slot up to and including its own operand, then copies to `out`.
pub(super) fn fold_in_rank_order(
    b: &mut Builder,
    t: usize,
    rank: usize,
    n: usize,
    src: impl Fn(usize) -> Region,
    out: Region,
) {
    if rank == 0 {
        b.copy(t, src(0), out);
        for p in 1..n {
            b.reduce(t, src(p), out);
        }
    } else {
        let acc = src(0);
        for p in 1..=rank {
            b.reduce(t, src(p), acc);
        }
        b.copy(t, acc, out);
        for p in rank + 1..n {
            b.reduce(t, src(p), out);
        }
    }
}

/// Direct all-reduce: round 0 sends the whole Input to every peer and receives each
/// peer's buffer into its own Scratch slot; round 1 (local) folds Input and slots in
/// rank order into Output. Scratch: `(n - 1) * count * elem_size`.
pub fn all_reduce(req: &PlanRequest) -> Schedule {
    let (n, r, bytes) = (req.world, req.rank, req.count * req.elem_size);
    let input = Region::new(BufId::Input, 0, bytes);
    let output = Region::new(BufId::Output, 0, bytes);
    let scratch = |p: usize| Region::new(BufId::Scratch, slot(r, p) * bytes, bytes);
    let mut b = Builder::new();
    for p in (0..n).filter(|&p| p != r) {
        b.send(0, p, input);
        b.recv(0, p, scratch(p));
    }
    let t = usize::from(n > 1);
    fold_in_rank_order(&mut b, t, r, n, |p| if p == r { input } else { scratch(p) }, output);
    b.finish(Algorithm::Direct, (n - 1) * bytes, vec![output])
}

/// Direct all-gather: copy the own Input into Output block `r`, send it to every
/// peer, and receive each peer's block into its place, all in one round.
pub fn all_gather(req: &PlanRequest) -> Schedule {
    let (n, r, bytes) = (req.world, req.rank, req.count * req.elem_size);
    let input = Region::new(BufId::Input, 0, bytes);
    let block = |j: usize| Region::new(BufId::Output, j * bytes, bytes);
    let mut b = Builder::new();
    b.copy(0, input, block(r));
    for p in (0..n).filter(|&p| p != r) {
        b.send(0, p, input);
        b.recv(0, p, block(p));
    }
    b.finish(Algorithm::Direct, 0, Vec::new())
}

/// Direct reduce-scatter: round 0 sends Input block `j` to rank `j` and receives
/// block `r` from every peer into Scratch slots; round 1 (local) folds them with the
/// own Input block `r` in rank order into Output. Scratch: `(n - 1) * count * elem_size`.
pub fn reduce_scatter(req: &PlanRequest) -> Schedule {
    let (n, r, bytes) = (req.world, req.rank, req.count * req.elem_size);
    let input = |j: usize| Region::new(BufId::Input, j * bytes, bytes);
    let output = Region::new(BufId::Output, 0, bytes);
    let scratch = |p: usize| Region::new(BufId::Scratch, slot(r, p) * bytes, bytes);
    let mut b = Builder::new();
    for p in (0..n).filter(|&p| p != r) {
        b.send(0, p, input(p));
        b.recv(0, p, scratch(p));
    }
    let t = usize::from(n > 1);
    fold_in_rank_order(&mut b, t, r, n, |p| if p == r { input(r) } else { scratch(p) }, output);
    b.finish(Algorithm::Direct, (n - 1) * bytes, vec![output])
}
