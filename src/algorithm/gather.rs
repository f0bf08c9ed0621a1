//! Gather and scatter: the rooted collectives that move distinct blocks (no
//! reduction). `count` is one rank's block; the root's buffer holds `world` blocks
//! in rank order.
//!
//! - Direct: every rank sends its block straight to the root (gather), or the root
//!   sends block `j` straight to rank `j` (scatter), all in one round. The root
//!   moves each byte once; it handles `n - 1` transfers at once.
//! - Tree: a binomial tree over ranks renumbered relative to the root
//!   (`v = (r - root) % n`), `ceil(log2 n)` rounds. Rank `v` owns the subtree of
//!   relative ranks `v .. v + lowbit(v)` (clipped to the world); an inner rank
//!   collects (gather) or receives (scatter) its subtree's blocks in Scratch,
//!   laid out by relative rank. The root sends or receives only `log2 n` messages,
//!   at the price of forwarding blocks through inner ranks: latency, not bandwidth.

use super::builder::Builder;
use super::{Algorithm, BufId, PlanRequest, Region, Schedule};

/// Direct gather: the root copies its Input to Output block `root` (a no-op in
/// place) and receives block `p` from every rank `p`; the others send their Input.
pub fn gather_direct(req: &PlanRequest) -> Schedule {
    let (n, r, root, bytes) = (req.world, req.rank, req.root, req.count * req.elem_size);
    let input = Region::new(BufId::Input, 0, bytes);
    let mut b = Builder::new();
    if r == root {
        b.copy(0, input, Region::new(BufId::Output, root * bytes, bytes));
        for p in (0..n).filter(|&p| p != root) {
            b.recv(0, p, Region::new(BufId::Output, p * bytes, bytes));
        }
    } else {
        b.send(0, root, input);
    }
    b.finish(Algorithm::Direct, 0, Vec::new())
}

/// Direct scatter: the root copies Input block `root` to its Output (a no-op in
/// place) and sends block `p` to every rank `p`; the others receive into Output.
pub fn scatter_direct(req: &PlanRequest) -> Schedule {
    let (n, r, root, bytes) = (req.world, req.rank, req.root, req.count * req.elem_size);
    let output = Region::new(BufId::Output, 0, bytes);
    let mut b = Builder::new();
    if r == root {
        b.copy(0, Region::new(BufId::Input, root * bytes, bytes), output);
        for p in (0..n).filter(|&p| p != root) {
            b.send(0, p, Region::new(BufId::Input, p * bytes, bytes));
        }
    } else {
        b.recv(0, root, output);
    }
    b.finish(Algorithm::Direct, 0, Vec::new())
}

/// Rounds of a binomial tree over `n` ranks: `ceil(log2 n)`.
fn depth(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}

/// Shape of the binomial tree seen from one rank.
struct Tree {
    n: usize,
    root: usize,
    /// This rank, relative to the root.
    v: usize,
    /// Bytes of one block.
    bytes: usize,
}

impl Tree {
    fn new(req: &PlanRequest) -> Tree {
        let n = req.world;
        Tree { n, root: req.root, v: (req.rank + n - req.root) % n, bytes: req.count * req.elem_size }
    }

    /// Absolute rank of relative rank `u`.
    fn abs(&self, u: usize) -> usize {
        (u + self.root) % self.n
    }

    /// Blocks in the subtree of relative rank `u` (all `n` for the root).
    fn subtree(&self, u: usize) -> usize {
        if u == 0 {
            self.n
        } else {
            (1 << u.trailing_zeros()).min(self.n - u)
        }
    }

    /// The round in which relative rank `u > 0` talks to its parent (gather's
    /// order; scatter runs the rounds backwards).
    fn parent_round(u: usize) -> usize {
        u.trailing_zeros() as usize
    }

    /// The blocks of relative ranks `a .. a + m` as pieces of the root's buffer
    /// `buf`: one piece, or two when the run wraps past the last rank back to rank 0.
    fn root_pieces(&self, buf: BufId, a: usize, m: usize) -> Vec<Region> {
        let start = self.abs(a);
        let first = m.min(self.n - start);
        let mut pieces = vec![Region::new(buf, start * self.bytes, first * self.bytes)];
        if first < m {
            pieces.push(Region::new(buf, 0, (m - first) * self.bytes));
        }
        pieces
    }

    /// The same split seen from the side that is not the root: `m` blocks of
    /// `buf` from byte `offset`, cut where the root's copy of them wraps (only
    /// when `to_root`, since inner ranks lay blocks out by relative rank).
    fn peer_pieces(&self, to_root: bool, a: usize, m: usize, buf: BufId, offset: usize) -> Vec<Region> {
        let cut = if to_root { m.min(self.n - self.abs(a)) } else { m };
        let mut pieces = vec![Region::new(buf, offset, cut * self.bytes)];
        if cut < m {
            pieces.push(Region::new(buf, offset + cut * self.bytes, (m - cut) * self.bytes));
        }
        pieces
    }
}

/// Binomial gather. In round `k`, relative rank `v` with `v % 2^(k+1) == 2^k`
/// sends its subtree's blocks to `v - 2^k` and is done; `v % 2^(k+1) == 0`
/// receives the subtree of `v + 2^k` (when it exists). The root receives straight
/// into Output; an inner rank first copies its Input into Scratch block 0 and
/// collects there; a leaf sends its Input.
pub fn gather_tree(req: &PlanRequest) -> Schedule {
    let t = Tree::new(req);
    let (n, v, bytes) = (t.n, t.v, t.bytes);
    let input = Region::new(BufId::Input, 0, bytes);
    let size = t.subtree(v);
    let inner = v != 0 && size > 1;
    let mut b = Builder::new();
    if v == 0 {
        b.copy(0, input, Region::new(BufId::Output, t.root * bytes, bytes));
    } else if inner {
        b.copy(0, input, Region::new(BufId::Scratch, 0, bytes));
    }
    for k in 0..depth(n) {
        let step = 1usize << k;
        if v % (2 * step) == step {
            let buf = if inner { BufId::Scratch } else { BufId::Input };
            for piece in t.peer_pieces(v == step, v, size, buf, 0) {
                b.send(k, t.abs(v - step), piece);
            }
            break;
        }
        let child = v + step;
        if child < n {
            let m = t.subtree(child);
            if v == 0 {
                for piece in t.root_pieces(BufId::Output, child, m) {
                    b.recv(k, t.abs(child), piece);
                }
            } else {
                b.recv(k, t.abs(child), Region::new(BufId::Scratch, step * bytes, m * bytes));
            }
        }
    }
    b.finish(Algorithm::Tree, if inner { size * bytes } else { 0 }, Vec::new())
}

/// Binomial scatter: gather's tree run backwards. In round `d - 1 - k` (`d` the
/// depth), relative rank `v % 2^(k+1) == 0` sends the subtree of `v + 2^k` to it;
/// that rank receives its subtree, into Output when it is a leaf, else into
/// Scratch, from whose block 0 it copies its own block to Output in the next round.
pub fn scatter_tree(req: &PlanRequest) -> Schedule {
    let t = Tree::new(req);
    let (n, v, bytes) = (t.n, t.v, t.bytes);
    let d = depth(n);
    let output = Region::new(BufId::Output, 0, bytes);
    let size = t.subtree(v);
    let inner = v != 0 && size > 1;
    let mut b = Builder::new();
    if v == 0 {
        b.copy(0, Region::new(BufId::Input, t.root * bytes, bytes), output);
    } else {
        let k = Tree::parent_round(v);
        let round = d - 1 - k;
        let buf = if inner { BufId::Scratch } else { BufId::Output };
        for piece in t.peer_pieces(v == 1 << k, v, size, buf, 0) {
            b.recv(round, t.abs(v - (1 << k)), piece);
        }
        if inner {
            b.copy(round + 1, Region::new(BufId::Scratch, 0, bytes), output);
        }
    }
    // Children, largest subtree first: relative ranks `v + 2^k` for `2^k` below
    // this rank's lowest set bit (every `k` at the root).
    let top = if v == 0 { d } else { Tree::parent_round(v) };
    for k in (0..top).rev() {
        let step = 1usize << k;
        let child = v + step;
        if child >= n {
            continue;
        }
        let m = t.subtree(child);
        let round = d - 1 - k;
        if v == 0 {
            for piece in t.root_pieces(BufId::Input, child, m) {
                b.send(round, t.abs(child), piece);
            }
        } else {
            b.send(round, t.abs(child), Region::new(BufId::Scratch, step * bytes, m * bytes));
        }
    }
    b.finish(Algorithm::Tree, if inner { size * bytes } else { 0 }, Vec::new())
}
