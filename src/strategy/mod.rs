//! Data-parallel strategies modelled on TensorFlow's `tf.distribute`: pick one, and
//! a training step runs the same way on one device, on many threads, on many
//! processes or hosts.
//!
//! A model is a list of f32 tensors ([`Tensors`]). A step hands every replica its
//! share of the global batch ([`Replica`]); the step function returns the *sums*
//! of the per-example gradients and losses over that share ([`Gradients`]); the
//! strategy adds them up across replicas and divides by the global batch size, so
//! every strategy applies the same mean gradient whatever the split (uneven shares
//! included), and the update function (`apply`) runs on that.
//!
//! | strategy | replicas | how gradients meet |
//! |---|---|---|
//! | [`OneDevice`] | 1 | no communication: the reference |
//! | [`Mirrored`] | threads of this process | all-reduce through a [`crate::fusion::Fuser`] (or reduce then broadcast, or hierarchical) |
//! | [`MultiWorkerMirrored`] | one per process, any hosts | all-reduce through a fuser over a store-built communicator |
//! | [`CentralStorage`] | threads of this process | reduced to the one copy of the variables, applied once, new values broadcast |
//! | [`ParameterServer`] | one per process, any hosts | asynchronous: workers push to and pull from the servers' shards, never waiting for each other |
//! | [`Sharded`] | one per process, any hosts | reduce-scatter: each replica updates its shard with its shard of the optimizer state, then all-gather (ZeRO stages 1 and 2) |
//!
//! Files: `mod.rs` the trait and shared pieces; `one_device.rs`; `mirrored.rs`
//! (mirrored and multi-worker); `elastic.rs` (multi-worker going on without lost
//! workers); `central_storage.rs`; `parameter_server.rs`; `sharded.rs`; `checkpoint.rs`.

mod central_storage;
mod checkpoint;
pub mod elastic;
mod mirrored;
mod one_device;
mod parameter_server;
mod sharded;

use std::ops::Range;
use std::path::Path;

pub use central_storage::CentralStorage;
pub use checkpoint::{read_checkpoint, write_checkpoint, Checkpoint};
pub use elastic::Recovery;
pub use mirrored::{CrossReplica, Mirrored, MultiWorkerMirrored};
pub use one_device::OneDevice;
pub use parameter_server::{ParameterServer, ServeReport};
pub use sharded::{Momentum, ShardOptimizer, Sharded};

use crate::error::Result;

/// A model's variables, or their gradients: a list of f32 tensors.
pub type Tensors = Vec<Vec<f32>>;

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
fn combine_local(strategy: &str, op: Reduction, values: &[f64], replicas: usize) -> Result<f64> {
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

/// `grads / count`, in place: the mean gradient from the summed one.
fn scale(grads: &mut Tensors, count: usize) {
    let k = 1.0 / count.max(1) as f32;
    grads.iter_mut().flatten().for_each(|g| *g *= k);
}

/// Every tensor of `t`, end to end.
fn flatten(t: &Tensors) -> Vec<f32> {
    t.iter().flatten().copied().collect()
}

/// Cut `flat` back into tensors of the shapes of `like`.
fn unflatten(flat: &[f32], like: &Tensors) -> Tensors {
    let mut off = 0;
    like.iter()
        .map(|t| {
            let v = flat[off..off + t.len()].to_vec();
            off += t.len();
            v
        })
        .collect()
}

/// Run `f` on every item, each in a thread of its own (replicas of one process);
/// the first error wins, a panic is an error.
fn on_each<W: Send, R: Send>(items: &mut [W], f: impl Fn(&mut W) -> Result<R> + Sync) -> Result<Vec<R>> {
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

/// Whether `a` and `b` have the same shapes.
fn same_shapes(a: &Tensors, b: &Tensors) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.len() == y.len())
}

#[cfg(test)]
mod sharded_tests;
#[cfg(test)]
mod tests;
