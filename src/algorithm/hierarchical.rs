//! Hierarchical (two-level) planners: traffic inside a host is cheap, traffic between
//! hosts is not, so every byte should cross between hosts as few times as the op
//! allows and the inter-host work should be spread over every rank of a host.
//!
//! **Lanes.** Let `L` be the largest number of ranks on one host. Lane `i < L` is
//! served on host `h` (of `L_h` ranks, ascending) by its rank of local index
//! `i % L_h`: with equal hosts every rank serves exactly the lane of its own local
//! index; a smaller host lets some of its ranks stand in for several lanes, which
//! keeps every layout correct (every lane has one rank on every host) while the
//! inter-host work stays spread as evenly as the host's size permits. The ranks that
//! serve lane `i`, host by host, form lane `i`'s inter-host ring; a ring of `H` hosts
//! crosses between hosts once per hop, and all `L` lane rings run in parallel.
//!
//! - **all-reduce**: reduce-scatter inside each host into `L` lane chunks, a ring
//!   all-reduce of each chunk over its lane, all-gather inside each host. Each rank
//!   sends `2 (H - 1) / H * bytes / L` across hosts (equal hosts), a host as a whole
//!   `2 (H - 1) / H * bytes`: the same as one flat ring crossing, spread over `L`
//!   links.
//! - **all-gather**: each lane's ring all-gathers the blocks of the ranks with that
//!   local index across hosts (so every block crosses into every other host exactly
//!   once), then each host all-gathers what its ranks collected.
//! - **reduce-scatter**: the reverse: a reduce-scatter inside each host leaves the
//!   host's partial of block `(h', i)` with the rank serving lane `i`, and each lane's
//!   ring reduce-scatters those partials across hosts. A block's partials cross
//!   between hosts `H - 1` times, the minimum for a ring.
//! - **broadcast / reduce**: a pipelined tree (segments of
//!   [`PlanParams::chain_segment_bytes`]): a chain of host leaders (the root leads its
//!   own host, elsewhere the lowest rank) with each leader also heading a chain
//!   through its own host. One segment moves one hop per round, and a leader passes
//!   each segment to the next leader and into its host in the same round, so the
//!   whole buffer crosses each inter-host hop once and the intra-host chains run
//!   while the inter-host chain is still busy, not after it. Reduce runs the tree
//!   backwards.
//!
//! On one host, or with one rank per host, the two levels collapse into one: the
//! schedules are the ring's (or, for the rooted ops, the chain's), labelled
//! hierarchical. Rounds are global: a phase starts in the round after the longest
//! previous phase ends on any host (hosts with fewer ranks idle), since messages
//! are matched by round.

use std::cmp::Reverse;

use super::builder::{chunk, Builder};
use super::ring::{self, all_gather_rounds, all_reduce_rounds, reduce_scatter_rounds, Ring};
use super::{Algorithm, BufId, PlanParams, PlanRequest, Region, Schedule};

/// The host structure as one rank sees it.
struct Hosts {
    /// Ranks of every host, ascending, hosts by number.
    members: Vec<Vec<usize>>,
    /// This rank's host and its index there.
    host: usize,
    local: usize,
    /// Number of lanes: the size of the largest host.
    lanes: usize,
}

impl Hosts {
    fn new(req: &PlanRequest) -> Hosts {
        let members = req.host_members();
        let host = req.host_of(req.rank);
        let local = members[host].iter().position(|&q| q == req.rank).expect("rank is on its host");
        let lanes = members.iter().map(Vec::len).max().unwrap_or(1);
        Hosts { members, host, local, lanes }
    }
    fn num_hosts(&self) -> usize {
        self.members.len()
    }
    /// This rank's host's ranks.
    fn mine(&self) -> &[usize] {
        &self.members[self.host]
    }
    /// One level is all there is: one host, or one rank per host.
    fn flat(&self) -> bool {
        self.num_hosts() == 1 || self.lanes == 1
    }
    /// The rank of local index `i` on host `h`, if the host is that large.
    fn at(&self, h: usize, i: usize) -> Option<usize> {
        self.members[h].get(i).copied()
    }
    /// Lane `i`'s inter-host ring: the rank serving it on every host, host by host.
    fn lane_ring(&self, i: usize) -> Vec<usize> {
        self.members.iter().map(|m| m[i % m.len()]).collect()
    }
    /// The lanes this rank serves.
    fn my_lanes(&self) -> impl Iterator<Item = usize> {
        (self.local..self.lanes).step_by(self.mine().len())
    }
    /// Intra-host layers: a host of `l` ranks runs its ring once per `l` lanes.
    fn layers(&self) -> usize {
        self.lanes.div_ceil(self.mine().len())
    }
}

/// A zero-length region: a segment that does not exist on this layout (the Builder
/// drops its steps, and so does the peer, which computes the same segment).
const NONE: Region = Region::new(BufId::Output, 0, 0);

/// Hierarchical all-reduce: reduce-scatter inside each host into lane chunks, ring
/// all-reduce of each lane chunk across hosts, all-gather inside each host.
///
/// Phase 1 (`L - 1` rounds) runs, on a host of `l` ranks, `ceil(L / l)` ring
/// reduce-scatters side by side, layer `k` over lane chunks `k l .. k l + l` (absent
/// lanes are empty), so the rank of local index `j` ends with the host's sum of
/// every chunk of its lanes in Output. Phase 2 (`2H - 3` rounds) all-reduces each
/// lane chunk over the lane's ring, from Output (or straight from Input on a host of
/// one rank, which had nothing to reduce). Phase 3 (`L - 1` rounds) circulates the
/// finished chunks inside each host. In-place calls are safe for the reasons the
/// ring gives: Input is only read in phase 1 (or phase 2 on a host of one), each
/// chunk by the step that first writes its Output bytes or earlier.
///
/// Long messages are pipelined: the buffer is cut into up to [`MAX_PIECES`] pieces
/// of at least `4 x chain_segment_bytes`, and piece `p` starts its phases one stride
/// (the longest phase) after piece `p - 1`, so the links between hosts carry piece
/// `p` while the hosts reduce piece `p + 1` and gather piece `p - 1`: the
/// inter-host transfer, the slow part, runs almost all the time instead of waiting
/// for the two phases inside the hosts. Pieces are disjoint element ranges, so they
/// never touch each other's bytes.
pub fn all_reduce(req: &PlanRequest<'_>, params: &PlanParams) -> Schedule {
    let hs = Hosts::new(req);
    if hs.flat() {
        return ring::all_reduce_as(req, Algorithm::Hierarchical);
    }
    let (es, c) = (req.elem_size, req.count);
    let min_piece = (4 * params.chain_segment_bytes / es).max(1);
    let pieces = (c / min_piece).clamp(1, MAX_PIECES);
    let phase1 = hs.lanes - 1;
    let phase2 = 2 * hs.num_hosts() - 3;
    let stride = phase1.max(phase2).max(1);
    let mut b = Builder::new();
    for p in 0..pieces {
        let (start, len) = chunk(c, pieces, p);
        all_reduce_piece(&mut b, p * stride, req, &hs, start, len);
    }
    b.finish(Algorithm::Hierarchical, 0, vec![Region::new(BufId::Output, 0, c * es)])
}

/// Most pieces a hierarchical all-reduce is cut into.
const MAX_PIECES: usize = 8;

/// The three phases of [`all_reduce`] over elements `start .. start + len`, from
/// round `t0`.
fn all_reduce_piece(b: &mut Builder, t0: usize, req: &PlanRequest, hs: &Hosts, start: usize, len: usize) {
    let (es, lanes) = (req.elem_size, hs.lanes);
    let lane_chunk = |buf, i: usize| {
        if i >= lanes {
            return NONE;
        }
        let (s, l) = chunk(len, lanes, i);
        Region::new(buf, (start + s) * es, l * es)
    };
    let l = hs.mine().len();
    let intra = Ring::new(hs.mine(), req.rank);
    if l > 1 {
        for k in 0..hs.layers() {
            let input = |j| lane_chunk(BufId::Input, k * l + j);
            let output = |_, j| lane_chunk(BufId::Output, k * l + j);
            reduce_scatter_rounds(b, t0, intra, 0, input, output, false);
        }
    }
    let t1 = t0 + lanes - 1;
    let src = if l > 1 { BufId::Output } else { BufId::Input };
    for i in hs.my_lanes() {
        let ranks = hs.lane_ring(i);
        let (s, n) = chunk(len, lanes, i);
        all_reduce_rounds(b, t1, Ring::new(&ranks, req.rank), es, src, start + s, n);
    }
    let t2 = t1 + 2 * hs.num_hosts() - 3;
    if l > 1 {
        for k in 0..hs.layers() {
            all_gather_rounds(b, t2, intra, 0, |j| lane_chunk(BufId::Output, k * l + j), false);
        }
    }
}

/// Hierarchical all-gather: across hosts per lane, then inside each host.
///
/// Phase 1 (rounds `0 .. H - 1`): each lane's ring all-gathers, host by host, the
/// blocks of the ranks of that local index (a host without one contributes nothing
/// but still passes the others on and keeps them). Phase 2 (`l - 1` rounds on a host
/// of `l`): the host all-gathers what its ranks collected, one ring per (layer,
/// source host) side by side, so the rank of local index `j` passes on the blocks of
/// local indices `j, j + l, ...` of every host. Each block crosses into every other
/// host once. The own block is copied to Output first (a no-op in place) and sent
/// from there.
pub fn all_gather(req: &PlanRequest<'_>, _params: &PlanParams) -> Schedule {
    if is_flat(req) {
        return ring::all_gather_as(req, Algorithm::Hierarchical);
    }
    let bytes = req.count * req.elem_size;
    let block = |q: usize| Region::new(BufId::Output, q * bytes, bytes);
    let mut b = Builder::new();
    b.copy(0, Region::new(BufId::Input, 0, bytes), block(req.rank));
    all_gather_blocks(&mut b, 0, req, block);
    b.finish(Algorithm::Hierarchical, 0, Vec::new())
}

/// Whether the layout has one level only (one host, or one rank per host).
pub(super) fn is_flat(req: &PlanRequest) -> bool {
    Hosts::new(req).flat()
}

/// The rounds of [`all_gather`] from round `t0` on a layout that is not flat, with
/// rank `q`'s block in `block(q)` (blocks may differ in size; each rank already
/// holds its own).
pub(super) fn all_gather_blocks(b: &mut Builder, t0: usize, req: &PlanRequest, block: impl Fn(usize) -> Region) {
    let hs = Hosts::new(req);
    let block = |q: Option<usize>| q.map_or(NONE, &block);
    for i in hs.my_lanes() {
        let ranks = hs.lane_ring(i);
        all_gather_rounds(b, t0, Ring::new(&ranks, req.rank), 0, |h| block(hs.at(h, i)), false);
    }
    let (t1, l) = (t0 + hs.num_hosts() - 1, hs.mine().len());
    if l > 1 {
        let intra = Ring::new(hs.mine(), req.rank);
        for k in 0..hs.layers() {
            for h in 0..hs.num_hosts() {
                all_gather_rounds(b, t1, intra, 0, |j| block(hs.at(h, k * l + j)), false);
            }
        }
    }
}

/// Hierarchical reduce-scatter: inside each host, then across hosts per lane.
///
/// Phase 1 (rounds `0 .. L - 1`): on a host of `l` ranks, one ring reduce-scatter
/// per (layer `k`, destination host `h'`) side by side, over the Input blocks of the
/// ranks of local index `k l .. k l + l` on `h'`; the rank of local index `j` ends
/// with the host's partial of block `(h', i)` for each of its lanes `i`, in Scratch
/// (two slots per ring, alternating, the last holding the result). Phase 2 (`H - 1`
/// rounds): each lane's ring reduce-scatters those partials across hosts, and the
/// last round lands the own block in Output. A host of one rank has nothing to
/// reduce and feeds its Input blocks to phase 2 directly. In place (Output = Input
/// block `r`) Input block `r` is read in phase 1 at the latest, or, on a host of
/// one, by the very step that writes Output, as in the flat ring. Scratch: up to
/// two blocks per phase-1 ring and per lane ring, `2H + 2` blocks on equal hosts
/// (the host partials a rank passes across hosts are `H` blocks by themselves).
pub fn reduce_scatter(req: &PlanRequest<'_>, _params: &PlanParams) -> Schedule {
    let hs = Hosts::new(req);
    if hs.flat() {
        return ring::reduce_scatter_as(req, Algorithm::Hierarchical);
    }
    let (bytes, nh, l) = (req.count * req.elem_size, hs.num_hosts(), hs.mine().len());
    let input = |q: usize| Region::new(BufId::Input, q * bytes, bytes);
    let scratch = |slot: usize| Region::new(BufId::Scratch, slot * bytes, bytes);
    let mut b = Builder::new();
    // Phase 1: ring (k, h') owns slots `per_ring * (k * H + h') ..`.
    let per_ring = (l - 1).min(2);
    if l > 1 {
        let intra = Ring::new(hs.mine(), req.rank);
        for k in 0..hs.layers() {
            for h in 0..nh {
                let ring_no = k * nh + h;
                let src = |j| hs.at(h, k * l + j).map_or(NONE, input);
                let acc = |s: usize, j| hs.at(h, k * l + j).map_or(NONE, |_| scratch(ring_no * per_ring + s % 2));
                reduce_scatter_rounds(&mut b, 0, intra, 0, src, acc, false);
            }
        }
    }
    let phase1_slots = hs.layers() * nh * per_ring;
    // Where this rank holds the host's partial of block (h', i), i one of its lanes.
    let partial = |h: usize, i: usize| match hs.at(h, i) {
        None => NONE,
        Some(q) if l == 1 => input(q),
        Some(_) => scratch((i / l * nh + h) * per_ring + (l - 2) % 2),
    };
    let t1 = hs.lanes - 1;
    let lane_slots = (nh - 2).min(2);
    let mut slots = phase1_slots;
    for i in hs.my_lanes() {
        let ranks = hs.lane_ring(i);
        let base = slots;
        let acc = |s: usize, h| match hs.at(h, i) {
            None => NONE,
            Some(_) if s == nh - 2 => Region::new(BufId::Output, 0, bytes),
            Some(_) => scratch(base + s % 2),
        };
        reduce_scatter_rounds(&mut b, t1, Ring::new(&ranks, req.rank), 0, |h| partial(h, i), acc, false);
        slots += lane_slots;
    }
    b.finish(Algorithm::Hierarchical, slots * bytes, vec![Region::new(BufId::Output, 0, bytes)])
}

/// This rank's place in the broadcast / reduce tree: a chain of host leaders, each
/// also heading a chain through its own host (see the module docs).
struct Tree {
    parent: Option<usize>,
    /// The next leader (if a leader and not the last), then the next rank of the host.
    children: Vec<usize>,
    /// Hops from the root.
    depth: usize,
    /// The largest depth of any rank.
    height: usize,
}

impl Tree {
    fn new(req: &PlanRequest) -> Tree {
        let hs = Hosts::new(req);
        let nh = hs.num_hosts();
        let root_host = req.host_of(req.root);
        // Root host first; then, since a host's chain ends `position + size - 1` hops
        // deep, larger hosts earlier (stable: otherwise hosts in order after the root's,
        // as the flat chain goes).
        let mut order: Vec<usize> = (1..nh).map(|q| (root_host + q) % nh).collect();
        order.sort_by_key(|&h| Reverse(hs.members[h].len()));
        order.insert(0, root_host);
        // Each host's chain: its leader, then the others ascending, wrapping around.
        let chain = |h: usize| {
            let m = &hs.members[h];
            let start = if h == root_host { m.iter().position(|&q| q == req.root).unwrap() } else { 0 };
            (0..m.len()).map(|d| m[(start + d) % m.len()]).collect::<Vec<_>>()
        };
        let height = order.iter().enumerate().map(|(q, &h)| q + hs.members[h].len() - 1).max().unwrap_or(0);
        let q = order.iter().position(|&h| h == hs.host).unwrap();
        let mine = chain(hs.host);
        let d = mine.iter().position(|&r| r == req.rank).unwrap();
        let parent = match (d, q) {
            (0, 0) => None,
            (0, _) => Some(chain(order[q - 1])[0]),
            _ => Some(mine[d - 1]),
        };
        let mut children = Vec::new();
        if d == 0 && q + 1 < nh {
            children.push(chain(order[q + 1])[0]);
        }
        if d + 1 < mine.len() {
            children.push(mine[d + 1]);
        }
        Tree { parent, children, depth: q + d, height }
    }
}

/// Element-aligned segments of at least one element (the chain's tunable).
fn segments(req: &PlanRequest, params: &PlanParams) -> (usize, usize) {
    let seg = (params.chain_segment_bytes / req.elem_size).max(1) * req.elem_size;
    let total = req.count * req.elem_size;
    (seg, total.div_ceil(seg))
}

/// Hierarchical broadcast down the tree, pipelined: a rank at depth `d` receives
/// segment `k` in round `k + d - 1` and passes it to all its children (the next
/// leader and the next rank of its host) in round `k + d`; `S + height - 1` rounds.
/// The root copies Input to Output (a no-op in place) and sends from Input; the
/// others receive into Output and forward from there.
pub fn broadcast(req: &PlanRequest<'_>, params: &PlanParams) -> Schedule {
    let tree = Tree::new(req);
    let (seg, nseg) = segments(req, params);
    let total = req.count * req.elem_size;
    let region = |buf, k: usize| Region::new(buf, k * seg, seg.min(total - k * seg));
    let mut b = Builder::new();
    if tree.parent.is_none() {
        b.copy(0, Region::new(BufId::Input, 0, total), Region::new(BufId::Output, 0, total));
    }
    for k in 0..nseg {
        let (t, src) = match tree.parent {
            None => (k, region(BufId::Input, k)),
            Some(p) => {
                b.recv(k + tree.depth - 1, p, region(BufId::Output, k));
                (k + tree.depth, region(BufId::Output, k))
            }
        };
        for &ch in &tree.children {
            b.send(t, ch, src);
        }
    }
    b.finish(Algorithm::Hierarchical, 0, Vec::new())
}

/// Hierarchical reduce up the tree, pipelined: a rank at depth `d` sends segment `k`
/// to its parent in round `k + height - d`, so its children's partials arrive in
/// the round before. The first child's is reduced with the own Input into the
/// accumulator as it arrives; a second child's (a leader hears from the next leader
/// and from its own host) lands in a Scratch slot and is folded in by a local step
/// at the start of the sending round. Accumulators and slots alternate by segment
/// parity, so a round never receives into what it sends. The root accumulates in
/// Output; leaves send their Input untouched.
pub fn reduce(req: &PlanRequest<'_>, params: &PlanParams) -> Schedule {
    let tree = Tree::new(req);
    let (seg, nseg) = segments(req, params);
    let total = req.count * req.elem_size;
    let len = |k: usize| seg.min(total - k * seg);
    let region = |buf, k: usize| Region::new(buf, k * seg, len(k));
    let is_root = tree.parent.is_none();
    // Scratch slot `i` for segment `k`, of parity `k % 2`; slots no longer than the
    // buffer, so a short reduce asks for little scratch.
    let stride = seg.min(total);
    let slot = |i: usize, k: usize| Region::new(BufId::Scratch, (2 * i + k % 2) * stride, len(k));
    let acc = |k| if is_root { region(BufId::Output, k) } else { slot(0, k) };
    let first_tmp = usize::from(!is_root);
    let mut b = Builder::new();
    let mut scratch = 0;
    if tree.children.is_empty() {
        match tree.parent {
            None => b.copy(0, Region::new(BufId::Input, 0, total), Region::new(BufId::Output, 0, total)),
            Some(p) => (0..nseg).for_each(|k| b.send(k + tree.height - tree.depth, p, region(BufId::Input, k))),
        }
    } else {
        for k in 0..nseg {
            let t = k + tree.height - tree.depth;
            b.recv_reduce(t - 1, tree.children[0], region(BufId::Input, k), acc(k));
            for (i, &ch) in tree.children.iter().enumerate().skip(1) {
                let tmp = slot(first_tmp + i - 1, k);
                b.recv(t - 1, ch, tmp);
                b.reduce(t, tmp, acc(k));
                scratch = scratch.max(tmp.end());
            }
            if let Some(p) = tree.parent {
                b.send(t, p, acc(k));
                scratch = scratch.max(acc(k).end());
            }
        }
    }
    let finalize = if is_root { vec![Region::new(BufId::Output, 0, total)] } else { Vec::new() };
    b.finish(Algorithm::Hierarchical, scratch, finalize)
}

#[cfg(test)]
mod tests {
    use super::super::check::check_on;
    use super::super::{plan_ranks, plan_with, Step};
    use super::*;
    use crate::types::OpKind;

    const OPS: [OpKind; 5] =
        [OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter, OpKind::Broadcast, OpKind::Reduce];

    /// Host numbers in order of first appearance, as `PlanRequest::hosts` wants them.
    fn numbered(raw: impl Iterator<Item = usize>) -> Vec<usize> {
        let mut seen = Vec::new();
        raw.map(|h| match seen.iter().position(|&x| x == h) {
            Some(i) => i,
            None => {
                seen.push(h);
                seen.len() - 1
            }
        })
        .collect()
    }

    /// One host; one rank per host; hosts of 2, 3, 4 consecutive ranks (the last one
    /// shorter); ranks interleaved over 2 and 3 hosts; consecutive hosts of 3, 1, 2,
    /// 3, 1, 2... ranks (`[0,0,0,1,2,2]` for 6); and uneven interleaved hosts.
    fn layouts(n: usize) -> Vec<Vec<usize>> {
        let sizes = [3, 1, 2];
        let mut uneven = Vec::new();
        for h in 0.. {
            if uneven.len() >= n {
                break;
            }
            uneven.extend(std::iter::repeat_n(h, sizes[h % 3]));
        }
        uneven.truncate(n);
        let mut out = vec![vec![0; n], (0..n).collect()];
        out.extend([2, 3, 4].map(|b| (0..n).map(|r| r / b).collect()));
        out.extend([2, 3].map(|h| (0..n).map(|r| r % h).collect()));
        out.push(uneven);
        out.push(numbered((0..n).map(|r| (r * r + r / 2) % 4)));
        out
    }

    use super::super::tests::counts;

    fn params(seg: usize) -> PlanParams {
        PlanParams { chain_segment_bytes: seg, ..PlanParams::default() }
    }

    fn sweep(ops: &[OpKind]) {
        for n in 1..=24 {
            for hosts in layouts(n) {
                for &op in ops {
                    let roots: &[usize] = if op.rooted() { &[0, n / 2, n - 1] } else { &[0] };
                    // The segment size is a tunable of the rooted ops and of all-reduce
                    // (which cuts long messages into pieces of four segments).
                    let tuned = op.rooted() || op == OpKind::AllReduce;
                    let segs: &[usize] = if tuned { &[1, 8, 512 * 1024] } else { &[512 * 1024] };
                    for count in counts(n) {
                        for es in [1, 4] {
                            for &root in roots {
                                for &seg in segs {
                                    let alg = Some(Algorithm::Hierarchical);
                                    if let Err(e) = check_on(op, &hosts, count, es, root, alg, &params(seg)) {
                                        panic!("hosts={hosts:?} count={count} es={es} root={root} seg={seg}: {e}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn sweep_all_reduce() {
        sweep(&[OpKind::AllReduce]);
    }

    #[test]
    fn sweep_all_gather() {
        sweep(&[OpKind::AllGather]);
    }

    #[test]
    fn sweep_reduce_scatter() {
        sweep(&[OpKind::ReduceScatter]);
    }

    #[test]
    fn sweep_broadcast() {
        sweep(&[OpKind::Broadcast]);
    }

    #[test]
    fn sweep_reduce() {
        sweep(&[OpKind::Reduce]);
    }

    #[test]
    fn larger_worlds_and_odd_layouts() {
        let p = params(8);
        let layouts: Vec<Vec<usize>> = vec![
            (0..65).map(|r| r / 8).collect(),
            (0..65).map(|r| r % 5).collect(),
            numbered((0..70).map(|r| (r * 7) % 11 % 6)),
            (0..40).map(|r| usize::from(r > 0)).collect(),
            (0..40usize).map(|r| r.saturating_sub(36)).collect(),
        ];
        for hosts in &layouts {
            let n = hosts.len();
            for op in OPS {
                for root in [0, n / 2, n - 1] {
                    check_on(op, hosts, 2 * n + 3, 2, root, Some(Algorithm::Hierarchical), &p)
                        .unwrap_or_else(|e| panic!("hosts={hosts:?}: {e}"));
                }
            }
        }
    }

    fn schedules(op: OpKind, hosts: &[usize], count: usize, root: usize, p: &PlanParams) -> Vec<Schedule> {
        let algorithm = Some(Algorithm::Hierarchical);
        let req =
            PlanRequest { op, rank: 0, world: hosts.len(), count, elem_size: 4, root, algorithm, hosts, blocks: None };
        plan_ranks(&req, p).unwrap()
    }

    /// Bytes each rank sends to ranks on other hosts.
    fn cross_bytes(scheds: &[Schedule], hosts: &[usize]) -> Vec<usize> {
        let host = |r: usize| hosts.get(r).copied().unwrap_or(0);
        (0..scheds.len())
            .map(|rank| {
                let steps = scheds[rank].rounds.iter().flat_map(|r| &r.steps);
                steps
                    .map(|s| match *s {
                        Step::Send { peer, src } if host(peer) != host(rank) => src.len,
                        Step::RecvReduceSend { to, dst, .. } if host(to) != host(rank) => dst.len,
                        _ => 0,
                    })
                    .sum()
            })
            .collect()
    }

    #[test]
    fn long_all_reduce_is_pipelined_across_the_two_levels() {
        // 2 hosts x 2 ranks, 8 pieces of one round per phase: 8 + 2 rounds, and in
        // the middle rounds every rank moves data inside its host and across at once.
        let hosts = [0, 0, 1, 1];
        let p = PlanParams { chain_segment_bytes: 1024, ..PlanParams::default() };
        let s = schedules(OpKind::AllReduce, &hosts, 8 * 4 * 1024, 0, &p);
        for (r, sched) in s.iter().enumerate() {
            assert_eq!(sched.rounds.len(), MAX_PIECES + 2, "rank {r}");
            for (t, round) in sched.rounds.iter().enumerate().take(MAX_PIECES).skip(2) {
                let peers: Vec<usize> = round.steps.iter().filter_map(|s| s.peer()).collect();
                let inside = peers.iter().any(|&q| hosts[q] == hosts[r]);
                let across = peers.iter().any(|&q| hosts[q] != hosts[r]);
                assert!(inside && across, "rank {r} round {t}: peers {peers:?}");
            }
        }
        // The bytes crossing hosts are those of the unpipelined schedule.
        let whole = schedules(OpKind::AllReduce, &hosts, 8 * 4 * 1024, 0, &PlanParams::default());
        assert_eq!(cross_bytes(&s, &hosts), cross_bytes(&whole, &hosts));
        assert_eq!(whole[0].rounds.len(), 3);
    }

    #[test]
    fn all_reduce_sends_a_lane_share_across_hosts() {
        // 2 hosts x 4 ranks: each rank sends 2 (H-1)/H * bytes / L across hosts.
        let (hosts, count, p) = ([0, 0, 0, 0, 1, 1, 1, 1], 4000, PlanParams::default());
        let bytes = count * 4;
        let s = schedules(OpKind::AllReduce, &hosts, count, 0, &p);
        for (r, &x) in cross_bytes(&s, &hosts).iter().enumerate() {
            assert_eq!(x, bytes / 4, "rank {r}");
            assert_eq!(s[r].rounds.len(), 3 + 1 + 3, "rank {r}");
        }
        // A flat ring in rank order over interleaved hosts crosses on every hop.
        let interleaved = [0, 1, 0, 1, 0, 1, 0, 1];
        let algorithm = Some(Algorithm::Ring);
        let req = PlanRequest {
            op: OpKind::AllReduce,
            rank: 0,
            world: 8,
            count,
            elem_size: 4,
            root: 0,
            algorithm,
            hosts: &[],
            blocks: None,
        };
        let flat = plan_ranks(&req, &p).unwrap();
        for x in cross_bytes(&flat, &interleaved) {
            assert_eq!(x, 2 * 7 * bytes / 8);
            assert!(x >= 7 * bytes / 4);
        }
        // The same layout interleaved: the hierarchical schedule still sends a lane's share.
        let s = schedules(OpKind::AllReduce, &interleaved, count, 0, &p);
        assert!(cross_bytes(&s, &interleaved).iter().all(|&x| x == bytes / 4));
        // 3 hosts x 4 ranks: 2 * 2/3 * bytes / 4, give or take an element per sub-chunk.
        let hosts: Vec<usize> = (0..12).map(|r| r / 4).collect();
        let s = schedules(OpKind::AllReduce, &hosts, 1201, 0, &p);
        for x in cross_bytes(&s, &hosts) {
            let ideal = 2.0 * 2.0 / 3.0 * 1201.0 * 4.0 / 4.0;
            assert!((x as f64 - ideal).abs() <= 4.0 * 4.0, "{x} vs {ideal}");
        }
    }

    #[test]
    fn uneven_hosts_spread_the_inter_host_share() {
        // Hosts of 3, 1 and 2 ranks: every host sends 2 (H-1)/H of the buffer across,
        // about, in all (the minimum for rings); the host of 3 over three ranks.
        let hosts = [0, 0, 0, 1, 2, 2];
        let count = 3000;
        let s = schedules(OpKind::AllReduce, &hosts, count, 0, &PlanParams::default());
        let x = cross_bytes(&s, &hosts);
        let per_host = |h| (0..6).filter(|&r| hosts[r] == h).map(|r| x[r]).sum::<usize>();
        for h in 0..3 {
            assert!(per_host(h).abs_diff(2 * 2 * count * 4 / 3) <= 6 * 4, "host {h}: {x:?}");
        }
        assert_eq!(x[0], x[1]);
        assert_eq!(x[1], x[2]);
        // All-gather: every block enters every other host exactly once.
        let s = schedules(OpKind::AllGather, &hosts, count, 0, &PlanParams::default());
        let x = cross_bytes(&s, &hosts);
        assert_eq!(x.iter().sum::<usize>(), 2 * 6 * count * 4);
    }

    #[test]
    fn gather_and_scatter_cross_once_per_block() {
        // Equal hosts: every rank sends (H-1) blocks across, nothing more.
        for hosts in [vec![0, 0, 0, 1, 1, 1, 2, 2, 2], vec![0, 1, 2, 3, 0, 1, 2, 3]] {
            let nh = hosts.iter().max().unwrap() + 1;
            for op in [OpKind::AllGather, OpKind::ReduceScatter] {
                let s = schedules(op, &hosts, 50, 0, &PlanParams::default());
                for x in cross_bytes(&s, &hosts) {
                    assert_eq!(x, (nh - 1) * 50 * 4, "{op} {hosts:?}");
                }
            }
        }
    }

    #[test]
    fn rooted_ops_cross_each_host_once_and_pipeline_both_levels() {
        // 3 hosts of 4: the buffer enters each other host once; leaders hand segments
        // into their host while the leaders' chain goes on, so rounds are
        // S + height - 1 with height = (H - 1) + (L - 1).
        let hosts: Vec<usize> = (0..12).map(|r| r % 3).collect();
        let p = params(64);
        for root in [0, 5, 11] {
            for op in [OpKind::Broadcast, OpKind::Reduce] {
                let s = schedules(op, &hosts, 160, root, &p);
                let x = cross_bytes(&s, &hosts);
                assert_eq!(x.iter().sum::<usize>(), 2 * 640, "{op} root {root}");
                assert_eq!(x.iter().filter(|&&b| b > 0).count(), 2, "{op} root {root}");
                let rounds = s.iter().map(|s| s.rounds.len()).max().unwrap();
                let extra = usize::from(op == OpKind::Reduce); // the root's last local fold
                assert_eq!(rounds, 10 + 2 + 3 - 1 + extra, "{op} root {root}");
                assert!(s.iter().all(|s| s.scratch_bytes <= 4 * 64));
            }
        }
        // A short reduce asks for scratch in proportion to its buffer, not the segment.
        let s = schedules(OpKind::Reduce, &hosts, 5, 0, &PlanParams::default());
        assert!(s.iter().all(|s| s.scratch_bytes <= 4 * 20), "{:?}", s.iter().map(|s| s.scratch_bytes));
    }

    #[test]
    fn one_level_rooted_ops_are_the_chain() {
        let p = params(8);
        for n in 1..=9 {
            for hosts in [vec![], vec![0; n], (0..n).collect()] {
                for op in [OpKind::Broadcast, OpKind::Reduce] {
                    for (rank, root) in (0..n).flat_map(|r| [(r, 0), (r, n / 2), (r, n - 1)]) {
                        let req = PlanRequest {
                            op,
                            rank,
                            world: n,
                            count: 3 * n + 2,
                            elem_size: 4,
                            root,
                            algorithm: Some(Algorithm::Chain),
                            hosts: &hosts,
                            blocks: None,
                        };
                        let mut chain = plan_with(&req, &p).unwrap();
                        chain.algorithm = Algorithm::Hierarchical;
                        let hier = plan_with(&PlanRequest { algorithm: Some(Algorithm::Hierarchical), ..req }, &p);
                        assert_eq!(hier.unwrap(), chain, "{op} n={n} hosts={hosts:?} rank {rank} root {root}");
                    }
                }
            }
        }
    }

    #[test]
    fn one_level_layouts_are_the_flat_ring() {
        let p = PlanParams::default();
        for n in 1..=9 {
            for hosts in [vec![], vec![0; n], (0..n).collect()] {
                for op in [OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter] {
                    for rank in 0..n {
                        let req = PlanRequest {
                            op,
                            rank,
                            world: n,
                            count: 3 * n + 2,
                            elem_size: 4,
                            root: 0,
                            algorithm: Some(Algorithm::Ring),
                            hosts: &hosts,
                            blocks: None,
                        };
                        let mut ring = plan_with(&req, &p).unwrap();
                        ring.algorithm = Algorithm::Hierarchical;
                        let hier = plan_with(&PlanRequest { algorithm: Some(Algorithm::Hierarchical), ..req }, &p);
                        assert_eq!(hier.unwrap(), ring, "{op} n={n} hosts={hosts:?} rank {rank}");
                    }
                }
            }
        }
    }
}
