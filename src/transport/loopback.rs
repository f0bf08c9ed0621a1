//! In-process links: ranks that are threads of one process talk through
//! single-producer single-consumer byte rings. No system call on the data path.

use std::cell::UnsafeCell;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::transport::{Link, TransportKind};

/// Bytes buffered per direction between two threads.
pub const RING_BYTES: usize = 4 << 20;

/// Pads a counter to its own 128-byte block so producer and consumer do not
/// false-share (adjacent-line prefetch pulls pairs of 64-byte lines).
#[repr(align(128))]
struct Padded<T>(T);

/// One direction: the writer advances `head`, the reader advances `tail`; both
/// only grow (wrapping), so `head - tail` is the number of buffered bytes.
struct ByteRing {
    head: Padded<AtomicUsize>,
    tail: Padded<AtomicUsize>,
    writer_closed: AtomicBool,
    reader_closed: AtomicBool,
    data: Box<[UnsafeCell<u8>]>,
}

// SAFETY: the head/tail protocol gives the writer exclusive access to the free
// part of `data` and the reader exclusive access to the filled part; the
// Release/Acquire pairs on head and tail order the byte copies.
unsafe impl Sync for ByteRing {}

impl ByteRing {
    fn new(capacity: usize) -> ByteRing {
        ByteRing {
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            writer_closed: AtomicBool::new(false),
            reader_closed: AtomicBool::new(false),
            data: (0..capacity).map(|_| UnsafeCell::new(0)).collect(),
        }
    }

    fn base(&self) -> *mut u8 {
        // UnsafeCell<u8> has the layout of u8.
        self.data.as_ptr() as *mut u8
    }

    /// Called only by the single writer.
    fn write(&self, bufs: &[&[u8]]) -> usize {
        let cap = self.data.len();
        let head = self.head.0.load(Ordering::Relaxed);
        let tail = self.tail.0.load(Ordering::Acquire);
        let mut free = cap - head.wrapping_sub(tail);
        let mut pos = head;
        for b in bufs {
            let n = b.len().min(free);
            let mut done = 0;
            while done < n {
                let at = pos % cap;
                let run = (n - done).min(cap - at);
                // SAFETY: [at, at+run) lies in the free part, owned by the writer.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr().add(done), self.base().add(at), run) };
                done += run;
                pos = pos.wrapping_add(run);
            }
            free -= n;
            if n < b.len() {
                break;
            }
        }
        let written = pos.wrapping_sub(head);
        if written > 0 {
            self.head.0.store(pos, Ordering::Release);
        }
        written
    }

    /// Called only by the single reader.
    fn read(&self, out: &mut [u8]) -> usize {
        let cap = self.data.len();
        let tail = self.tail.0.load(Ordering::Relaxed);
        let head = self.head.0.load(Ordering::Acquire);
        let n = head.wrapping_sub(tail).min(out.len());
        let mut done = 0;
        while done < n {
            let at = (tail.wrapping_add(done)) % cap;
            let run = (n - done).min(cap - at);
            // SAFETY: [at, at+run) lies in the filled part, owned by the reader.
            unsafe { std::ptr::copy_nonoverlapping(self.base().add(at), out.as_mut_ptr().add(done), run) };
            done += run;
        }
        if n > 0 {
            self.tail.0.store(tail.wrapping_add(n), Ordering::Release);
        }
        n
    }

    fn is_empty(&self) -> bool {
        self.head.0.load(Ordering::Acquire) == self.tail.0.load(Ordering::Relaxed)
    }
}

/// One end of an in-process connection.
pub struct LoopbackLink {
    peer: usize,
    tx: Arc<ByteRing>,
    rx: Arc<ByteRing>,
}

impl LoopbackLink {
    /// A connected pair: the first end belongs to rank `a` (its peer is `b`), the
    /// second to rank `b`.
    pub fn pair(a: usize, b: usize, capacity: usize) -> (LoopbackLink, LoopbackLink) {
        let ab = Arc::new(ByteRing::new(capacity));
        let ba = Arc::new(ByteRing::new(capacity));
        (LoopbackLink { peer: b, tx: ab.clone(), rx: ba.clone() }, LoopbackLink { peer: a, tx: ba, rx: ab })
    }

    /// A full mesh for `world` thread ranks: `result[r][p]` is rank r's link to p.
    pub fn mesh(world: usize) -> Vec<Vec<Option<LoopbackLink>>> {
        let mut m: Vec<Vec<Option<LoopbackLink>>> = (0..world).map(|_| (0..world).map(|_| None).collect()).collect();
        for (a, b) in (0..world).flat_map(|a| (a + 1..world).map(move |b| (a, b))) {
            let (x, y) = LoopbackLink::pair(a, b, RING_BYTES);
            m[a][b] = Some(x);
            m[b][a] = Some(y);
        }
        m
    }
}

impl Link for LoopbackLink {
    fn peer(&self) -> usize {
        self.peer
    }

    fn kind(&self) -> TransportKind {
        TransportKind::InProcess
    }

    fn try_write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        if self.tx.reader_closed.load(Ordering::Acquire) {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "peer thread dropped its link"));
        }
        Ok(self.tx.write(bufs))
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.rx.read(buf);
        if n == 0 && !buf.is_empty() && self.rx.writer_closed.load(Ordering::Acquire) && self.rx.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer thread closed its link"));
        }
        Ok(n)
    }

    fn poll_fd(&self) -> Option<RawFd> {
        None
    }

    fn close(&mut self) {
        self.tx.writer_closed.store(true, Ordering::Release);
    }
}

impl Drop for LoopbackLink {
    fn drop(&mut self) {
        self.tx.writer_closed.store(true, Ordering::Release);
        self.rx.reader_closed.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_bytes_across_threads_with_wraparound() {
        let (mut a, mut b) = LoopbackLink::pair(0, 1, 1000);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let expect = data.clone();
        let t = std::thread::spawn(move || {
            let mut off = 0;
            while off < data.len() {
                off += a.try_write(&[&data[off..(off + 777).min(data.len())]]).unwrap();
            }
            a.close();
        });
        let mut got = Vec::new();
        let mut buf = [0u8; 333];
        loop {
            match b.try_read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
                    break;
                }
            }
        }
        t.join().unwrap();
        assert_eq!(got, expect);
    }

    #[test]
    fn writing_to_a_dropped_peer_fails() {
        let (mut a, b) = LoopbackLink::pair(0, 1, 64);
        drop(b);
        assert_eq!(a.try_write(&[b"x"]).unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(a.try_read(&mut [0u8; 4]).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
