//! Bootstrap: how ranks find each other. A key-value [`Store`] (TCP, torch's TCPStore, file, prefix)
//! carries each link's endpoint as opaque bytes; [`crate::config::Config`] reads who
//! we are from the environment.

mod file_store;
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

pub use file_store::FileStore;
pub use mem_store::MemStore;
pub use prefix_store::PrefixStore;
#[cfg(feature = "redis")]
pub use redis_store::RedisStore;
pub use store::{connect_store, redact_store_url, Store};
pub use tcp_store::{StoreLimits, TcpStore, TcpStoreServer};
#[doc(hidden)]
pub use torch_store::mock::{MockFault, MockTorchServer};
pub use torch_store::TorchStore;

/// The stores a launcher's variables derive (see [`crate::config`]): `pmix:NAMESPACE[;else=URL]`
/// ([`pmix`]), `local:ID` (a one-host private store, [`mpi`]) and `slurm://HOST:PORT`
/// ([`slurm`]); None for any other URL. `rank0` says whether this rank hosts.
fn connect_launcher_store(
    url: &str,
    rank0: bool,
    world_size: usize,
    key: &crate::auth::JobKey,
    timeout: std::time::Duration,
) -> Option<crate::error::Result<std::sync::Arc<dyn Store>>> {
    let key = key.clone();
    if let Some((namespace, fallback)) = pmix::parse_url(url) {
        Some(pmix::connect(namespace, fallback, rank0, world_size, key, timeout))
    } else if let Some(id) = mpi::parse_local_url(url) {
        Some(mpi::connect_local(id, rank0, world_size, key, timeout))
    } else {
        slurm::parse_url(url).map(|addr| slurm::connect(addr, rank0, world_size, key, timeout))
    }
}
