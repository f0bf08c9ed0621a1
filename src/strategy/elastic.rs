//! Elastic synchronous training: a [`MultiWorkerMirrored`] that loses workers
//! goes on with the survivors, losing no step (issue 38).
//!
//! When a step fails (a peer died, or aborted), the survivors shrink the
//! communicator ([`crate::Communicator::shrink`]) and find out how far each got. A
//! worker can be at most one step ahead of another: it completed step `s` (its
//! all-reduce delivered every bucket before the loss) while another's step `s`
//! failed, and then its own step `s + 1` failed, since that needs the other. So:
//!
//! - if every survivor completed the same steps, all redo the failed one;
//! - otherwise the first survivor that is ahead broadcasts its variables and the
//!   loss of its last step: the ones behind take them as the result of the step
//!   they were in (computed with every replica, as it was), and the ones ahead redo
//!   their failed step, which the ones behind run next.
//!
//! A redone step re-splits the same global batch over the survivors and divides
//! the summed gradient once by the global batch size, so its update is the one a
//! run with that many replicas would make. A failure during the recovery shrinks
//! again; fewer than `min_replicas` survivors end training with an error.

use std::time::{Duration, Instant};

use super::mirrored::{MultiWorkerMirrored, SyncReplica};
use super::{flatten, unflatten, ApplyFn, StepFn, Strategy};
use crate::error::{Error, Result};

/// One recovery from lost workers ([`MultiWorkerMirrored::recoveries`]).
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

impl MultiWorkerMirrored {
    /// Go on without lost workers as long as at least `min_replicas` remain (see
    /// the module docs); without this, a lost worker ends training with the
    /// step's error. `min_replicas` of 0 counts as 1.
    pub fn elastic(mut self, min_replicas: usize) -> MultiWorkerMirrored {
        self.elastic = Some(min_replicas.max(1));
        self
    }

    /// The recoveries so far, oldest first.
    pub fn recoveries(&self) -> &[Recovery] {
        &self.recoveries
    }

    /// Steps this replica completed since it was made.
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// Count a completed step of mean loss `loss`.
    pub(super) fn stepped(&mut self, loss: f64) -> f64 {
        self.steps_done += 1;
        self.last_loss = loss;
        loss
    }

    /// After `cause` failed this replica's step: shrink to the survivors, settle
    /// who is ahead, and finish the step (see the module docs).
    pub(super) fn recover(
        &mut self,
        cause: Error,
        min_replicas: usize,
        global_batch: usize,
        step: &StepFn<'_>,
        apply: &ApplyFn<'_>,
    ) -> Result<f64> {
        let started = Instant::now();
        let failed_step = self.steps_done;
        let before = self.num_replicas_in_sync();
        let mut last_error = cause.to_string();
        tracing::warn!(rank = self.replica.id, step = failed_step, "elastic: step failed, recovering: {cause}");
        loop {
            let small = self.replica.comm().shrink()?;
            let n = small.world_size();
            if n < min_replicas {
                return Err(Error::Broken(format!(
                    "elastic training: {n} replicas left, fewer than the minimum of {min_replicas} \
                     (last failure: {last_error})"
                )));
            }
            let vars = std::mem::take(&mut self.replica.vars);
            self.replica = SyncReplica::with_vars(small, vars, super::CrossReplica::AllReduce, self.fusion);
            match self.settle(global_batch, step, apply) {
                Ok((loss, adopted)) => {
                    self.recoveries.push(Recovery {
                        step: failed_step,
                        replicas: (before, n),
                        adopted,
                        took: started.elapsed(),
                        cause: cause.to_string(),
                    });
                    tracing::info!(
                        rank = self.replica.id,
                        step = failed_step,
                        replicas = n,
                        adopted,
                        seconds = started.elapsed().as_secs_f64(),
                        "elastic: recovered"
                    );
                    return Ok(loss);
                }
                // Another worker went while recovering: shrink again.
                Err(e) => last_error = e.to_string(),
            }
        }
    }

    /// On the shrunk communicator: compare completed steps, hand the ahead
    /// replica's result to the ones behind, and redo the step where it failed.
    /// The step's mean loss, and whether it was taken from another replica.
    fn settle(&mut self, global_batch: usize, step: &StepFn<'_>, apply: &ApplyFn<'_>) -> Result<(f64, bool)> {
        let comm = self.replica.comm();
        let mut all = vec![0i64; comm.world_size()];
        comm.all_gather(&[self.steps_done as i64], &mut all)?;
        let (least, most) = (all.iter().copied().min().unwrap_or(0), all.iter().copied().max().unwrap_or(0));
        if most > least + 1 {
            return Err(Error::Broken(format!(
                "elastic training: survivors completed between {least} and {most} steps; at most one apart is possible"
            )));
        }
        if most > least {
            let source = all.iter().position(|&s| s == most).unwrap_or(0);
            let mut flat = flatten(&self.replica.vars);
            flat.push(self.last_loss as f32);
            comm.broadcast(&mut flat, source)?;
            let loss = flat.pop().map_or(f64::NAN, f64::from);
            if self.steps_done as i64 == least {
                self.replica.vars = unflatten(&flat, &self.replica.vars);
                return Ok((self.stepped(loss), true));
            }
        }
        let share = self.split_batch(global_batch)[self.replica.id].clone();
        let loss = self.replica.step(share, global_batch, step, apply)?;
        Ok((self.stepped(loss), false))
    }
}

#[cfg(test)]
#[path = "elastic_tests.rs"]
mod tests;
