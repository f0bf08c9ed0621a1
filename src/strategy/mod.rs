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
//! Files: `mod.rs` only re-exports; `base.rs` the trait and shared pieces;
//! `tensors.rs` the tensor helpers; `one_device.rs`; `mirrored.rs` (mirrored and
//! multi-worker); `elastic.rs` (multi-worker going on without lost workers) and
//! `elastic_state.rs` (what it keeps); `central_storage.rs`; `parameter_server.rs`;
//! `sharded.rs`; `checkpoint.rs`.

mod base;
mod central_storage;
mod checkpoint;
pub mod elastic;
mod elastic_state;
mod mirrored;
mod one_device;
mod parameter_server;
mod sharded;
mod tensors;

pub use base::{split_batch, ApplyFn, Gradients, Reduction, Replica, StepFn, Strategy};
pub use central_storage::CentralStorage;
pub use checkpoint::{read_checkpoint, write_checkpoint, Checkpoint};
pub use elastic::Recovery;
pub use mirrored::{CrossReplica, Mirrored, MultiWorkerMirrored};
pub use one_device::OneDevice;
pub use parameter_server::{ParameterServer, ServeReport};
pub use sharded::{Momentum, ShardOptimizer, Sharded};
pub use tensors::Tensors;

#[cfg(test)]
mod sharded_tests;
#[cfg(test)]
mod tests;
