//! An in-memory store for ranks that are threads of one process.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::bootstrap::store::Store;
use crate::error::{Error, Result};

/// A store held in this process: share it (in an `Arc`) between rank threads.
#[derive(Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u8>>> {
        // A panicking rank thread must not wedge the others: the map stays valid.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock().insert(key.to_owned(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.lock().get(key).cloned())
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut map = self.lock();
        loop {
            let missing: Vec<&str> = keys.iter().copied().filter(|k| !map.contains_key(*k)).collect();
            if missing.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Store(format!("timed out after {timeout:?} waiting for keys {missing:?}")));
            }
            map = self.changed.wait_timeout(map, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut map = self.lock();
        let current = match map.get(key) {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| Error::Store(format!("key `{key}` does not hold an integer")))?,
        };
        let next = current.wrapping_add(delta);
        map.insert(key.to_owned(), next.to_string().into_bytes());
        drop(map);
        self.changed.notify_all();
        Ok(next)
    }

    fn delete(&self, key: &str) -> Result<bool> {
        Ok(self.lock().remove(key).is_some())
    }

    fn set_if_absent(&self, key: &str, value: &[u8]) -> Result<Vec<u8>> {
        let mut map = self.lock();
        let held = map.entry(key.to_owned()).or_insert_with(|| value.to_vec()).clone();
        drop(map);
        self.changed.notify_all();
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn set_get_add_delete_wait() {
        let s = Arc::new(MemStore::new());
        assert_eq!(s.get("a").unwrap(), None);
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.wait_get("a", Duration::from_secs(5)).unwrap());
        s.set("a", b"x").unwrap();
        assert_eq!(t.join().unwrap(), b"x");
        assert_eq!(s.add("n", 2).unwrap(), 2);
        assert_eq!(s.add("n", -5).unwrap(), -3);
        assert!(s.delete("a").unwrap());
        assert!(!s.delete("a").unwrap());
        let err = s.wait(&["a", "n"], Duration::from_millis(20)).unwrap_err().to_string();
        assert!(err.contains("\"a\"") && !err.contains("\"n\""), "{err}");
    }
}
