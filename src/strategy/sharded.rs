//! Sharded data parallelism (ZeRO stages 1 and 2, the idea FSDP builds on; none
//! of tf.distribute's strategies has it): one replica per process, as
//! [`MultiWorkerMirrored`](super::MultiWorkerMirrored), but each replica keeps the
//! reduced gradient and the optimizer state of its shard of the variables only.
//!
//! A step: every replica computes the gradient sums of its share of the batch;
//! a reduce-scatter leaves each replica the sums over all replicas for its shard
//! (contiguous, sizes differing by at most one, in the order of the flattened
//! variables); each divides by the global batch once and updates its shard; an
//! all-gather brings every replica the whole new variables. The same step as
//! every other strategy (sum over the global batch, divided once), with a 1/N
//! share of the optimizer state and the reduced gradient per replica.

use std::ops::Range;
use std::path::Path;

use super::base::{split_batch, ApplyFn, Reduction, Replica, StepFn, Strategy};
use super::tensors::{same_shapes, Tensors};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::types::ReduceOp;

/// An update rule that works element by element, so that each replica can run
/// it on its shard with its shard of the state.
pub trait ShardOptimizer: Send + Sync {
    /// State values kept per variable element (0 for plain SGD, 1 for momentum).
    fn state_per_element(&self) -> usize;
    /// Update `params` by the global mean gradient `grads` (same length);
    /// `state` holds `state_per_element() * params.len()` values, this shard's,
    /// zero before the first step.
    fn update(&self, params: &mut [f32], grads: &[f32], state: &mut [f32]);
}

/// SGD with heavy-ball momentum: `v = momentum * v + g; p -= lr * v` (plain SGD,
/// with no state, when `momentum` is 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Momentum {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor.
    pub momentum: f32,
}

impl ShardOptimizer for Momentum {
    fn state_per_element(&self) -> usize {
        usize::from(self.momentum != 0.0)
    }
    fn update(&self, params: &mut [f32], grads: &[f32], state: &mut [f32]) {
        if self.momentum == 0.0 {
            params.iter_mut().zip(grads).for_each(|(p, g)| *p -= self.lr * g);
            return;
        }
        for ((p, g), v) in params.iter_mut().zip(grads).zip(state.iter_mut()) {
            *v = self.momentum * *v + g;
            *p -= self.lr * *v;
        }
    }
}

/// Sharded data parallelism over a communicator (see the module docs).
pub struct Sharded {
    comm: Communicator,
    vars: Tensors,
    /// The variables end to end: this replica updates its shard of it.
    flat: Vec<f32>,
    /// Every replica's shard of `flat`.
    shards: Vec<Range<usize>>,
    /// None: the step's `apply` updates the shard (it must work element by element).
    optimizer: Option<Box<dyn ShardOptimizer>>,
    /// This replica's shard of the optimizer state.
    state: Vec<f32>,
}

impl Sharded {
    /// This process's replica over `comm`, starting from rank 0's `vars`; each
    /// step's `apply` updates this replica's shard, given as one flat tensor (so it
    /// must work element by element and keep no state, as plain SGD).
    pub fn new(comm: Communicator, vars: Tensors) -> Result<Sharded> {
        Sharded::build(comm, vars, None)
    }

    /// [`Sharded::new`] with `optimizer` updating the shard and keeping its state
    /// (the step's `apply` is not called).
    pub fn with_optimizer(comm: Communicator, vars: Tensors, optimizer: Box<dyn ShardOptimizer>) -> Result<Sharded> {
        Sharded::build(comm, vars, Some(optimizer))
    }

    /// [`Sharded::new`] over [`Communicator::from_env`].
    pub fn from_env(vars: Tensors) -> Result<Sharded> {
        Sharded::new(Communicator::from_env()?, vars)
    }

    fn build(comm: Communicator, vars: Tensors, optimizer: Option<Box<dyn ShardOptimizer>>) -> Result<Sharded> {
        let mut flat = super::tensors::flatten(&vars);
        comm.broadcast(&mut flat, 0)?;
        let vars = super::tensors::unflatten(&flat, &vars);
        let shards = split_batch(flat.len(), comm.world_size());
        let mine = shards[comm.rank()].len();
        let state = vec![0.0; optimizer.as_ref().map_or(0, |o| o.state_per_element()) * mine];
        Ok(Sharded { comm, vars, flat, shards, optimizer, state })
    }

    /// The elements of the flattened variables this replica updates.
    pub fn shard(&self) -> Range<usize> {
        self.shards[self.comm.rank()].clone()
    }

    /// Optimizer state values this replica holds (one device would hold
    /// `state_per_element` times every element).
    pub fn optimizer_state_len(&self) -> usize {
        self.state.len()
    }

    /// The job's communicator.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// Where this replica's shard of the optimizer state is saved beside `path`.
    fn state_path(&self, path: &Path) -> std::path::PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".state{}of{}", self.comm.rank(), self.comm.world_size()));
        name.into()
    }

    fn counts(&self) -> Vec<usize> {
        self.shards.iter().map(Range::len).collect()
    }
}

impl Strategy for Sharded {
    fn name(&self) -> &'static str {
        "sharded"
    }
    fn num_replicas_in_sync(&self) -> usize {
        self.comm.world_size()
    }
    fn local_replicas(&self) -> Range<usize> {
        let r = self.comm.rank();
        r..r + 1
    }
    fn step(&mut self, global_batch: usize, step: &StepFn<'_>, apply: &ApplyFn<'_>) -> Result<f64> {
        let (rank, replicas) = (self.comm.rank(), self.comm.world_size());
        let share = split_batch(global_batch, replicas)[rank].clone();
        let g = step(&Replica { id: rank, replicas, batch: share, vars: &self.vars });
        let counts = self.counts();
        let mut mine = vec![0.0f32; counts[rank]];
        if !same_shapes(&g.grads, &self.vars) {
            // Still take part, so the other replicas fail on the mismatch instead
            // of waiting: another call at this turn, and the collectives say so.
            let _ = self.comm.all_reduce_in_place(&mut super::tensors::flatten(&g.grads), ReduceOp::Sum);
            return Err(Error::InvalidArgument(format!(
                "replica {rank}: the step's gradients do not have the variables' shapes"
            )));
        }
        self.comm.reduce_scatter_v(&super::tensors::flatten(&g.grads), &mut mine, &counts, ReduceOp::Sum)?;
        let mut loss = [g.loss];
        self.comm.all_reduce_in_place(&mut loss, ReduceOp::Sum)?;
        let k = 1.0 / global_batch.max(1) as f32;
        mine.iter_mut().for_each(|g| *g *= k);
        let shard = self.shards[rank].clone();
        match &self.optimizer {
            Some(o) => o.update(&mut self.flat[shard], &mine, &mut self.state),
            None => {
                let mut part = vec![self.flat[shard.clone()].to_vec()];
                apply(&mut part, &vec![mine]);
                self.flat[shard].copy_from_slice(&part[0]);
            }
        }
        self.comm.all_gather_v_in_place(&mut self.flat, &counts)?;
        let mut at = 0;
        for t in &mut self.vars {
            let n = t.len();
            t.copy_from_slice(&self.flat[at..at + n]);
            at += n;
        }
        Ok(loss[0] / global_batch.max(1) as f64)
    }
    fn reduce(&mut self, op: Reduction, local: &[f64]) -> Result<f64> {
        let [value] = local else {
            return Err(Error::InvalidArgument(format!("sharded reduce: {} values for 1 local replica", local.len())));
        };
        let mut v = [*value];
        self.comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        Ok(match op {
            Reduction::Sum => v[0],
            Reduction::Mean => v[0] / self.num_replicas_in_sync() as f64,
        })
    }
    fn variables(&self) -> &Tensors {
        &self.vars
    }
    fn set_variables(&mut self, vars: Tensors) -> Result<()> {
        if !same_shapes(&vars, &self.vars) {
            return Err(Error::InvalidArgument("sharded: new variables do not have the old shapes".into()));
        }
        self.flat = super::tensors::flatten(&vars);
        self.vars = vars;
        Ok(())
    }
    /// Replica 0 writes the variables (every replica holds them whole after a
    /// step); each replica with optimizer state writes its shard of it beside them
    /// (`{path}.state{rank}of{replicas}`).
    fn save(&mut self, path: &Path, epoch: u64) -> Result<()> {
        let rank = self.comm.rank();
        let mut written = if rank == 0 {
            super::write_checkpoint(path, &super::Checkpoint { epoch, vars: self.vars.clone() })
        } else {
            Ok(())
        };
        if written.is_ok() && !self.state.is_empty() {
            let state = super::Checkpoint { epoch, vars: vec![self.state.clone()] };
            written = super::write_checkpoint(&self.state_path(path), &state);
        }
        let failed = self.reduce(Reduction::Sum, &[if written.is_ok() { 0.0 } else { 1.0 }])?;
        written?;
        if failed != 0.0 {
            return Err(Error::Broken(format!(
                "a replica could not write its part of the checkpoint {}",
                path.display()
            )));
        }
        Ok(())
    }
    /// The variables, and this replica's shard of the optimizer state when it
    /// keeps one (from a checkpoint of as many replicas, of the same epoch).
    fn restore(&mut self, path: &Path) -> Result<u64> {
        let c = super::read_checkpoint(path, Some(&self.vars))?;
        self.set_variables(c.vars)?;
        if !self.state.is_empty() {
            let like = vec![vec![0.0f32; self.state.len()]];
            let s = super::read_checkpoint(&self.state_path(path), Some(&like))?;
            if s.epoch != c.epoch {
                return Err(Error::InvalidArgument(format!(
                    "sharded restore: the optimizer state beside {} is of epoch {}, the variables of epoch {}",
                    path.display(),
                    s.epoch,
                    c.epoch
                )));
            }
            self.state.copy_from_slice(&s.vars[0]);
        }
        Ok(c.epoch)
    }
}
