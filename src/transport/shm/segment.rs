//! The shared segment itself: its header layout, the checks an attacher makes
//! before trusting it, and the mapping both ends hold.
//!
//! Everything in the header can be rewritten by the peer at any moment, so a
//! value is read once, checked, and kept privately ([`Mapping::cap`]); nothing
//! later re-reads it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use super::super::ring;
use super::exposure::ExposureWords;

/// Written last by the creator: an attacher that sees it sees a complete header.
pub(super) const SEG_MAGIC: u64 = u64::from_le_bytes(*b"BRAIDSHM");
/// Bump on any change of the segment layout (2: job-key challenge-response;
/// 3: exposure words for single copy).
pub(super) const SEG_VERSION: u32 = 3;
/// The segment header takes one page, so the rings start page-aligned.
pub(super) const SEG_HEADER_BYTES: usize = 4096;
const PAGE: usize = 4096;
/// Largest ring either side accepts: far above any useful size (the default is
/// 512 KiB), small enough that a segment length never comes near overflowing.
pub const MAX_RING_BYTES: usize = 1 << 30;

/// Probe outcomes in the header.
pub(super) const PROBE_PENDING: u32 = 0;
pub(super) const PROBE_OK: u32 = 1;
/// Failed, or not attempted because this side does not want CMA.
pub(super) const PROBE_FAILED: u32 = 2;

/// The creator's verdict on the attacher's job-key proof.
pub(super) const VERDICT_PENDING: u32 = 0;
pub(super) const VERDICT_ACCEPTED: u32 = 1;
pub(super) const VERDICT_REJECTED: u32 = 2;

/// 32 bytes (a challenge or a proof) as atomics, since both processes touch the header.
pub(super) type Words = [AtomicU64; 4];

/// The segment header. Index 0 of each pair is the creator (lower rank), 1 the attacher.
#[repr(C)]
pub(super) struct SegHeader {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    /// Set to 1 by the attacher once it has mapped the segment and written its proof.
    pub attached: AtomicU32,
    pub ring_capacity: AtomicU64,
    pub ranks: [AtomicU64; 2],
    pub pids: [AtomicI32; 2],
    /// `probe_result[i]`: whether side i could read side 1-i's token with CMA.
    pub probe_result: [AtomicU32; 2],
    pub probetoken: [AtomicU64; 2],
    /// Address of side i's token in its own address space, stored after the token (Release).
    pub probe_addr: [AtomicU64; 2],
    /// Set by side i once it may be probed (its ptrace policy is in place).
    pub probe_ready: [AtomicU32; 2],
    /// Side i's job-key challenge.
    pub challenge: [Words; 2],
    /// Side i's answer to side 1-i's challenge.
    pub proof: [Words; 2],
    /// The creator's verdict on the attacher's proof; its own proof is valid once accepted.
    pub verdict: AtomicU32,
    /// Random, published with a memfd handle: tells the attacher it opened this
    /// very segment and not some other descriptor that process holds.
    pub segment_id: AtomicU64,
    /// What side i lets side 1-i read of its memory ([`super::exposure`]).
    pub exposure: [ExposureWords; 2],
}

const _: () = assert!(std::mem::size_of::<SegHeader>() <= SEG_HEADER_BYTES);

/// Store 32 bytes into header words.
pub(super) fn store_words(w: &Words, bytes: &[u8; 32]) {
    for (i, word) in w.iter().enumerate() {
        word.store(u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes")), Ordering::Relaxed);
    }
}

/// Load 32 bytes from header words.
pub(super) fn load_words(w: &Words) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, word) in w.iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    out
}

/// Bytes of one ring region rounded up to whole pages, or `None` on overflow.
fn ring_stride(capacity: usize) -> Option<usize> {
    ring::RING_HEADER_BYTES.checked_add(capacity)?.checked_next_multiple_of(PAGE)
}

/// Bytes of a segment whose rings hold `capacity` bytes each, or `None` when that
/// does not fit a `usize` (a peer-chosen capacity must not wrap it into a small length).
pub(super) fn segment_len(capacity: usize) -> Option<usize> {
    ring_stride(capacity)?.checked_mul(2)?.checked_add(SEG_HEADER_BYTES)
}

/// What an attacher reads from a segment before it trusts it: one snapshot of
/// the peer-writable fields, taken once.
#[derive(Clone, Copy, Debug)]
pub(super) struct HeaderFields {
    pub magic: u64,
    pub version: u32,
    pub ranks: [u64; 2],
    pub ring_capacity: u64,
    pub segment_id: u64,
}

/// `N` bytes of `image` at `off`; bytes past its end read as zero.
fn bytes_at<const N: usize>(image: &[u8], off: usize) -> [u8; N] {
    let mut b = [0u8; N];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = off.checked_add(i).and_then(|at| image.get(at)).copied().unwrap_or(0);
    }
    b
}

impl HeaderFields {
    /// The fields in a byte image of the header (the header's atomics hold
    /// native-endian values). Any slice parses; missing bytes read as zero.
    pub(super) fn parse(image: &[u8]) -> HeaderFields {
        use std::mem::offset_of;
        let u64_at = |off| u64::from_ne_bytes(bytes_at(image, off));
        let ranks = offset_of!(SegHeader, ranks);
        HeaderFields {
            magic: u64_at(offset_of!(SegHeader, magic)),
            version: u32::from_ne_bytes(bytes_at(image, offset_of!(SegHeader, version))),
            ranks: [u64_at(ranks), u64_at(ranks + 8)],
            ring_capacity: u64_at(offset_of!(SegHeader, ring_capacity)),
            segment_id: u64_at(offset_of!(SegHeader, segment_id)),
        }
    }
}

/// Check a header snapshot of a segment `file_len` bytes long that `creator` made
/// for `attacher` (with id `segment_id`, when it was published with one); returns
/// the ring capacity to use from then on. Pure, so it can be fed arbitrary values.
pub(super) fn validate_header(
    f: &HeaderFields,
    file_len: u64,
    creator: usize,
    attacher: usize,
    segment_id: Option<u64>,
) -> Result<usize, String> {
    if f.magic != SEG_MAGIC || f.version != SEG_VERSION {
        return Err(format!("not a braid v{SEG_VERSION} segment (magic {:#x}, version {})", f.magic, f.version));
    }
    if segment_id.is_some_and(|id| id != f.segment_id) {
        return Err(format!("segment id {:#x} is not the one published", f.segment_id));
    }
    if f.ranks != [creator as u64, attacher as u64] {
        return Err(format!("it links ranks {:?}, not [{creator}, {attacher}]", f.ranks));
    }
    let cap = usize::try_from(f.ring_capacity).ok().filter(|c| (1..=MAX_RING_BYTES).contains(c));
    let Some(cap) = cap else {
        return Err(format!("ring capacity {} is not in 1..={MAX_RING_BYTES}", f.ring_capacity));
    };
    match segment_len(cap) {
        Some(len) if len as u64 == file_len => Ok(cap),
        _ => Err(format!("it has {file_len} bytes, which rings of {cap} bytes do not fill")),
    }
}

/// A shared mapping of a whole segment, unmapped on drop. Its length and ring
/// capacity are fixed when it is made (checked then) and never re-read.
pub(super) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: the mapping is plain shared memory; all concurrent access to it goes
// through atomics (header) or the ring protocol (data).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map the segment in `file` for rings of `cap` bytes. The caller has checked
    /// that the file is [`segment_len`]`(cap)` bytes long (made so, or validated).
    pub(super) fn map(file: &File, cap: usize) -> io::Result<Mapping> {
        let len = segment_len(cap)
            .filter(|_| (1..=MAX_RING_BYTES).contains(&cap))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no segment for rings of {cap}")))?;
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
        Ok(Mapping { ptr: NonNull::new(p as *mut u8).ok_or_else(|| io::Error::other("mmap returned null"))?, len, cap })
    }

    pub(super) fn header(&self) -> &SegHeader {
        // SAFETY: len >= SEG_HEADER_BYTES (segment_len), the mapping is page-aligned,
        // and the header holds only atomics, so any bytes the peer writes are valid.
        unsafe { &*(self.ptr.as_ptr() as *const SegHeader) }
    }

    /// Start and length of ring region `i` (0: lower rank to higher, 1: back).
    pub(super) fn ring(&self, i: usize) -> io::Result<(NonNull<u8>, usize)> {
        let region = ring::RING_HEADER_BYTES + self.cap;
        let off = ring_stride(self.cap)
            .and_then(|s| s.checked_mul(i))
            .and_then(|o| o.checked_add(SEG_HEADER_BYTES))
            .filter(|&o| i < 2 && o.checked_add(region).is_some_and(|end| end <= self.len));
        let Some(off) = off else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("ring {i} lies outside the segment")));
        };
        // SAFETY: off + region <= len (checked above), so the pointer stays in the mapping.
        Ok((unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(off)) }, region))
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length; every ring end holding a
        // pointer into it holds this Arc too, so none is left.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// Seals that make a memfd segment's length fixed for good: nobody (the peer
/// included) can shrink it under our mapping (SIGBUS), grow it, or change the seals.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A sealed anonymous segment of `len` bytes (`memfd_create`, then `fallocate`,
/// then [`SEALS`]).
pub(super) fn create_memfd(name: &str, len: usize) -> io::Result<File> {
    let cname = std::ffi::CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a NUL-terminated name and flags; returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: plain system calls on our descriptor.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0
        || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// What the creator publishes for a memfd segment: where the attacher opens it
/// (the creator's pid and descriptor) and the id in its header.
pub(super) fn memfd_handle(pid: u32, fd: i32, segment_id: u64) -> String {
    format!("memfd:{pid}:{fd}:{segment_id:016x}")
}

/// The pid, descriptor and id in a [`memfd_handle`], if `text` is one.
pub(super) fn parse_memfd_handle(text: &[u8]) -> Option<(u32, i32, u64)> {
    let text = std::str::from_utf8(text).ok()?.strip_prefix("memfd:")?;
    let mut parts = text.split(':');
    let pid = parts.next()?.parse().ok().filter(|&p: &u32| p > 0)?;
    let fd = parts.next()?.parse().ok().filter(|&f: &i32| f >= 0)?;
    let id = u64::from_str_radix(parts.next()?, 16).ok()?;
    parts.next().is_none().then_some((pid, fd, id))
}

/// Open descriptor `fd` of process `pid` through `/proc` (the same memory object,
/// read-write), and check that it is a sealed memfd: a regular file whose length
/// nobody can change. Fails where `/proc` does not show that process (another pid
/// namespace, `hidepid`) or ptrace policy forbids it; the caller then falls back
/// to a named segment.
pub(super) fn open_memfd(pid: u32, fd: i32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(format!("/proc/{pid}/fd/{fd}"))?;
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
    }
    // SAFETY: plain system call on our descriptor.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & SEALS != SEALS {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("not a sealed memfd (seals {seals:#x})")));
    }
    Ok(file)
}

/// A segment's name in `/dev/shm`, unlinked on drop unless that already happened.
pub(super) struct SegmentFile {
    pub path: PathBuf,
}

impl Drop for SegmentFile {
    fn drop(&mut self) {
        unlink_quietly(&self.path);
    }
}

pub(super) fn unlink_quietly(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), "shm: cannot remove segment: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn image(f: &HeaderFields) -> Vec<u8> {
        use std::mem::offset_of;
        let mut img = vec![0u8; SEG_HEADER_BYTES];
        let mut put = |off: usize, b: &[u8]| img[off..off + b.len()].copy_from_slice(b);
        put(offset_of!(SegHeader, magic), &f.magic.to_ne_bytes());
        put(offset_of!(SegHeader, version), &f.version.to_ne_bytes());
        put(offset_of!(SegHeader, ranks), &f.ranks[0].to_ne_bytes());
        put(offset_of!(SegHeader, ranks) + 8, &f.ranks[1].to_ne_bytes());
        put(offset_of!(SegHeader, ring_capacity), &f.ring_capacity.to_ne_bytes());
        put(offset_of!(SegHeader, segment_id), &f.segment_id.to_ne_bytes());
        img
    }

    fn good(cap: u64) -> HeaderFields {
        HeaderFields { magic: SEG_MAGIC, version: SEG_VERSION, ranks: [0, 1], ring_capacity: cap, segment_id: 7 }
    }

    #[test]
    fn a_good_header_gives_its_capacity_and_each_bad_field_is_named() {
        let len = segment_len(512 << 10).unwrap() as u64;
        assert_eq!(validate_header(&HeaderFields::parse(&image(&good(512 << 10))), len, 0, 1, None), Ok(512 << 10));
        let e = validate_header(&good(512 << 10), len, 0, 2, None).unwrap_err();
        assert!(e.contains("[0, 2]"), "{e}");
        let e = validate_header(&good(512 << 10), len - 1, 0, 1, None).unwrap_err();
        assert!(e.contains("bytes"), "{e}");
        let e = validate_header(&HeaderFields { version: 1, ..good(512 << 10) }, len, 0, 1, None).unwrap_err();
        assert!(e.contains("v3"), "{e}");
        // A capacity whose segment length would wrap around to a small number.
        let e = validate_header(&good(512 << 10), len, 0, 1, Some(8)).unwrap_err();
        assert!(e.contains("segment id"), "{e}");
        for cap in [u64::MAX, u64::MAX - 4095, (usize::MAX / 2) as u64, MAX_RING_BYTES as u64 + 1, 0] {
            assert!(validate_header(&good(cap), len, 0, 1, None).is_err(), "{cap}");
        }
        assert_eq!(segment_len(usize::MAX), None);
        assert_eq!(segment_len(usize::MAX / 2), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        /// Arbitrary header bytes and file lengths: the decoder never panics, and
        /// whatever it accepts is a capacity in range whose segment is exactly the file.
        #[test]
        fn the_header_decoder_accepts_only_capacities_that_fill_the_file(
            bytes in proptest::collection::vec(any::<u8>(), 0..SEG_HEADER_BYTES),
            file_len in any::<u64>(),
            creator in 0usize..8,
            attacher in 0usize..8,
            id in proptest::option::of(any::<u64>()),
        ) {
            let f = HeaderFields::parse(&bytes);
            if let Ok(cap) = validate_header(&f, file_len, creator, attacher, id) {
                prop_assert!(id.is_none_or(|id| id == f.segment_id));
                prop_assert!((1..=MAX_RING_BYTES).contains(&cap));
                prop_assert_eq!(segment_len(cap).map(|l| l as u64), Some(file_len));
            }
        }

        /// Valid magic and ranks, arbitrary capacity and length (the interesting
        /// part, which random bytes almost never reach).
        #[test]
        fn any_capacity_is_accepted_only_with_its_exact_length(
            cap in prop_oneof![any::<u64>(), 0u64..=(MAX_RING_BYTES as u64 + 8192), (u64::MAX - 8192)..=u64::MAX],
            len in prop_oneof![any::<u64>(), 0u64..=(3 * MAX_RING_BYTES as u64)],
            exact in any::<bool>(),
        ) {
            let want = usize::try_from(cap).ok().and_then(segment_len);
            let file_len = if exact { want.map_or(len, |l| l as u64) } else { len };
            match validate_header(&HeaderFields::parse(&image(&good(cap))), file_len, 0, 1, Some(7)) {
                Ok(got) => {
                    prop_assert_eq!(got as u64, cap);
                    prop_assert!((1..=MAX_RING_BYTES).contains(&got));
                    prop_assert_eq!(segment_len(got).map(|l| l as u64), Some(file_len));
                }
                Err(_) => prop_assert!(
                    cap == 0 || cap > MAX_RING_BYTES as u64 || want.map(|l| l as u64) != Some(file_len)
                ),
            }
        }
    }

    #[test]
    fn rings_lie_inside_the_mapping() {
        let file = tempfile_in_shm();
        let cap = 1000;
        // SAFETY: plain system call on our descriptor.
        assert_eq!(unsafe { libc::ftruncate(file.as_raw_fd(), segment_len(cap).unwrap() as libc::off_t) }, 0);
        let map = Mapping::map(&file, cap).unwrap();
        let (r0, l0) = map.ring(0).unwrap();
        let (r1, l1) = map.ring(1).unwrap();
        assert_eq!((l0, l1), (ring::RING_HEADER_BYTES + cap, ring::RING_HEADER_BYTES + cap));
        let base = map.ptr.as_ptr() as usize;
        assert_eq!(r0.as_ptr() as usize - base, SEG_HEADER_BYTES);
        assert!(r1.as_ptr() as usize - base + l1 <= map.len);
        assert!(map.ring(2).is_err());
        assert!(map.ring(usize::MAX).is_err());
        assert!(Mapping::map(&file, 0).is_err() && Mapping::map(&file, usize::MAX).is_err());
    }

    fn tempfile_in_shm() -> File {
        let path = format!("/dev/shm/braid-test-seg-{}-{:016x}", std::process::id(), super::super::random_u64());
        let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        unlink_quietly(Path::new(&path));
        f
    }
}
