//! The key-value store trait that rendezvous is built on.

use std::sync::Arc;
use std::time::Duration;

use crate::auth::JobKey;
use crate::error::{Error, Result};

/// A key-value store shared by every rank of a job.
///
/// Keys are UTF-8 strings, values opaque bytes. Implementations must be safe to
/// share between threads; every blocking call takes a deadline.
pub trait Store: Send + Sync {
    /// Set `key` to `value`, replacing any earlier value.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// The value of `key`, or None when it is not set. Never blocks on absence.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// Block until every key in `keys` is set, or fail with [`Error::Store`] naming
    /// the missing keys once `timeout` passes.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()>;
    /// Add `delta` to the integer at `key` (absent counts as 0) and return the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Remove `key`; returns whether it existed.
    fn delete(&self, key: &str) -> Result<bool>;

    /// Wait for `key` and return its value.
    fn wait_get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait(&[key], timeout)?;
        self.get(key)?.ok_or_else(|| Error::Store(format!("key `{key}` vanished between wait and get")))
    }
}

/// Open the store named by a URL: `tcp://HOST:PORT` or `file:///PATH`.
///
/// For `tcp://`, when `host_if_absent` is true (rank 0) and nothing listens at the
/// address yet, a server is started in this process and kept alive as long as the
/// returned store, as torch's TCPStore master does, with room for `world_size`
/// ranks. Every TCP connection proves `key` (the file store has no handshake: the
/// file system's permissions guard it); `timeout` bounds connecting and every request.
pub fn connect_store(
    url: &str,
    host_if_absent: bool,
    world_size: usize,
    key: JobKey,
    timeout: Duration,
) -> Result<Arc<dyn Store>> {
    if let Some(addr) = url.strip_prefix("tcp://") {
        Ok(Arc::new(crate::bootstrap::TcpStore::connect_or_host(addr, host_if_absent, world_size, key, timeout)?))
    } else if let Some(path) = url.strip_prefix("file://") {
        Ok(Arc::new(crate::bootstrap::FileStore::open(path)?))
    } else {
        Err(Error::Config(format!("unsupported store URL `{url}` (expected tcp://HOST:PORT or file:///PATH)")))
    }
}
