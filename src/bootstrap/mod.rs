//! Bootstrap: how ranks find each other. A key-value [`Store`] (TCP, torch's TCPStore, file, prefix)
//! carries each link's endpoint as opaque bytes; [`crate::config::Config`] reads who
//! we are from the environment.

mod connect;
mod file_store;
mod hosted_store;
mod mem_store;
pub(crate) mod mpi;
pub(crate) mod pmix;
mod prefix_store;
#[cfg(feature = "redis")]
mod redis_store;
pub(crate) mod slurm;
mod store;
mod tcp_store;
pub(crate) mod tf_config;
pub(crate) mod torch_store;

pub use connect::connect_store;
pub use file_store::FileStore;
pub use mem_store::MemStore;
pub use prefix_store::PrefixStore;
#[cfg(feature = "redis")]
pub use redis_store::RedisStore;
pub use store::{redact_store_url, Store};
pub use tcp_store::{StoreLimits, TcpStore, TcpStoreServer};
#[doc(hidden)]
pub use torch_store::mock::{MockFault, MockTorchServer};
pub use torch_store::TorchStore;
