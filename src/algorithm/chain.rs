//! Pipelined chain planners for rooted ops. Ranks form the chain
//! `root, root + 1, ..., root - 1` (mod n); the buffer is cut into segments of
//! [`PlanParams::chain_segment_bytes`] so that, once the pipeline is full, every link
//! of the chain carries a different segment in the same round. Rounds are aligned
//! across ranks: a segment moves one hop per round, so `S` segments over `n` ranks
//! take `S + n - 2` rounds and each rank sends each byte once.

use super::builder::Builder;
use super::{Algorithm, BufId, PlanParams, PlanRequest, Region, Schedule};

/// Segment geometry of one chain: element-aligned segments of `seg` bytes (the last
/// one shorter) covering `total` bytes.
struct Segments {
    seg: usize,
    total: usize,
}

impl Segments {
    fn new(req: &PlanRequest, params: &PlanParams) -> Segments {
        let es = req.elem_size;
        // At least one element per segment, whatever the tunable says.
        let seg = (params.chain_segment_bytes / es).max(1) * es;
        Segments { seg, total: req.count * es }
    }
    fn count(&self) -> usize {
        self.total.div_ceil(self.seg)
    }
    /// Segment `k` of `buf`.
    fn region(&self, buf: BufId, k: usize) -> Region {
        let off = k * self.seg;
        Region::new(buf, off, self.seg.min(self.total - off))
    }
}

/// Chain broadcast. Position `p` (distance from the root along the chain) receives
/// segment `k` in round `k + p - 1` and forwards it in round `k + p`, so in round `t`
/// it receives segment `t - p + 1` while sending segment `t - p`. The root copies
/// Input to Output (a no-op in place) and sends from Input; the others receive into
/// Output and forward from there.
pub fn broadcast(req: &PlanRequest, params: &PlanParams) -> Schedule {
    let (n, r) = (req.world, req.rank);
    let segs = Segments::new(req, params);
    let pos = (r + n - req.root) % n;
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let mut b = Builder::new();
    for k in 0..segs.count() {
        if pos == 0 {
            if k == 0 {
                b.copy(0, Region::new(BufId::Input, 0, segs.total), Region::new(BufId::Output, 0, segs.total));
            }
            if n > 1 {
                b.send(k, next, segs.region(BufId::Input, k));
            }
        } else {
            b.recv(k + pos - 1, prev, segs.region(BufId::Output, k));
            if pos + 1 < n {
                b.send(k + pos, next, segs.region(BufId::Output, k));
            }
        }
    }
    b.finish(Algorithm::Chain, 0, Vec::new())
}

/// Chain reduce toward the root: the tail of the chain (the rank just before the
/// root) sends its raw Input segments; each middle rank, at distance `q` from the
/// tail, receives segment `k` in round `k + q - 1`, reduces it with its own Input
/// into one of two Scratch slots (alternating, so the slot being sent is never the
/// slot being received into), and sends the partial on in round `k + q`. The root
/// reduces the last hop with its Input straight into Output. Scratch on middle
/// ranks: two segments.
pub fn reduce(req: &PlanRequest, params: &PlanParams) -> Schedule {
    let (n, r) = (req.world, req.rank);
    let segs = Segments::new(req, params);
    let whole = |buf| Region::new(buf, 0, segs.total);
    let mut b = Builder::new();
    if n == 1 {
        b.copy(0, whole(BufId::Input), whole(BufId::Output));
        return b.finish(Algorithm::Chain, 0, vec![whole(BufId::Output)]);
    }
    let pos = (r + n - req.root) % n;
    let q = n - 1 - pos;
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let nseg = segs.count();
    let slot = |k: usize| {
        let seg = segs.region(BufId::Scratch, k);
        Region::new(BufId::Scratch, (k % 2) * segs.seg, seg.len)
    };
    let mut scratch = 0;
    for k in 0..nseg {
        if q == 0 {
            b.send(k, prev, segs.region(BufId::Input, k));
        } else if pos == 0 {
            b.recv_reduce(k + q - 1, next, segs.region(BufId::Input, k), segs.region(BufId::Output, k));
        } else {
            b.recv_reduce(k + q - 1, next, segs.region(BufId::Input, k), slot(k));
            b.send(k + q, prev, slot(k));
            scratch = scratch.max(slot(k).end());
        }
    }
    let finalize = if pos == 0 { vec![whole(BufId::Output)] } else { Vec::new() };
    b.finish(Algorithm::Chain, scratch, finalize)
}
