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

    /// Set `key` to `value` only if it is absent, atomically with respect to every
    /// other `set_if_absent` of the key, and return what the key holds afterwards:
    /// `value` when this call set it, the earlier value otherwise. Of many ranks
    /// proposing at once, all get the one value that was first: the agreement of
    /// [`crate::Communicator::agree`] is built on it. Stores that cannot do this
    /// atomically refuse with [`Error::Unsupported`] (the default).
    fn set_if_absent(&self, key: &str, value: &[u8]) -> Result<Vec<u8>> {
        let _ = value;
        Err(Error::Unsupported(format!(
            "this store cannot set `{key}` only if absent, which agreeing on survivors needs \
             (braid's tcp:// and file:// stores can)"
        )))
    }

    /// This process's address on its route to the store's server, when the store is
    /// reached over IP: TCP links listen there by default, since the hosts that reach
    /// the store reach it. None (the default) for stores without one.
    fn route_source(&self) -> Option<std::net::IpAddr> {
        None
    }

    /// Wait for `key` and return its value.
    fn wait_get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait(&[key], timeout)?;
        self.get(key)?.ok_or_else(|| Error::Store(format!("key `{key}` vanished between wait and get")))
    }
}

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
        crate::bootstrap::torch_store::detect::connect_tcp_url(addr, host_if_absent, world_size, key, timeout)
    } else if let Some(rest) = url.strip_prefix("torch://") {
        crate::bootstrap::torch_store::open_url(rest, timeout)
    } else if let Some(path) = url.strip_prefix("file://") {
        Ok(Arc::new(crate::bootstrap::FileStore::open(path)?))
    } else if url.starts_with("redis://") || url.starts_with("rediss://") {
        connect_redis(url, timeout)
    } else if let Some(store) = crate::bootstrap::connect_launcher_store(url, host_if_absent, world_size, &key, timeout)
    {
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
    Ok(Arc::new(crate::bootstrap::RedisStore::connect(url, timeout)?))
}

#[cfg(not(feature = "redis"))]
fn connect_redis(url: &str, _timeout: Duration) -> Result<Arc<dyn Store>> {
    Err(Error::Config(format!(
        "store `{}` needs braid built with the `redis` feature (the braid command has it)",
        redact_store_url(url)
    )))
}

/// `url` with the password of its `USER:PASSWORD@` part (if any) replaced by
/// `***`, for logs and error messages.
pub fn redact_store_url(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else { return url.to_owned() };
    let end = url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i);
    // The last `@` ends the credentials: a password may hold an unescaped `@`.
    let Some(at) = url[start..end].rfind('@').map(|i| start + i) else { return url.to_owned() };
    match url[start..at].find(':') {
        Some(colon) => format!("{}***{}", &url[..start + colon + 1], &url[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_shown_without_their_password() {
        for (url, shown) in [
            ("redis://u:hunter2@h:1/0?prefix=a", "redis://u:***@h:1/0?prefix=a"),
            ("redis://:hunter2@h", "redis://:***@h"),
            ("redis://u:hun@ter2@h/?p=x@y", "redis://u:***@h/?p=x@y"),
            ("redis://user@h", "redis://user@h"),
            ("tcp://h:1", "tcp://h:1"),
            ("file:///tmp/a:b@c", "file:///tmp/a:b@c"),
            ("no scheme:pw@h", "no scheme:pw@h"),
        ] {
            assert_eq!(redact_store_url(url), shown, "{url}");
        }
    }

    #[test]
    fn an_unsupported_url_is_refused_without_its_password() {
        let err = connect_store("etcd://u:hunter2@h:2379", false, 1, JobKey::none(), Duration::from_secs(1))
            .err()
            .expect("etcd is not a store braid speaks");
        let msg = err.to_string();
        assert!(msg.contains("etcd://u:***@h:2379") && !msg.contains("hunter2"), "{msg}");
    }
}
