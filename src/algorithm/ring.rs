//! Ring planners: every rank sends only to its right neighbour `(r + 1) % n` and
//! receives only from its left `(r - 1) % n`, one chunk per round. Bandwidth-optimal
//! (each rank sends `(n - 1) / n` of the data per phase) at the price of `n - 1`
//! rounds per phase.

use super::collectives::{chunk, Builder};
use super::{Algorithm, BufId, PlanRequest, Region, Schedule};

/// Ring all-reduce: reduce-scatter over `n` element-aligned chunks (uneven when
/// `count % n != 0`), then all-gather; `2n - 3` rounds.
///
/// In round `s` of the reduce-scatter, rank `r` sends chunk `(r - s) % n` and
/// receives chunk `(r - s - 1) % n`, reducing it with its own Input into Output. The
/// first send of a chunk reads Input; later ones read the partial in Output. Each
/// Input chunk is read at most in the same step that first writes the Output chunk
/// (or before it), so in-place calls are safe. The last reduce-scatter round
/// finishes chunk `(r + 1) % n` and forwards it right as it is reduced (the first
/// all-gather send, fused), and receives the finished chunk `r` from the left in
/// the same round; the remaining `n - 2` rounds circulate the rest.
///
/// With two ranks, in place, that round sends Input chunk `r` and receives the
/// finished chunk `r` into the same bytes. That is safe because the peer forwards
/// each byte only after reducing it, that is after taking this rank's copy of it
/// (the checker verifies this causal pairing rather than rejecting the overlap).
pub fn all_reduce(req: &PlanRequest) -> Schedule {
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
            let send_j = (r + n - s) % n;
            let src = if s == 0 { BufId::Input } else { BufId::Output };
            b.send(s, right, region(src, send_j));
            let recv_j = (r + 2 * n - s - 1) % n;
            let (input, output) = (region(BufId::Input, recv_j), region(BufId::Output, recv_j));
            if s == n - 2 {
                // recv_j == r + 1: finished here, and the first chunk to circulate.
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

/// Ring all-gather: copy the own Input into Output block `r`, then in round `s`
/// send block `(r - s) % n` right and receive block `(r - s - 1) % n` from the left.
/// In place, Input is Output block `r` and the copy is skipped by the executor.
pub fn all_gather(req: &PlanRequest) -> Schedule {
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

/// Ring reduce-scatter: rank `r` ends with block `r` of the reduced Input in Output.
///
/// In round `s`, rank `r` sends block `(r - s - 1) % n` (its raw Input block in
/// round 0, else the partial received the round before) and receives block
/// `(r - s - 2) % n`, reducing it with its Input block. Partials alternate between
/// two Scratch slots so a round never sends the slot it receives into; the last
/// round lands block `r` straight in Output. Input block `r` is read only by that
/// last step, which is what makes the in-place call (Output = Input block `r`) safe.
pub fn reduce_scatter(req: &PlanRequest) -> Schedule {
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
    let scratch = (n - 2).min(2) * bytes;
    b.finish(Algorithm::Ring, scratch, vec![output])
}
