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
        if len < RING_HEADER_BYTES || !(mem.as_ptr() as usize).is_multiple_of(RING_ALIGN) {
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

    /// Whether the reader's `tail` is one it could have reached: not behind what this
    /// end saw, not past `head`, and not inside the bytes skipped by the last rewind
    /// (the reader jumps from `skip_from` to where bytes resume, never between: a
    /// tail there would count more than the capacity as buffered).
    fn tail_is_valid(&self, tail: u64) -> bool {
        let skipped = tail > self.skip_from && tail < next_lap(self.skip_from, self.view.cap);
        tail >= self.seen_tail && tail <= self.head && !skipped
    }

    /// Bytes buffered now, from the reader's checked `tail`.
    fn used(&mut self) -> io::Result<usize> {
        let tail = self.view.hdr().tail.0.load(Ordering::Acquire);
        if !self.tail_is_valid(tail) {
            return Err(corrupt(format!(
                "ring tail moved from {} to {tail} with head at {} (last rewind at {}): the reader broke the protocol",
                self.seen_tail, self.head, self.skip_from
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
        if !self.tail_is_valid(tail) {
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
#[path = "ring_tests.rs"]
mod tests;
