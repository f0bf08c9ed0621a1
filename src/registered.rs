//! Registered buffers: memory that peers on this host can map and read directly,
//! like NCCL's `ncclMemAlloc` + `ncclCommRegister`.
//!
//! A [`SharedBuffer`] lives in its own segment under `/dev/shm`. When a large
//! transfer's data lies in such a segment, the single-copy frame names the segment
//! and offset; the receiving rank maps the segment once (cached per link) and copies
//! or reduces straight out of the mapping — no system call per transfer, no staging.
//! Unregistered memory still goes single-copy through `process_vm_readv`.

use std::ffi::CString;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::types::Element;

/// Longest segment name carried in a frame.
pub(crate) const MAX_NAME: usize = 64;

/// Live registered segments of this process: (start address, end address, name).
/// Process-wide because any communicator may be handed any buffer.
fn registry() -> &'static Mutex<Vec<(usize, usize, String)>> {
    static REGISTRY: OnceLock<Mutex<Vec<(usize, usize, String)>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Vec::new()))
}

/// The segment holding `[addr, addr + len)`, as (name, offset), if registered.
pub(crate) fn lookup(addr: usize, len: usize) -> Option<(String, usize)> {
    let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    reg.iter().find(|(s, e, _)| addr >= *s && addr + len <= *e).map(|(s, _, n)| (n.clone(), addr - s))
}

/// A buffer of `T` in shared memory that peers on this host can read directly.
/// Dereferences to a slice; pass it to any collective.
pub struct SharedBuffer<T: Element> {
    ptr: *mut T,
    len: usize,
    bytes: usize,
    path: CString,
}

// SAFETY: the buffer owns its mapping exclusively, like a Vec<T>.
unsafe impl<T: Element> Send for SharedBuffer<T> {}
// SAFETY: shared access only hands out &[T].
unsafe impl<T: Element> Sync for SharedBuffer<T> {}

impl<T: Element> SharedBuffer<T> {
    /// The name of the shared-memory segment (a file under `/dev/shm`, removed
    /// when the buffer is dropped): what peers on this host map, for logs and tools.
    pub fn name(&self) -> &str {
        let path = self.path.to_str().expect("segment names are ASCII");
        path.strip_prefix("/dev/shm/").unwrap_or(path)
    }

    /// A zeroed buffer of `len` elements.
    pub fn new(len: usize) -> Result<SharedBuffer<T>> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "registered buffer of {len} elements of {} bytes is too large",
                    std::mem::size_of::<T>()
                ))
            })?
            .max(1);
        let name = format!(
            "braid-reg-{}-{}-{:x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos())
        );
        let path = CString::new(format!("/dev/shm/{name}")).expect("no NUL in name");
        let io = |what: &str| Error::io(format!("{what} {}", path.to_string_lossy()), std::io::Error::last_os_error());
        // SAFETY: plain libc calls on a path we own; every failure is checked.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o600);
            if fd < 0 {
                return Err(io("creating"));
            }
            // Reserve the pages now: a full /dev/shm fails here, not with SIGBUS later.
            let rc = libc::posix_fallocate(fd, 0, bytes as libc::off_t);
            if rc != 0 {
                libc::close(fd);
                libc::unlink(path.as_ptr());
                return Err(Error::io(
                    format!("reserving {bytes} bytes for {}", path.to_string_lossy()),
                    std::io::Error::from_raw_os_error(rc),
                ));
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            );
            libc::close(fd);
            if p == libc::MAP_FAILED {
                let e = io("mapping");
                libc::unlink(path.as_ptr());
                return Err(e);
            }
            registry().lock().unwrap_or_else(|e| e.into_inner()).push((p as usize, p as usize + bytes, name));
            Ok(SharedBuffer { ptr: p as *mut T, len, bytes, path })
        }
    }
}

impl<T: Element> Deref for SharedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` zero-initialised (valid for Pod) elements.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: Element> DerefMut for SharedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, and we hold the only handle.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: Element> Drop for SharedBuffer<T> {
    fn drop(&mut self) {
        let start = self.ptr as usize;
        registry().lock().unwrap_or_else(|e| e.into_inner()).retain(|(s, _, _)| *s != start);
        // SAFETY: unmapping our own mapping; peers keep theirs until they drop them.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.bytes);
            libc::unlink(self.path.as_ptr());
        }
    }
}

/// A read-only mapping of a peer's registered segment.
///
/// The name comes from a peer's frame and the file from `/dev/shm`, where anyone
/// may plant one, so it is opened as shm setup opens a named segment: not through a
/// symlink, never waiting (a FIFO there would block `open` past any deadline),
/// and only a regular file of this user. Named tmpfs files cannot be sealed (only
/// memfds can), so the file can still be truncated under the mapping, and reading
/// a page past its end would raise SIGBUS: each [`PeerSegment::slice`] first checks
/// the file's current length (one `fstat`, next to a copy of up to a MiB). A
/// truncation racing with the copy itself is not caught, as for the rings' named
/// fallback segment ([`crate::transport::shm`]).
pub(crate) struct PeerSegment {
    base: *const u8,
    bytes: usize,
    /// Device and inode of the file mapped, to tell it from a later file of the same name.
    file: (u64, u64),
    /// The file, kept open to check its length before each read.
    fd: std::os::fd::OwnedFd,
}

// SAFETY: a read-only mapping; the executor reads it only inside a rendezvous.
unsafe impl Send for PeerSegment {}

impl PeerSegment {
    /// Map the segment `name` (as carried in a frame) read-only.
    pub fn open(name: &str) -> std::io::Result<PeerSegment> {
        use std::io::{Error as IoError, ErrorKind};
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        if name.len() > MAX_NAME || name.contains('/') || !name.starts_with("braid-reg-") {
            return Err(IoError::new(ErrorKind::InvalidData, format!("bad segment name `{name}`")));
        }
        let path = CString::new(format!("/dev/shm/{name}")).map_err(IoError::other)?;
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated path; returns a new descriptor or -1.
        let fd = unsafe { libc::open(path.as_ptr(), flags) };
        if fd < 0 {
            return Err(IoError::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = fstat(&fd)?;
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != me {
            return Err(IoError::new(
                ErrorKind::InvalidData,
                format!("segment {name} is not a regular file of this user (mode {:o})", st.st_mode),
            ));
        }
        let bytes = usize::try_from(st.st_size)
            .ok()
            .filter(|&b| (1..=isize::MAX as usize).contains(&b))
            .ok_or_else(|| IoError::new(ErrorKind::InvalidData, format!("segment {name} has {} bytes", st.st_size)))?;
        // SAFETY: a fresh read-only shared mapping of a file we hold open.
        let p =
            unsafe { libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(IoError::last_os_error());
        }
        Ok(PeerSegment { base: p as *const u8, bytes, file: (st.st_dev, st.st_ino), fd })
    }

    /// The mapped bytes `[offset, offset + len)`, if inside the segment and inside
    /// the file as it is now (a file truncated since it was mapped is refused).
    pub fn slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len).filter(|&e| e <= self.bytes)?;
        let now = fstat(&self.fd).ok()?;
        if u64::try_from(now.st_size).map_or(true, |size| size < end as u64) {
            return None;
        }
        // SAFETY: in bounds of a live read-only mapping, and of the file behind it.
        Some(unsafe { std::slice::from_raw_parts(self.base.add(offset), len) })
    }
}

/// `fstat` of an open file.
fn fstat(fd: &std::os::fd::OwnedFd) -> std::io::Result<libc::stat> {
    use std::os::fd::AsRawFd;
    // SAFETY: all-zero is a valid `stat`, which fstat fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we own and a pointer to a local.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Whether the file `name` under /dev/shm is still the one `seg` maps (its owner
/// unlinks it when it frees the buffer).
fn still_linked(name: &str, seg: &PeerSegment) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/dev/shm/{name}")).is_ok_and(|m| (m.dev(), m.ino()) == seg.file)
}

/// Most peer segments one link keeps mapped; past it the least recently used goes.
pub(crate) const MAX_CACHED_SEGMENTS: usize = 32;

/// The registered segments of one peer mapped so far, by name. A mapping is
/// dropped once its owner has freed the buffer (checked whenever a new segment is
/// mapped, so a loop that allocates a buffer per step holds at most one stale
/// mapping), and beyond [`MAX_CACHED_SEGMENTS`] the least recently used one goes.
/// A hit costs a hash lookup: no system call per transfer.
#[derive(Default)]
pub(crate) struct SegmentCache {
    /// name -> (mapping, tick of its last use)
    segments: std::collections::HashMap<String, (PeerSegment, u64)>,
    tick: u64,
}

impl SegmentCache {
    /// The mapping of `name`, mapped now if it is not cached.
    pub fn get_or_open(&mut self, name: &str) -> std::io::Result<&PeerSegment> {
        self.tick += 1;
        if !self.segments.contains_key(name) {
            let seg = PeerSegment::open(name)?;
            self.segments.retain(|n, (s, _)| still_linked(n, s));
            if self.segments.len() >= MAX_CACHED_SEGMENTS {
                let oldest = self.segments.iter().min_by_key(|(_, (_, t))| *t).map(|(n, _)| n.clone());
                oldest.map(|n| self.segments.remove(&n));
            }
            self.segments.insert(name.to_owned(), (seg, 0));
        }
        let entry = self.segments.get_mut(name).expect("present: found or inserted above");
        entry.1 = self.tick;
        Ok(&entry.0)
    }

    /// How many segments are mapped.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.segments.len()
    }
}

impl Drop for PeerSegment {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_memory_is_found_and_mappable_and_cleaned_up() {
        let mut b = SharedBuffer::<f32>::new(1000).unwrap();
        b[10] = 3.5;
        let addr = b.as_ptr() as usize;
        let (name, off) = lookup(addr + 40, 8).unwrap();
        assert_eq!((name.as_str(), off), (b.name(), 40));
        assert!(lookup(addr + 3996, 8).is_none(), "range past the end is not registered");
        let peer = PeerSegment::open(&name).unwrap();
        assert_eq!(peer.slice(40, 4).unwrap(), &3.5f32.to_le_bytes());
        assert!(peer.slice(3999, 8).is_none());
        drop(b);
        // Tests run in parallel: another test's new buffer may be mapped at the freed
        // address at once, so what must be gone is this segment, not the address.
        assert!(lookup(addr, 4).is_none_or(|(n, _)| n != name), "{name} is still registered after its drop");
        assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
        assert!(PeerSegment::open("../etc/passwd").is_err());
    }

    /// A unique `braid-reg-` name for a file a test plants in /dev/shm, removed on drop.
    struct Planted(String);

    impl Planted {
        fn new(what: &str) -> Planted {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
            static N: AtomicU64 = AtomicU64::new(0);
            Planted(format!(
                "braid-reg-test-{what}-{}-{}-{nanos:x}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ))
        }
        fn path(&self) -> String {
            format!("/dev/shm/{}", self.0)
        }
    }

    impl Drop for Planted {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.path());
        }
    }

    #[test]
    fn a_fifo_under_a_segment_name_is_refused_without_waiting() {
        let fifo = Planted::new("fifo");
        let path = CString::new(fifo.path()).unwrap();
        // SAFETY: a NUL-terminated path; creates a FIFO.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        // Run on a thread so that a blocking open fails the test instead of hanging it.
        let name = fifo.0.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(PeerSegment::open(&name).map(|_| ())));
        let r = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("open() blocked on a FIFO");
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_symlink_under_a_segment_name_is_not_followed() {
        let real = SharedBuffer::<u8>::new(4096).unwrap();
        let link = Planted::new("link");
        std::os::unix::fs::symlink(format!("/dev/shm/{}", real.name()), link.path()).unwrap();
        let e = PeerSegment::open(&link.0).err().expect("a symlink was followed");
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert!(PeerSegment::open(real.name()).is_ok());
    }

    #[test]
    fn a_truncated_segment_is_refused_instead_of_raising_sigbus() {
        let file = Planted::new("short");
        let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(file.path()).unwrap();
        f.set_len(1 << 20).unwrap();
        std::fs::write(file.path(), vec![5u8; 1 << 20]).unwrap();
        let mut cache = SegmentCache::default();
        assert_eq!(cache.get_or_open(&file.0).unwrap().slice(0, 1 << 20).unwrap()[12345], 5);
        // Cut short under the cached mapping: reading its old pages would be SIGBUS.
        f.set_len(4096).unwrap();
        let seg = cache.get_or_open(&file.0).unwrap();
        assert!(seg.slice(8192, 4096).is_none(), "a range past the truncated end was handed out");
        assert_eq!(seg.slice(0, 4096).unwrap()[100], 5, "the part still in the file stays readable");
        // An empty file is no segment at all.
        f.set_len(0).unwrap();
        let empty = Planted::new("empty");
        std::fs::File::create(empty.path()).unwrap();
        assert_eq!(
            PeerSegment::open(&empty.0).err().expect("empty segment mapped").kind(),
            std::io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn len_times_element_size_overflow_is_an_error_not_a_tiny_mapping() {
        // 2^63 elements of 4 bytes: the product wraps to 0 in release builds.
        let e = SharedBuffer::<f32>::new(usize::MAX / 2 + 1).err().expect("must fail");
        assert!(e.to_string().contains("too large"), "{e}");
        assert!(SharedBuffer::<f64>::new(usize::MAX / 8 + 1).is_err());
        // Does not wrap, but is more than a slice may span.
        assert!(SharedBuffer::<u8>::new(isize::MAX as usize + 1).is_err());
    }

    #[test]
    fn the_cache_drops_mappings_of_freed_segments_and_stays_capped() {
        let mut cache = SegmentCache::default();
        let first = SharedBuffer::<u8>::new(4096).unwrap();
        let (first_name, _) = lookup(first.as_ptr() as usize, 1).unwrap();
        cache.get_or_open(&first_name).unwrap();
        for step in 0..10 {
            let b = SharedBuffer::<u8>::new(4096).unwrap();
            let (name, _) = lookup(b.as_ptr() as usize, 1).unwrap();
            assert_eq!(cache.get_or_open(&name).unwrap().slice(0, 1).unwrap(), &[0]);
            // The live first buffer and at most one freed one besides this step's.
            assert!(cache.len() <= 3, "step {step}: {} mappings", cache.len());
        }
        assert!(cache.segments.contains_key(&first_name), "a live segment stays cached");
        // Live segments past the cap: the least recently used goes.
        let live: Vec<_> = (0..MAX_CACHED_SEGMENTS + 5).map(|_| SharedBuffer::<u8>::new(4096).unwrap()).collect();
        for b in &live {
            cache.get_or_open(&lookup(b.as_ptr() as usize, 1).unwrap().0).unwrap();
            assert!(cache.len() <= MAX_CACHED_SEGMENTS);
        }
        assert!(!cache.segments.contains_key(&first_name), "least recently used evicted");
        drop(first);
    }
}
