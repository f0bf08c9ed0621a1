//! Pairwise exchange (all-to-all) and dissemination (barrier): the two planners in
//! which rank `r` talks to `r + k` and hears from `r - k` with a distance `k` that
//! changes every round.

use super::builder::Builder;
use super::{Algorithm, BufId, PlanRequest, Region, Schedule, Step};

/// Pairwise all-to-all (`count` is the per-peer block): copy Input block `r` to
/// Output block `r`, then in round `k - 1` (k = 1..n-1) send Input block `(r + k) % n`
/// to rank `(r + k) % n` and receive Output block `(r - k) % n` from rank
/// `(r - k) % n`. Each round every rank sends one block and receives one, so no
/// link carries more than one message at a time.
pub fn all_to_all(req: &PlanRequest) -> Schedule {
    let (n, r, bytes) = (req.world, req.rank, req.count * req.elem_size);
    let input = |j: usize| Region::new(BufId::Input, j * bytes, bytes);
    let output = |j: usize| Region::new(BufId::Output, j * bytes, bytes);
    let mut b = Builder::new();
    b.copy(0, input(r), output(r));
    for k in 1..n {
        let (to, from) = ((r + k) % n, (r + n - k) % n);
        b.send(k - 1, to, input(to));
        b.recv(k - 1, from, output(from));
    }
    b.finish(Algorithm::Pairwise, 0, Vec::new())
}

/// Dissemination barrier: `ceil(log2 n)` rounds; in round `k` send a zero-length
/// message to `(r + 2^k) % n` and receive one from `(r - 2^k) % n`. After round `k`
/// every rank has heard (transitively) from the `2^(k+1)` ranks before it, so after
/// the last round from all of them. Uses no buffers.
pub fn barrier(req: &PlanRequest) -> Schedule {
    let (n, r) = (req.world, req.rank);
    let empty = Region::new(BufId::Input, 0, 0);
    let mut b = Builder::new();
    let mut k = 0;
    while (1usize << k) < n {
        let d = 1usize << k;
        b.push_empty(k, Step::Send { peer: (r + d) % n, src: empty });
        b.push_empty(k, Step::Recv { peer: (r + n - d) % n, dst: empty });
        k += 1;
    }
    b.finish(Algorithm::Dissemination, 0, Vec::new())
}
