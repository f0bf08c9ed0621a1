//! Shared-memory links between processes of one host.
//!
//! Each pair of ranks shares one segment: a small header, then two byte rings
//! ([`super::ring`]), lower rank to higher and back. The lower rank creates the
//! segment as a file in `/dev/shm` with a unique name, `fallocate`s it (a full
//! `/dev/shm` fails here, not as a SIGBUS on first touch later), maps it and
//! publishes the name in the store under `{key_prefix}/shm/{a}/{b}`; the higher
//! rank maps it and says so in the header. The name is unlinked as soon as the
//! peer has mapped it (by both sides, whoever is first), and on every error
//! path, so a crash leaves nothing behind in `/dev/shm` after setup.
//!
//! A peer process that is killed leaves no end-of-stream mark in the rings, so
//! the header carries both pids and a link checks its peer's liveness (a pidfd,
//! immune to pid reuse) whenever it finds nothing to read or no room to write
//! and at least [`LIVENESS_INTERVAL`] passed since the last check. (Pids are
//! those of the creator's pid namespace: ranks that share `/dev/shm` but not a
//! pid namespace are not supported, their liveness checks would watch the wrong pid.)
//!
//! Single copy: [`Link::read_peer`] reads the peer's memory with
//! `process_vm_readv` (CMA). Whether that works depends on ptrace policy, user
//! namespaces and seccomp, so it is probed at connect time with a real read of a
//! token each side publishes, and enabled only when it works in both directions
//! (the answer decides the framing, so both ends must agree).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use super::ring::{self, RingReader, RingWriter};
use super::{Link, TransportKind};
use crate::bootstrap::Store;
use crate::error::{Error, OpContext, Result};

#[cfg(test)]
mod tests;

/// Data bytes buffered per direction of a shared-memory link when every rank of
/// the host has a core: about a core's L2, so long streams stay in cache between
/// writer and reader (2-core Zen 3 VM, 2 ranks: 512 KiB beat 256 KiB, 1 MiB and
/// 4 MiB from 16 MiB up, and matched 4 MiB at 1 MiB).
pub const SHM_RING_BYTES: usize = 512 << 10;
/// Ring bytes when ranks outnumber cores: a rank can then post a whole step and
/// give up its core instead of waiting for room (4 ranks on 2 cores: 1.4–1.6 GB/s
/// at 1 MiB with 512 KiB rings, 2.1–2.3 with 4 MiB).
pub const SHM_RING_BYTES_OVERSUBSCRIBED: usize = 4 << 20;

/// The ring size for a host running `local_ranks` ranks of the communicator.
pub fn default_ring_bytes(local_ranks: usize) -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if local_ranks > cores {
        SHM_RING_BYTES_OVERSUBSCRIBED
    } else {
        SHM_RING_BYTES
    }
}

/// Least time between two liveness checks of a link's peer process.
pub const LIVENESS_INTERVAL: Duration = Duration::from_millis(50);

/// Directory the segments live in (a tmpfs on Linux).
const SHM_DIR: &str = "/dev/shm";
/// Written last by the creator: an attacher that sees it sees a complete header.
const SEG_MAGIC: u64 = u64::from_le_bytes(*b"BRAIDSHM");
/// Bump on any change of the segment layout.
const SEG_VERSION: u32 = 1;
/// The segment header takes one page, so the rings start page-aligned.
const SEG_HEADER_BYTES: usize = 4096;
const PAGE: usize = 4096;
/// Probe outcomes in the header.
const PROBE_PENDING: u32 = 0;
const PROBE_OK: u32 = 1;
const PROBE_FAILED: u32 = 2;

/// How to set up the shared-memory links of one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmOptions {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Store namespace of this communicator; segment names go under `{key_prefix}/shm/{a}/{b}`.
    pub key_prefix: String,
    /// Which ranks to link with (`world` entries; this rank's own entry is ignored).
    /// Both ends of a pair must mark each other, or setup waits for the missing one.
    pub peers: Vec<bool>,
    /// Deadline for the whole setup.
    pub timeout: Duration,
    /// Data bytes per direction (the creator's value wins; the attacher reads it from the segment).
    pub ring_bytes: usize,
}

impl ShmOptions {
    /// Options linking `rank` with every other rank of `world`, 60 s timeout,
    /// [`SHM_RING_BYTES`] per direction.
    pub fn new(rank: usize, world: usize, key_prefix: impl Into<String>) -> ShmOptions {
        ShmOptions {
            rank,
            world,
            key_prefix: key_prefix.into(),
            peers: vec![true; world],
            timeout: crate::config::DEFAULT_TIMEOUT,
            ring_bytes: SHM_RING_BYTES,
        }
    }
}

/// The store key under which lower rank `a` publishes the segment it shares with `b`.
pub fn segment_key(key_prefix: &str, a: usize, b: usize) -> String {
    format!("{key_prefix}/shm/{a}/{b}")
}

/// The segment header. Index 0 of each pair is the creator (lower rank), 1 the attacher.
#[repr(C)]
struct SegHeader {
    magic: AtomicU64,
    version: AtomicU32,
    /// Set to 1 by the attacher once it has mapped the segment.
    attached: AtomicU32,
    ring_capacity: AtomicU64,
    ranks: [AtomicU64; 2],
    pids: [AtomicI32; 2],
    /// `probe_result[i]`: whether side i could read side 1-i's token with CMA.
    probe_result: [AtomicU32; 2],
    probetoken: [AtomicU64; 2],
    /// Address of side i's token in its own address space, stored after the token (Release).
    probe_addr: [AtomicU64; 2],
}

const _: () = assert!(std::mem::size_of::<SegHeader>() <= SEG_HEADER_BYTES);

const fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Bytes of a segment whose rings hold `capacity` bytes each.
fn segment_len(capacity: usize) -> usize {
    SEG_HEADER_BYTES + 2 * round_up(ring::region_len(capacity), PAGE)
}

/// A shared mapping of a whole segment, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all concurrent access to it goes
// through atomics (header) or the ring protocol (data).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(file: &File, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of an open file; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                // Pre-fault: a ring touched page by page would take a fault per 4 KiB on first use.
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: NonNull::new(p as *mut u8).ok_or_else(|| io::Error::other("mmap returned null"))?, len })
    }

    fn header(&self) -> &SegHeader {
        // SAFETY: the mapping is at least SEG_HEADER_BYTES long (checked before
        // mapping), page-aligned, and the header holds only atomics.
        unsafe { &*(self.ptr.as_ptr() as *const SegHeader) }
    }

    /// Start of ring `i` (0: lower rank to higher, 1: back).
    fn ring(&self, i: usize, capacity: usize) -> NonNull<u8> {
        let off = SEG_HEADER_BYTES + i * round_up(ring::region_len(capacity), PAGE);
        debug_assert!(off + ring::region_len(capacity) <= self.len);
        // SAFETY: in bounds of the mapping (segment_len).
        unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(off)) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length; every ring end holding a
        // pointer into it holds this Arc too, so none is left.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// A segment's name in `/dev/shm`, unlinked on drop unless that already happened.
struct SegmentFile {
    path: PathBuf,
}

impl Drop for SegmentFile {
    fn drop(&mut self) {
        unlink_quietly(&self.path);
    }
}

fn unlink_quietly(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), "shm: cannot remove segment: {e}");
        }
    }
}

/// How a link learns that its peer process is gone.
enum PeerWatch {
    /// The peer is this very process (ranks as threads): it cannot die alone.
    SameProcess,
    /// A pidfd: readable once the process exited, whatever later reuses its pid.
    Pidfd(OwnedFd),
    /// No pidfd (old kernel): `kill(pid, 0)` and ESRCH.
    Pid(i32),
}

impl PeerWatch {
    fn new(pid: i32) -> PeerWatch {
        if pid == std::process::id() as i32 {
            return PeerWatch::SameProcess;
        }
        // SAFETY: plain system call; on success it returns a new descriptor we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor nothing else owns.
            PeerWatch::Pidfd(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        } else {
            PeerWatch::Pid(pid)
        }
    }

    fn alive(&self) -> bool {
        match self {
            PeerWatch::SameProcess => true,
            PeerWatch::Pidfd(fd) => {
                let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd, zero timeout.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                !(n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0)
            }
            PeerWatch::Pid(pid) => {
                // SAFETY: signal 0 only checks that the process exists.
                let r = unsafe { libc::kill(*pid, 0) };
                !(r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH))
            }
        }
    }
}

/// One end of a shared-memory connection to a process on this host.
pub struct ShmLink {
    peer: usize,
    peer_pid: i32,
    tx: RingWriter,
    rx: RingReader,
    watch: PeerWatch,
    last_check: Instant,
    cma: bool,
}

impl ShmLink {
    /// The peer's process id.
    pub fn peer_pid(&self) -> i32 {
        self.peer_pid
    }

    /// Whether a liveness check is due (at most one per [`LIVENESS_INTERVAL`]).
    fn check_due(&mut self) -> bool {
        let now = Instant::now();
        if now.duration_since(self.last_check) >= LIVENESS_INTERVAL {
            self.last_check = now;
            true
        } else {
            false
        }
    }

    fn peer_gone(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("rank {} (pid {}) exited without closing its shared-memory link", self.peer, self.peer_pid),
        )
    }
}

impl Link for ShmLink {
    fn peer(&self) -> usize {
        self.peer
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn try_write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        if self.tx.is_reader_closed() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("rank {} dropped its shared-memory link", self.peer),
            ));
        }
        let n = self.tx.write(bufs);
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) && self.check_due() && !self.watch.alive() {
            return Err(self.peer_gone());
        }
        Ok(n)
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.rx.read(buf);
        if n > 0 || buf.is_empty() {
            return Ok(n);
        }
        if self.rx.is_writer_closed() && self.rx.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("rank {} closed its shared-memory link", self.peer),
            ));
        }
        if self.check_due() && !self.watch.alive() {
            // What it wrote before dying is still good: hand that out first.
            return match self.rx.read(buf) {
                0 => Err(self.peer_gone()),
                n => Ok(n),
            };
        }
        Ok(0)
    }

    fn can_peek(&self) -> bool {
        true
    }

    fn peek(&mut self, max: usize) -> io::Result<&[u8]> {
        // Same end-of-stream and liveness rules as `try_read`; the borrow of the ring
        // is taken last so the checks can use `self`.
        if self.rx.is_empty() && max > 0 {
            if self.rx.is_writer_closed() && self.rx.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("rank {} closed its shared-memory link", self.peer),
                ));
            }
            if self.check_due() && !self.watch.alive() && self.rx.is_empty() {
                return Err(self.peer_gone());
            }
        }
        Ok(self.rx.peek(max))
    }

    fn consume(&mut self, n: usize) {
        self.rx.consume(n);
    }

    fn poll_fd(&self) -> Option<RawFd> {
        None
    }

    fn close(&mut self) {
        self.tx.close();
    }

    fn can_read_peer(&self) -> bool {
        self.cma
    }

    fn read_peer(&mut self, addr: usize, dst: &mut [u8]) -> io::Result<()> {
        if !self.cma {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("process_vm_readv from rank {} did not pass the connect-time probe", self.peer),
            ));
        }
        vm_read(self.peer_pid, addr, dst).map_err(|e| {
            let kind = if e.raw_os_error() == Some(libc::ESRCH) { io::ErrorKind::UnexpectedEof } else { e.kind() };
            io::Error::new(
                kind,
                format!("reading {} bytes at {addr:#x} of rank {} (pid {}): {e}", dst.len(), self.peer, self.peer_pid),
            )
        })
    }
}

/// Copy `dst.len()` bytes from `addr` in process `pid` with `process_vm_readv`,
/// looping over partial reads.
fn vm_read(pid: i32, addr: usize, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let from = addr
            .checked_add(done)
            .filter(|a| *a != 0 && a.checked_add(dst.len() - done).is_some())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "peer address range wraps"))?;
        let local = libc::iovec { iov_base: dst[done..].as_mut_ptr() as *mut libc::c_void, iov_len: dst.len() - done };
        let remote = libc::iovec { iov_base: from as *mut libc::c_void, iov_len: dst.len() - done };
        // SAFETY: `local` covers exactly the writable tail of `dst`; the kernel
        // checks the remote range and fails with EFAULT rather than touching us.
        let r = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "process_vm_readv made no progress"));
        }
        done += r as usize;
    }
    Ok(())
}

/// Where Yama restricts ptrace to descendants (`ptrace_scope` = 1), let any
/// process of ours read this one, as Open MPI's CMA component does. Scopes 2 and 3
/// cannot be relaxed this way; the probe then reports CMA as unavailable.
fn allow_ptrace_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
        if scope.trim() == "1" {
            // SAFETY: prctl with integer arguments only.
            let r = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
            if r != 0 {
                tracing::debug!("shm: PR_SET_PTRACER failed: {}", io::Error::last_os_error());
            }
        }
    });
}

/// 64 random bits from the kernel (falls back to std's per-process random keys).
pub(crate) fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: writes at most 8 bytes into `v`.
    let r = unsafe { libc::getrandom(&mut v as *mut u64 as *mut libc::c_void, 8, 0) };
    if r == 8 {
        return v;
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.write_u32(std::process::id());
    h.finish()
}

/// A segment being set up with one peer.
struct Setup {
    peer: usize,
    /// 0: this rank created the segment (lower rank); 1: it attached.
    side: usize,
    map: Arc<Mapping>,
    /// The name, while it may still exist (the creator's, until the peer attached).
    file: Option<SegmentFile>,
    /// Our probe token; the peer reads it, so it lives until both probes are done.
    token: Box<u64>,
    /// Set once the peer's pid is known.
    watch: Option<PeerWatch>,
    probed: bool,
}

impl Setup {
    fn done(&self) -> bool {
        let h = self.map.header();
        self.probed && h.probe_result.iter().all(|r| r.load(Ordering::Acquire) != PROBE_PENDING)
    }

    /// Read the other side's token through CMA and record whether it matched.
    fn probe(&mut self) {
        let h = self.map.header();
        let other = 1 - self.side;
        let addr = h.probe_addr[other].load(Ordering::Acquire) as usize;
        let want = h.probetoken[other].load(Ordering::Relaxed);
        let pid = h.pids[other].load(Ordering::Relaxed);
        let mut got = [0u8; 8];
        let ok = match vm_read(pid, addr, &mut got) {
            Ok(()) => u64::from_ne_bytes(got) == want,
            Err(e) => {
                tracing::debug!(peer = self.peer, pid, "shm: process_vm_readv probe failed: {e}");
                false
            }
        };
        h.probe_result[self.side].store(if ok { PROBE_OK } else { PROBE_FAILED }, Ordering::Release);
        self.probed = true;
    }

    /// Publish this side's pid and probe token.
    fn announce(&mut self, pid: i32) {
        let h = self.map.header();
        h.pids[self.side].store(pid, Ordering::Relaxed);
        h.probetoken[self.side].store(*self.token, Ordering::Relaxed);
        h.probe_addr[self.side].store(&*self.token as *const u64 as u64, Ordering::Release);
    }

    fn into_link(self) -> Result<ShmLink> {
        let h = self.map.header();
        let cap = h.ring_capacity.load(Ordering::Relaxed) as usize;
        let region = ring::region_len(cap);
        let keep: Arc<dyn Send + Sync> = self.map.clone();
        let (tx_ring, rx_ring) = if self.side == 0 { (0, 1) } else { (1, 0) };
        // SAFETY: both regions lie in the mapping `keep` holds, were set up by the
        // creator, and this side is the only writer of `tx_ring` and the only
        // reader of `rx_ring` (the peer holds the opposite ends).
        let (tx, rx) = unsafe {
            (
                RingWriter::attach(self.map.ring(tx_ring, cap), region, keep.clone()),
                RingReader::attach(self.map.ring(rx_ring, cap), region, keep),
            )
        };
        let what = |e| Error::io(format!("attaching the rings shared with rank {}", self.peer), e);
        let peer_pid = h.pids[1 - self.side].load(Ordering::Relaxed);
        let cma = h.probe_result.iter().all(|r| r.load(Ordering::Acquire) == PROBE_OK);
        Ok(ShmLink {
            peer: self.peer,
            peer_pid,
            tx: tx.map_err(what)?,
            rx: rx.map_err(what)?,
            watch: self.watch.unwrap_or_else(|| PeerWatch::new(peer_pid)),
            last_check: Instant::now(),
            cma,
        })
    }
}

fn setup_ctx(rank: usize) -> OpContext {
    OpContext { rank, call: None, seq: 0 }
}

/// Create, fill in and publish the segment this (lower) rank shares with `peer`.
fn create(opts: &ShmOptions, peer: usize, store: &dyn Store) -> Result<Setup> {
    let rank = opts.rank;
    let cap = opts.ring_bytes;
    let len = segment_len(cap);
    let path = PathBuf::from(format!("{SHM_DIR}/braid-{}-{rank}-{peer}-{:016x}", std::process::id(), random_u64()));
    let what = |doing: &str| format!("rank {rank}: {doing} shared-memory segment {} for rank {peer}", path.display());
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io(what("creating"), e))?;
    // From here on, every early return unlinks the name (SegmentFile's drop).
    let guard = SegmentFile { path: path.clone() };
    // SAFETY: plain system call on our descriptor.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) } != 0 {
        let e = io::Error::last_os_error();
        return Err(Error::io(what(&format!("reserving {len} bytes (is {SHM_DIR} full?) for")), e));
    }
    let map = Arc::new(Mapping::map(&file, len).map_err(|e| Error::io(what("mapping"), e))?);
    // SAFETY: both regions lie inside the fresh mapping, page-aligned, unused.
    unsafe {
        ring::init(map.ring(0, cap), cap);
        ring::init(map.ring(1, cap), cap);
    }
    let h = map.header();
    h.version.store(SEG_VERSION, Ordering::Relaxed);
    h.ring_capacity.store(cap as u64, Ordering::Relaxed);
    h.ranks[0].store(rank as u64, Ordering::Relaxed);
    h.ranks[1].store(peer as u64, Ordering::Relaxed);
    let mut s =
        Setup { peer, side: 0, map, file: Some(guard), token: Box::new(random_u64()), watch: None, probed: false };
    s.announce(std::process::id() as i32);
    s.map.header().magic.store(SEG_MAGIC, Ordering::Release);
    store.set(&segment_key(&opts.key_prefix, rank, peer), path.as_os_str().as_encoded_bytes())?;
    tracing::debug!(rank, peer, path = %path.display(), len, "shm: segment created");
    Ok(s)
}

/// Map the segment lower rank `peer` published as `name`, check it, and say so.
fn attach(opts: &ShmOptions, peer: usize, name: &[u8]) -> Result<Setup> {
    let rank = opts.rank;
    let path = PathBuf::from(String::from_utf8_lossy(name).into_owned());
    let what = |doing: &str| format!("rank {rank}: {doing} shared-memory segment {} of rank {peer}", path.display());
    let bad = |detail: String| Error::Protocol { ctx: setup_ctx(rank), peer, detail };
    // Only a braid segment directly in /dev/shm: the name comes from the store, and
    // this rank is about to write into whatever file it names.
    let is_segment = path.parent() == Some(Path::new(SHM_DIR))
        && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("braid-"));
    if !is_segment {
        return Err(bad(format!("segment name `{}` is not a braid segment in {SHM_DIR}", path.display())));
    }
    let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| Error::io(what("opening"), e))?;
    // The name has served its purpose once we hold the file open.
    unlink_quietly(&path);
    let len = file.metadata().map_err(|e| Error::io(what("inspecting"), e))?.len() as usize;
    if len < SEG_HEADER_BYTES {
        return Err(bad(format!("segment {} has only {len} bytes", path.display())));
    }
    let map = Arc::new(Mapping::map(&file, len).map_err(|e| Error::io(what("mapping"), e))?);
    let h = map.header();
    if h.magic.load(Ordering::Acquire) != SEG_MAGIC || h.version.load(Ordering::Relaxed) != SEG_VERSION {
        return Err(bad(format!("segment {} is not a braid v{SEG_VERSION} segment", path.display())));
    }
    let ranks = [h.ranks[0].load(Ordering::Relaxed), h.ranks[1].load(Ordering::Relaxed)];
    if ranks != [peer as u64, rank as u64] {
        return Err(bad(format!("segment {} links ranks {ranks:?}, not [{peer}, {rank}]", path.display())));
    }
    let cap = h.ring_capacity.load(Ordering::Relaxed) as usize;
    if cap == 0 || segment_len(cap) != len {
        return Err(bad(format!("segment {} has {len} bytes, rings of {cap}", path.display())));
    }
    let pid = h.pids[0].load(Ordering::Relaxed);
    let mut s = Setup {
        peer,
        side: 1,
        map,
        file: None,
        token: Box::new(random_u64()),
        watch: Some(PeerWatch::new(pid)),
        probed: false,
    };
    s.announce(std::process::id() as i32);
    s.map.header().attached.store(1, Ordering::Release);
    s.probe();
    tracing::debug!(rank, peer, path = %path.display(), "shm: segment attached");
    Ok(s)
}

/// Connect this rank by shared memory to every rank marked in `opts.peers`.
///
/// Returns one entry per rank: a link for each marked peer, `None` elsewhere
/// (this rank included). The lower rank of each pair creates the segment, so
/// the call never waits on a rank that waits on it. Fails with
/// [`Error::Timeout`] naming the peers that did not finish by `opts.timeout`,
/// [`Error::PeerLost`] when a peer process dies during setup, and
/// [`Error::Io`] naming both ranks when a segment cannot be made or mapped.
pub fn connect_shm(opts: &ShmOptions, store: &dyn Store) -> Result<Vec<Option<ShmLink>>> {
    let (rank, world) = (opts.rank, opts.world);
    if world == 0 || rank >= world {
        return Err(Error::InvalidArgument(format!("rank {rank} is not below world size {world}")));
    }
    if opts.peers.len() != world {
        return Err(Error::InvalidArgument(format!(
            "shm peers mask has {} entries for world size {world}",
            opts.peers.len()
        )));
    }
    if opts.ring_bytes == 0 {
        return Err(Error::InvalidArgument("shm ring size must be positive".into()));
    }
    let wanted = |j: usize| j != rank && opts.peers[j];
    let mut links: Vec<Option<ShmLink>> = (0..world).map(|_| None).collect();
    if !(0..world).any(wanted) {
        return Ok(links);
    }
    allow_ptrace_once();
    let deadline = Instant::now() + opts.timeout;

    // Higher peers first: publishing never waits, so no rank waits on one that waits on it.
    let mut setups: Vec<Setup> = Vec::new();
    for b in (rank + 1..world).filter(|&b| wanted(b)) {
        setups.push(create(opts, b, store)?);
    }
    let mut lower: Vec<usize> = (0..rank).filter(|&a| wanted(a)).collect();
    let mut pause = Duration::from_micros(100);
    let mut last_check = Instant::now();
    loop {
        let mut progressed = false;
        let mut i = 0;
        while i < lower.len() {
            let a = lower[i];
            match store.get(&segment_key(&opts.key_prefix, a, rank))? {
                Some(name) => {
                    setups.push(attach(opts, a, &name)?);
                    lower.swap_remove(i);
                    progressed = true;
                }
                None => i += 1,
            }
        }
        for s in setups.iter_mut().filter(|s| s.side == 0 && !s.probed) {
            let h = s.map.header();
            if h.attached.load(Ordering::Acquire) == 1 {
                s.file = None; // unlinks the name: both sides have it mapped
                s.watch = Some(PeerWatch::new(h.pids[1].load(Ordering::Relaxed)));
                s.probe();
                progressed = true;
            }
        }
        if lower.is_empty() && setups.iter().all(Setup::done) {
            break;
        }
        if last_check.elapsed() >= LIVENESS_INTERVAL {
            last_check = Instant::now();
            for s in setups.iter().filter(|s| !s.done()) {
                if s.watch.as_ref().is_some_and(|w| !w.alive()) {
                    return Err(Error::PeerLost {
                        ctx: setup_ctx(rank),
                        peer: s.peer,
                        detail: "its process exited during shared-memory setup".into(),
                    });
                }
            }
        }
        if Instant::now() >= deadline {
            let mut waiting_on: Vec<usize> = lower.clone();
            waiting_on.extend(setups.iter().filter(|s| !s.done()).map(|s| s.peer));
            waiting_on.sort_unstable();
            return Err(Error::Timeout { ctx: setup_ctx(rank), timeout: opts.timeout, waiting_on });
        }
        // Short pauses while things move (ranks start together), longer ones for a late rank.
        pause = if progressed { Duration::from_micros(100) } else { (pause * 2).min(Duration::from_millis(10)) };
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
    }
    for s in setups {
        let peer = s.peer;
        links[peer] = Some(s.into_link()?);
    }
    Ok(links)
}
