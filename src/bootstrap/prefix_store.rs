//! A namespaced view of another store, so that several communicators (or several
//! jobs) can share one rendezvous server without their keys colliding.

use std::sync::Arc;
use std::time::Duration;

use crate::bootstrap::store::Store;
use crate::error::Result;

/// A view of `inner` in which every key `k` is stored as `"{prefix}/{k}"`.
///
/// Views nest: a prefix store over a prefix store joins both prefixes.
#[derive(Clone)]
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl PrefixStore {
    /// A view of `inner` under `prefix`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> PrefixStore {
        PrefixStore { prefix: prefix.into(), inner }
    }

    /// The prefix this view adds (without the `/` separator).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The store underneath.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}/{}", self.prefix, key)
    }
}

impl std::fmt::Debug for PrefixStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixStore").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.full_key(key), value)
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.get(&self.full_key(key))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        // The inner store's error names the full keys, which is what an operator
        // looking at the shared server will see, so it is passed through as is.
        let full: Vec<String> = keys.iter().map(|k| self.full_key(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.wait(&refs, timeout)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.full_key(key), delta)
    }

    fn delete(&self, key: &str) -> Result<bool> {
        self.inner.delete(&self.full_key(key))
    }

    fn set_if_absent(&self, key: &str, value: &[u8]) -> Result<Vec<u8>> {
        self.inner.set_if_absent(&self.full_key(key), value)
    }

    fn route_source(&self) -> Option<std::net::IpAddr> {
        self.inner.route_source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::MemStore;
    use std::time::Instant;

    fn stores() -> (Arc<MemStore>, PrefixStore) {
        let mem = Arc::new(MemStore::new());
        let view = PrefixStore::new("job7", mem.clone() as Arc<dyn Store>);
        (mem, view)
    }

    #[test]
    fn keys_are_prefixed_set_get_overwrite_delete() {
        let (mem, s) = stores();
        assert_eq!(s.get("a").unwrap(), None);
        s.set("a", b"one").unwrap();
        assert_eq!(s.get("a").unwrap().as_deref(), Some(&b"one"[..]));
        assert_eq!(mem.get("job7/a").unwrap().as_deref(), Some(&b"one"[..]));
        assert_eq!(mem.get("a").unwrap(), None);
        s.set("a", b"two").unwrap();
        assert_eq!(s.get("a").unwrap().as_deref(), Some(&b"two"[..]));
        assert!(s.delete("a").unwrap());
        assert!(!s.delete("a").unwrap());
        assert_eq!(s.get("a").unwrap(), None);
        assert_eq!(mem.get("job7/a").unwrap(), None);
    }

    #[test]
    fn views_with_different_prefixes_do_not_collide_and_nest() {
        let mem: Arc<dyn Store> = Arc::new(MemStore::new());
        let a = PrefixStore::new("a", mem.clone());
        let b = PrefixStore::new("b", mem.clone());
        a.set("k", b"from a").unwrap();
        b.set("k", b"from b").unwrap();
        assert_eq!(a.get("k").unwrap().unwrap(), b"from a");
        assert_eq!(b.get("k").unwrap().unwrap(), b"from b");
        let nested = PrefixStore::new("inner", Arc::new(a.clone()) as Arc<dyn Store>);
        nested.set("k", b"deep").unwrap();
        assert_eq!(mem.get("a/inner/k").unwrap().unwrap(), b"deep");
        assert_eq!(nested.prefix(), "inner");
    }

    #[test]
    fn wait_sees_a_later_set() {
        let (mem, s) = stores();
        let s = Arc::new(s);
        let setter = {
            let s = s.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                s.set("late", b"v").unwrap();
            })
        };
        assert_eq!(s.wait_get("late", Duration::from_secs(5)).unwrap(), b"v");
        setter.join().unwrap();
        assert!(mem.get("job7/late").unwrap().is_some());
    }

    #[test]
    fn wait_times_out_naming_the_missing_key() {
        let (_mem, s) = stores();
        s.set("here", b"1").unwrap();
        let start = Instant::now();
        let err = s.wait(&["here", "missing"], Duration::from_millis(60)).unwrap_err().to_string();
        assert!(start.elapsed() >= Duration::from_millis(60));
        assert!(err.contains("job7/missing"), "{err}");
        assert!(!err.contains("job7/here"), "{err}");
    }

    #[test]
    fn concurrent_add_counts_exactly() {
        let (mem, s) = stores();
        let s = Arc::new(s);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        s.add("n", 1).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.add("n", 0).unwrap(), 800);
        assert_eq!(mem.get("job7/n").unwrap().unwrap(), b"800");
    }
}
