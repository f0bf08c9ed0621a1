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
//!
//! A writer that finds the ring empty far into its data area starts its next
//! bytes at the beginning again (a rewind): it records the counter it rewound at
//! (`skip_from`, beside `head`) and moves `head` on to the next multiple of the
//! capacity; a reader whose `tail` reaches `skip_from` jumps the same way. Small
//! messages exchanged back and forth so keep reusing the first few kilobytes,
//! which stay in both cores' caches, instead of walking megabytes of lines that
//! are cold until the ring has wrapped once: 2-rank all-gathers of 4 KiB took
//! 0.5 µs for the first thousand calls of a fresh communicator and 0.31 after
//! (results/vs-mpi-2026-11-25-late.md).

use std::alloc::{self, Layout};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::stream_copy::WriterStreaming;

/// A long write publishes its progress in steps of this many bytes.
const PUBLISH_BYTES: usize = 64 << 10;

/// A writer this far or further into the data area rewinds when it finds the ring
/// empty. Looking costs a load of the reader's counter (a cross-core miss), so a
/// writer that found bytes still buffered looks again only this many bytes later.
const REWIND_AFTER: u64 = 16 << 10;

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

/// What the writer publishes: its counter, and where it last rewound.
#[repr(C)]
struct WriterSide {
    /// Bytes ever written (skipped ones included).
    head: AtomicU64,
    /// The counter at which the writer last rewound to the start of the data area
    /// (stored before the `head` that follows it): the bytes from here to the next
    /// multiple of the capacity are skipped. 0 until the first rewind.
    skip_from: AtomicU64,
}

/// The control block at the start of a ring region (384 bytes, 128-aligned).
#[repr(C)]
pub struct RingHeader {
    /// Stored only by the writer.
    head: Block<WriterSide>,
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
            head: Block(WriterSide { head: AtomicU64::new(0), skip_from: AtomicU64::new(0) }),
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

/// The first multiple of `cap` at or after `at`: where bytes resume after a rewind at `at`.
fn next_lap(at: u64, cap: usize) -> u64 {
    at.div_ceil(cap as u64) * cap as u64
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
    /// Where this end last rewound (what it stored in `skip_from`).
    skip_from: u64,
    /// The next `head` at which to look whether the ring is empty, to rewind.
    rewind_check: u64,
}

/// The reading end of a ring. Exactly one exists per ring.
///
/// Keeps its own `tail` and the last `head` it saw, like [`RingWriter`]: a `head`
/// that goes backwards or runs more than a capacity ahead is a protocol error.
pub struct RingReader {
    view: View,
    /// Bytes ever read, skipped ones included (this end is the only writer of
    /// the shared `tail`); a `Cell` because noticing a rewind moves it.
    tail: std::cell::Cell<u64>,
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
    let (head, tail) = (hdr.head.0.head.load(Ordering::Acquire), hdr.tail.0.load(Ordering::Acquire));
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
        // A writer attaching to a ring in use (never done today) keeps a rewind its
        // predecessor made if the reader may still have to pass it; a skip that no
        // correct writer could have left (bytes resuming past `head`) is never
        // matched, so the free space is never overstated.
        let shared = view.hdr().head.0.skip_from.load(Ordering::Relaxed);
        let skip_from = if shared < head && next_lap(shared, view.cap) <= head { shared } else { u64::MAX };
        Ok(RingWriter { view, head, seen_tail: tail, stream: WriterStreaming::plain(), skip_from, rewind_check: head })
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
        Ok(self.buffered(tail))
    }

    /// Bytes the reader has still to pass, given its `tail` (checked `<= head`):
    /// none of the skipped ones when it stands where this end last rewound.
    /// At most `cap` by induction: this end never writes more than is free.
    fn buffered(&self, tail: u64) -> usize {
        let tail = if tail == self.skip_from { next_lap(tail, self.view.cap) } else { tail };
        self.head.saturating_sub(tail) as usize
    }

    /// Start the next bytes at the beginning of the data area when the ring is
    /// empty and this end is far into it (see the module docs).
    fn maybe_rewind(&mut self) -> io::Result<()> {
        let cap = self.view.cap as u64;
        let at = self.head % cap;
        if at < REWIND_AFTER.min(cap / 2) || self.head < self.rewind_check {
            return Ok(());
        }
        if self.buffered(self.seen_tail) != 0 && self.used()? != 0 {
            self.rewind_check = self.head + REWIND_AFTER;
            return Ok(());
        }
        // Empty: the reader's tail is `head`. The skip is stored before the next
        // `head` (Release), so a reader that sees that head sees it too.
        self.skip_from = self.head;
        self.view.hdr().head.0.skip_from.store(self.head, Ordering::Relaxed);
        self.head = next_lap(self.head, self.view.cap);
        self.rewind_check = self.head;
        Ok(())
    }

    /// Copy as much of the concatenation of `bufs` as fits; returns how many bytes
    /// were taken. Fails with `InvalidData` when the reader's counter is corrupt.
    pub fn write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        let cap = self.view.cap;
        // The reader's counter sits on a line the reader keeps writing: loading it
        // costs a cross-core miss on every small message. The last value seen is a
        // lower bound of the free space (the tail only moves forward), so it is
        // reloaded only when that is not enough.
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        if want == 0 {
            return Ok(0);
        }
        self.maybe_rewind()?;
        let mut free = cap - self.buffered(self.seen_tail);
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
                    hdr.head.0.head.store(pos, Ordering::Release);
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
            hdr.head.0.head.store(pos, Ordering::Release);
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
        self.view.cap - self.buffered(tail)
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
        Ok(RingReader { view, tail: std::cell::Cell::new(tail), seen_head: std::cell::Cell::new(head) })
    }

    /// Data bytes the ring holds when full.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.view.cap
    }

    /// The writer's `head` and, when the writer rewound where this end stands,
    /// the `tail` to resume from (unchecked: callers check them together).
    fn look(&self) -> (u64, u64) {
        let side = &self.view.hdr().head.0;
        let head = side.head.load(Ordering::Acquire);
        let tail = self.tail.get();
        // The skip is stored before the head that follows it, so after the Acquire
        // load above a Relaxed load sees it.
        if head != tail && side.skip_from.load(Ordering::Relaxed) == tail {
            (head, next_lap(tail, self.view.cap))
        } else {
            (head, tail)
        }
    }

    /// Bytes buffered now, from the writer's checked `head` (moves past a rewind).
    fn filled(&self) -> io::Result<usize> {
        let (head, tail) = self.look();
        let seen = self.seen_head.get();
        // `head < tail` wraps to a huge difference, so one comparison covers it
        // (a forged skip that jumps past `head` included).
        if head < seen || head.wrapping_sub(tail) > self.view.cap as u64 {
            return Err(corrupt(format!(
                "ring head moved from {seen} to {head} with tail at {tail} and capacity {}: the writer broke the protocol",
                self.view.cap
            )));
        }
        self.seen_head.set(head);
        self.tail.set(tail);
        Ok((head - tail) as usize)
    }

    /// Copy up to `out.len()` buffered bytes into `out`; returns how many. Fails
    /// with `InvalidData` when the writer's counter is corrupt.
    pub fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.filled()?.min(out.len());
        let v = &self.view;
        let cap = v.cap;
        let hdr = v.hdr();
        let tail = self.tail.get();
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
            self.tail.set(tail + done as u64);
            hdr.tail.0.store(tail + done as u64, Ordering::Release);
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
        let at = (self.tail.get() % v.cap as u64) as usize;
        let n = filled.min(max).min(v.cap - at);
        // SAFETY: [at, at+n) lies inside the data area (at < cap, n <= cap - at), in its
        // filled part, which the writer leaves alone until `tail` moves past it (only
        // `read` and `consume`, which take `&mut self` and so end this borrow, move it).
        Ok(unsafe { std::slice::from_raw_parts(v.data.as_ptr().add(at), n) })
    }

    /// Release the first `n` bytes shown by [`RingReader::peek`] to the writer (at
    /// most what the last look at the writer's counter showed).
    pub fn consume(&mut self, n: usize) {
        let tail = self.tail.get();
        let tail = tail + (n as u64).min(self.seen_head.get() - tail);
        self.tail.set(tail);
        self.view.hdr().tail.0.store(tail, Ordering::Release);
    }

    /// Bytes buffered now. A corrupt counter counts as something to read, so the
    /// caller goes on to [`RingReader::read`] or [`RingReader::peek`] and gets the error.
    pub fn available(&self) -> usize {
        let (head, tail) = self.look();
        let filled = head.wrapping_sub(tail);
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
        r.view.hdr().head.0.head.store(1 << 50, Ordering::Release);
        let mut out = [0u8; 200];
        assert_eq!(r.read(&mut out).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(r.peek(200).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert!(!r.is_empty(), "a corrupt ring must not look empty (the caller would wait forever)");
        // Nothing was consumed by the failed reads.
        assert_eq!(r.tail.get(), 0);
        r.view.hdr().head.0.head.store(4, Ordering::Release);
        assert_eq!(r.read(&mut out[..2]).unwrap(), 2);
        assert_eq!(&out[..2], b"ab");
        // Now a head behind what the reader already saw (and behind its tail).
        r.view.hdr().head.0.head.store(1, Ordering::Release);
        assert_eq!(r.read(&mut out).unwrap_err().kind(), io::ErrorKind::InvalidData);
        r.view.hdr().head.0.head.store(3, Ordering::Release);
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
            hdr.as_ref().head.0.head.store(500, Ordering::Relaxed);
            assert_eq!(RingReader::attach(ptr, 1024, keep.clone()).err().unwrap().kind(), io::ErrorKind::InvalidData);
            hdr.as_ref().tail.0.store(600, Ordering::Relaxed);
            assert!(RingWriter::attach(ptr, 1024, keep.clone()).is_err(), "tail past head");
            hdr.as_ref().head.0.head.store(u64::MAX, Ordering::Relaxed);
            hdr.as_ref().tail.0.store(u64::MAX, Ordering::Relaxed);
            assert!(RingWriter::attach(ptr, 1024, keep.clone()).is_err(), "counters near wrapping");
            hdr.as_ref().tail.0.store(600, Ordering::Relaxed);
            hdr.as_ref().head.0.head.store(650, Ordering::Relaxed);
            assert_eq!(RingReader::attach(ptr, 1024, keep).unwrap().available(), 50);
            alloc::dealloc(ptr.as_ptr(), layout);
        }
    }

    #[test]
    fn back_and_forth_messages_reuse_the_start_of_the_ring() {
        let (mut w, mut r) = heap_ring(1 << 20);
        let mut out = vec![0u8; 2048];
        for i in 0..2000u32 {
            let msg = vec![(i % 251) as u8; 2048];
            assert_eq!(w.write(&[&msg]).unwrap(), 2048);
            // Never further in than the rewind point plus one message.
            assert!(w.head % (1 << 20) <= REWIND_AFTER + 2048, "write {i} at {}", w.head);
            assert_eq!(r.read(&mut out).unwrap(), 2048);
            assert_eq!(out, msg, "message {i}");
        }
        assert!(r.is_empty());
        assert_eq!(w.free(), 1 << 20);
    }

    #[test]
    fn a_rewind_is_followed_by_peek_and_by_the_free_space() {
        let (mut w, mut r) = heap_ring(64 << 10);
        let first: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        assert_eq!(w.write(&[&first]).unwrap(), first.len());
        let mut out = vec![0u8; first.len()];
        assert_eq!(r.read(&mut out).unwrap(), first.len());
        assert_eq!(out, first);
        // Empty and past the rewind point: the next bytes start the data area again,
        // and all of it but those bytes is free before the reader has looked.
        assert_eq!(w.write(&[b"hello ", b"world"]).unwrap(), 11);
        assert_eq!(w.head, (64 << 10) + 11);
        assert_eq!(w.free(), (64 << 10) - 11);
        assert_eq!(r.available(), 11);
        assert_eq!(r.peek(5).unwrap(), b"hello");
        r.consume(6);
        let mut rest = [0u8; 16];
        assert_eq!(r.read(&mut rest).unwrap(), 5);
        assert_eq!(&rest[..5], b"world");
        assert_eq!(w.free(), 64 << 10);
    }

    #[test]
    fn a_writer_with_bytes_still_buffered_does_not_rewind() {
        let (mut w, mut r) = heap_ring(64 << 10);
        let big = vec![3u8; 20_000];
        assert_eq!(w.write(&[&big]).unwrap(), big.len());
        let mut out = vec![0u8; 10];
        assert_eq!(r.read(&mut out).unwrap(), 10);
        assert_eq!(w.write(&[b"x"]).unwrap(), 1);
        assert_eq!(w.head, 20_001, "continues where it was: the reader is behind");
        let mut out = vec![0u8; 20_000];
        assert_eq!(r.read(&mut out).unwrap(), 19_991);
        assert!(out[..19_990].iter().all(|&b| b == 3) && out[19_990] == b'x');
    }

    #[test]
    fn a_forged_skip_is_invalid_data_not_a_read_elsewhere() {
        let (mut w, mut r) = heap_ring(64 << 10);
        let big = vec![5u8; 20_000];
        assert_eq!(w.write(&[&big]).unwrap(), big.len());
        let mut out = vec![0u8; 20_000];
        assert_eq!(r.read(&mut out).unwrap(), 20_000);
        // A bad writer claims a rewind where the reader stands but a head short of
        // where bytes resume.
        let side = &r.view.hdr().head.0;
        side.skip_from.store(20_000, Ordering::Relaxed);
        side.head.store(20_100, Ordering::Release);
        assert_eq!(r.read(&mut out).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(r.peek(10).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert!(!r.is_empty());
        assert_eq!(r.tail.get(), 20_000, "nothing consumed");
        drop(w);
    }

    #[test]
    fn a_writer_attaching_ignores_a_skip_no_writer_could_have_made() {
        let layout = Layout::from_size_align(region_len(1000), RING_ALIGN).unwrap();
        // SAFETY: non-zero size; freed below.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).unwrap();
        let keep: Arc<dyn Send + Sync> = Arc::new(());
        // SAFETY: valid, aligned memory that outlives the ends; header via atomics.
        unsafe {
            init(ptr, 1000);
            let hdr = ptr.cast::<RingHeader>();
            // 100 bytes buffered (200..300), and a skip at the reader's 200 that
            // would resume at 1000, past the head.
            hdr.as_ref().head.0.head.store(300, Ordering::Relaxed);
            hdr.as_ref().tail.0.store(200, Ordering::Relaxed);
            hdr.as_ref().head.0.skip_from.store(200, Ordering::Relaxed);
            let w = RingWriter::attach(ptr, layout.size(), keep.clone()).unwrap();
            assert_eq!(w.free(), 900);
            drop(w);
            alloc::dealloc(ptr.as_ptr(), layout);
        }
    }

    #[test]
    fn threads_streaming_messages_of_any_size_through_rewinds_and_wraps() {
        let (mut w, mut r) = heap_ring(48 << 10);
        const TOTAL: u64 = 8 << 20;
        let writer = std::thread::spawn(move || {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = 0u64;
            let mut buf = Vec::new();
            while next < TOTAL {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let len = (seed % (40 << 10)).min(TOTAL - next) as usize;
                buf.clear();
                buf.extend((next..next + len as u64).map(|i| (i % 253) as u8));
                let mut off = 0;
                while off < len {
                    off += w.write(&[&buf[off..]]).unwrap();
                    std::hint::spin_loop();
                }
                next += len as u64;
                // Now and then let the reader drain the ring, so the next write
                // finds it empty and rewinds while the reader is still busy.
                if seed % 4 == 0 {
                    while w.free() < 48 << 10 {
                        std::thread::yield_now();
                    }
                }
            }
            w
        });
        let mut got = 0u64;
        let mut out = vec![0u8; 5000];
        let mut step = 1usize;
        while got < TOTAL {
            step = step % 4999 + 1;
            let n = if step % 3 == 0 {
                let seen = r.peek(step).unwrap();
                let n = seen.len();
                out[..n].copy_from_slice(seen);
                r.consume(n);
                n
            } else {
                r.read(&mut out[..step]).unwrap()
            };
            for (k, b) in out[..n].iter().enumerate() {
                assert_eq!(*b, ((got + k as u64) % 253) as u8, "byte {}", got + k as u64);
            }
            got += n as u64;
        }
        let w = writer.join().unwrap();
        assert!(w.skip_from != 0 && w.skip_from != u64::MAX, "the run rewound at least once");
        assert!(r.is_empty());
    }
}
