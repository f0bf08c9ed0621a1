//! What an elastic [`MultiWorkerMirrored`](super::MultiWorkerMirrored) keeps
//! between steps: where joiners wait ([`Joining`]) and the recoveries so far
//! ([`Recovery`]). Apart from `elastic.rs`, which re-exports them, so that
//! `mirrored.rs` can hold them without naming the file that extends it.

use std::time::{Duration, Instant};

/// Where replacement processes wait to join
/// ([`MultiWorkerMirrored::joinable`](super::MultiWorkerMirrored::joinable)), and
/// how rank 0 looks for them.
pub(super) struct Joining {
    pub(super) name: String,
    /// When rank 0 last read the store.
    pub(super) last_look: Instant,
    /// The most replicas the job had: the count replacements restore.
    pub(super) full: usize,
    /// How long rank 0 holds a step for replacements after a loss, if at all.
    pub(super) hold: Option<Duration>,
    /// Since when the job is short of replicas and rank 0 has not yet held.
    pub(super) short_since: Option<Instant>,
}

/// One recovery from lost workers
/// ([`MultiWorkerMirrored::recoveries`](super::MultiWorkerMirrored::recoveries)).
#[derive(Clone, Debug, PartialEq)]
pub struct Recovery {
    /// The step (counted from 0 over the run) that failed on this replica.
    pub step: u64,
    /// Replicas before and after.
    pub replicas: (usize, usize),
    /// Whether this replica took the step's result from one that was ahead
    /// instead of computing it again.
    pub adopted: bool,
    /// From the failure's error to the step completed on the survivors.
    pub took: Duration,
    /// The error that started it.
    pub cause: String,
}
