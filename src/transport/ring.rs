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

use super::stream_copy::WriterStreaming;

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

/// The error for counters no correct peer can produce: the ring is corrupt or
/// the peer is not following the protocol.
fn corrupt(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// The writing end of a ring. Exactly one exists per ring.
///
/// The peer (possibly another process) can write anything into the ring header
/// at any time, so this end keeps its own `head` and the last `tail` it saw, and
/// never uses a shared value it has not checked: a `tail` that goes backwards
/// or past `head` is a protocol error, never a copy out of bounds.
pub struct RingWriter {
    view: View,
    /// Bytes ever written (this end is the only writer of the shared `head`).
    head: u64,
    /// The reader's `tail` when last looked at; it only grows.
    seen_tail: u64,
    /// Plain or streaming stores for large writes.
    stream: WriterStreaming,
}

/// The reading end of a ring. Exactly one exists per ring.
///
/// Keeps its own `tail` and the last `head` it saw, like [`RingWriter`]: a `head`
/// that goes backwards or runs more than a capacity ahead is a protocol error.
pub struct RingReader {
    view: View,
    /// Bytes ever read (this end is the only writer of the shared `tail`).
    tail: u64,
    /// The writer's `head` when last looked at (checked, so `tail <= seen_head <= tail + cap`).
    seen_head: std::cell::Cell<u64>,
}

// SAFETY: an end is only used through `&mut self` (or atomics through `&self`), so
// moving it to another thread is fine; the memory it points to outlives it (`_keep`).
unsafe impl Send for RingWriter {}
// SAFETY: as above (the `Cell` is only touched by the thread holding the end).
unsafe impl Send for RingReader {}

/// Both counters as they stand when an end attaches, checked against each other.
fn attach_counters(view: &View) -> io::Result<(u64, u64)> {
    let hdr = view.hdr();
    let (head, tail) = (hdr.head.0.load(Ordering::Acquire), hdr.tail.0.load(Ordering::Acquire));
    // Far below where u64 counters would wrap (2^62 bytes is a century at 1 TB/s),
    // so plain additions on them cannot overflow.
    if tail > head || head - tail > view.cap as u64 || head >= 1 << 62 {
        return Err(corrupt(format!("ring counters head {head} tail {tail} do not fit a capacity of {}", view.cap)));
    }
    Ok((head, tail))
}

impl RingWriter {
    /// The writing end of the ring at `mem`.
    ///
    /// # Safety
    /// `mem` must be 128-aligned, valid for `len` bytes as long as `keep` lives,
    /// hold a region set up by [`init`], and no other writer may exist for it (in
    /// any process).
    pub unsafe fn attach(mem: NonNull<u8>, len: usize, keep: Arc<dyn Send + Sync>) -> io::Result<RingWriter> {
        // SAFETY: forwarded contract.
        let view = unsafe { View::attach(mem, len, keep) }?;
        let (head, tail) = attach_counters(&view)?;
        Ok(RingWriter { view, head, seen_tail: tail, stream: WriterStreaming::plain() })
    }

    /// Data bytes the ring holds when full.
    pub fn capacity(&self) -> usize {
        self.view.cap
    }

    /// Bytes buffered now, from the reader's checked `tail`.
    fn used(&mut self) -> io::Result<usize> {
        let tail = self.view.hdr().tail.0.load(Ordering::Acquire);
        if tail < self.seen_tail || tail > self.head {
            return Err(corrupt(format!(
                "ring tail moved from {} to {tail} with head at {}: the reader broke the protocol",
                self.seen_tail, self.head
            )));
        }
        self.seen_tail = tail;
        // head - seen_tail <= cap holds by induction: this end never writes more than is free.
        Ok((self.head - tail) as usize)
    }

    /// Copy as much of the concatenation of `bufs` as fits; returns how many bytes
    /// were taken. Fails with `InvalidData` when the reader's counter is corrupt.
    pub fn write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        let cap = self.view.cap;
        // The reader's counter sits on a line the reader keeps writing: loading it
        // costs a cross-core miss on every small message. The last value seen is a
        // lower bound of the free space (the tail only moves forward), so it is
        // reloaded only when that is not enough.
        let mut free = cap - (self.head - self.seen_tail) as usize;
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        if free < want {
            free = cap - self.used()?;
        }
        let streamed = self.stream.pick(want.min(free));
        let v = &self.view;
        let hdr = v.hdr();
        let start = self.head;
        let mut pos = start;
        for b in bufs {
            let n = b.len().min(free);
            let mut done = 0;
            while done < n {
                let at = (pos % cap as u64) as usize;
                // Publish every PUBLISH_BYTES so the reader consumes (and reduces) the
                // start of a long message while the rest is still being copied.
                let run = (n - done).min(cap - at).min(PUBLISH_BYTES);
                // SAFETY: at < cap and run <= cap - at, so [at, at+run) lies inside the
                // data area (`cap` is this end's own validated copy); it is in the free
                // part, which only this (single) writer touches until `head` is published.
                unsafe {
                    let (src, dst) = (b.as_ptr().add(done), v.data.as_ptr().add(at));
                    if streamed {
                        // Ends with a store fence: the data is ordered before `head`.
                        crate::reduce::copy_nontemporal_raw(dst, src, run)
                    } else {
                        std::ptr::copy_nonoverlapping(src, dst, run)
                    }
                };
                done += run;
                pos += run as u64;
                if done < n {
                    hdr.head.0.store(pos, Ordering::Release);
                }
            }
            free -= n;
            if n < b.len() {
                break;
            }
        }
        let written = (pos - start) as usize;
        if written > 0 {
            self.head = pos;
            hdr.head.0.store(pos, Ordering::Release);
        }
        Ok(written)
    }

    /// How large writes are stored (see [`super::stream_copy`]); plain until set.
    pub fn set_streaming(&mut self, streaming: WriterStreaming) {
        self.stream = streaming;
    }

    /// Bytes that can be written now (0 when the reader's counter is corrupt:
    /// [`RingWriter::write`] reports that).
    pub fn free(&self) -> usize {
        let tail = self.view.hdr().tail.0.load(Ordering::Acquire);
        if tail < self.seen_tail || tail > self.head {
            return 0;
        }
        self.view.cap - (self.head - tail) as usize
    }

    /// Mark the stream finished: the reader sees end-of-stream once it drained the ring.
    pub fn close(&mut self) {
        self.view.hdr().meta.0.writer_closed.store(1, Ordering::Release);
    }

    /// Whether the reading end was dropped (nothing written from now on will be read).
    pub fn is_reader_closed(&self) -> bool {
        self.view.hdr().meta.0.reader_closed.load(Ordering::Acquire) != 0
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
        let view = unsafe { View::attach(mem, len, keep) }?;
        let (head, tail) = attach_counters(&view)?;
        Ok(RingReader { view, tail, seen_head: std::cell::Cell::new(head) })
    }

    /// Data bytes the ring holds when full.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.view.cap
    }

    /// Bytes buffered now, from the writer's checked `head`.
    fn filled(&self) -> io::Result<usize> {
        let head = self.view.hdr().head.0.load(Ordering::Acquire);
        let seen = self.seen_head.get();
        // `head < tail` wraps to a huge difference, so one comparison covers it.
        if head < seen || head.wrapping_sub(self.tail) > self.view.cap as u64 {
            return Err(corrupt(format!(
                "ring head moved from {seen} to {head} with tail at {} and capacity {}: the writer broke the protocol",
                self.tail, self.view.cap
            )));
        }
        self.seen_head.set(head);
        Ok((head - self.tail) as usize)
    }

    /// Copy up to `out.len()` buffered bytes into `out`; returns how many. Fails
    /// with `InvalidData` when the writer's counter is corrupt.
    pub fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.filled()?.min(out.len());
        let v = &self.view;
        let cap = v.cap;
        let hdr = v.hdr();
        let tail = self.tail;
        let mut done = 0;
        while done < n {
            let at = ((tail + done as u64) % cap as u64) as usize;
            // Hand space back every PUBLISH_BYTES so the writer refills the ring while
            // a long read is still copying out of it.
            let run = (n - done).min(cap - at).min(PUBLISH_BYTES);
            // SAFETY: at < cap and run <= cap - at, so [at, at+run) lies inside the data
            // area (`cap` is this end's validated copy); it is in the filled part (n <=
            // checked head - tail), which the writer leaves alone until `tail` moves.
            unsafe { std::ptr::copy_nonoverlapping(v.data.as_ptr().add(at), out.as_mut_ptr().add(done), run) };
            done += run;
            self.tail = tail + done as u64;
            hdr.tail.0.store(self.tail, Ordering::Release);
        }
        Ok(n)
    }

    /// The oldest buffered bytes that lie contiguously in the data area (at most
    /// `max`), left in the ring until [`RingReader::consume`]: lets a receiver reduce
    /// straight out of the ring instead of copying into a staging buffer first.
    /// Fails like [`RingReader::read`].
    pub fn peek(&self, max: usize) -> io::Result<&[u8]> {
        let filled = self.filled()?;
        let v = &self.view;
        let at = (self.tail % v.cap as u64) as usize;
        let n = filled.min(max).min(v.cap - at);
        // SAFETY: [at, at+n) lies inside the data area (at < cap, n <= cap - at), in its
        // filled part, which the writer leaves alone until `tail` moves past it (only
        // `read` and `consume`, which take `&mut self` and so end this borrow, move it).
        Ok(unsafe { std::slice::from_raw_parts(v.data.as_ptr().add(at), n) })
    }

    /// Release the first `n` bytes shown by [`RingReader::peek`] to the writer (at
    /// most what the last look at the writer's counter showed).
    pub fn consume(&mut self, n: usize) {
        let n = (n as u64).min(self.seen_head.get() - self.tail);
        self.tail += n;
        self.view.hdr().tail.0.store(self.tail, Ordering::Release);
    }

    /// Bytes buffered now. A corrupt counter counts as something to read, so the
    /// caller goes on to [`RingReader::read`] or [`RingReader::peek`] and gets the error.
    pub fn available(&self) -> usize {
        let head = self.view.hdr().head.0.load(Ordering::Acquire);
        let filled = head.wrapping_sub(self.tail);
        if head < self.seen_head.get() || filled > self.view.cap as u64 {
            return 1;
        }
        filled as usize
    }

    /// Whether no byte is buffered.
    pub fn is_empty(&self) -> bool {
        self.available() == 0
    }

    /// Whether the writer closed the stream (bytes may still be buffered).
    pub fn is_writer_closed(&self) -> bool {
        self.view.hdr().meta.0.writer_closed.load(Ordering::Acquire) != 0
    }

    /// Tell the writer nothing more will be read.
    pub fn close(&mut self) {
        self.view.hdr().meta.0.reader_closed.store(1, Ordering::Release);
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
        assert_eq!(w.write(&[b"abc", b"defgh"]).unwrap(), 8);
        assert_eq!(w.free(), 2);
        // Only a prefix of the second buffer fits, and nothing of the third.
        assert_eq!(w.write(&[b"ij", b"kl"]).unwrap(), 2);
        assert_eq!(w.write(&[b"x"]).unwrap(), 0);
        let mut out = [0u8; 7];
        assert_eq!(r.read(&mut out).unwrap(), 7);
        assert_eq!(&out, b"abcdefg");
        assert_eq!(w.write(&[b"klmnopqrs"]).unwrap(), 7);
        let mut out = [0u8; 20];
        assert_eq!(r.read(&mut out).unwrap(), 10);
        assert_eq!(&out[..10], b"hijklmnopq");
        assert!(r.is_empty());
    }

    #[test]
    fn peek_shows_contiguous_bytes_until_consumed() {
        let (mut w, mut r) = heap_ring(10);
        assert_eq!(r.peek(100).unwrap(), b"");
        assert_eq!(w.write(&[b"abcdefgh"]).unwrap(), 8);
        assert_eq!(r.peek(3).unwrap(), b"abc");
        r.consume(6);
        assert_eq!(w.write(&[b"ijklmn"]).unwrap(), 6);
        // The filled part wraps: a peek stops at the end of the data area.
        assert_eq!(r.peek(100).unwrap(), b"ghij");
        r.consume(4);
        assert_eq!(r.peek(100).unwrap(), b"klmn");
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

    #[test]
    fn a_head_beyond_the_capacity_or_going_back_is_invalid_data() {
        let (mut w, mut r) = heap_ring(64);
        assert_eq!(w.write(&[b"abcd"]).unwrap(), 4);
        // The writer (a bad peer) claims far more than the ring holds.
        r.view.hdr().head.0.store(1 << 50, Ordering::Release);
        let mut out = [0u8; 200];
        assert_eq!(r.read(&mut out).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(r.peek(200).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert!(!r.is_empty(), "a corrupt ring must not look empty (the caller would wait forever)");
        // Nothing was consumed by the failed reads.
        assert_eq!(r.tail, 0);
        r.view.hdr().head.0.store(4, Ordering::Release);
        assert_eq!(r.read(&mut out[..2]).unwrap(), 2);
        assert_eq!(&out[..2], b"ab");
        // Now a head behind what the reader already saw (and behind its tail).
        r.view.hdr().head.0.store(1, Ordering::Release);
        assert_eq!(r.read(&mut out).unwrap_err().kind(), io::ErrorKind::InvalidData);
        r.view.hdr().head.0.store(3, Ordering::Release);
        let e = r.read(&mut out).unwrap_err();
        assert!(e.to_string().contains("moved from 4 to 3"), "{e}");
    }

    #[test]
    fn a_tail_beyond_the_head_or_going_back_is_invalid_data() {
        let (mut w, mut r) = heap_ring(64);
        assert_eq!(w.write(&[b"abcdefgh"]).unwrap(), 8);
        let mut out = [0u8; 4];
        assert_eq!(r.read(&mut out).unwrap(), 4);
        // A write that fits the free space already known does not look at the
        // reader's counter (head 9, last seen tail 0: 55 bytes known free).
        assert_eq!(w.write(&[b"i"]).unwrap(), 1);
        let big = [7u8; 58];
        // The reader (a bad peer) claims to have read bytes never written: seen as
        // soon as a write needs more room than is known free.
        w.view.hdr().tail.0.store(100, Ordering::Release);
        assert_eq!(w.write(&[&big]).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(w.free(), 0);
        // The true counter (4) frees enough room for the big write: head 67.
        w.view.hdr().tail.0.store(4, Ordering::Release);
        assert_eq!(w.write(&[&big]).unwrap(), 58);
        // ...or moves its counter backwards (1 byte known free, 2 wanted).
        w.view.hdr().tail.0.store(2, Ordering::Release);
        assert_eq!(w.write(&[b"xy"]).unwrap_err().kind(), io::ErrorKind::InvalidData);
        w.view.hdr().tail.0.store(4, Ordering::Release);
        assert_eq!(w.write(&[b"xy"]).unwrap(), 1);
    }

    #[test]
    fn a_capacity_rewritten_after_attach_is_not_used() {
        let (mut w, mut r) = heap_ring(16);
        // The peer rewrites the capacity in the header: both ends keep the one they checked.
        w.view.hdr().meta.0.capacity.store(1 << 40, Ordering::Relaxed);
        let big = vec![9u8; 1 << 20];
        assert_eq!(w.write(&[&big]).unwrap(), 16);
        let mut out = vec![0u8; 1 << 20];
        assert_eq!(r.read(&mut out).unwrap(), 16);
        assert_eq!((w.capacity(), r.capacity()), (16, 16));
    }

    #[test]
    fn attaching_refuses_counters_that_do_not_fit() {
        let layout = Layout::from_size_align(1024, RING_ALIGN).unwrap();
        // SAFETY: non-zero size; freed below.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).unwrap();
        let keep: Arc<dyn Send + Sync> = Arc::new(());
        // SAFETY: valid, aligned memory of 1024 bytes that outlives the attempts; the
        // header is only touched through its atomics.
        unsafe {
            init(ptr, 100);
            let hdr = ptr.cast::<RingHeader>();
            hdr.as_ref().head.0.store(500, Ordering::Relaxed);
            assert_eq!(RingReader::attach(ptr, 1024, keep.clone()).err().unwrap().kind(), io::ErrorKind::InvalidData);
            hdr.as_ref().tail.0.store(600, Ordering::Relaxed);
            assert!(RingWriter::attach(ptr, 1024, keep.clone()).is_err(), "tail past head");
            hdr.as_ref().head.0.store(u64::MAX, Ordering::Relaxed);
            hdr.as_ref().tail.0.store(u64::MAX, Ordering::Relaxed);
            assert!(RingWriter::attach(ptr, 1024, keep.clone()).is_err(), "counters near wrapping");
            hdr.as_ref().tail.0.store(600, Ordering::Relaxed);
            hdr.as_ref().head.0.store(650, Ordering::Relaxed);
            assert_eq!(RingReader::attach(ptr, 1024, keep).unwrap().available(), 50);
            alloc::dealloc(ptr.as_ptr(), layout);
        }
    }
}
