//! # braid: collective communication for CPU and mixed clusters
//!
//! braid moves and reduces tensors between ranks — threads of one process, processes
//! on one host, or hosts on a network — with the collectives of NCCL, Gloo and MPI:
//! all-reduce, broadcast, all-gather, reduce-scatter, reduce, barrier, all-to-all and
//! point-to-point send/recv, over `f32 f64 f16 bf16 i8 u8 i32 i64` with
//! `sum prod min max avg`.
//!
//! ```text
//!   strategy/     data-parallel training as tf.distribute has it: OneDevice, Mirrored,
//!     │           MultiWorkerMirrored, CentralStorage, ParameterServer; checkpoints
//!   fusion/       many async all-reduces packed into buckets, one collective each
//!     │
//!   Communicator  the collective API (public, at the crate root): blocking, async
//!     │           (Work), byte-buffer (CallSig) and device-buffer forms; deadlines,
//!     │           split, abort; built from Config / CommunicatorBuilder
//!     │
//!   tuner/        which algorithm: every allowed candidate priced off its schedules,
//!     │           alpha x steps + beta x bytes + gamma x bytes reduced (BRAID_ALGO)
//!   algorithm/    pure planners: plan(op, rank, world, count, hosts) -> Schedule
//!     │           (no I/O, no clock)
//!     │
//!   executor      the one place a Schedule meets the peers: rounds, deadlines, errors,
//!     │           over a channel per peer (framing and single copy over byte-stream
//!     │           links; device regions staged through host memory or copied
//!     │           peer to peer; verbs queue pairs)
//!     │             device/  what an accelerator must do: Device; SimDevice, CUDA
//!     │
//!   transport     a link per peer, the first of shm, rdma, tcp that can reach it
//!     │           (probed, not guessed; restricted by BRAID_TRANSPORTS):
//!     │             in-process   threads of one process, in-memory rings
//!     │             shm          processes of one host, rings in a shared segment,
//!     │                          single copy out of registered buffers
//!     │             tcp          hosts on a network, job-key handshake
//!     │             rdma         RDMA verbs, reliable-connected queue pairs
//!     │                          (feature `rdma`)
//!     │             cuda         GPU buffers: staged over the links above, or read
//!     │                          device to device (CUDA IPC) between ranks whose
//!     │                          GPUs reach each other; a device, not a link
//!     │                          (feature `cuda`, on by default)
//!     │
//!   bootstrap/    Store (tcp, file, memory, prefix) for rendezvous; Config from the
//!                 environment or a launcher (torchrun, Open MPI, Slurm)
//! ```
//!
//! Each layer talks only to the one below: an algorithm never sees a socket, and a
//! transport never sees an algorithm.
//!
//! ## What is public
//!
//! One surface serves Rust users and the C ABI (the `braid-ffi` crate) alike; the
//! layers drawn with a trailing `/` above are public modules, the others are
//! internal and may change in any release.
//!
//! - **The facade, at the crate root**: [`Communicator`], [`CommunicatorBuilder`],
//!   [`Work`], [`Config`], [`Error`] / [`Result`] (with [`OpContext`]), the element
//!   and call types [`DType`], [`ReduceOp`], [`Element`], [`OpKind`], [`CallSig`],
//!   [`TransportKind`] (which transport reaches a peer, and the allow-list of
//!   `BRAID_TRANSPORTS`) and [`JobKey`] (the secret that admits a rank to a job).
//! - [`strategy`] and [`fusion`]: the training layer — strategies behind one
//!   trait, and the fuser their gradients go through.
//! - [`bootstrap`]: the [`Store`](bootstrap::Store) trait and the stores, for
//!   rendezvous through a store of your own or one of braid's.
//! - [`config`]: the typed configuration, its [`Tuning`](config::Tuning) knobs and
//!   the parsers of its environment values (sizes, durations).
//! - [`registered`]: [`SharedBuffer`](registered::SharedBuffer), host memory other
//!   ranks of the host read directly (single copy).
//! - [`device`]: the [`Device`](device::Device) trait and
//!   [`DeviceBuffer`](device::DeviceBuffer) for collectives on accelerator memory,
//!   the CUDA device, and [`SimDevice`](device::SimDevice), a host-memory device for
//!   tests. Public because callers allocate GPU buffers through it and may bring
//!   their own accelerator.
//! - [`algorithm`] and [`tuner`]: the planning API — schedules as plain data, the
//!   checker that proves them, the cost model, `BRAID_ALGO` policies, and what
//!   `braid explain` and `braid simulate` print (choose, rank, price without
//!   running). Public because planning is useful without a communicator, and a
//!   communicator hands out its plans ([`Communicator::plan`]) and its tuner.
//! - [`reduce`]: the vectorised reduction kernels the collectives use, on byte
//!   buffers of any [`DType`], for local reductions.
//! - [`placement`]: the CPU binding policy of `BRAID_BIND` and a description of
//!   this process's affinity.
//!
//! Internal: the executor, wire frames, the transports' links and channels, the
//! job-key handshake and topology discovery. Their tests are unit tests inside the
//! crate.
//!
//! ## Features
//!
//! - `cuda` (default): GPU buffers through CUDA; the driver is loaded at run time, so
//!   the build needs no toolkit, and the reductions are embedded as PTX (NVRTC only
//!   with `BRAID_NVRTC=1`).
//! - `rdma`: the RDMA verbs transport (needs libibverbs and librdmacm to build).
//! - `cli` (default): the `braid` command and its dependencies (clap,
//!   tracing-subscriber, serde_json, plotters). Depend on braid with
//!   `default-features = false` (and `features = ["cuda"]` for GPU buffers) to link
//!   only what the library needs.
//!
//! ## Examples
//!
//! Four ranks as threads of this process (in-memory links; runs anywhere):
//!
//! ```
//! use braid::{Communicator, ReduceOp};
//! let comms = Communicator::in_process(4)?;
//! std::thread::scope(|s| {
//!     let ranks: Vec<_> = comms
//!         .iter()
//!         .map(|comm| s.spawn(move || -> braid::Result<()> {
//!             let mut grads = vec![comm.rank() as f32; 8];
//!             comm.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
//!             assert_eq!(grads, [1.5; 8]); // (0 + 1 + 2 + 3) / 4
//!             Ok(())
//!         }))
//!         .collect();
//!     ranks.into_iter().try_for_each(|h| h.join().unwrap())
//! })?;
//! # Ok::<(), braid::Error>(())
//! ```
//!
//! One rank per process, started by a launcher (not run as a test: it needs the
//! launcher's variables in every process):
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
pub mod ceiling;
mod comm;
pub mod config;
pub mod device;
mod error;
mod executor;
mod frame;
pub mod fusion;
pub mod placement;
pub mod recorder;
pub mod reduce;
pub mod registered;
pub mod strategy;
mod topology;
mod transport;
pub mod tuner;
mod types;

/// Fault injection for tests: a [`FaultPlan`](fault::FaultPlan) given to
/// [`CommunicatorBuilder::fault_plan`] or [`Config::fault`] delays, stalls, cuts or
/// corrupts one point of one rank's outgoing stream (`tests/fault_grid.rs`).
#[doc(hidden)]
pub mod fault {
    pub use crate::transport::fault::{FaultAction, FaultPlan, FaultPoint};
}

pub use auth::JobKey;
pub use comm::P2p;
pub use comm::{Agreement, Communicator, CommunicatorBuilder, Work};
pub use comm::{Scope, ScopedWork};
pub use config::Config;
pub use error::{Error, OpContext, Result};
pub use executor::{ChainEnd, WaitChain};
pub use transport::ifaces::AddrFamily;
pub use transport::TransportKind;
pub use types::{CallSig, DType, Element, OpKind, ReduceOp};
