//! The key-value store trait that rendezvous is built on.

use std::time::Duration;

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
}
