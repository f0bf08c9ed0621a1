//! Opening a store from its URL: the dispatcher over every kind of store and
//! every launcher's derived store. It sits above all of them, and nothing else in
//! the bootstrap layer calls it (PMIx's fallback is handed [`connect_store`] as an
//! argument), so the stores and launchers below never import it back.

use std::sync::Arc;
use std::time::Duration;

use crate::auth::JobKey;
use crate::bootstrap::file_store::FileStore;
use crate::bootstrap::mpi;
use crate::bootstrap::pmix;
#[cfg(feature = "redis")]
use crate::bootstrap::redis_store::RedisStore;
use crate::bootstrap::slurm;
use crate::bootstrap::store::{redact_store_url, Store};
use crate::bootstrap::torch_store::detect::connect_tcp_url;
use crate::bootstrap::torch_store::open_url;
use crate::error::{Error, Result};

/// Open the store named by a URL: `tcp://HOST:PORT`, `torch://HOST:PORT[?prefix=P]`
/// (a client of torch's TCPStore, keys under `P/`), `file:///PATH`, (feature
/// `redis`) `redis://…` ([`crate::bootstrap::RedisStore`]), or one a launcher's
/// variables derived ([`crate::config`]): `pmix:NAMESPACE[;else=URL]`, `local:ID`,
/// `slurm://HOST:PORT`.
///
/// For `tcp://`, when `host_if_absent` is true (rank 0) and nothing listens at the
/// address yet, a server is started in this process and kept alive as long as the
/// returned store, as torch's TCPStore master does, with room for `world_size`
/// ranks; when torch's TCPStore already serves the address (torchrun's agent,
/// `init_process_group`), every rank is its client instead. Every braid TCP connection proves `key` (the file store has no handshake: the
/// file system's permissions guard it); `timeout` bounds connecting and every request.
pub fn connect_store(
    url: &str,
    host_if_absent: bool,
    world_size: usize,
    key: JobKey,
    timeout: Duration,
) -> Result<Arc<dyn Store>> {
    if let Some(addr) = url.strip_prefix("tcp://") {
        // torch's TCPStore may already serve the address (torchrun, init_process_group).
        connect_tcp_url(addr, host_if_absent, world_size, key, timeout)
    } else if let Some(rest) = url.strip_prefix("torch://") {
        open_url(rest, timeout)
    } else if let Some(path) = url.strip_prefix("file://") {
        Ok(Arc::new(FileStore::open(path)?))
    } else if url.starts_with("redis://") || url.starts_with("rediss://") {
        connect_redis(url, timeout)
    } else if let Some(store) = connect_launcher_store(url, host_if_absent, world_size, &key, timeout) {
        store
    } else {
        let url = redact_store_url(url);
        Err(Error::Config(format!(
            "unsupported store URL `{url}` (expected tcp://HOST:PORT, torch://HOST:PORT, redis://HOST:PORT or file:///PATH)"
        )))
    }
}

#[cfg(feature = "redis")]
fn connect_redis(url: &str, timeout: Duration) -> Result<Arc<dyn Store>> {
    Ok(Arc::new(RedisStore::connect(url, timeout)?))
}

#[cfg(not(feature = "redis"))]
fn connect_redis(url: &str, _timeout: Duration) -> Result<Arc<dyn Store>> {
    Err(Error::Config(format!(
        "store `{}` needs braid built with the `redis` feature (the braid command has it)",
        redact_store_url(url)
    )))
}

/// The stores a launcher's variables derive (see [`crate::config`]): `pmix:NAMESPACE[;else=URL]`
/// ([`pmix`]), `local:ID` (a one-host private store, [`mpi`]) and `slurm://HOST:PORT`
/// ([`slurm`]); None for any other URL. `rank0` says whether this rank hosts.
fn connect_launcher_store(
    url: &str,
    rank0: bool,
    world_size: usize,
    key: &JobKey,
    timeout: Duration,
) -> Option<Result<Arc<dyn Store>>> {
    let key = key.clone();
    if let Some((namespace, fallback)) = pmix::parse_url(url) {
        Some(pmix::connect(namespace, fallback, rank0, world_size, key, timeout, connect_store))
    } else if let Some(id) = mpi::parse_local_url(url) {
        Some(mpi::connect_local(id, rank0, world_size, key, timeout))
    } else {
        slurm::parse_url(url).map(|addr| slurm::connect(addr, rank0, world_size, key, timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsupported_url_is_refused_without_its_password() {
        let err = connect_store("etcd://u:hunter2@h:2379", false, 1, JobKey::none(), Duration::from_secs(1))
            .err()
            .expect("etcd is not a store braid speaks");
        let msg = err.to_string();
        assert!(msg.contains("etcd://u:***@h:2379") && !msg.contains("hunter2"), "{msg}");
    }
}
