//! The `*v` collectives: all-gather-v, reduce-scatter-v and all-to-all-v, whose
//! blocks differ in size by rank ([`VBlocks`]). Regions address each block where
//! its displacement puts it, so nothing is packed or unpacked around the schedule.
//!
//! Unlike the fixed-size planners, a transfer of an empty block is still sent, as
//! an empty frame: ranks that disagree on a block's size then fail on the length
//! check of that frame (naming the peer and both sizes) instead of one of them
//! skipping a message the other waits for, or leaving one for the next call.
//!
//! - Ring (all-gather-v, reduce-scatter-v): the fixed-size ring with block `j` of
//!   its own size; `n - 1` rounds, each rank sends every block once.
//! - Direct (all-gather-v, reduce-scatter-v): one exchange round with every peer,
//!   then (reduce-scatter-v) a local fold in rank order.
//! - Pairwise (all-to-all-v): in round `k - 1` send to `r + k`, receive from `r - k`.

use super::builder::Builder;
use super::direct::{fold_in_rank_order, slot};
use super::ring::Ring;
use super::{Algorithm, BufId, PlanRequest, Region, Schedule, Step, VBlocks};
use crate::types::OpKind;

/// Block `j` of `buf` as a byte region.
fn block(buf: BufId, counts: &[usize], displs: &[usize], es: usize, j: usize) -> Region {
    Region::new(buf, displs[j] * es, counts[j] * es)
}

/// A send that is sent even when empty (see the module notes).
fn send(b: &mut Builder, t: usize, peer: usize, src: Region) {
    b.push_empty(t, Step::Send { peer, src });
}

/// A receive that is posted even when empty.
fn recv(b: &mut Builder, t: usize, peer: usize, dst: Region) {
    b.push_empty(t, Step::Recv { peer, dst });
}

/// The blocks of `req`: the planner entry points check they are there.
fn blocks<'a>(req: &PlanRequest<'a>) -> VBlocks<'a> {
    req.blocks.unwrap_or_default()
}

/// Direct all-gather-v: copy the own Input into Output block `r`, send it to every
/// peer and receive each peer's block into its place, in one round.
pub fn all_gather_direct(req: &PlanRequest) -> Schedule {
    let (n, r, es, v) = (req.world, req.rank, req.elem_size, blocks(req));
    let out = |j| block(BufId::Output, v.recv_counts, v.recv_displs, es, j);
    let input = Region::new(BufId::Input, 0, v.recv_counts[r] * es);
    let mut b = Builder::new();
    b.copy(0, input, out(r));
    for p in (0..n).filter(|&p| p != r) {
        send(&mut b, 0, p, input);
        recv(&mut b, 0, p, out(p));
    }
    b.finish(Algorithm::Direct, 0, Vec::new())
}

/// Ring all-gather-v over [`PlanRequest::ring_order`]: in round `s`, ring position
/// `p` sends the block of position `p - s` (its own in round 0, else the one it
/// received the round before) and receives that of `p - s - 1`.
pub fn all_gather_ring(req: &PlanRequest) -> Schedule {
    let (n, r, es, v) = (req.world, req.rank, req.elem_size, blocks(req));
    let order = req.ring_order();
    let ring = Ring::new(&order, r);
    let out = |pos: usize| block(BufId::Output, v.recv_counts, v.recv_displs, es, order[pos]);
    let mut b = Builder::new();
    b.copy(
        0,
        Region::new(BufId::Input, 0, v.recv_counts[r] * es),
        block(BufId::Output, v.recv_counts, v.recv_displs, es, r),
    );
    for s in 0..n - 1 {
        send(&mut b, s, ring.right(), out(ring.seg(0, s)));
        recv(&mut b, s, ring.left(), out(ring.seg(0, s + 1)));
    }
    b.finish(Algorithm::Ring, 0, Vec::new())
}

/// Direct reduce-scatter-v: round 0 sends Input block `j` to rank `j` and receives
/// block `r` from every peer into a Scratch slot; round 1 folds them with the own
/// Input block `r` in rank order into Output (safe in place, see
/// [`fold_in_rank_order`]). Scratch: `(n - 1)` blocks of `r`'s size.
pub fn reduce_scatter_direct(req: &PlanRequest) -> Schedule {
    let (n, r, es, v) = (req.world, req.rank, req.elem_size, blocks(req));
    let input = |j| block(BufId::Input, v.send_counts, v.send_displs, es, j);
    let bytes = v.send_counts[r] * es;
    let output = Region::new(BufId::Output, 0, bytes);
    let scratch = |p: usize| Region::new(BufId::Scratch, slot(r, p) * bytes, bytes);
    let mut b = Builder::new();
    for p in (0..n).filter(|&p| p != r) {
        send(&mut b, 0, p, input(p));
        recv(&mut b, 0, p, scratch(p));
    }
    let t = usize::from(n > 1);
    fold_in_rank_order(&mut b, t, r, n, |p| if p == r { input(r) } else { scratch(p) }, output);
    b.finish(Algorithm::Direct, (n - 1) * bytes, vec![output])
}

/// Ring reduce-scatter-v: the fixed-size ring's rounds (see `ring::reduce_scatter`)
/// with blocks of their own sizes. In round `s`, ring position `p` sends the block
/// of position `p - s - 1` (its Input block in round 0, else the partial it
/// received the round before) and receives that of `p - s - 2`, reduced with its
/// Input block into a Scratch slot (two, alternating, each as large as the largest
/// block), and in the last round straight into Output. Input block `r` is read
/// only by that last step, which keeps the in-place call safe.
pub fn reduce_scatter_ring(req: &PlanRequest) -> Schedule {
    let (n, r, es, v) = (req.world, req.rank, req.elem_size, blocks(req));
    let order = req.ring_order();
    let ring = Ring::new(&order, r);
    let bytes = |pos: usize| v.send_counts[order[pos]] * es;
    let input = |pos: usize| block(BufId::Input, v.send_counts, v.send_displs, es, order[pos]);
    let output = Region::new(BufId::Output, 0, v.send_counts[r] * es);
    let mut b = Builder::new();
    if n == 1 {
        b.copy(0, input(0), output);
        return b.finish(Algorithm::Ring, 0, vec![output]);
    }
    let largest = v.send_counts.iter().max().copied().unwrap_or(0) * es;
    let acc = |s: usize, pos: usize| {
        if s == n - 2 {
            output
        } else {
            Region::new(BufId::Scratch, (s % 2) * largest, bytes(pos))
        }
    };
    for s in 0..n - 1 {
        let sent = ring.seg(0, 1 + s);
        send(&mut b, s, ring.right(), if s == 0 { input(sent) } else { acc(s - 1, sent) });
        let got = ring.seg(0, 2 + s);
        if bytes(got) == 0 {
            recv(&mut b, s, ring.left(), acc(s, got));
        } else {
            b.recv_reduce(s, ring.left(), input(got), acc(s, got));
        }
    }
    b.finish(Algorithm::Ring, (n - 2).min(2) * largest, vec![output])
}

/// Pairwise all-to-all-v: copy Input block `r` to Output block `r`, then in round
/// `k - 1` (k = 1..n-1) send Input block `r + k` to rank `r + k` and receive
/// Output block `r - k` from rank `r - k` (mod `n`).
pub fn all_to_all_pairwise(req: &PlanRequest) -> Schedule {
    let (n, r, es, v) = (req.world, req.rank, req.elem_size, blocks(req));
    let input = |j| block(BufId::Input, v.send_counts, v.send_displs, es, j);
    let output = |j| block(BufId::Output, v.recv_counts, v.recv_displs, es, j);
    let mut b = Builder::new();
    b.copy(0, input(r), output(r));
    for k in 1..n {
        let (to, from) = ((r + k) % n, (r + n - k) % n);
        send(&mut b, k - 1, to, input(to));
        recv(&mut b, k - 1, from, output(from));
    }
    b.finish(Algorithm::Pairwise, 0, Vec::new())
}

/// Why `req`'s blocks cannot be planned, if they cannot: every list the op reads
/// has one entry per rank, and every buffer's extent fits in bytes.
pub(crate) fn invalid(req: &PlanRequest) -> Option<String> {
    let op = req.op;
    let Some(v) = req.blocks else {
        return Some(format!("{op} needs its per-rank counts"));
    };
    let (send, recv) = match op {
        OpKind::AllGatherV => (false, true),
        OpKind::ReduceScatterV => (true, false),
        _ => (true, true),
    };
    let lists = [("send", send, v.send_counts, v.send_displs), ("recv", recv, v.recv_counts, v.recv_displs)];
    for (what, _, counts, displs) in lists.into_iter().filter(|l| l.1) {
        if counts.len() != req.world || displs.len() != req.world {
            return Some(format!(
                "{op}: {} {what} counts and {} displacements for a world of {}",
                counts.len(),
                displs.len(),
                req.world
            ));
        }
        if VBlocks::extent(counts, displs).and_then(|e| e.checked_mul(req.elem_size)).is_none() {
            return Some(format!("{op}: {what} blocks overflow the address space"));
        }
    }
    if op == OpKind::AllToAllV && v.send_counts[req.rank] != v.recv_counts[req.rank] {
        return Some(format!(
            "{op}: rank {} sends itself {} elements but expects {}",
            req.rank, v.send_counts[req.rank], v.recv_counts[req.rank]
        ));
    }
    None
}

#[cfg(test)]
#[path = "vblocks_tests.rs"]
mod tests;
