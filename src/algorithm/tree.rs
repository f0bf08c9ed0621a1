//! Binomial-tree planners for rooted ops: `ceil(log2 n)` rounds, whole buffer per
//! message. Latency-optimal for small messages; the root sends (or receives)
//! `log2 n` times the buffer, so long messages go to the chain instead.
//!
//! Ranks are renumbered relative to the root, `v = (r - root) % n`. In round `k` of
//! a broadcast every `v < 2^k` that already holds the data sends it to `v + 2^k`;
//! reduce runs the same tree backwards.

use super::builder::Builder;
use super::{Algorithm, BufId, PlanRequest, Region, Schedule};

/// Rounds of a binomial tree over `n` ranks: `ceil(log2 n)`.
fn depth(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}

/// Binomial broadcast. Relative rank `v > 0` receives in round `floor(log2 v)` from
/// `v - 2^floor(log2 v)` and then sends to `v + 2^k` in every later round `k` while
/// that rank exists. The root copies Input to Output (a no-op in place) and sends
/// from Input; the others receive into Output and forward from there.
pub fn broadcast(req: &PlanRequest) -> Schedule {
    let (n, root) = (req.world, req.root);
    let v = (req.rank + n - root) % n;
    let abs = |u: usize| (u + root) % n;
    let bytes = req.count * req.elem_size;
    let (input, output) = (Region::new(BufId::Input, 0, bytes), Region::new(BufId::Output, 0, bytes));
    let mut b = Builder::new();
    if v == 0 {
        b.copy(0, input, output);
    }
    for k in 0..depth(n) {
        let step = 1usize << k;
        if v < step && v + step < n {
            b.send(k, abs(v + step), if v == 0 { input } else { output });
        } else if v >= step && v < 2 * step {
            b.recv(k, abs(v - step), output);
        }
    }
    b.finish(Algorithm::Tree, 0, Vec::new())
}

/// Binomial reduce. In round `k`, relative rank `v` with `v % 2^(k+1) == 2^k` sends
/// its partial to `v - 2^k` and is done; `v` with `v % 2^(k+1) == 0` receives from
/// `v + 2^k` (when it exists) and reduces. A rank's first receive reduces with its
/// Input into the accumulator (Output at the root, Scratch elsewhere, since a
/// non-root's Output is not the caller's to write), later ones reduce into the
/// accumulator in place; leaves send their Input untouched.
pub fn reduce(req: &PlanRequest) -> Schedule {
    let (n, root) = (req.world, req.root);
    let v = (req.rank + n - root) % n;
    let abs = |u: usize| (u + root) % n;
    let bytes = req.count * req.elem_size;
    let input = Region::new(BufId::Input, 0, bytes);
    let acc = Region::new(if v == 0 { BufId::Output } else { BufId::Scratch }, 0, bytes);
    let mut b = Builder::new();
    let mut received = false;
    for k in 0..depth(n) {
        let step = 1usize << k;
        if v % (2 * step) == step {
            b.send(k, abs(v - step), if received { acc } else { input });
            break;
        }
        if v + step < n {
            b.recv_reduce(k, abs(v + step), if received { acc } else { input }, acc);
            received = true;
        }
    }
    if v == 0 && !received {
        // World of one: the result is the root's own Input.
        b.copy(0, input, acc);
    }
    let scratch = if v != 0 && received { bytes } else { 0 };
    let finalize = if v == 0 { vec![acc] } else { Vec::new() };
    b.finish(Algorithm::Tree, scratch, finalize)
}
