//! Ring planners: every rank sends only to its right neighbour and receives only
//! from its left, one chunk per round. Bandwidth-optimal (each rank sends
//! `(n - 1) / n` of the data per phase) at the price of `n - 1` rounds per phase.
//!
//! The ring follows [`PlanRequest::ring_order`]: ranks host by host, so the ring
//! crosses from one host to the next only once per host (twice in all for two
//! hosts, however their ranks interleave), and the slow inter-host links carry one
//! ring hop each instead of many. On one host the order is the identity. Chunks are
//! numbered by ring position; all-gather and reduce-scatter blocks stay where the op
//! puts them, by rank.
//!
//! The round-level building blocks ([`Ring`], [`reduce_scatter_rounds`],
//! [`all_gather_rounds`], [`all_reduce_rounds`]) take any list of ranks, any
//! segmentation and any starting round, so the hierarchical planners run the same
//! rings inside hosts and across them.

use super::builder::{chunk, Builder};
use super::{Algorithm, BufId, PlanRequest, Region, Schedule};

/// One ring: its ranks in ring order and this rank's position among them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ring<'a> {
    ranks: &'a [usize],
    pos: usize,
}

impl<'a> Ring<'a> {
    /// The ring through `ranks` as `rank` (one of them) sees it.
    pub(super) fn new(ranks: &'a [usize], rank: usize) -> Ring<'a> {
        let pos = ranks.iter().position(|&q| q == rank).expect("rank is on its ring");
        Ring { ranks, pos }
    }
    fn len(&self) -> usize {
        self.ranks.len()
    }
    pub(super) fn right(&self) -> usize {
        self.ranks[(self.pos + 1) % self.len()]
    }
    pub(super) fn left(&self) -> usize {
        self.ranks[(self.pos + self.len() - 1) % self.len()]
    }
    /// Segment `(pos + shift - back) % n`: the ring walks segments backwards.
    pub(super) fn seg(&self, shift: usize, back: usize) -> usize {
        let n = self.len();
        (self.pos + shift % n + 2 * n - back % (2 * n)) % n
    }
}

/// Ring reduce-scatter of `n = ring.len() >= 2` segments in rounds `t0 .. t0 + n - 1`:
/// position `p` ends with segment `(p + shift) % n` reduced over the whole ring, in
/// `acc(n - 2, that segment)`.
///
/// In round `s`, position `p` sends segment `(p + shift - 1 - s) % n` (its own
/// operand `src(j)` in round 0, else the partial it received the round before) and
/// receives segment `(p + shift - 2 - s) % n`, storing `src(j) ⊕ received` in
/// `acc(s, j)`. Each segment is received at most once per rank and `src` of a
/// segment is read only by the step that first writes its accumulator (or, for the
/// segment a rank starts, by the round-0 send, which it never receives), which keeps
/// in-place calls safe when `src` and `acc` name the same bytes.
///
/// With `fuse`, the last round forwards the finished segment right as it is reduced
/// (NCCL's recvReduceSend): that is round 0 of [`all_gather_rounds`] with `fused`.
pub(super) fn reduce_scatter_rounds(
    b: &mut Builder,
    t0: usize,
    ring: Ring,
    shift: usize,
    src: impl Fn(usize) -> Region,
    acc: impl Fn(usize, usize) -> Region,
    fuse: bool,
) {
    let n = ring.len();
    for s in 0..n - 1 {
        let send_j = ring.seg(shift, 1 + s);
        b.send(t0 + s, ring.right(), if s == 0 { src(send_j) } else { acc(s - 1, send_j) });
        let j = ring.seg(shift, 2 + s);
        if fuse && s == n - 2 {
            b.recv_reduce_send(t0 + s, ring.left(), src(j), acc(s, j), ring.right());
        } else {
            b.recv_reduce(t0 + s, ring.left(), src(j), acc(s, j));
        }
    }
}

/// Ring all-gather of `n = ring.len()` segments in rounds `t0 .. t0 + n - 1`, where
/// position `p` starts with segment `(p + shift) % n` in `seg(..)`: in round `s` it
/// sends segment `(p + shift - s) % n` and receives `(p + shift - s - 1) % n`.
///
/// `fused`: round 0's send already left as the forward of a fused
/// [`reduce_scatter_rounds`] ending in round `t0`, so only its receive is added.
pub(super) fn all_gather_rounds(
    b: &mut Builder,
    t0: usize,
    ring: Ring,
    shift: usize,
    seg: impl Fn(usize) -> Region,
    fused: bool,
) {
    for s in 0..ring.len().saturating_sub(1) {
        if !(fused && s == 0) {
            b.send(t0 + s, ring.right(), seg(ring.seg(shift, s)));
        }
        b.recv(t0 + s, ring.left(), seg(ring.seg(shift, s + 1)));
    }
}

/// Ring all-reduce of the `len` elements from element `start`: this rank's operand
/// is in `src` (Input, or Output when an earlier phase left a partial there), the
/// result lands in Output at the same offset. Reduce-scatter over `n` chunks with
/// its last round fused into the all-gather, `2n - 3` rounds from `t0`; returns the
/// number of rounds (0 for a ring of one, which only copies, as a local step of
/// round `t0`).
///
/// Every chunk is reduced once, by its owner, and then copied around, so all ranks
/// end with bitwise-identical results.
pub(super) fn all_reduce_rounds(
    b: &mut Builder,
    t0: usize,
    ring: Ring,
    es: usize,
    src: BufId,
    start: usize,
    len: usize,
) -> usize {
    let n = ring.len();
    let region = |buf, j: usize| {
        let (s, l) = chunk(len, n, j);
        Region::new(buf, (start + s) * es, l * es)
    };
    if n == 1 {
        if src != BufId::Output {
            b.copy(t0, region(src, 0), region(BufId::Output, 0));
        }
        return 0;
    }
    // Shift 1: position p finishes chunk p + 1 and forwards it right at once, while
    // its left neighbour forwards the finished chunk p to it in the same round.
    let output = |_: usize, j: usize| region(BufId::Output, j);
    reduce_scatter_rounds(b, t0, ring, 1, |j| region(src, j), output, true);
    all_gather_rounds(b, t0 + n - 2, ring, 1, |j| region(BufId::Output, j), true);
    2 * n - 3
}

/// Ring all-reduce in [`PlanRequest::ring_order`]: reduce-scatter over `n`
/// element-aligned chunks (uneven when `count % n != 0`), then all-gather, `2n - 3`
/// rounds (see [`all_reduce_rounds`]).
///
/// In round `s` of the reduce-scatter, ring position `p` sends chunk `(p - s) % n`
/// and receives chunk `(p - s - 1) % n`, reducing it with its own Input into Output.
/// The first send of a chunk reads Input; later ones read the partial in Output.
/// Each Input chunk is read at most in the same step that first writes the Output
/// chunk (or before it), so in-place calls are safe. The last reduce-scatter round
/// finishes chunk `(p + 1) % n` and forwards it right as it is reduced (the first
/// all-gather send, fused), and receives the finished chunk `p` from the left in
/// the same round; the remaining `n - 2` rounds circulate the rest.
///
/// With two ranks, in place, that round sends Input chunk `p` and receives the
/// finished chunk `p` into the same bytes. That is safe because the peer forwards
/// each byte only after reducing it, that is after taking this rank's copy of it
/// (the checker verifies this causal pairing rather than rejecting the overlap).
pub fn all_reduce(req: &PlanRequest) -> Schedule {
    all_reduce_as(req, Algorithm::Ring)
}

/// [`all_reduce`], labelled `alg` (the hierarchical planner on one host, or with one
/// rank per host, is exactly this ring).
pub(super) fn all_reduce_as(req: &PlanRequest, alg: Algorithm) -> Schedule {
    let order = req.ring_order();
    let mut b = Builder::new();
    all_reduce_rounds(&mut b, 0, Ring::new(&order, req.rank), req.elem_size, BufId::Input, 0, req.count);
    b.finish(alg, 0, vec![Region::new(BufId::Output, 0, req.count * req.elem_size)])
}

/// Ring all-gather: copy the own Input into Output block `r`, then in round `s`
/// send the block `s` places behind on the ring and receive the one `s + 1` places
/// behind. In place, Input is Output block `r` and the copy is skipped by the
/// executor.
pub fn all_gather(req: &PlanRequest) -> Schedule {
    all_gather_as(req, Algorithm::Ring)
}

/// [`all_gather`], labelled `alg`.
pub(super) fn all_gather_as(req: &PlanRequest, alg: Algorithm) -> Schedule {
    let (r, bytes) = (req.rank, req.count * req.elem_size);
    let order = req.ring_order();
    let block = |q: usize| Region::new(BufId::Output, q * bytes, bytes);
    let mut b = Builder::new();
    b.copy(0, Region::new(BufId::Input, 0, bytes), block(r));
    all_gather_rounds(&mut b, 0, Ring::new(&order, r), 0, |j| block(order[j]), false);
    b.finish(alg, 0, Vec::new())
}

/// Ring reduce-scatter: rank `r` ends with block `r` of the reduced Input in Output.
///
/// In round `s`, ring position `p` sends the block of position `(p - s - 1) % n` (its
/// raw Input block in round 0, else the partial received the round before) and
/// receives that of `(p - s - 2) % n`, reducing it with its Input block. Partials
/// alternate between two Scratch slots so a round never sends the slot it receives
/// into; the last round lands block `r` straight in Output. Input block `r` is read
/// only by that last step, which is what makes the in-place call (Output = Input
/// block `r`) safe.
pub fn reduce_scatter(req: &PlanRequest) -> Schedule {
    reduce_scatter_as(req, Algorithm::Ring)
}

/// [`reduce_scatter`], labelled `alg`.
pub(super) fn reduce_scatter_as(req: &PlanRequest, alg: Algorithm) -> Schedule {
    let (n, r, bytes) = (req.world, req.rank, req.count * req.elem_size);
    let order = req.ring_order();
    let input = |j: usize| Region::new(BufId::Input, order[j] * bytes, bytes);
    let output = Region::new(BufId::Output, 0, bytes);
    let mut b = Builder::new();
    if n == 1 {
        b.copy(0, input(0), output);
        return b.finish(alg, 0, vec![output]);
    }
    let acc = |s: usize, _| if s == n - 2 { output } else { Region::new(BufId::Scratch, (s % 2) * bytes, bytes) };
    reduce_scatter_rounds(&mut b, 0, Ring::new(&order, r), 0, input, acc, false);
    let scratch = (n - 2).min(2) * bytes;
    b.finish(alg, scratch, vec![output])
}

#[cfg(test)]
mod tests {
    use super::super::check::check_on;
    use super::super::{plan, PlanParams, Step};
    use super::*;
    use crate::types::OpKind;

    /// Host layouts of `n` ranks that stress the ring order: interleaved hosts,
    /// round-robin over three hosts, and uneven blocks.
    fn layouts(n: usize) -> Vec<Vec<usize>> {
        let mut out = vec![vec![0; n], (0..n).collect(), (0..n).map(|r| r % 2).collect()];
        out.push((0..n).map(|r| r % 3).collect());
        out.push((0..n).map(|r| r / 3).collect());
        if n == 6 {
            out.push(vec![0, 0, 0, 1, 2, 2]);
            out.push(vec![0, 1, 1, 0, 2, 1]);
        }
        out
    }

    #[test]
    fn ring_sweep_host_layouts() {
        let p = PlanParams::default();
        for n in 1..=24 {
            for hosts in layouts(n) {
                for count in [0, 1, 2, n.saturating_sub(1), n + 1, 3 * n + 2, 97] {
                    for es in [1, 4] {
                        for op in [OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter] {
                            if let Err(e) = check_on(op, &hosts, count, es, 0, Some(Algorithm::Ring), &p) {
                                panic!("hosts={hosts:?} count={count} es={es}: {e}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Distinct (sender, receiver) pairs on different hosts over all ranks' schedules.
    fn crossing_links(op: OpKind, hosts: &[usize], count: usize) -> usize {
        let mut links = std::collections::BTreeSet::new();
        for rank in 0..hosts.len() {
            let req = PlanRequest {
                op,
                rank,
                world: hosts.len(),
                count,
                elem_size: 4,
                root: 0,
                algorithm: Some(Algorithm::Ring),
                hosts,
                blocks: None,
            };
            for step in plan(&req).unwrap().rounds.iter().flat_map(|r| &r.steps) {
                let to = match *step {
                    Step::Send { peer, .. } => peer,
                    Step::RecvReduceSend { to, .. } => to,
                    _ => continue,
                };
                if hosts[to] != hosts[rank] {
                    links.insert((rank, to));
                }
            }
        }
        links.len()
    }

    #[test]
    fn interleaved_ring_crosses_hosts_once_per_host() {
        for n in [4, 8, 12, 16] {
            let two: Vec<usize> = (0..n).map(|r| r % 2).collect();
            let four: Vec<usize> = (0..n).map(|r| r % 4).collect();
            for op in [OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter] {
                assert_eq!(crossing_links(op, &two, 10 * n), 2, "{op} n={n}");
                assert_eq!(crossing_links(op, &four, 10 * n), 4, "{op} n={n}");
                assert_eq!(crossing_links(op, &vec![0; n], 10 * n), 0, "{op} n={n}");
            }
        }
    }

    // The planners as they were before rings followed hosts, kept to prove that one
    // host still gets exactly the same schedules.
    fn old_all_reduce(req: &PlanRequest) -> Schedule {
        let (n, r, es, c) = (req.world, req.rank, req.elem_size, req.count);
        let mut b = Builder::new();
        let region = |buf, j: usize| {
            let (start, len) = chunk(c, n, j);
            Region::new(buf, start * es, len * es)
        };
        if n == 1 {
            b.copy(0, Region::new(BufId::Input, 0, c * es), Region::new(BufId::Output, 0, c * es));
        } else {
            let (right, left) = ((r + 1) % n, (r + n - 1) % n);
            for s in 0..n - 1 {
                let src = if s == 0 { BufId::Input } else { BufId::Output };
                b.send(s, right, region(src, (r + n - s) % n));
                let recv_j = (r + 2 * n - s - 1) % n;
                let (input, output) = (region(BufId::Input, recv_j), region(BufId::Output, recv_j));
                if s == n - 2 {
                    b.recv_reduce_send(s, left, input, output, right);
                    b.recv(s, left, region(BufId::Output, r));
                } else {
                    b.recv_reduce(s, left, input, output);
                }
            }
            for s in 1..n - 1 {
                let t = n - 2 + s;
                b.send(t, right, region(BufId::Output, (r + 1 + n - s) % n));
                b.recv(t, left, region(BufId::Output, (r + n - s) % n));
            }
        }
        b.finish(Algorithm::Ring, 0, vec![Region::new(BufId::Output, 0, c * es)])
    }

    fn old_all_gather(req: &PlanRequest) -> Schedule {
        let (n, r, bytes) = (req.world, req.rank, req.count * req.elem_size);
        let block = |j: usize| Region::new(BufId::Output, j * bytes, bytes);
        let mut b = Builder::new();
        b.copy(0, Region::new(BufId::Input, 0, bytes), block(r));
        if n > 1 {
            let (right, left) = ((r + 1) % n, (r + n - 1) % n);
            for s in 0..n - 1 {
                b.send(s, right, block((r + n - s) % n));
                b.recv(s, left, block((r + 2 * n - s - 1) % n));
            }
        }
        b.finish(Algorithm::Ring, 0, Vec::new())
    }

    fn old_reduce_scatter(req: &PlanRequest) -> Schedule {
        let (n, r, bytes) = (req.world, req.rank, req.count * req.elem_size);
        let input = |j: usize| Region::new(BufId::Input, j * bytes, bytes);
        let slot = |s: usize| Region::new(BufId::Scratch, (s % 2) * bytes, bytes);
        let output = Region::new(BufId::Output, 0, bytes);
        let mut b = Builder::new();
        if n == 1 {
            b.copy(0, input(0), output);
            return b.finish(Algorithm::Ring, 0, vec![output]);
        }
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        for s in 0..n - 1 {
            let send_src = if s == 0 { input((r + n - 1) % n) } else { slot(s - 1) };
            b.send(s, right, send_src);
            let j = (r + 2 * n - s - 2) % n;
            let dst = if s == n - 2 { output } else { slot(s) };
            b.recv_reduce(s, left, input(j), dst);
        }
        b.finish(Algorithm::Ring, (n - 2).min(2) * bytes, vec![output])
    }

    #[test]
    fn one_host_schedules_are_unchanged() {
        for n in 1..=12 {
            for count in [0, 1, n + 1, 3 * n + 2, 97] {
                for rank in 0..n {
                    for zeros in [vec![], vec![0; n]] {
                        let req = |op| PlanRequest {
                            op,
                            rank,
                            world: n,
                            count,
                            elem_size: 4,
                            root: 0,
                            algorithm: Some(Algorithm::Ring),
                            hosts: &zeros,
                            blocks: None,
                        };
                        let ar = req(OpKind::AllReduce);
                        assert_eq!(all_reduce(&ar), old_all_reduce(&ar), "n={n} count={count} rank={rank}");
                        let ag = req(OpKind::AllGather);
                        assert_eq!(all_gather(&ag), old_all_gather(&ag), "n={n} count={count} rank={rank}");
                        let rs = req(OpKind::ReduceScatter);
                        assert_eq!(reduce_scatter(&rs), old_reduce_scatter(&rs), "n={n} count={count} rank={rank}");
                    }
                }
            }
        }
    }
}
