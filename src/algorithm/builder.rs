//! What every planner builds with: element chunking and a schedule builder that
//! keeps the invariants the executor and the checker rely on. Below the planners
//! (and the dispatch in `collectives`), above only the plan's data in `schedule`.

use super::{Algorithm, Region, Round, Schedule, Step};

/// Element range `(start, len)` of chunk `j` when `count` elements are split into
/// `parts` chunks as evenly as possible (the first `count % parts` chunks carry one
/// extra element; chunks are empty when `count < parts`).
pub(super) fn chunk(count: usize, parts: usize, j: usize) -> (usize, usize) {
    let (q, r) = (count / parts, count % parts);
    (j * q + j.min(r), q + usize::from(j < r))
}

/// Builds a [`Schedule`] round by round while keeping the invariants: local steps
/// precede transfers within a round, zero-length steps are never emitted (a rank
/// with an empty chunk simply skips, and so does its peer, since both compute the
/// same chunk), and trailing empty rounds are dropped.
pub(super) struct Builder {
    rounds: Vec<Round>,
}

impl Builder {
    pub(super) fn new() -> Builder {
        Builder { rounds: Vec::new() }
    }

    fn round(&mut self, t: usize) -> &mut Round {
        if self.rounds.len() <= t {
            self.rounds.resize_with(t + 1, Round::default);
        }
        &mut self.rounds[t]
    }

    /// Add `step` to round `t` unless it moves no bytes.
    pub(super) fn push(&mut self, t: usize, step: Step) {
        if step_len(&step) > 0 {
            self.round(t).steps.push(step);
        }
    }

    /// Add a zero-length message (barrier) to round `t`.
    pub(super) fn push_empty(&mut self, t: usize, step: Step) {
        self.round(t).steps.push(step);
    }

    /// Add a local `Copy`.
    pub(super) fn copy(&mut self, t: usize, src: Region, dst: Region) {
        self.push(t, Step::Copy { src, dst });
    }

    /// Add a local `Reduce` (`dst = dst ⊕ src`).
    pub(super) fn reduce(&mut self, t: usize, src: Region, dst: Region) {
        self.push(t, Step::Reduce { src, dst });
    }

    /// Add a `Send`.
    pub(super) fn send(&mut self, t: usize, peer: usize, src: Region) {
        self.push(t, Step::Send { peer, src });
    }

    /// Add a `Recv`.
    pub(super) fn recv(&mut self, t: usize, peer: usize, dst: Region) {
        self.push(t, Step::Recv { peer, dst });
    }

    /// Add a `RecvReduce` (`dst = src ⊕ received`).
    pub(super) fn recv_reduce(&mut self, t: usize, peer: usize, src: Region, dst: Region) {
        self.push(t, Step::RecvReduce { peer, src, dst });
    }

    /// Add a `RecvReduceSend` (`dst = src ⊕ received`, then `dst` on to `to`).
    pub(super) fn recv_reduce_send(&mut self, t: usize, peer: usize, src: Region, dst: Region, to: usize) {
        self.push(t, Step::RecvReduceSend { peer, src, dst, to });
    }

    /// The finished schedule. `finalize` regions of length zero are dropped.
    pub(super) fn finish(mut self, algorithm: Algorithm, scratch_bytes: usize, finalize: Vec<Region>) -> Schedule {
        for r in &mut self.rounds {
            // Stable: keeps the order among locals and among transfers.
            r.steps.sort_by_key(|s| s.peer().is_some());
        }
        while self.rounds.last().is_some_and(|r| r.steps.is_empty()) {
            self.rounds.pop();
        }
        Schedule {
            algorithm,
            rounds: self.rounds,
            scratch_bytes,
            finalize: finalize.into_iter().filter(|r| r.len > 0).collect(),
        }
    }
}

/// Bytes a step moves.
fn step_len(s: &Step) -> usize {
    match s {
        Step::Send { src, .. } => src.len,
        Step::Recv { dst, .. }
        | Step::RecvReduce { dst, .. }
        | Step::RecvReduceSend { dst, .. }
        | Step::Reduce { dst, .. }
        | Step::Copy { dst, .. } => dst.len,
    }
}
