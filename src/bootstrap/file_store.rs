//! A store in a directory that every rank can see (a local path for ranks on one
//! host, or a shared file system such as NFS across hosts). No server is needed,
//! which makes it the fallback when no rank can host a TCP store.
//!
//! Each key is one file. Writes go to a temporary file that is then renamed over
//! the key's file, so a reader sees either the old value or the new one, never a
//! torn write. `add` is a read-modify-write under an exclusive `flock` on one lock
//! file, which serialises counters across threads and processes alike.

use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::bootstrap::store::Store;
use crate::error::{Error, Result};

/// Every key file starts with this, so the empty key has a name and no key file can
/// be mistaken for the lock file or a temporary file (both start with `.`).
const KEY_FILE_PREFIX: &str = "k_";
const LOCK_FILE: &str = ".lock";
/// Most file systems cap a name at 255 bytes; stay clear of it.
const MAX_FILE_NAME: usize = 250;
const POLL_START: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(50);

/// A store in a shared directory: one file per key.
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// Open the store in directory `path`, creating it if absent. Its parent must
    /// exist: a mistyped path fails here instead of growing directories from `/`
    /// that the other ranks (which see another tree) would never meet in.
    pub fn open(path: impl AsRef<Path>) -> Result<FileStore> {
        let dir = path.as_ref().to_path_buf();
        if !dir.exists() {
            let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            if !parent.is_dir() {
                return Err(Error::Config(format!(
                    "file store directory {}: its parent {} does not exist (create it on a file system every rank \
                     sees, or fix the path in BRAID_STORE=file:///PATH)",
                    dir.display(),
                    parent.display()
                )));
            }
            // Another rank may create it first.
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io(format!("creating file store directory {}", dir.display()), e)),
            }
        }
        let meta = fs::metadata(&dir).map_err(|e| Error::io(format!("opening file store {}", dir.display()), e))?;
        if !meta.is_dir() {
            return Err(Error::Config(format!("file store path {} is not a directory", dir.display())));
        }
        tracing::debug!(dir = %dir.display(), "file store opened");
        Ok(FileStore { dir })
    }

    /// The directory holding the store.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn key_path(&self, key: &str) -> Result<PathBuf> {
        let name = encode_key(key);
        if name.len() > MAX_FILE_NAME {
            return Err(Error::Store(format!(
                "key `{key}` is too long for the file store in {} (its encoded file name has {} bytes, limit {MAX_FILE_NAME})",
                self.dir.display(),
                name.len()
            )));
        }
        Ok(self.dir.join(name))
    }

    /// Write `value` to `target` atomically: a reader never sees a partial file.
    fn write_atomic(&self, key: &str, target: &Path, value: &[u8]) -> Result<()> {
        let tmp = self.dir.join(temp_name());
        let written = File::create(&tmp).and_then(|mut f| f.write_all(value)).and_then(|()| fs::rename(&tmp, target));
        written.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::io(format!("file store {}: writing key `{key}`", self.dir.display()), e)
        })
    }

    fn read(&self, key: &str, path: &Path) -> Result<Option<Vec<u8>>> {
        match fs::read(path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("file store {}: reading key `{key}`", self.dir.display()), e)),
        }
    }

    /// Take the store-wide exclusive lock; it is released when the guard drops,
    /// and by the kernel if this process dies holding it.
    fn lock(&self) -> Result<Flock<File>> {
        let path = self.dir.join(LOCK_FILE);
        let what = || format!("file store {}: locking {}", self.dir.display(), path.display());
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(what(), e))?;
        loop {
            match Flock::lock(file, FlockArg::LockExclusive) {
                Ok(guard) => return Ok(guard),
                Err((f, Errno::EINTR)) => file = f,
                Err((_, errno)) => return Err(Error::io(what(), io::Error::from(errno))),
            }
        }
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let path = self.key_path(key)?;
        self.write_atomic(key, &path, value)
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let path = self.key_path(key)?;
        self.read(key, &path)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let paths = keys.iter().map(|k| self.key_path(k)).collect::<Result<Vec<_>>>()?;
        let deadline = Instant::now().checked_add(timeout);
        let mut pause = POLL_START;
        // Keys only ever appear while we wait (deletes are not expected mid-rendezvous),
        // so a key seen once is not checked again.
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        loop {
            let mut still = Vec::with_capacity(pending.len());
            for &i in &pending {
                let exists = paths[i].try_exists().map_err(|e| {
                    Error::io(format!("file store {}: checking key `{}`", self.dir.display(), keys[i]), e)
                })?;
                if !exists {
                    still.push(i);
                }
            }
            pending = still;
            if pending.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            let left = deadline.map_or(POLL_MAX, |d| d.saturating_duration_since(now));
            if left.is_zero() {
                let missing: Vec<&str> = pending.iter().map(|&i| keys[i]).collect();
                return Err(Error::Store(format!(
                    "file store {}: timed out after {timeout:?} waiting for keys {missing:?}",
                    self.dir.display()
                )));
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let path = self.key_path(key)?;
        let _guard = self.lock()?;
        let current = match self.read(key, &path)? {
            None => 0,
            Some(v) => std::str::from_utf8(&v).ok().and_then(|s| s.trim().parse::<i64>().ok()).ok_or_else(|| {
                Error::Store(format!("file store {}: key `{key}` does not hold an integer", self.dir.display()))
            })?,
        };
        let next = current.wrapping_add(delta);
        self.write_atomic(key, &path, next.to_string().as_bytes())?;
        Ok(next)
    }

    fn set_if_absent(&self, key: &str, value: &[u8]) -> Result<Vec<u8>> {
        let path = self.key_path(key)?;
        // Under the directory's lock, as `add`: every conditional set of every
        // handle (and process) is ordered, and a plain write is one rename.
        let _guard = self.lock()?;
        if let Some(held) = self.read(key, &path)? {
            return Ok(held);
        }
        self.write_atomic(key, &path, value)?;
        Ok(value.to_vec())
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let path = self.key_path(key)?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io(format!("file store {}: deleting key `{key}`", self.dir.display()), e)),
        }
    }
}

/// The file name of `key`: ASCII letters, digits, `-` and `_` stay as they are and
/// every other byte becomes `%XX`, so `/`, `.`, `..` and `:` cannot escape the
/// directory or collide, and the mapping is reversible.
fn encode_key(key: &str) -> String {
    let mut name = String::with_capacity(KEY_FILE_PREFIX.len() + key.len());
    name.push_str(KEY_FILE_PREFIX);
    for &b in key.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            name.push(b as char);
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    name
}

/// A temporary file name unique across threads (the counter), processes (the pid)
/// and hosts sharing the directory (a random per-process tag).
fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static TAG: OnceLock<u64> = OnceLock::new();
    let tag = *TAG.get_or_init(|| std::collections::hash_map::RandomState::new().build_hasher().finish());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(".tmp-{}-{tag:016x}-{n}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A fresh directory removed when the test ends.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
            let dir = std::env::temp_dir().join(format!("braid-fs-{name}-{}-{nanos}", std::process::id()));
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn set_get_overwrite_delete() {
        let dir = TempDir::new("basic");
        fs::create_dir(&dir.0).unwrap();
        let s = FileStore::open(dir.0.join("store")).unwrap();
        assert_eq!(s.get("a").unwrap(), None);
        s.set("a", b"one").unwrap();
        assert_eq!(s.get("a").unwrap().unwrap(), b"one");
        s.set("a", b"two!").unwrap();
        assert_eq!(s.get("a").unwrap().unwrap(), b"two!");
        s.set("empty", b"").unwrap();
        assert_eq!(s.get("empty").unwrap().unwrap(), b"");
        assert!(s.delete("a").unwrap());
        assert!(!s.delete("a").unwrap());
        assert_eq!(s.get("a").unwrap(), None);
        // No temporary files are left behind.
        let leftovers: Vec<_> = fs::read_dir(s.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn awkward_keys_are_distinct_and_stay_inside_the_directory() {
        let dir = TempDir::new("keys");
        let s = FileStore::open(&dir.0).unwrap();
        let keys = ["a/b", "a%2Fb", "a_2Fb", "..", ".", "", ".lock", "host:29500/rank 0", "ключ", "a\nb"];
        for (i, k) in keys.iter().enumerate() {
            s.set(k, i.to_string().as_bytes()).unwrap();
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(s.get(k).unwrap().unwrap(), i.to_string().as_bytes(), "key {k:?}");
        }
        // Every key is a plain file directly inside the directory.
        let files = fs::read_dir(&dir.0).unwrap().filter(|e| e.as_ref().unwrap().file_type().unwrap().is_file());
        assert_eq!(files.count(), keys.len());
        let err = s.set(&"x".repeat(300), b"v").unwrap_err().to_string();
        assert!(err.contains("too long"), "{err}");
    }

    #[test]
    fn wait_sees_a_later_set_from_another_handle() {
        let dir = TempDir::new("wait");
        let s = FileStore::open(&dir.0).unwrap();
        let path = dir.0.clone();
        let setter = std::thread::spawn(move || {
            let other = FileStore::open(&path).unwrap();
            std::thread::sleep(Duration::from_millis(40));
            other.set("late/key", b"v").unwrap();
        });
        let start = Instant::now();
        assert_eq!(s.wait_get("late/key", Duration::from_secs(5)).unwrap(), b"v");
        assert!(start.elapsed() < Duration::from_secs(2));
        setter.join().unwrap();
    }

    #[test]
    fn wait_times_out_naming_the_missing_key() {
        let dir = TempDir::new("timeout");
        let s = FileStore::open(&dir.0).unwrap();
        s.set("here", b"1").unwrap();
        let start = Instant::now();
        let err = s.wait(&["here", "missing/key"], Duration::from_millis(80)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(80));
        assert!(matches!(err, Error::Store(_)), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("\"missing/key\"") && !msg.contains("\"here\""), "{msg}");
    }

    #[test]
    fn concurrent_set_if_absent_from_many_handles_has_one_winner() {
        let dir = TempDir::new("cas");
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let path = dir.0.clone();
                std::thread::spawn(move || {
                    let s = FileStore::open(&path).unwrap();
                    (0..10).map(|k| s.set_if_absent(&format!("d/{k}"), format!("t{t}").as_bytes()).unwrap()).collect()
                })
            })
            .collect();
        let seen: Vec<Vec<Vec<u8>>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let s = FileStore::open(&dir.0).unwrap();
        for k in 0..10 {
            let stored = s.get(&format!("d/{k}")).unwrap().unwrap();
            assert!(seen.iter().all(|v| v[k] == stored), "key d/{k}");
        }
    }

    #[test]
    fn concurrent_add_from_many_handles_counts_exactly() {
        let dir = TempDir::new("add");
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let path = dir.0.clone();
                std::thread::spawn(move || {
                    let s = FileStore::open(&path).unwrap();
                    for _ in 0..100 {
                        s.add("counter", 1).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = Arc::new(FileStore::open(&dir.0).unwrap());
        assert_eq!(s.get("counter").unwrap().unwrap(), b"800");
        assert_eq!(s.add("counter", -801).unwrap(), -1);
        s.set("text", b"abc").unwrap();
        let err = s.add("text", 1).unwrap_err().to_string();
        assert!(err.contains("`text`"), "{err}");
    }

    #[test]
    fn a_store_whose_parent_is_missing_is_refused_and_nothing_is_created() {
        let dir = TempDir::new("noparent");
        let err = FileStore::open(dir.0.join("missing/store")).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("{} does not exist", dir.0.join("missing").display())), "{msg}");
        assert!(!dir.0.exists(), "{} was created", dir.0.display());
    }

    #[test]
    fn open_on_a_regular_file_is_a_config_error() {
        let dir = TempDir::new("notdir");
        fs::create_dir_all(&dir.0).unwrap();
        let file = dir.0.join("plain");
        fs::write(&file, b"x").unwrap();
        assert!(FileStore::open(&file).is_err());
    }
}
