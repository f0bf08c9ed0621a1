//! Admission to the TCP store server: the connections that have not proven the
//! job key yet.
//!
//! They wait in the accept loop's own `poll`, costing a socket and a few bytes
//! but no thread, and never count toward the connection cap: a stranger can
//! neither hold a thread nor take a rank's place. They have a budget of their
//! own; past it the oldest is closed, since a real client answers the server's
//! hello within one round trip and a silent one has had the longest to do so.
//! Those still silent at the proof deadline are closed too.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

use super::limits::StoreLimits;
use super::wire::*;
use crate::auth::{self, Challenge, JobKey, PROOF_LEN};

/// What to do with a connection just accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// Start its handshake.
    Admit,
    /// Start its handshake, closing the oldest unproven connection to make room.
    EvictOldest,
    /// Close it before the hello: the proven connections are at the cap.
    Refuse,
}

/// Admission of a new connection while `proven` connections are open and
/// `unproven` are proving the key. Only proven ones count toward the cap.
pub(super) fn admit(limits: &StoreLimits, proven: usize, unproven: usize) -> Admission {
    if proven >= limits.max_connections {
        Admission::Refuse
    } else if unproven >= limits.max_unproven.max(1) {
        Admission::EvictOldest
    } else {
        Admission::Admit
    }
}

/// An accepted connection that has not proven the job key: non-blocking, our
/// hello sent, its hello being read.
struct Unproven {
    stream: TcpStream,
    peer: SocketAddr,
    /// Our challenge, sent in the hello.
    ours: Challenge,
    hello: [u8; CLIENT_HELLO_LEN],
    got: usize,
    /// Closed if its proof is not in by then.
    deadline: Instant,
}

/// How reading an unproven connection went.
enum Answer {
    /// Not all of the hello is in yet.
    Waiting,
    /// The client proved the key: our proof for it, to send.
    Proven([u8; PROOF_LEN]),
}

impl Unproven {
    /// Read what has arrived of the client's hello, and check it once complete.
    fn read(&mut self, key: &JobKey) -> io::Result<Answer> {
        while self.got < CLIENT_HELLO_LEN {
            match (&self.stream).read(&mut self.hello[self.got..]) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed during the handshake")),
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Answer::Waiting),
                Err(e) => return Err(e),
            }
            // Garbage is dropped as soon as its first bytes show it, not at the deadline.
            let seen = self.got.min(STORE_MAGIC.len());
            if self.hello[..seen] != STORE_MAGIC[..seen] {
                return Err(invalid("not a braid tcp store client (bad magic)".into()));
            }
            if self.got >= 12 {
                check_prefix(&self.hello[..12], "client hello").map_err(invalid)?;
            }
        }
        let theirs = decode_client_hello(&self.hello, key, &self.ours).map_err(invalid)?;
        Ok(Answer::Proven(server_proof(key, &self.ours, &theirs)))
    }
}

/// The unproven connections, oldest first.
#[derive(Default)]
pub(super) struct Pending {
    conns: VecDeque<Unproven>,
}

impl Pending {
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// The sockets to poll for input, in the order [`Pending::progress`] takes their readiness.
    pub fn fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.conns.iter().map(|c| c.stream.as_fd())
    }

    /// Send our hello on a connection just accepted and wait for its proof until `deadline`.
    pub fn start(&mut self, stream: TcpStream, peer: SocketAddr, deadline: Instant) {
        let ours = auth::challenge();
        let hello = encode_server_hello(&ours);
        // A fresh socket's buffer takes the 44 bytes whole; anything less is a broken connection.
        let sent = stream.set_nonblocking(true).and_then(|()| (&stream).write(&hello));
        match sent {
            Ok(n) if n == hello.len() => {
                self.conns.push_back(Unproven { stream, peer, ours, hello: [0; CLIENT_HELLO_LEN], got: 0, deadline })
            }
            Ok(n) => tracing::debug!(%peer, "tcp store server: dropping a connection that took {n} bytes of our hello"),
            Err(e) => tracing::debug!(%peer, "tcp store server: dropping a connection: {e}"),
        }
    }

    /// Close the oldest unproven connection; its address.
    pub fn evict_oldest(&mut self) -> Option<SocketAddr> {
        self.conns.pop_front().map(|c| c.peer)
    }

    /// Read every connection marked in `ready` (one flag per [`Pending::fds`]
    /// entry); take out and return those that proved `key`, with our proof for
    /// each, and drop those that failed.
    pub fn progress(&mut self, ready: &[bool], key: &JobKey) -> Vec<(TcpStream, SocketAddr, [u8; PROOF_LEN])> {
        let mut proven = Vec::new();
        let mut i = 0;
        let mut flags = ready.iter();
        while i < self.conns.len() {
            if !flags.next().copied().unwrap_or(false) {
                i += 1;
                continue;
            }
            match self.conns[i].read(key) {
                Ok(Answer::Waiting) => i += 1,
                Ok(Answer::Proven(proof)) => {
                    let c = self.conns.remove(i).expect("index in range");
                    proven.push((c.stream, c.peer, proof));
                }
                Err(e) => {
                    let c = self.conns.remove(i).expect("index in range");
                    // Strangers and scanners are routine on an open port: debug, not warn.
                    tracing::debug!(peer = %c.peer, "tcp store server: dropping a connection that failed the handshake: {e}");
                }
            }
        }
        proven
    }

    /// Close the connections whose proof deadline passed by `now`.
    pub fn expire(&mut self, now: Instant) {
        self.conns.retain(|c| {
            let keep = c.deadline > now;
            if !keep {
                tracing::debug!(peer = %c.peer, "tcp store server: closing a connection that did not prove the job key in time");
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_proven_connections_count_toward_a_cap_that_scales_with_the_world() {
        // A job of 10 000 ranks, each with its pooled connections, fits the cap.
        let big = StoreLimits::for_world(10_000);
        assert!(big.max_connections >= 10_000 * super::super::MAX_IDLE_CONNS, "{big:?}");
        assert_eq!(admit(&big, 9_999 * 2, 0), Admission::Admit);
        assert_eq!(admit(&big, big.max_connections, 0), Admission::Refuse);
        // Small jobs keep the default floor.
        assert_eq!(StoreLimits::for_world(2).max_connections, StoreLimits::default().max_connections);
        assert_eq!(StoreLimits::for_world(usize::MAX).max_connections, usize::MAX);
        // A full unproven budget evicts its oldest instead of refusing a newcomer,
        // and never stands in for the cap of proven connections.
        let small = StoreLimits { max_connections: 4, max_unproven: 2, ..StoreLimits::default() };
        assert_eq!(admit(&small, 3, 0), Admission::Admit);
        assert_eq!(admit(&small, 3, 1_000), Admission::EvictOldest);
        assert_eq!(admit(&small, 0, 2), Admission::EvictOldest);
        assert_eq!(admit(&small, 4, 0), Admission::Refuse);
        // A zero budget still admits one at a time.
        let none = StoreLimits { max_unproven: 0, ..small };
        assert_eq!(admit(&none, 0, 0), Admission::Admit);
    }
}
