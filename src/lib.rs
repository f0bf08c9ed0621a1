//! # braid: collective communication for CPU and mixed clusters
//!
//! braid moves and reduces tensors between ranks — threads of one process, processes
//! on one host, or hosts on a network — with the collectives of NCCL, Gloo and MPI:
//! all-reduce, broadcast, all-gather, reduce-scatter, reduce, barrier, all-to-all and
//! point-to-point send/recv, over `f32 f64 f16 bf16 i8 u8 i32 i64` with
//! `sum prod min max avg`.
//!
//! ```text
//!   comm        Communicator: the collective API, async work handles, deadlines,
//!               split, abort
//!     │
//!   tuner/      which algorithm: every allowed candidate priced off its schedules,
//!     │         alpha x steps + beta x bytes + gamma x bytes reduced (BRAID_ALGO)
//!   algorithm/  pure planners: plan(op, rank, world, count, hosts) -> Schedule
//!               (no I/O, no clock)
//!     │
//!   executor    the one place a Schedule meets the peers: rounds, deadlines, errors,
//!               over a PeerChannel per peer (StreamChannel: framing, single copy;
//!               StagedChannel: device regions through host staging, device reductions)
//!     │           device/  what an accelerator must do (Device; SimDevice, CUDA)
//!     │
//!   transport/  a Link per peer: in-process rings, TCP
//!     │
//!   bootstrap/  Store (tcp, file, prefix) for rendezvous; Config from the environment
//! ```
//!
//! Each layer talks only to the one below: an algorithm never sees a socket, and a
//! transport never sees an algorithm.
//!
//! ```no_run
//! use braid::{Communicator, ReduceOp};
//! # fn main() -> braid::Result<()> {
//! // Under `braid run -n 4 ...` (or torchrun-style BRAID_* variables):
//! let comm = Communicator::from_env()?;
//! let mut grads = vec![1.0f32; 1024];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! assert_eq!(grads[0], comm.world_size() as f32);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// Every type a public item mentions can be named from outside the crate.
#![warn(unnameable_types)]

pub mod algorithm;
mod auth;
pub mod bootstrap;
mod comm;
pub mod config;
pub mod device;
mod error;
mod executor;
mod frame;
pub mod placement;
pub mod reduce;
pub mod registered;
mod topology;
mod transport;
pub mod tuner;
mod types;

pub use auth::JobKey;
pub use comm::{Communicator, CommunicatorBuilder, Work};
pub use config::Config;
pub use error::{Error, OpContext, Result};
pub use transport::TransportKind;
pub use types::{CallSig, DType, Element, OpKind, ReduceOp};
