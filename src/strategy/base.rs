//! The [`Strategy`] trait, what a step function sees ([`Replica`]) and returns
//! ([`Gradients`]), and the helpers the strategies share to split a batch and run
//! local replicas. Below every strategy file; above `tensors.rs` and `checkpoint.rs`.

use std::ops::Range;
use std::path::Path;

use super::checkpoint::{read_checkpoint, write_checkpoint, Checkpoint};
use super::tensors::Tensors;
use crate::error::Result;

/// What a replica's step function sees.
pub struct Replica<'a> {
    /// This replica's index among all replicas in sync (`0..replicas`).
    pub id: usize,
    /// Replicas in sync.
    pub replicas: usize,
    /// This replica's examples: a range of indices into the step's global batch.
    pub batch: Range<usize>,
    /// The variables as this replica holds them (every replica's are equal).
    pub vars: &'a Tensors,
}

/// What a replica's step function returns: sums over its examples, not means.
#[derive(Clone, Debug, Default)]
pub struct Gradients {
    /// Sum over this replica's examples of each variable's gradient (same shapes
    /// as the variables).
    pub grads: Tensors,
    /// Sum of the examples' losses.
    pub loss: f64,
}

/// A step function: one replica's gradients.
pub type StepFn<'a> = dyn Fn(&Replica<'_>) -> Gradients + Sync + 'a;
/// An update: apply the global mean gradient to the variables.
pub type ApplyFn<'a> = dyn Fn(&mut Tensors, &Tensors) + Sync + 'a;

/// How [`Strategy::reduce`] combines per-replica values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// The sum over replicas.
    Sum,
    /// The mean over replicas.
    Mean,
}

/// A way to run synchronous or asynchronous data-parallel training.
pub trait Strategy: Send {
    /// Its name, as the example's `--strategy` takes it.
    fn name(&self) -> &'static str;

    /// Replicas that take part in every step (all processes together).
    fn num_replicas_in_sync(&self) -> usize;

    /// The replicas this process runs (indices among all).
    fn local_replicas(&self) -> Range<usize>;

    /// Split a global batch of `global` examples into every replica's share:
    /// contiguous, sizes differing by at most one.
    fn split_batch(&self, global: usize) -> Vec<Range<usize>> {
        split_batch(global, self.num_replicas_in_sync())
    }

    /// One training step over a global batch of `global_batch` examples: `step`
    /// runs on every local replica with its share, the gradient sums meet across
    /// replicas, and `apply` updates the variables with their mean. Returns the
    /// mean loss over the global batch.
    fn step(&mut self, global_batch: usize, step: &StepFn<'_>, apply: &ApplyFn<'_>) -> Result<f64>;

    /// Combine one value per local replica across every replica in sync.
    fn reduce(&mut self, op: Reduction, local: &[f64]) -> Result<f64>;

    /// The variables (every replica's copy is equal; this is the first local one).
    fn variables(&self) -> &Tensors;

    /// Bring [`Strategy::variables`] up to date where they live elsewhere (a
    /// parameter-server worker pulls them); nothing for the synchronous strategies.
    fn sync(&mut self) -> Result<()> {
        Ok(())
    }

    /// Replace the variables on every replica (same shapes as before).
    fn set_variables(&mut self, vars: Tensors) -> Result<()>;

    /// Save the variables and `epoch` to `path` (in a multi-process strategy,
    /// replica 0 writes and every process waits for it).
    fn save(&mut self, path: &Path, epoch: u64) -> Result<()> {
        write_checkpoint(path, &Checkpoint { epoch, vars: self.variables().clone() })
    }

    /// Load what [`Strategy::save`] wrote; returns its epoch.
    fn restore(&mut self, path: &Path) -> Result<u64> {
        let c = read_checkpoint(path, Some(self.variables()))?;
        self.set_variables(c.vars)?;
        Ok(c.epoch)
    }
}

/// Contiguous shares of `global` examples over `replicas`, sizes differing by at
/// most one (the first `global % replicas` get the extra one).
pub fn split_batch(global: usize, replicas: usize) -> Vec<Range<usize>> {
    let replicas = replicas.max(1);
    let (q, r) = (global / replicas, global % replicas);
    let mut start = 0;
    (0..replicas)
        .map(|i| {
            let len = q + usize::from(i < r);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

/// Combine the values of every replica of a process that runs them all
/// (`strategy` names it in the error when the count is wrong).
pub(super) fn combine_local(strategy: &str, op: Reduction, values: &[f64], replicas: usize) -> Result<f64> {
    if values.len() != replicas {
        return Err(crate::Error::InvalidArgument(format!(
            "{strategy} reduce: {} values for {replicas} replicas",
            values.len()
        )));
    }
    let sum: f64 = values.iter().sum();
    Ok(match op {
        Reduction::Sum => sum,
        Reduction::Mean => sum / replicas.max(1) as f64,
    })
}

/// Run `f` on every item, each in a thread of its own (replicas of one process);
/// the first error wins, a panic is an error.
pub(super) fn on_each<W: Send, R: Send>(items: &mut [W], f: impl Fn(&mut W) -> Result<R> + Sync) -> Result<Vec<R>> {
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items.iter_mut().map(|w| s.spawn(move || f(w))).collect();
        let results: Vec<Result<R>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(crate::Error::Broken("a replica's thread panicked".into()))))
            .collect();
        results.into_iter().collect()
    })
}
