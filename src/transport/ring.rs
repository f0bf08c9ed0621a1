//! A single-producer single-consumer byte ring that runs over any memory: a heap
//! allocation (threads of one process, [`super::loopback`]) or a shared mapping
//! (processes of one host, [`super::shm`]).
//!
//! A ring region is a [`RingHeader`] followed by `capacity` data bytes. The
//! writer advances `head`, the reader advances `tail`; both are byte counters
//! that only grow (u64, so they never wrap in practice), and `head - tail` is
//! the number of buffered bytes. Each counter sits alone in a 128-byte block so
//! the two sides do not false-share (the adjacent-line prefetcher pulls 64-byte
//! lines in pairs). The header holds only fixed-width atomics in `#[repr(C)]`
//! order, so two processes of the same build agree on it.
//!
//! The two ends are separate types, [`RingWriter`] and [`RingReader`], each the
//! only one of its kind for a region: that is what makes the plain byte copies
//! race-free (the writer owns the free part of the data area, the reader the
//! filled part, and the Release/Acquire pairs on `head` and `tail` order the copies).
//! Dropping an end sets its closed flag, so the other end sees it go.

use std::alloc::{self, Layout};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// A long write publishes its progress in steps of this many bytes.
const PUBLISH_BYTES: usize = 64 << 10;

/// Alignment a ring region must have (the counters' block size).
pub const RING_ALIGN: usize = 128;

/// Written last by [`init`], so an end attaching to a region can tell it was set up.
const MAGIC: u64 = u64::from_le_bytes(*b"BRAIDRNG");

/// One 128-byte block holding a single value.
#[repr(C, align(128))]
struct Block<T>(T);

/// Everything except the counters: written once at set-up, then only the flags change.
#[repr(C)]
struct Meta {
    magic: AtomicU64,
    capacity: AtomicU64,
    writer_closed: AtomicU32,
    reader_closed: AtomicU32,
}

/// The control block at the start of a ring region (384 bytes, 128-aligned).
#[repr(C)]
pub struct RingHeader {
    /// Bytes ever written; stored only by the writer.
    head: Block<AtomicU64>,
    /// Bytes ever read; stored only by the reader.
    tail: Block<AtomicU64>,
    meta: Block<Meta>,
}

/// Size of [`RingHeader`]; the data area starts this many bytes into a region.
pub const RING_HEADER_BYTES: usize = std::mem::size_of::<RingHeader>();

/// Bytes a region needs for a ring of `capacity` data bytes.
pub const fn region_len(capacity: usize) -> usize {
    RING_HEADER_BYTES + capacity
}

/// Set up a ring of `capacity` bytes at `mem` (both counters zero, both ends open).
///
/// # Safety
/// `mem` must be aligned to [`RING_ALIGN`], valid for writes of
/// [`region_len`]`(capacity)` bytes, and not in use by any ring end.
pub unsafe fn init(mem: NonNull<u8>, capacity: usize) {
    debug_assert_eq!(mem.as_ptr() as usize % RING_ALIGN, 0);
    let hdr = mem.as_ptr() as *mut RingHeader;
    // SAFETY: the caller vouches for the memory; nothing else reads it yet.
    unsafe {
        hdr.write(RingHeader {
            head: Block(AtomicU64::new(0)),
            tail: Block(AtomicU64::new(0)),
            meta: Block(Meta {
                magic: AtomicU64::new(0),
                capacity: AtomicU64::new(capacity as u64),
                writer_closed: AtomicU32::new(0),
                reader_closed: AtomicU32::new(0),
            }),
        });
        (*hdr).meta.0.magic.store(MAGIC, Ordering::Release);
    }
}

/// What both ends hold: where the ring is, and something that keeps its memory mapped.
struct View {
    hdr: NonNull<RingHeader>,
    data: NonNull<u8>,
    cap: usize,
    /// Owner of the memory (a heap block or a mapping); dropped after the end's own Drop ran.
    _keep: Arc<dyn Send + Sync>,
}

impl View {
    /// # Safety
    /// `mem` must stay valid for `len` bytes while `keep` lives, be 128-aligned,
    /// and hold a region set up by [`init`] (possibly by another process).
    unsafe fn attach(mem: NonNull<u8>, len: usize, keep: Arc<dyn Send + Sync>) -> io::Result<View> {
        if len < RING_HEADER_BYTES || mem.as_ptr() as usize % RING_ALIGN != 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "ring region too small or misaligned"));
        }
        let hdr = mem.cast::<RingHeader>();
        // SAFETY: in bounds (checked above) and aligned; all fields are atomics.
        let meta = unsafe { &hdr.as_ref().meta.0 };
        if meta.magic.load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "ring region is not initialised"));
        }
        let cap = usize::try_from(meta.capacity.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        if cap == 0 || cap > len - RING_HEADER_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("ring capacity {cap} does not fit a region of {len} bytes"),
            ));
        }
        // SAFETY: RING_HEADER_BYTES <= len.
        let data = unsafe { NonNull::new_unchecked(mem.as_ptr().add(RING_HEADER_BYTES)) };
        Ok(View { hdr, data, cap, _keep: keep })
    }

    fn hdr(&self) -> &RingHeader {
        // SAFETY: `_keep` keeps the region mapped; every field is an atomic.
        unsafe { self.hdr.as_ref() }
    }
}

/// The writing end of a ring. Exactly one exists per ring.
pub struct RingWriter(View);

/// The reading end of a ring. Exactly one exists per ring.
pub struct RingReader(View);

// SAFETY: an end is only used through `&mut self` (or atomics through `&self`), so
// moving it to another thread is fine; the memory it points to outlives it (`_keep`).
unsafe impl Send for RingWriter {}
// SAFETY: as above.
unsafe impl Send for RingReader {}

impl RingWriter {
    /// The writing end of the ring at `mem`.
    ///
    /// # Safety
    /// `mem` must be 128-aligned, valid for `len` bytes as long as `keep` lives,
    /// hold a region set up by [`init`], and no other writer may exist for it (in
    /// any process).
    pub unsafe fn attach(mem: NonNull<u8>, len: usize, keep: Arc<dyn Send + Sync>) -> io::Result<RingWriter> {
        // SAFETY: forwarded contract.
        unsafe { View::attach(mem, len, keep) }.map(RingWriter)
    }

    /// Data bytes the ring holds when full.
    pub fn capacity(&self) -> usize {
        self.0.cap
    }

    /// Copy as much of the concatenation of `bufs` as fits; returns how many bytes were taken.
    pub fn write(&mut self, bufs: &[&[u8]]) -> usize {
        let v = &self.0;
        let cap = v.cap;
        let hdr = v.hdr();
        let head = hdr.head.0.load(Ordering::Relaxed);
        let tail = hdr.tail.0.load(Ordering::Acquire);
        // A corrupt peer (another process) can only shrink this, never push a copy out of bounds.
        let used = head.wrapping_sub(tail).min(cap as u64) as usize;
        let mut free = cap - used;
        let mut pos = head;
        for b in bufs {
            let n = b.len().min(free);
            let mut done = 0;
            while done < n {
                let at = (pos % cap as u64) as usize;
                // Publish every PUBLISH_BYTES so the reader consumes (and reduces) the
                // start of a long message while the rest is still being copied.
                let run = (n - done).min(cap - at).min(PUBLISH_BYTES);
                // SAFETY: [at, at+run) lies inside the data area, in its free part,
                // which only this (single) writer touches until `head` is published.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr().add(done), v.data.as_ptr().add(at), run) };
                done += run;
                pos = pos.wrapping_add(run as u64);
                if done < n {
                    hdr.head.0.store(pos, Ordering::Release);
                }
            }
            free -= n;
            if n < b.len() {
                break;
            }
        }
        let written = pos.wrapping_sub(head) as usize;
        if written > 0 {
            hdr.head.0.store(pos, Ordering::Release);
        }
        written
    }

    /// Bytes that can be written now.
    pub fn free(&self) -> usize {
        let hdr = self.0.hdr();
        let used = hdr.head.0.load(Ordering::Relaxed).wrapping_sub(hdr.tail.0.load(Ordering::Acquire));
        self.0.cap - used.min(self.0.cap as u64) as usize
    }

    /// Mark the stream finished: the reader sees end-of-stream once it drained the ring.
    pub fn close(&mut self) {
        self.0.hdr().meta.0.writer_closed.store(1, Ordering::Release);
    }

    /// Whether the reading end was dropped (nothing written from now on will be read).
    pub fn is_reader_closed(&self) -> bool {
        self.0.hdr().meta.0.reader_closed.load(Ordering::Acquire) != 0
    }
}

impl Drop for RingWriter {
    fn drop(&mut self) {
        self.close();
    }
}

impl RingReader {
    /// The reading end of the ring at `mem`.
    ///
    /// # Safety
    /// As [`RingWriter::attach`], with "no other reader".
    pub unsafe fn attach(mem: NonNull<u8>, len: usize, keep: Arc<dyn Send + Sync>) -> io::Result<RingReader> {
        // SAFETY: forwarded contract.
        unsafe { View::attach(mem, len, keep) }.map(RingReader)
    }

    /// Data bytes the ring holds when full.
    pub fn capacity(&self) -> usize {
        self.0.cap
    }

    /// Copy up to `out.len()` buffered bytes into `out`; returns how many.
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        let v = &self.0;
        let cap = v.cap;
        let hdr = v.hdr();
        let tail = hdr.tail.0.load(Ordering::Relaxed);
        let head = hdr.head.0.load(Ordering::Acquire);
        // Clamped to the capacity so a corrupt peer cannot make us read out of bounds.
        let n = (head.wrapping_sub(tail).min(cap as u64) as usize).min(out.len());
        let mut done = 0;
        while done < n {
            let at = (tail.wrapping_add(done as u64) % cap as u64) as usize;
            // Hand space back every PUBLISH_BYTES so the writer refills the ring while
            // a long read is still copying out of it.
            let run = (n - done).min(cap - at).min(PUBLISH_BYTES);
            // SAFETY: [at, at+run) lies inside the data area, in its filled part,
            // which the writer leaves alone until `tail` is published.
            unsafe { std::ptr::copy_nonoverlapping(v.data.as_ptr().add(at), out.as_mut_ptr().add(done), run) };
            done += run;
            hdr.tail.0.store(tail.wrapping_add(done as u64), Ordering::Release);
        }
        n
    }

    /// The oldest buffered bytes that lie contiguously in the data area (at most
    /// `max`), left in the ring until [`RingReader::consume`]: lets a receiver reduce
    /// straight out of the ring instead of copying into a staging buffer first.
    pub fn peek(&self, max: usize) -> &[u8] {
        let v = &self.0;
        let hdr = v.hdr();
        let tail = hdr.tail.0.load(Ordering::Relaxed);
        let head = hdr.head.0.load(Ordering::Acquire);
        let at = (tail % v.cap as u64) as usize;
        // Clamped like `read`, so a corrupt peer cannot widen the slice.
        let n = (head.wrapping_sub(tail).min(v.cap as u64) as usize).min(max).min(v.cap - at);
        // SAFETY: [at, at+n) lies inside the data area, in its filled part, which the
        // writer leaves alone until `tail` moves past it (only `consume`, which takes
        // `&mut self` and so ends this borrow, moves it).
        unsafe { std::slice::from_raw_parts(v.data.as_ptr().add(at), n) }
    }

    /// Release the first `n` bytes shown by [`RingReader::peek`] to the writer.
    pub fn consume(&mut self, n: usize) {
        let hdr = self.0.hdr();
        let tail = hdr.tail.0.load(Ordering::Relaxed);
        let n = n.min(self.available());
        hdr.tail.0.store(tail.wrapping_add(n as u64), Ordering::Release);
    }

    /// Bytes buffered now.
    pub fn available(&self) -> usize {
        let hdr = self.0.hdr();
        let used = hdr.head.0.load(Ordering::Acquire).wrapping_sub(hdr.tail.0.load(Ordering::Relaxed));
        used.min(self.0.cap as u64) as usize
    }

    /// Whether no byte is buffered.
    pub fn is_empty(&self) -> bool {
        self.available() == 0
    }

    /// Whether the writer closed the stream (bytes may still be buffered).
    pub fn is_writer_closed(&self) -> bool {
        self.0.hdr().meta.0.writer_closed.load(Ordering::Acquire) != 0
    }

    /// Tell the writer nothing more will be read.
    pub fn close(&mut self) {
        self.0.hdr().meta.0.reader_closed.store(1, Ordering::Release);
    }
}

impl Drop for RingReader {
    fn drop(&mut self) {
        self.close();
    }
}

/// A zeroed, 128-aligned heap block that frees itself.
struct HeapRegion {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the block is plain memory; access to it is governed by the ring protocol.
unsafe impl Send for HeapRegion {}
// SAFETY: as above.
unsafe impl Sync for HeapRegion {}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `heap_ring` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A ring of `capacity` bytes on the heap, for two threads of one process.
///
/// # Panics
/// When `capacity` is 0 or the allocation fails.
pub fn heap_ring(capacity: usize) -> (RingWriter, RingReader) {
    assert!(capacity > 0, "a ring needs a capacity");
    let layout = Layout::from_size_align(region_len(capacity), RING_ALIGN).expect("ring size overflows");
    // SAFETY: the layout has a non-zero size.
    let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).unwrap_or_else(|| alloc::handle_alloc_error(layout));
    let region: Arc<dyn Send + Sync> = Arc::new(HeapRegion { ptr, layout });
    // SAFETY: fresh, aligned, large enough; exactly one writer and one reader are made.
    unsafe {
        init(ptr, capacity);
        let w = RingWriter::attach(ptr, layout.size(), region.clone()).expect("fresh ring attaches");
        let r = RingReader::attach(ptr, layout.size(), region).expect("fresh ring attaches");
        (w, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_fixed() {
        assert_eq!(RING_HEADER_BYTES, 384);
        assert_eq!(std::mem::align_of::<RingHeader>(), RING_ALIGN);
    }

    #[test]
    fn gathers_writes_and_wraps_around() {
        let (mut w, mut r) = heap_ring(10);
        assert!(r.is_empty());
        assert_eq!(w.write(&[b"abc", b"defgh"]), 8);
        assert_eq!(w.free(), 2);
        // Only a prefix of the second buffer fits, and nothing of the third.
        assert_eq!(w.write(&[b"ij", b"kl"]), 2);
        assert_eq!(w.write(&[b"x"]), 0);
        let mut out = [0u8; 7];
        assert_eq!(r.read(&mut out), 7);
        assert_eq!(&out, b"abcdefg");
        assert_eq!(w.write(&[b"klmnopqrs"]), 7);
        let mut out = [0u8; 20];
        assert_eq!(r.read(&mut out), 10);
        assert_eq!(&out[..10], b"hijklmnopq");
        assert!(r.is_empty());
    }

    #[test]
    fn peek_shows_contiguous_bytes_until_consumed() {
        let (mut w, mut r) = heap_ring(10);
        assert_eq!(r.peek(100), b"");
        assert_eq!(w.write(&[b"abcdefgh"]), 8);
        assert_eq!(r.peek(3), b"abc");
        r.consume(6);
        assert_eq!(w.write(&[b"ijklmn"]), 6);
        // The filled part wraps: a peek stops at the end of the data area.
        assert_eq!(r.peek(100), b"ghij");
        r.consume(4);
        assert_eq!(r.peek(100), b"klmn");
        // Consuming more than is buffered releases only what is there.
        r.consume(100);
        assert!(r.is_empty());
        assert_eq!(w.free(), 10);
    }

    #[test]
    fn dropping_an_end_closes_it() {
        let (w, r) = heap_ring(16);
        assert!(!r.is_writer_closed());
        drop(w);
        assert!(r.is_writer_closed());
        let (w, r) = heap_ring(16);
        drop(r);
        assert!(w.is_reader_closed());
    }

    #[test]
    fn attaching_checks_the_region() {
        let layout = Layout::from_size_align(1024, RING_ALIGN).unwrap();
        // SAFETY: non-zero size; freed below.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).unwrap();
        let keep: Arc<dyn Send + Sync> = Arc::new(());
        // SAFETY: valid, aligned memory of 1024 bytes that outlives the attempts.
        unsafe {
            assert!(RingReader::attach(ptr, 1024, keep.clone()).is_err(), "not initialised");
            init(ptr, 1024 - RING_HEADER_BYTES + 1);
            assert!(RingReader::attach(ptr, 1024, keep.clone()).is_err(), "capacity too big");
            init(ptr, 1024 - RING_HEADER_BYTES);
            assert_eq!(RingReader::attach(ptr, 1024, keep).unwrap().capacity(), 1024 - RING_HEADER_BYTES);
            alloc::dealloc(ptr.as_ptr(), layout);
        }
    }
}
