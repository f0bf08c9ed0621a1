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

use super::base::{ApplyFn, StepFn, Strategy};
use super::elastic_state::Joining;
pub use super::elastic_state::Recovery;
use super::mirrored::{MultiWorkerMirrored, SyncReplica};
use super::tensors::{flatten, unflatten, Tensors};
use crate::comm::Communicator;
use crate::error::{Error, Result};

/// How often rank 0 looks in the store for processes waiting to join.
const JOIN_POLL: Duration = Duration::from_millis(200);

impl MultiWorkerMirrored {
    /// Go on without lost workers as long as at least `min_replicas` remain (see
    /// the module docs); without this, a lost worker ends training with the
    /// step's error. `min_replicas` of 0 counts as 1.
    pub fn elastic(mut self, min_replicas: usize) -> MultiWorkerMirrored {
        self.elastic = Some(min_replicas.max(1));
        self
    }

    /// Take in replacement processes that wait under `name`
    /// ([`MultiWorkerMirrored::join`]): rank 0 looks in the store at most five
    /// times a second and tells the others inside the next step's loss
    /// all-reduce; after that step every replica grows the communicator
    /// ([`Communicator::grow`]) and rank 0 hands the joiners the variables and the
    /// step count. The next step is split over everyone.
    pub fn joinable(mut self, name: &str) -> MultiWorkerMirrored {
        let full = self.num_replicas_in_sync();
        self.joinable =
            Some(Joining { name: name.to_owned(), last_look: Instant::now(), full, hold: None, short_since: None });
        self
    }

    /// After [`joinable`](MultiWorkerMirrored::joinable) (before it, or without
    /// it, this does nothing: there is nowhere to wait): after workers are lost,
    /// rank 0 holds the next step until as many processes wait to join as the job
    /// lost, or `wait` has passed since the loss, and takes in those waiting: a
    /// launcher that restarts lost workers (torchrun's `--max-restarts`) gets them
    /// back at once instead of at the next look. The other replicas wait meanwhile
    /// inside the step's all-reduce, so `wait` is cut to half the communicator's
    /// timeout. Without it, training goes on at once with the survivors.
    pub fn await_replacements(mut self, wait: Duration) -> MultiWorkerMirrored {
        let wait = wait.min(self.replica.comm().timeout() / 2);
        if let Some(j) = &mut self.joinable {
            j.hold = Some(wait);
        }
        self
    }

    /// Take no more joiners ([`crate::Communicator::close_joining`]): processes
    /// still waiting to join fail at once instead of waiting out their timeout.
    /// Call it when training ends; nothing if the replica is not joinable.
    pub fn close_joining(&self) -> Result<()> {
        match &self.joinable {
            Some(j) => self.replica.comm().close_joining(&j.name),
            None => Ok(()),
        }
    }

    /// Join a job whose replicas are [`joinable`](MultiWorkerMirrored::joinable)
    /// under `name`, as a new replica: wait until they take this process in, then
    /// receive the variables (shaped like `like`) and the step count. Train from
    /// step [`steps_done`](MultiWorkerMirrored::steps_done) on.
    /// `comm` is what [`Communicator::join`] returned.
    pub fn join(comm: Communicator, like: Tensors) -> Result<MultiWorkerMirrored> {
        let mut mw = MultiWorkerMirrored::new_unsynced(comm, like)?;
        mw.receive_state()?;
        Ok(mw)
    }

    /// Growths so far: (steps done then, replicas before, after).
    pub fn growths(&self) -> &[(u64, usize, usize)] {
        &self.growths
    }

    /// Rank 0's count of waiting joiners when it is time to look; 0 otherwise.
    /// After a loss, with [`await_replacements`](MultiWorkerMirrored::await_replacements),
    /// it waits here for the replacements (the others wait in the step).
    pub(super) fn joiners_waiting(&mut self) -> Result<f64> {
        let comm = self.replica.comm();
        let n = comm.world_size();
        let Some(j) = &mut self.joinable else { return Ok(0.0) };
        if comm.rank() != 0 {
            return Ok(0.0);
        }
        let missing = j.full.saturating_sub(n);
        if let (Some(hold), Some(since), true) = (j.hold, j.short_since, missing > 0) {
            loop {
                let waiting = comm.pending_joiners(&j.name)?;
                if waiting >= missing || since.elapsed() >= hold {
                    // Wait once per loss: after this, look as usual.
                    j.short_since = None;
                    j.last_look = Instant::now();
                    return Ok(waiting as f64);
                }
                std::thread::sleep(JOIN_POLL.min(hold / 10).max(Duration::from_millis(5)));
            }
        }
        if j.last_look.elapsed() < JOIN_POLL {
            return Ok(0.0);
        }
        j.last_look = Instant::now();
        Ok(comm.pending_joiners(&j.name)? as f64)
    }

    /// After a step: if rank 0 said processes wait, grow to take them in.
    pub(super) fn admit_joiners(&mut self) -> Result<()> {
        let waiting = self.replica.side_sum.round() as usize;
        let Some(j) = &self.joinable else { return Ok(()) };
        if waiting == 0 {
            return Ok(());
        }
        let before = self.num_replicas_in_sync();
        let big = self.replica.comm().grow(&j.name, waiting)?;
        let vars = std::mem::take(&mut self.replica.vars);
        self.replica = SyncReplica::with_vars(big, vars, super::CrossReplica::AllReduce, self.fusion);
        self.send_state()?;
        let after = self.num_replicas_in_sync();
        if let Some(j) = &mut self.joinable {
            j.full = j.full.max(after);
        }
        self.growths.push((self.steps_done, before, after));
        tracing::info!(
            rank = self.replica.id,
            joiners = waiting,
            replicas = self.num_replicas_in_sync(),
            "elastic: grew"
        );
        Ok(())
    }

    /// Rank 0's variables, step count and last loss, to every replica.
    fn send_state(&mut self) -> Result<()> {
        let comm = self.replica.comm();
        let mut flat = flatten(&self.replica.vars);
        comm.broadcast(&mut flat, 0)?;
        let mut counts = [self.steps_done as i64, self.last_loss.to_bits() as i64];
        comm.broadcast(&mut counts, 0)?;
        self.replica.vars = unflatten(&flat, &self.replica.vars);
        self.steps_done = counts[0].max(0) as u64;
        self.last_loss = f64::from_bits(counts[1] as u64);
        Ok(())
    }

    /// A joiner's side of [`MultiWorkerMirrored::send_state`].
    fn receive_state(&mut self) -> Result<()> {
        self.send_state()
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
                    if let Some(j) = &mut self.joinable {
                        j.short_since = Some(started);
                    }
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
