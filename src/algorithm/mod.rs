//! Pure planners: `plan(request) -> Schedule`. No I/O, no clock.
//!
//! A [`Schedule`] is plain data: for one rank, an ordered list of [`Round`]s. Within a
//! round, local steps ([`Step::Copy`]) run first in order, then every transfer of the
//! round proceeds concurrently; the round ends when all of its transfers completed.
//! Transfers between one ordered pair of ranks are matched in order, and a message
//! sent in round `t` is always received in round `t` of the receiver (the checker in
//! [`check`] enforces this), which is what makes any schedule deadlock-free on links
//! with bounded buffering.
//!
//! Steps say *what* moves, not *how*: the executor decides whether a receive lands
//! in a staging chunk or straight in place, and how a long transfer is pipelined.

mod agree;
mod bruck;
mod builder;
mod call_sig;
mod chain;
pub mod check;
mod collectives;
mod dbtree;
mod direct;
mod gather;
mod halving_doubling;
mod hier_gather;
mod hierarchical;
mod ordered;
mod pairwise;
mod ring;
mod schedule;
#[cfg(test)]
mod tests;
mod tree;
mod vblocks;
pub(crate) use vblocks::invalid as vblocks_invalid;

pub use agree::with_agreement;
pub use collectives::default_algorithm;
// The plan's data is defined in `schedule`, below the planners, because this file
// calls into them: each file imports one way.
pub use schedule::{algorithms_for, Algorithm, BufId, PlanParams, PlanRequest, Region, Round, Schedule, Step, VBlocks};

/// Plan `req` for its rank. Errors when the algorithm does not implement the op.
pub fn plan(req: &PlanRequest<'_>) -> Result<Schedule, String> {
    plan_with(req, &PlanParams::default())
}

/// Plan every rank of one call: `req` with its `rank` replaced by each rank of the
/// world in turn (`schedules[r]` is rank r's). What the checker, the tuner and the
/// simulator price or prove.
pub fn plan_ranks(req: &PlanRequest<'_>, params: &PlanParams) -> Result<Vec<Schedule>, String> {
    (0..req.world)
        .map(|rank| plan_with(&PlanRequest { rank, ..*req }, params).map_err(|e| format!("rank {rank}: {e}")))
        .collect()
}

/// Plan `req` for its rank with explicit tunables. Errors when the request is
/// malformed (rank or root outside the world, zero element size) or the algorithm
/// does not implement the op.
pub fn plan_with(req: &PlanRequest<'_>, params: &PlanParams) -> Result<Schedule, String> {
    collectives::plan(req, params)
}
