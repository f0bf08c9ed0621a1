//! In-process links: ranks that are threads of one process talk through
//! single-producer single-consumer byte rings ([`super::ring`]) on the heap. No
//! system call on the data path.

use std::io;
use std::os::fd::RawFd;

use crate::transport::ring::{heap_ring, RingReader, RingWriter};
use crate::transport::{Link, TransportKind};

/// Bytes buffered per direction between two threads.
pub const RING_BYTES: usize = 4 << 20;

/// One end of an in-process connection.
pub struct LoopbackLink {
    peer: usize,
    tx: RingWriter,
    rx: RingReader,
}

impl LoopbackLink {
    /// A connected pair: the first end belongs to rank `a` (its peer is `b`), the
    /// second to rank `b`.
    pub fn pair(a: usize, b: usize, capacity: usize) -> (LoopbackLink, LoopbackLink) {
        let (ab_tx, ab_rx) = heap_ring(capacity);
        let (ba_tx, ba_rx) = heap_ring(capacity);
        (LoopbackLink { peer: b, tx: ab_tx, rx: ba_rx }, LoopbackLink { peer: a, tx: ba_tx, rx: ab_rx })
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
        if self.rx.is_empty() && max > 0 && self.rx.is_writer_closed() {
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

    fn can_read_peer(&self) -> bool {
        // Both ends are threads of this process: the peer's memory is our memory.
        true
    }

    /// A plain copy from `addr` in this address space.
    ///
    /// Safety contract (the trait method is safe, so the caller upholds it): the
    /// executor passes only the address of a buffer the peer thread announced,
    /// keeps alive and does not write until this rank acknowledges the read, so
    /// `[addr, addr + dst.len())` is live, initialised and not written concurrently.
    fn read_peer(&mut self, addr: usize, dst: &mut [u8]) -> io::Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        if addr == 0 || addr.checked_add(dst.len()).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad peer address {addr:#x} for {} bytes from rank {}", dst.len(), self.peer),
            ));
        }
        // SAFETY: see the contract above; `dst` is a distinct exclusive borrow, so
        // the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
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
    fn read_peer_copies_from_the_peer_threads_buffer() {
        let (mut a, b) = LoopbackLink::pair(0, 1, 64);
        assert!(a.can_read_peer() && b.can_read_peer());
        let src: Vec<u8> = (0..1000u32).map(|i| (i % 253) as u8).collect();
        let mut dst = vec![0u8; 1000];
        a.read_peer(src.as_ptr() as usize, &mut dst).unwrap();
        assert_eq!(dst, src);
        assert_eq!(a.read_peer(0, &mut dst).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
