//! How far a collective is from the machine: the least memory work one rank must
//! do for a call, this host's copy and reduce rates, and the time those give.
//!
//! A collective on one host moves bytes through memory, so however good its
//! algorithm and protocol, it cannot beat the time its ranks need to copy and
//! reduce what the result requires. [`memory_work`] counts that work: the bytes
//! the collective must copy (read once, write once) and reduce into an
//! accumulator (`acc ⊕= inc`: read two, write one) summed over all ranks, with
//! single-copy access to the peers' data, then spread evenly over the ranks
//! (any rank can do any part: a root's peers can pull, a receiver's peer can
//! push). [`MemoryRates`] are what one rank does while every rank works at once
//! (every rank timing a [`Probe`] together); [`bound_seconds`] is one rank's
//! share at those rates. `braid perf` prints `bound / measured` for every row.
//!
//! The bound is the collective's, not the algorithm's: an algorithm or a protocol
//! that moves more bytes than it must (staging through a ring, a tree that copies
//! the whole message at every level) or leaves ranks idle (a broadcast only its
//! receivers copy) shows as a lower fraction, which is what the column is for.
//! Small calls are bound by latency, not memory: their fraction is tiny and says
//! so.
//!
//! Work per rank, for a call of `S` bytes (nccl-tests' size: the all-gather's
//! output, the reduce-scatter's input, the whole buffer of a root) on `n` ranks:
//!
//! | collective | reduced | copied |
//! |---|---|---|
//! | all-reduce | `(n-1)/n·S` | `(n-1)/n·S` (reduce-scatter, then all-gather); or `(n-1)·S` reduced and nothing copied, whichever is faster |
//! | reduce | `(n-1)/n·S` | `(n-1)/n²·S` (the reduced blocks to the root) |
//! | reduce-scatter | `(n-1)/n·S` | 0 |
//! | all-gather, all-to-all | 0 | `(n-1)/n·S`; `S` out of place (every rank's own block too) |
//! | broadcast | 0 | `(n-1)/n·S`; `S` out of place (the root's own copy too) |
//! | gather, scatter | 0 | `(n-1)/n²·S`; `S/n` out of place (the root's own block too) |
//! | send-recv (every rank sends `S` and receives `S`) | 0 | `S` |
//! | barrier | 0 | 0 |
//!
//! One rank alone moves nothing in place, and copies `S` out of place. The
//! `-v` forms count as their even forms of the same total.

use std::time::Instant;

use crate::types::{DType, OpKind, ReduceOp};

/// The least memory work of the busiest rank in one call, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryWork {
    /// Bytes copied: read once and written once.
    pub copy: f64,
    /// Bytes reduced into an accumulator (`acc ⊕= inc`).
    pub reduce: f64,
}

impl MemoryWork {
    /// Whether the call has no memory work at all (a barrier, one rank in place).
    pub fn is_none(&self) -> bool {
        self.copy <= 0.0 && self.reduce <= 0.0
    }
}

/// What one rank's memory does while every local rank works at once, in bytes per
/// second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryRates {
    /// Bytes one rank copies per second.
    pub copy: f64,
    /// Bytes of accumulator one rank reduces per second.
    pub reduce: f64,
}

/// One rank's share of the least memory work of `op` over `bytes` (nccl-tests'
/// size convention) on `ranks` ranks; `in_place` as the call. The table in the
/// module docs; an all-reduce takes whichever split is faster at `rates`.
pub fn memory_work(op: OpKind, ranks: usize, bytes: usize, in_place: bool, rates: MemoryRates) -> MemoryWork {
    let (n, s) = (ranks.max(1) as f64, bytes as f64);
    let share = (n - 1.0) / n * s;
    let copy = |c: f64| MemoryWork { copy: c, reduce: 0.0 };
    if ranks <= 1 {
        return if in_place || op == OpKind::Barrier { MemoryWork::default() } else { copy(s) };
    }
    match op {
        OpKind::Barrier => MemoryWork::default(),
        OpKind::AllReduce => {
            let split = MemoryWork { copy: share, reduce: share };
            let one_shot = MemoryWork { copy: 0.0, reduce: (n - 1.0) * s };
            if bound_seconds(one_shot, rates) < bound_seconds(split, rates) {
                one_shot
            } else {
                split
            }
        }
        OpKind::Reduce => MemoryWork { copy: share / n, reduce: share },
        OpKind::ReduceScatter | OpKind::ReduceScatterV => MemoryWork { copy: 0.0, reduce: share },
        OpKind::AllGather | OpKind::AllGatherV | OpKind::AllToAll | OpKind::AllToAllV | OpKind::Broadcast => {
            copy(if in_place { share } else { s })
        }
        OpKind::Gather | OpKind::Scatter => copy(if in_place { share / n } else { s / n }),
        OpKind::Send | OpKind::Recv => copy(s),
    }
}

/// Seconds `work` takes at `rates` (copies and reductions one after the other: one
/// rank's memory does one at a time). Zero work takes no time; a zero rate is
/// treated as infinitely slow.
pub fn bound_seconds(work: MemoryWork, rates: MemoryRates) -> f64 {
    let part = |bytes: f64, rate: f64| {
        if bytes <= 0.0 {
            0.0
        } else if rate > 0.0 {
            bytes / rate
        } else {
            f64::INFINITY
        }
    };
    part(work.copy, rates.copy) + part(work.reduce, rates.reduce)
}

/// The fraction of the memory bound a call reached: `bound / measured`, or `None`
/// where the call has no memory work or the time is not positive.
pub fn bound_fraction(work: MemoryWork, rates: MemoryRates, measured_seconds: f64) -> Option<f64> {
    if work.is_none() || measured_seconds <= 0.0 {
        return None;
    }
    Some(bound_seconds(work, rates) / measured_seconds)
}

/// A kernel the probe times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `dst = src`.
    Copy,
    /// `dst = src` with non-temporal stores (x86-64; a plain copy elsewhere), which
    /// skip reading the destination into cache first: the executor's copies of
    /// large messages use them, so the copy rate of a ceiling is the faster of the two.
    StreamCopy,
    /// `dst ⊕= src` in `dtype`, with `op`.
    Reduce(DType, ReduceOp),
}

/// Buffers a rank times [`Kernel`]s over: its own source and destination, written
/// (untouched pages would all read the zero page) with small integers, so sums of
/// any dtype stay finite.
pub struct Probe {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl Probe {
    /// Buffers for kernels over at most `max_bytes`.
    pub fn new(max_bytes: usize) -> Probe {
        Probe { src: vec![1u8; max_bytes], dst: vec![1u8; max_bytes] }
    }

    /// Seconds `reps` runs of `kernel` take over the first `bytes` (rounded down to
    /// whole elements, at most the buffers' size).
    pub fn time(&mut self, kernel: Kernel, bytes: usize, reps: usize) -> f64 {
        let elem = match kernel {
            Kernel::Copy | Kernel::StreamCopy => 1,
            Kernel::Reduce(dtype, _) => dtype.size(),
        };
        let len = bytes.min(self.src.len()) / elem * elem;
        let (dst, src) = (&mut self.dst[..len], &self.src[..len]);
        let t = Instant::now();
        for _ in 0..reps {
            match kernel {
                Kernel::Copy => dst.copy_from_slice(src),
                Kernel::StreamCopy => crate::reduce::copy_nontemporal(dst, src),
                // Whole elements, so this cannot fail; were it to, the time would show
                // a rate with no work done rather than a panic in a measurement.
                Kernel::Reduce(dtype, op) => {
                    let _ = crate::reduce::reduce_inplace(dtype, op, dst, src);
                }
            }
            std::hint::black_box(&mut *dst);
        }
        t.elapsed().as_secs_f64()
    }
}

/// Repetitions of a kernel over `bytes` that cover at least `min_trial_bytes`, so
/// a small size is timed over many runs rather than at the clock's resolution.
pub fn reps_for(bytes: usize, min_trial_bytes: usize) -> usize {
    min_trial_bytes.div_ceil(bytes.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;
    const MIB: usize = 1 << 20;

    fn rates(copy: f64, reduce: f64) -> MemoryRates {
        MemoryRates { copy: copy * GB, reduce: reduce * GB }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
    }

    #[test]
    fn all_reduce_on_two_ranks_reduces_half_and_copies_half() {
        // Copy 8 GB/s, reduce 4 GB/s, 64 MiB: 32 MiB at each rate.
        let r = rates(8.0, 4.0);
        let w = memory_work(OpKind::AllReduce, 2, 64 * MIB, true, r);
        assert_eq!(w, MemoryWork { copy: (32 * MIB) as f64, reduce: (32 * MIB) as f64 });
        let t = bound_seconds(w, r);
        assert!(close(t, (32 * MIB) as f64 / (8.0 * GB) + (32 * MIB) as f64 / (4.0 * GB)), "{t}");
        // busbw at the bound: 2(n-1)/n S / t = 2 / (1/c + 1/r) = 5.33 GB/s.
        let busbw = (64 * MIB) as f64 / t;
        assert!(close(busbw, 2.0 / (1.0 / (8.0 * GB) + 1.0 / (4.0 * GB))), "{busbw}");
    }

    #[test]
    fn all_reduce_takes_the_one_shot_split_when_copies_are_dear() {
        // Copying slower than reducing (made up): reducing everything beats the split
        // at 2 ranks (S/r = 1 s against S/2r + S/2c = 0.5 + 1 s).
        let r = rates(0.5, 1.0);
        let w = memory_work(OpKind::AllReduce, 2, 1_000_000_000, true, r);
        assert_eq!(w, MemoryWork { copy: 0.0, reduce: 1e9 });
        assert!(close(bound_seconds(w, r), 1.0));
        // At 8 ranks the split wins again: 7/8 (1 + 2) = 2.625 s against 7 s.
        let w8 = memory_work(OpKind::AllReduce, 8, 1_000_000_000, true, r);
        assert_eq!(w8, MemoryWork { copy: 0.875e9, reduce: 0.875e9 });
        assert!(close(bound_seconds(w8, r), 2.625));
    }

    #[test]
    fn gathers_copy_the_peers_blocks_and_their_own_out_of_place() {
        let r = rates(10.0, 5.0);
        for op in [OpKind::AllGather, OpKind::AllToAll, OpKind::Broadcast] {
            let in_place = memory_work(op, 4, 4_000, true, r);
            assert_eq!(in_place, MemoryWork { copy: 3_000.0, reduce: 0.0 }, "{op:?}");
            assert!(close(bound_seconds(in_place, r), 3_000.0 / (10.0 * GB)));
            assert_eq!(memory_work(op, 4, 4_000, false, r), MemoryWork { copy: 4_000.0, reduce: 0.0 }, "{op:?}");
        }
        // A root's blocks: 3 of 1000 bytes move in all, 750 per rank; 4000 (1000 per
        // rank) with the root's own block out of place.
        for op in [OpKind::Gather, OpKind::Scatter] {
            assert_eq!(memory_work(op, 4, 4_000, true, r), MemoryWork { copy: 750.0, reduce: 0.0 }, "{op:?}");
            assert_eq!(memory_work(op, 4, 4_000, false, r), MemoryWork { copy: 1_000.0, reduce: 0.0 }, "{op:?}");
        }
    }

    #[test]
    fn reduce_scatter_reduces_every_peer_block_into_its_own() {
        let r = rates(10.0, 5.0);
        let w = memory_work(OpKind::ReduceScatter, 4, 4_000, false, r);
        assert_eq!(w, MemoryWork { copy: 0.0, reduce: 3_000.0 });
        assert!(close(bound_seconds(w, r), 3_000.0 / (5.0 * GB)));
    }

    #[test]
    fn send_recv_copies_everything_and_reduce_only_the_root_blocks() {
        let r = rates(10.0, 5.0);
        assert_eq!(memory_work(OpKind::Send, 3, 1_000, true, r), MemoryWork { copy: 1_000.0, reduce: 0.0 });
        // Reduce at 4 ranks: all-reduce's reductions, but only the 3 reduced blocks
        // other ranks hold go to the root: 3000 bytes, 750 per rank.
        assert_eq!(memory_work(OpKind::Reduce, 4, 4_000, true, r), MemoryWork { copy: 750.0, reduce: 3_000.0 });
    }

    #[test]
    fn no_work_has_no_fraction() {
        let r = rates(10.0, 5.0);
        let barrier = memory_work(OpKind::Barrier, 4, 0, true, r);
        assert!(barrier.is_none());
        assert_eq!(bound_fraction(barrier, r, 1e-6), None);
        // One rank: nothing in place, a copy out of place.
        assert!(memory_work(OpKind::AllReduce, 1, 1_000, true, r).is_none());
        assert_eq!(memory_work(OpKind::AllReduce, 1, 1_000, false, r), MemoryWork { copy: 1_000.0, reduce: 0.0 });
    }

    #[test]
    fn the_fraction_is_bound_over_measured() {
        let r = rates(8.0, 4.0);
        let w = memory_work(OpKind::AllGather, 2, 16 * MIB, true, r);
        let t = bound_seconds(w, r);
        assert!(close(bound_fraction(w, r, 2.0 * t).unwrap(), 0.5));
        assert!(close(bound_fraction(w, r, t).unwrap(), 1.0));
        assert_eq!(bound_fraction(w, r, 0.0), None);
        // A zero rate makes the bound infinite, not a division by zero.
        assert_eq!(bound_seconds(w, rates(0.0, 4.0)), f64::INFINITY);
    }

    #[test]
    fn the_probe_times_work_that_is_done() {
        let mut p = Probe::new(4096);
        assert!(p.time(Kernel::Copy, 4096, 3) > 0.0);
        // Three sums of ones into ones: every f32 of the destination is now 4.
        assert!(p.time(Kernel::Reduce(DType::F32, ReduceOp::Sum), 4096, 3) > 0.0);
        let first = f32::from_ne_bytes(p.dst[..4].try_into().unwrap());
        assert_eq!(first, f32::from_ne_bytes([1, 1, 1, 1]) * 4.0);
        assert_eq!(reps_for(1 << 10, 8 << 20), 8192);
        assert_eq!(reps_for(64 << 20, 8 << 20), 1);
        assert_eq!(reps_for(0, 8), 8);
    }

    #[test]
    fn every_kernel_does_its_work_over_the_bytes_asked() {
        let mut p = Probe::new(1 << 20);
        p.src.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 7) as u8);
        for kernel in [Kernel::Copy, Kernel::StreamCopy] {
            p.dst.fill(9);
            assert!(p.time(kernel, 1000, 2) > 0.0);
            assert_eq!(p.dst[..1000], p.src[..1000], "{kernel:?}");
            assert!(p.dst[1000..].iter().all(|&b| b == 9), "{kernel:?} wrote past the bytes asked");
        }
        p.dst.fill(1);
        p.time(Kernel::Reduce(DType::U8, ReduceOp::Sum), 1000, 3);
        assert!(p.dst[..1000].iter().zip(&p.src).all(|(&d, &s)| d == 1 + 3 * s));
        assert!(p.dst[1000..].iter().all(|&b| b == 1));
    }
}
