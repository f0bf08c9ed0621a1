//! A call's buffer made of separate allocations laid end to end (the fuser's
//! owned tensors), run without packing them into one buffer.
//!
//! The schedule is planned for the whole length as usual, then every step is cut
//! where a segment ends ([`split_schedule`]), so each step names memory inside one
//! segment and the executor and the channels see ordinary contiguous regions.
//! Both ends of a transfer must cut it at the same places. They do when the
//! transfer's two regions lie at the same offset of the same layout on both ranks,
//! which holds for an in-place all-reduce whose transfers all name the caller's
//! buffer (element `i` only ever meets element `i`): [`runs_on_segments`] admits
//! only such schedules. A schedule that moves scratch over the wire would cut its
//! scratch side differently, so the communicator packs for it instead.

use crate::algorithm::{Algorithm, BufId, Region, Round, Schedule, Step};

/// The parts of one logical buffer: part `k` holds bytes
/// `[starts[k], starts[k] + lens[k])` of it, at `ptrs[k]`. Empty parts are left out.
#[derive(Debug, Default)]
pub struct Segments {
    starts: Vec<usize>,
    ptrs: Vec<*mut u8>,
    total: usize,
}

impl Segments {
    /// The parts of `parts`, in order, as one buffer. The pointers are kept raw: the
    /// caller of [`execute`](super::execute) vouches for them as for any buffer.
    pub fn new(parts: &mut [&mut [u8]]) -> Segments {
        let mut s = Segments::default();
        for p in parts.iter_mut().filter(|p| !p.is_empty()) {
            s.starts.push(s.total);
            s.ptrs.push(p.as_mut_ptr());
            s.total += p.len();
        }
        s
    }

    /// Bytes in all parts together.
    pub fn total(&self) -> usize {
        self.total
    }

    /// How many non-empty parts there are.
    pub fn count(&self) -> usize {
        self.starts.len()
    }

    /// One past the last byte of part `k`.
    fn end_of(&self, k: usize) -> usize {
        self.starts.get(k + 1).copied().unwrap_or(self.total)
    }

    /// Where `[offset, offset + len)` of the logical buffer lives, if it lies inside
    /// one part (an empty range anywhere up to the end does).
    pub fn locate(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.total {
            return None;
        }
        if self.starts.is_empty() {
            // Nothing to point at: only empty ranges get here, and they touch nothing.
            return Some(std::ptr::NonNull::dangling().as_ptr());
        }
        // The last part starting at or before `offset` (an empty range at the very
        // end points one past the last part).
        let k = self.starts.partition_point(|&s| s <= offset).saturating_sub(1);
        if end > self.end_of(k) {
            return None;
        }
        // Wrapping: one past a part's end is a valid address to name, not to read.
        Some(self.ptrs[k].wrapping_add(offset - self.starts[k]))
    }

    /// The offsets, relative to `offset`, strictly inside `[offset, offset + len)`
    /// at which a part begins.
    fn cuts_within(&self, offset: usize, len: usize) -> impl Iterator<Item = usize> + '_ {
        let first = self.starts.partition_point(|&s| s <= offset);
        let end = offset.saturating_add(len);
        self.starts[first..].iter().take_while(move |&&s| s < end).map(move |&s| s - offset)
    }

    /// Copy every part, in order, onto the end of `out`.
    pub fn gather_into(&self, out: &mut Vec<u8>) {
        for k in 0..self.count() {
            // SAFETY: part k is `end_of(k) - starts[k]` live bytes (see `new`).
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(self.ptrs[k], self.end_of(k) - self.starts[k]) });
        }
    }

    /// Copy `packed` (laid out as [`gather_into`](Self::gather_into) writes) back
    /// into the parts.
    pub fn scatter_from(&self, packed: &[u8]) {
        for k in 0..self.count() {
            let (lo, hi) = (self.starts[k], self.end_of(k).min(packed.len()));
            if lo < hi {
                // SAFETY: part k is live and at least `hi - lo` bytes long; `packed`
                // is another allocation.
                unsafe { std::ptr::copy_nonoverlapping(packed[lo..hi].as_ptr(), self.ptrs[k], hi - lo) };
            }
        }
    }
}

/// Whether an in-place all-reduce planned with `algorithm` over `world` ranks may
/// run on segments: on every rank its schedule moves only the caller's buffer over
/// the wire, each transfer between the same offsets on both ends (checked for
/// world sizes 1-9 by `the_listed_algorithms_move_every_byte_between_equal_offsets`).
/// It depends on nothing but what every rank agrees on, so all choose alike. (The
/// double binary tree and recursive doubling receive into scratch beyond 2 and 1
/// ranks, and direct everywhere.)
pub fn runs_on_segments(algorithm: Algorithm, world: usize) -> bool {
    match algorithm {
        Algorithm::Ring | Algorithm::HalvingDoubling => true,
        Algorithm::Tree => world <= 2,
        _ => false,
    }
}

/// The regions a step names, in the order [`with_regions`] takes them.
fn regions(step: &Step) -> [Option<Region>; 2] {
    match *step {
        Step::Send { src: r, .. } | Step::Recv { dst: r, .. } => [Some(r), None],
        Step::RecvReduce { src, dst, .. }
        | Step::RecvReduceSend { src, dst, .. }
        | Step::Reduce { src, dst }
        | Step::Copy { src, dst } => [Some(src), Some(dst)],
    }
}

/// `step` with its regions moved to `[cut, cut + len)` of themselves.
fn piece_of(step: &Step, cut: usize, len: usize) -> Step {
    let at = |r: Region| Region::new(r.buf, r.offset + cut, len);
    match *step {
        Step::Send { peer, src } => Step::Send { peer, src: at(src) },
        Step::Recv { peer, dst } => Step::Recv { peer, dst: at(dst) },
        Step::RecvReduce { peer, src, dst } => Step::RecvReduce { peer, src: at(src), dst: at(dst) },
        Step::RecvReduceSend { peer, src, dst, to } => Step::RecvReduceSend { peer, src: at(src), dst: at(dst), to },
        Step::Reduce { src, dst } => Step::Reduce { src: at(src), dst: at(dst) },
        Step::Copy { src, dst } => Step::Copy { src: at(src), dst: at(dst) },
    }
}

/// Relative cut points of region `r` (none for scratch, which is one allocation).
fn cuts_of<'a>(segs: &'a Segments, r: &Region) -> impl Iterator<Item = usize> + 'a {
    let inside = r.buf != BufId::Scratch;
    let (offset, len) = if inside { (r.offset, r.len) } else { (0, 0) };
    segs.cuts_within(offset, len)
}

/// `schedule` with every step, and every finalize region, cut where a part of
/// `segs` begins, so that each names memory inside one part. The steps keep their
/// order (a step's pieces follow each other), so the pieces of a transfer match
/// the peer's pieces one by one.
pub fn split_schedule(schedule: &Schedule, segs: &Segments) -> Schedule {
    let mut cuts = Vec::new();
    let rounds = schedule
        .rounds
        .iter()
        .map(|round| {
            let mut steps = Vec::with_capacity(round.steps.len());
            for step in &round.steps {
                cuts.clear();
                for r in regions(step).iter().flatten() {
                    cuts.extend(cuts_of(segs, r));
                }
                if cuts.is_empty() {
                    steps.push(*step);
                    continue;
                }
                cuts.sort_unstable();
                cuts.dedup();
                let len = regions(step)[0].map_or(0, |r| r.len);
                let mut at = 0;
                for &cut in cuts.iter().chain(std::iter::once(&len)) {
                    steps.push(piece_of(step, at, cut - at));
                    at = cut;
                }
            }
            Round { steps }
        })
        .collect();
    let mut finalize = Vec::with_capacity(schedule.finalize.len());
    for r in &schedule.finalize {
        let mut at = 0;
        for cut in cuts_of(segs, r).chain(std::iter::once(r.len)) {
            finalize.push(Region::new(r.buf, r.offset + at, cut - at));
            at = cut;
        }
    }
    Schedule { algorithm: schedule.algorithm, rounds, scratch_bytes: schedule.scratch_bytes, finalize }
}

#[cfg(test)]
#[path = "segments_tests.rs"]
mod tests;
