//! In-process links: ranks that are threads of one process talk through
//! single-producer single-consumer byte rings ([`super::ring`]) on the heap. No
//! system call on the data path.
//!
//! Single copy between threads is a plain copy out of the peer's buffer, so it is
//! guarded by an exposure list per direction: the sender lists what it lets its peer
//! read while its call runs and withdraws it before the call returns; the reader
//! copies only from a listed range, and a withdrawal waits for a copy in progress.

use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::transport::ring::{heap_ring, RingReader, RingWriter};
use crate::transport::{Link, TransportKind};

/// Bytes buffered per direction between two threads.
pub const RING_BYTES: usize = 4 << 20;

/// What one end of a link lets the other read, shared by both ends.
#[derive(Default)]
struct Exposure {
    /// Held for reading across each copy out of an exposed range and for writing
    /// while ranges are withdrawn, so a withdrawal waits for the copy in progress
    /// and no copy starts from a range being withdrawn.
    copying: RwLock<()>,
    /// `[start, end)` of each exposed range. Adding one never waits for a copy.
    ranges: Mutex<Vec<(usize, usize)>>,
}

impl Exposure {
    fn add(&self, start: usize, end: usize) {
        let mut ranges = self.ranges.lock().unwrap_or_else(PoisonError::into_inner);
        // The frames of one transfer are adjacent: one range each, not one per frame,
        // keeps the list (scanned by every read) as short as the call's transfers.
        match ranges.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => ranges.push((start, end)),
        }
    }

    fn revoke_all(&self) {
        let _no_copy = self.copying.write().unwrap_or_else(PoisonError::into_inner);
        self.ranges.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

/// One end of an in-process connection.
pub struct LoopbackLink {
    peer: usize,
    tx: RingWriter,
    rx: RingReader,
    /// Ranges of this thread's memory the peer may read.
    mine: Arc<Exposure>,
    /// Ranges of the peer thread's memory this end may read.
    theirs: Arc<Exposure>,
}

impl LoopbackLink {
    /// A connected pair: the first end belongs to rank `a` (its peer is `b`), the
    /// second to rank `b`.
    pub fn pair(a: usize, b: usize, capacity: usize) -> (LoopbackLink, LoopbackLink) {
        let (ab_tx, ab_rx) = heap_ring(capacity);
        let (ba_tx, ba_rx) = heap_ring(capacity);
        let (by_a, by_b) = (Arc::new(Exposure::default()), Arc::new(Exposure::default()));
        (
            LoopbackLink { peer: b, tx: ab_tx, rx: ba_rx, mine: by_a.clone(), theirs: by_b.clone() },
            LoopbackLink { peer: a, tx: ba_tx, rx: ab_rx, mine: by_b, theirs: by_a },
        )
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

    /// Run `copy` (of `[addr, addr + len)` of the peer thread's memory) only if the
    /// peer exposes that range, holding the exposure across it so the peer's
    /// revocation (and with it the end of its call, and the freeing of its buffer)
    /// waits for it.
    fn while_exposed(&self, addr: usize, len: usize, copy: impl FnOnce()) -> io::Result<()> {
        let Some(end) = addr.checked_add(len).filter(|_| addr != 0) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad peer address {addr:#x} for {len} bytes from rank {}", self.peer),
            ));
        };
        let _copying = self.theirs.copying.read().unwrap_or_else(PoisonError::into_inner);
        let exposed = {
            let ranges = self.theirs.ranges.lock().unwrap_or_else(PoisonError::into_inner);
            ranges.iter().any(|&(s, e)| addr >= s && end <= e)
        };
        if !exposed {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "rank {} does not expose [{addr:#x}, {end:#x}) (its call has ended, or the address is wrong)",
                    self.peer
                ),
            ));
        }
        copy();
        Ok(())
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
        if self.tx.is_reader_closed() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "peer thread dropped its link"));
        }
        self.tx.write(bufs)
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.rx.read(buf)?;
        if n == 0 && !buf.is_empty() && self.rx.is_writer_closed() && self.rx.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer thread closed its link"));
        }
        Ok(n)
    }

    fn can_peek(&self) -> bool {
        true
    }

    fn peek(&mut self, max: usize) -> io::Result<&[u8]> {
        // Empty, then closed, then still empty: the writer closes after its last
        // write, so bytes written between the first look and the close are not lost.
        if max > 0 && self.rx.is_empty() && self.rx.is_writer_closed() && self.rx.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer thread closed its link"));
        }
        self.rx.peek(max)
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

    fn peer_gone(&mut self) -> bool {
        // A dropped end closes its reader too; a failing peer closes only its writer.
        self.tx.is_reader_closed()
    }

    fn can_read_peer(&self) -> bool {
        // Both ends are threads of this process: the peer's memory is our memory.
        true
    }

    /// A plain copy from `addr` in this address space, only out of a range the peer
    /// thread exposed ([`Link::expose`]) and has not revoked; anything else is an
    /// error. The exposure is held across the copy, so the peer's revocation (and
    /// with it the end of its call, and the freeing of its buffer) waits for it.
    fn read_peer(&mut self, addr: usize, dst: &mut [u8]) -> io::Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let (to, len) = (dst.as_mut_ptr(), dst.len());
        // SAFETY: [addr, addr + len) lies inside a range the peer exposed, which by
        // `expose`'s contract stays allocated and initialised until the peer revokes
        // it, and `while_exposed` holds off that revocation across the copy. `dst` is
        // an exclusive borrow of our own memory, which the peer never exposes to us,
        // so the ranges do not overlap.
        self.while_exposed(addr, len, || unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, to, len) })
    }

    /// The same exposure check and hold as [`Link::read_peer`], around a copy made
    /// out of the peer's registered segment.
    fn read_peer_with(&mut self, addr: usize, len: usize, copy: &mut dyn FnMut()) -> io::Result<()> {
        self.while_exposed(addr, len, copy)
    }

    unsafe fn expose(&mut self, addr: usize, len: usize) {
        if let Some(end) = addr.checked_add(len).filter(|_| len > 0) {
            self.mine.add(addr, end);
        }
    }

    fn revoke_exposed(&mut self) {
        self.mine.revoke_all();
    }
}

impl Drop for LoopbackLink {
    fn drop(&mut self) {
        // `expose` promises the memory only until revocation or drop.
        self.mine.revoke_all();
    }
}

// Dropping a link drops its ring ends, which set the closed flags the peer watches
// (writer closed: the peer reads end-of-stream; reader closed: its writes fail).

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

    #[test]
    fn read_peer_copies_only_what_the_peer_exposed_until_revoked() {
        let (mut a, mut b) = LoopbackLink::pair(0, 1, 64);
        assert!(a.can_read_peer() && b.can_read_peer());
        let src: Vec<u8> = (0..1000u32).map(|i| (i % 253) as u8).collect();
        let addr = src.as_ptr() as usize;
        let mut dst = vec![0u8; 1000];
        let err = a.read_peer(addr, &mut dst).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "not exposed yet: {err}");
        assert!(err.to_string().contains("rank 1"), "{err}");
        // SAFETY: `src` outlives the link pair's use of it (revoked below).
        unsafe { b.expose(addr, src.len()) };
        a.read_peer(addr, &mut dst).unwrap();
        assert_eq!(dst, src);
        let mut part = [0u8; 10];
        a.read_peer(addr + 990, &mut part).unwrap();
        assert_eq!(part, src[990..]);
        // One byte past the exposed range, and a range of the wrong direction.
        assert_eq!(a.read_peer(addr + 991, &mut part).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(b.read_peer(addr, &mut part).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(a.read_peer(0, &mut dst).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(a.read_peer(usize::MAX - 3, &mut part).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        b.revoke_exposed();
        assert_eq!(a.read_peer(addr, &mut dst).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        // Adjacent exposures read as one range, and still end where they end.
        // SAFETY: `src` outlives these exposures (revoked below).
        unsafe {
            b.expose(addr, 400);
            b.expose(addr + 400, 500);
        }
        a.read_peer(addr + 390, &mut part).unwrap();
        assert_eq!(part, src[390..400]);
        assert_eq!(a.read_peer(addr + 895, &mut part).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        // A copy by another path (a registered segment) runs only under the same check.
        let mut copies = 0;
        a.read_peer_with(addr, 900, &mut || copies += 1).unwrap();
        assert_eq!(
            a.read_peer_with(addr, 901, &mut || copies += 1).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        b.revoke_exposed();
        assert_eq!(
            a.read_peer_with(addr, 10, &mut || copies += 1).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        assert_eq!(copies, 1);
        // Dropping the exposing end revokes too.
        // SAFETY: `src` outlives the exposure, which dropping `b` revokes.
        unsafe { b.expose(addr, src.len()) };
        drop(b);
        assert_eq!(a.read_peer(addr, &mut dst).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn revoking_waits_for_the_copy_in_progress() {
        // The reader copies 8 MiB (an mmap'd allocation, unmapped when freed) in a
        // loop while the owner revokes and frees it: every copy either completes
        // from live memory or is refused; none faults or sees freed bytes.
        let (mut reader, mut owner) = LoopbackLink::pair(0, 1, 64);
        let src = vec![7u8; 8 << 20];
        let addr = src.as_ptr() as usize;
        // SAFETY: revoked below before `src` is dropped.
        unsafe { owner.expose(addr, src.len()) };
        let (first_tx, first_rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let mut dst = vec![0u8; 8 << 20];
            let mut ok = 0;
            while reader.read_peer(addr, &mut dst).is_ok() {
                assert!(dst.iter().all(|&x| x == 7));
                ok += 1;
                if ok == 1 {
                    first_tx.send(()).unwrap();
                }
            }
            ok
        });
        first_rx.recv().unwrap();
        owner.revoke_exposed();
        drop(src);
        assert!(t.join().unwrap() >= 1);
    }
}
