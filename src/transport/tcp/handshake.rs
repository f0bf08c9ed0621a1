//! The handshake of a TCP data link: who is connecting to whom, and proof that
//! both ends hold the job key ([`crate::auth`]). The key never travels.
//!
//! Three messages, little-endian, each starting with the same 32-byte header:
//!
//! ```text
//! header = magic "BRAIDTCP" | version:u32 | kind:u32 | comm_id:u64 | from:u32 | to:u32
//! HELLO  kind 1, connector -> acceptor,  64 B: header | connector challenge[32]
//! ACK    kind 2, acceptor -> connector,  96 B: header | acceptor challenge[32] | acceptor proof[32]
//! PROOF  kind 3, connector -> acceptor,  64 B: header | connector proof[32]
//! ```
//!
//! The proofs are HMACs under the job key over a context naming the
//! communicator, the connecting rank and the accepting rank, and both
//! challenges; the acceptor answers as [`Role::Responder`], the connector as
//! [`Role::Initiator`], so neither answer can be reflected back as the other.
//! The connector checks the ACK before it sends its PROOF; the acceptor checks
//! the PROOF before the link counts as made and before the rank counts as
//! claimed, so a stranger that only knows a rank number cannot take its place.
//!
//! Everything here is non-blocking: [`drive_outgoing`] and [`drive_incoming`]
//! move one connection as far as it goes and return, and the mesh's `poll` loop
//! comes back to them.

use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::options::MeshOptions;
use crate::auth::{self, Challenge, JobKey, Role, CHALLENGE_LEN, PROOF_LEN};

/// Protocol version carried in every handshake message; bump on any wire change.
pub const PROTOCOL_VERSION: u32 = 2;

/// First bytes of every handshake message.
pub(super) const MAGIC: [u8; 8] = *b"BRAIDTCP";
pub(super) const KIND_HELLO: u32 = 1;
pub(super) const KIND_ACK: u32 = 2;
pub(super) const KIND_PROOF: u32 = 3;
/// Bytes of the header every message starts with.
pub(super) const HEADER_LEN: usize = 32;
pub(super) const HELLO_LEN: usize = HEADER_LEN + CHALLENGE_LEN;
pub(super) const ACK_LEN: usize = HEADER_LEN + CHALLENGE_LEN + PROOF_LEN;
pub(super) const PROOF_MSG_LEN: usize = HEADER_LEN + PROOF_LEN;

/// First and longest pause between connect attempts to a rank that is not listening yet.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(10);
pub(super) const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Part of every error for a failed job-key proof (the mesh tells those apart).
pub(super) const KEY_NOT_PROVEN: &str = "did not prove the job key";

/// The header of a handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    pub version: u32,
    pub kind: u32,
    pub comm_id: u64,
    pub from: u32,
    pub to: u32,
}

impl Header {
    pub fn new(kind: u32, comm_id: u64, from: usize, to: usize) -> Header {
        Header { version: PROTOCOL_VERSION, kind, comm_id, from: from as u32, to: to as u32 }
    }

    pub(super) fn put(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.kind.to_le_bytes());
        b[16..24].copy_from_slice(&self.comm_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.from.to_le_bytes());
        b[28..32].copy_from_slice(&self.to.to_le_bytes());
    }

    /// Decode the header at the start of `b` and check everything but the
    /// sender's rank: magic, version, kind, communicator and target.
    pub fn decode(b: &[u8], kind: u32, comm_id: u64, to: usize) -> Result<Header, String> {
        if b.len() < HEADER_LEN {
            return Err(format!("handshake message of {} bytes, shorter than its header", b.len()));
        }
        if b[0..8] != MAGIC {
            return Err("not a braid peer (bad magic)".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[16..24]);
        let h = Header {
            version: u32_at(8),
            kind: u32_at(12),
            comm_id: u64::from_le_bytes(id),
            from: u32_at(24),
            to: u32_at(28),
        };
        if h.version != PROTOCOL_VERSION {
            return Err(format!("protocol version {} (this build speaks {PROTOCOL_VERSION})", h.version));
        }
        if h.kind != kind {
            return Err(format!("message kind {} where {kind} was expected", h.kind));
        }
        if h.comm_id != comm_id {
            return Err(format!("communicator id {:#x}, expected {comm_id:#x}", h.comm_id));
        }
        if h.to as usize != to {
            return Err(format!("addressed to rank {}, this is rank {to}", h.to));
        }
        Ok(h)
    }
}

/// What both proofs of the link from `connector` to `acceptor` are bound to.
pub(super) fn context(comm_id: u64, connector: usize, acceptor: usize) -> Vec<u8> {
    let mut c = b"braid-tcp-link".to_vec();
    c.extend_from_slice(&comm_id.to_le_bytes());
    c.extend_from_slice(&(connector as u32).to_le_bytes());
    c.extend_from_slice(&(acceptor as u32).to_le_bytes());
    c
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

pub(super) fn encode_hello(comm_id: u64, from: usize, to: usize, challenge: &Challenge) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    Header::new(KIND_HELLO, comm_id, from, to).put(&mut b);
    b[HEADER_LEN..].copy_from_slice(challenge);
    b
}

/// The acceptor's answer to the hello of `connector` that carried `theirs`.
pub(super) fn encode_ack(
    key: &JobKey,
    comm_id: u64,
    acceptor: usize,
    connector: usize,
    ours: &Challenge,
    theirs: &Challenge,
) -> [u8; ACK_LEN] {
    let mut b = [0u8; ACK_LEN];
    Header::new(KIND_ACK, comm_id, acceptor, connector).put(&mut b);
    b[HEADER_LEN..HEADER_LEN + CHALLENGE_LEN].copy_from_slice(ours);
    let proof = key.prove(Role::Responder, &context(comm_id, connector, acceptor), ours, theirs);
    b[HEADER_LEN + CHALLENGE_LEN..].copy_from_slice(&proof);
    b
}

/// The connector's proof, answering the acceptor's challenge `theirs`.
pub(super) fn encode_proof(
    key: &JobKey,
    comm_id: u64,
    connector: usize,
    acceptor: usize,
    ours: &Challenge,
    theirs: &Challenge,
) -> [u8; PROOF_MSG_LEN] {
    let mut b = [0u8; PROOF_MSG_LEN];
    Header::new(KIND_PROOF, comm_id, connector, acceptor).put(&mut b);
    let proof = key.prove(Role::Initiator, &context(comm_id, connector, acceptor), ours, theirs);
    b[HEADER_LEN..].copy_from_slice(&proof);
    b
}

/// Decode a hello to `acceptor`: the connector's rank and challenge.
pub(super) fn decode_hello(b: &[u8], comm_id: u64, acceptor: usize) -> Result<(usize, Challenge), String> {
    if b.len() != HELLO_LEN {
        return Err(format!("hello of {} bytes, expected {HELLO_LEN}", b.len()));
    }
    let h = Header::decode(b, KIND_HELLO, comm_id, acceptor)?;
    Ok((h.from as usize, array(&b[HEADER_LEN..])))
}

/// Decode and verify the ack that `acceptor` owes `connector`, which sent `ours`:
/// the acceptor's challenge, once its proof checks out.
pub(super) fn decode_ack(
    b: &[u8],
    key: &JobKey,
    comm_id: u64,
    connector: usize,
    acceptor: usize,
    ours: &Challenge,
) -> Result<Challenge, String> {
    if b.len() != ACK_LEN {
        return Err(format!("ack of {} bytes, expected {ACK_LEN}", b.len()));
    }
    let h = Header::decode(b, KIND_ACK, comm_id, connector)?;
    if h.from as usize != acceptor {
        return Err(format!("ack from rank {}, expected rank {acceptor}", h.from));
    }
    let theirs: Challenge = array(&b[HEADER_LEN..]);
    let proof = &b[HEADER_LEN + CHALLENGE_LEN..];
    if !key.verify(Role::Responder, &context(comm_id, connector, acceptor), ours, &theirs, proof) {
        return Err(format!("rank {acceptor} {KEY_NOT_PROVEN} (is BRAID_JOB_KEY the same on every rank?)"));
    }
    Ok(theirs)
}

/// Check the proof that `connector` owes `acceptor`: it sent `theirs` and
/// answers our challenge `ours`.
pub(super) fn decode_proof(
    b: &[u8],
    key: &JobKey,
    comm_id: u64,
    connector: usize,
    acceptor: usize,
    ours: &Challenge,
    theirs: &Challenge,
) -> Result<(), String> {
    if b.len() != PROOF_MSG_LEN {
        return Err(format!("proof of {} bytes, expected {PROOF_MSG_LEN}", b.len()));
    }
    let h = Header::decode(b, KIND_PROOF, comm_id, acceptor)?;
    if h.from as usize != connector {
        return Err(format!("proof from rank {}, expected rank {connector}", h.from));
    }
    if !key.verify(Role::Initiator, &context(comm_id, connector, acceptor), ours, theirs, &b[HEADER_LEN..]) {
        return Err(format!(
            "a connection claiming rank {connector} {KEY_NOT_PROVEN} (is BRAID_JOB_KEY the same on every rank?)"
        ));
    }
    Ok(())
}

/// What one step of progress on a socket came to.
pub(super) enum Step<T> {
    /// Not ready yet; poll again.
    Pending,
    /// Finished, with a result.
    Ready(T),
}

/// Progress of the connection to one lower rank.
pub(super) enum Outgoing {
    /// Not connected; try again at this instant.
    Idle(Instant),
    /// Non-blocking connect in flight; our challenge.
    Connecting(Socket, Challenge),
    /// Writing the hello; bytes sent so far.
    SendingHello(Socket, Challenge, usize),
    /// Reading the ack; bytes received so far.
    AwaitingAck(Socket, Challenge, Box<[u8; ACK_LEN]>, usize),
    /// The ack checked out: writing our proof; bytes sent so far.
    SendingProof(Socket, Box<[u8; PROOF_MSG_LEN]>, usize),
    /// Link made.
    Done,
}

impl Outgoing {
    /// The socket and the readiness it waits for, if any.
    fn poll_interest(&self) -> Option<(&Socket, PollFlags)> {
        match self {
            Outgoing::Idle(_) | Outgoing::Done => None,
            Outgoing::Connecting(s, _) | Outgoing::SendingHello(s, ..) | Outgoing::SendingProof(s, ..) => {
                Some((s, PollFlags::POLLOUT))
            }
            Outgoing::AwaitingAck(s, ..) => Some((s, PollFlags::POLLIN)),
        }
    }
}

/// Where an accepted connection stands.
pub(super) enum Phase {
    /// Reading the hello.
    Hello,
    /// The hello checked out: writing the ack to rank `from`, who sent `theirs`.
    SendingAck { from: usize, theirs: Challenge, ack: Box<[u8; ACK_LEN]>, sent: usize },
    /// Reading the proof of rank `from`.
    Proof { from: usize, theirs: Challenge },
}

/// An accepted connection that has not proven who it is yet.
pub(super) struct Incoming {
    pub sock: Socket,
    pub addr: String,
    /// Our challenge to this connection.
    ours: Challenge,
    buf: [u8; ACK_LEN],
    got: usize,
    pub phase: Phase,
}

impl Incoming {
    fn new(sock: Socket, addr: String) -> Incoming {
        Incoming { sock, addr, ours: auth::challenge(), buf: [0; ACK_LEN], got: 0, phase: Phase::Hello }
    }

    /// The rank this connection claims, once its hello checked out.
    pub fn claims(&self) -> Option<usize> {
        match self.phase {
            Phase::Hello => None,
            Phase::SendingAck { from, .. } | Phase::Proof { from, .. } => Some(from),
        }
    }
}

/// Where the connection to a lower rank stands after [`drive_outgoing`].
pub(super) enum Progress {
    /// Not finished: keep this state and come back after `poll`.
    Waiting(Outgoing),
    /// Handshake done: the socket is the link.
    Connected(Socket),
}

/// Advance the connection to lower rank `peer` as far as it goes without blocking.
/// `Err(reason)` means this attempt failed and a new one should start after a pause.
pub(super) fn drive_outgoing(
    mut state: Outgoing,
    addr: SocketAddr,
    opts: &MeshOptions,
    peer: usize,
) -> Result<Progress, String> {
    let (rank, comm_id) = (opts.rank, opts.comm_id);
    loop {
        state = match state {
            Outgoing::Idle(at) if Instant::now() < at => return Ok(Progress::Waiting(Outgoing::Idle(at))),
            Outgoing::Idle(_) => {
                let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                    .and_then(|s| s.set_nonblocking(true).map(|_| s))
                    .map_err(|e| format!("socket: {e}"))?;
                match sock.connect(&SockAddr::from(addr)) {
                    Ok(()) => Outgoing::SendingHello(sock, auth::challenge(), 0),
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == io::ErrorKind::WouldBlock => {
                        Outgoing::Connecting(sock, auth::challenge())
                    }
                    Err(e) => return Err(format!("connect: {e}")),
                }
            }
            Outgoing::Connecting(sock, ours) => {
                if let Some(e) = sock.take_error().map_err(|e| e.to_string())? {
                    return Err(format!("connect: {e}"));
                }
                match sock.peer_addr() {
                    Ok(_) => Outgoing::SendingHello(sock, ours, 0),
                    Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                        return Ok(Progress::Waiting(Outgoing::Connecting(sock, ours)))
                    }
                    Err(e) => return Err(format!("connect: {e}")),
                }
            }
            Outgoing::SendingHello(sock, ours, sent) => {
                let hello = encode_hello(comm_id, rank, peer, &ours);
                match write_some(&sock, &hello[sent..]).map_err(|e| format!("sending hello: {e}"))? {
                    Step::Pending => return Ok(Progress::Waiting(Outgoing::SendingHello(sock, ours, sent))),
                    Step::Ready(n) if sent + n == HELLO_LEN => {
                        Outgoing::AwaitingAck(sock, ours, Box::new([0; ACK_LEN]), 0)
                    }
                    Step::Ready(n) => Outgoing::SendingHello(sock, ours, sent + n),
                }
            }
            Outgoing::AwaitingAck(sock, ours, mut buf, got) => {
                match read_some(&sock, &mut buf[got..]).map_err(|e| format!("reading ack: {e}"))? {
                    Step::Pending => return Ok(Progress::Waiting(Outgoing::AwaitingAck(sock, ours, buf, got))),
                    Step::Ready(n) if got + n < ACK_LEN => Outgoing::AwaitingAck(sock, ours, buf, got + n),
                    Step::Ready(_) => {
                        let theirs = decode_ack(&buf[..], &opts.key, comm_id, rank, peer, &ours)
                            .map_err(|e| format!("bad ack: {e}"))?;
                        let proof = encode_proof(&opts.key, comm_id, rank, peer, &ours, &theirs);
                        Outgoing::SendingProof(sock, Box::new(proof), 0)
                    }
                }
            }
            Outgoing::SendingProof(sock, proof, sent) => {
                match write_some(&sock, &proof[sent..]).map_err(|e| format!("sending proof: {e}"))? {
                    Step::Pending => return Ok(Progress::Waiting(Outgoing::SendingProof(sock, proof, sent))),
                    Step::Ready(n) if sent + n == PROOF_MSG_LEN => return Ok(Progress::Connected(sock)),
                    Step::Ready(n) => Outgoing::SendingProof(sock, proof, sent + n),
                }
            }
            Outgoing::Done => return Ok(Progress::Waiting(Outgoing::Done)),
        };
    }
}

/// Read more of the message of `len` bytes that `inc.buf` collects; `Ready(())`
/// once it is complete. Never reads past it: what follows belongs to the link.
fn fill(inc: &mut Incoming, len: usize, what: &str) -> Result<Step<()>, String> {
    while inc.got < len {
        match read_some(&inc.sock, &mut inc.buf[inc.got..len]).map_err(|e| format!("reading {what}: {e}"))? {
            Step::Pending => return Ok(Step::Pending),
            Step::Ready(n) => inc.got += n,
        }
        // Garbage is refused as soon as its first bytes show it, not at the deadline.
        let seen = inc.got.min(MAGIC.len());
        if inc.buf[..seen] != MAGIC[..seen] {
            return Err("not a braid peer (bad magic)".into());
        }
    }
    Ok(Step::Ready(()))
}

/// Read and check the hello of an accepted connection, write the ack, then
/// read and verify the proof. `Ready(rank)` once the peer proved the job key
/// and the rank was free (it is then marked claimed); `Err(reason)` drops the
/// connection.
pub(super) fn drive_incoming(
    inc: &mut Incoming,
    opts: &MeshOptions,
    claimed: &mut [bool],
) -> Result<Step<usize>, String> {
    let (rank, world) = (opts.rank, opts.world);
    loop {
        inc.phase = match std::mem::replace(&mut inc.phase, Phase::Hello) {
            Phase::Hello => {
                if let Step::Pending = fill(inc, HELLO_LEN, "hello")? {
                    // A wrong header (another version, communicator or rank) is
                    // refused as soon as it is all there.
                    if inc.got >= HEADER_LEN {
                        Header::decode(&inc.buf[..HEADER_LEN], KIND_HELLO, opts.comm_id, rank)?;
                    }
                    return Ok(Step::Pending);
                }
                let (from, theirs) = decode_hello(&inc.buf[..HELLO_LEN], opts.comm_id, rank)?;
                if from <= rank || from >= world {
                    return Err(format!(
                        "hello from rank {from}, but rank {rank} of {world} accepts only ranks {}..{world}",
                        rank + 1
                    ));
                }
                if !opts.links_to(from) {
                    return Err(format!("hello from rank {from}, which rank {rank} does not link with over tcp"));
                }
                if claimed[from] {
                    return Err(format!("rank {from} is already linked"));
                }
                let ack = encode_ack(&opts.key, opts.comm_id, rank, from, &inc.ours, &theirs);
                Phase::SendingAck { from, theirs, ack: Box::new(ack), sent: 0 }
            }
            Phase::SendingAck { from, theirs, ack, mut sent } => {
                while sent < ACK_LEN {
                    match write_some(&inc.sock, &ack[sent..]).map_err(|e| format!("sending ack: {e}"))? {
                        Step::Pending => {
                            inc.phase = Phase::SendingAck { from, theirs, ack, sent };
                            return Ok(Step::Pending);
                        }
                        Step::Ready(n) => sent += n,
                    }
                }
                inc.got = 0;
                Phase::Proof { from, theirs }
            }
            Phase::Proof { from, theirs } => {
                let step = fill(inc, PROOF_MSG_LEN, "proof").map_err(|e| {
                    format!(
                        "a connection claiming rank {from} {KEY_NOT_PROVEN} ({e}; is BRAID_JOB_KEY the same on every rank?)"
                    )
                });
                inc.phase = Phase::Proof { from, theirs };
                if let Step::Pending = step? {
                    return Ok(Step::Pending);
                }
                decode_proof(&inc.buf[..PROOF_MSG_LEN], &opts.key, opts.comm_id, from, rank, &inc.ours, &theirs)?;
                // Claimed only now: an unproven connection never holds a rank's place.
                if claimed[from] {
                    return Err(format!("duplicate connection claiming rank {from}"));
                }
                claimed[from] = true;
                return Ok(Step::Ready(from));
            }
        };
    }
}

/// Take up to `max` waiting connections (the rest wait for the next turn of
/// the poll loop, so a burst cannot starve the handshakes already under way).
pub(super) fn accept_some(listener: &Socket, incoming: &mut Vec<Incoming>, rank: usize, max: usize) {
    for _ in 0..max.max(1) {
        match listener.accept() {
            Ok((sock, addr)) => {
                let addr = addr.as_socket().map_or_else(|| "?".to_owned(), |a| a.to_string());
                if let Err(e) = sock.set_nonblocking(true) {
                    tracing::debug!(rank, %addr, "tcp mesh: dropping connection: {e}");
                    continue;
                }
                incoming.push(Incoming::new(sock, addr));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // WouldBlock: none left. Anything else (EMFILE, ECONNABORTED) is transient
            // or will show at the deadline; the poll loop comes back.
            Err(e) => {
                if e.kind() != io::ErrorKind::WouldBlock {
                    tracing::debug!(rank, "tcp mesh: accept: {e}");
                }
                return;
            }
        }
    }
}

/// Drop unproven connections (`incoming` is oldest first) until at most `max`
/// remain: first the oldest that have not sent a valid hello, then the newest.
/// A connection past its hello claims a rank that this one links with and is a
/// round trip from proving it; a stranger that never speaks cannot push it out.
pub(super) fn shed_pending(incoming: &mut Vec<Incoming>, rank: usize, max: usize) {
    while incoming.len() > max {
        let at = incoming.iter().position(|i| i.claims().is_none()).unwrap_or(incoming.len() - 1);
        let dropped = incoming.remove(at);
        tracing::debug!(
            rank,
            addr = %dropped.addr,
            "tcp mesh: {} connections are unproven, the most allowed is {max}: dropping one",
            incoming.len() + 1
        );
    }
}

fn write_some(sock: &Socket, buf: &[u8]) -> io::Result<Step<usize>> {
    loop {
        match sock.send_with_flags(buf, libc::MSG_NOSIGNAL) {
            Ok(n) => return Ok(Step::Ready(n)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Pending),
            Err(e) => return Err(e),
        }
    }
}

fn read_some(mut sock: &Socket, buf: &mut [u8]) -> io::Result<Step<usize>> {
    loop {
        match sock.read(buf) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")),
            Ok(n) => return Ok(Step::Ready(n)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Pending),
            Err(e) => return Err(e),
        }
    }
}

/// Sleep in `poll` until some socket of the setup can move, or until `wake`.
pub(super) fn wait_for_progress(listener: &Socket, outgoing: &[Outgoing], incoming: &[Incoming], wake: Instant) {
    let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    for (s, ev) in outgoing.iter().filter_map(Outgoing::poll_interest) {
        fds.push(PollFd::new(s.as_fd(), ev));
    }
    for i in incoming {
        let ev = match i.phase {
            Phase::SendingAck { .. } => PollFlags::POLLOUT,
            Phase::Hello | Phase::Proof { .. } => PollFlags::POLLIN,
        };
        fds.push(PollFd::new(i.sock.as_fd(), ev));
    }
    // Round up so a sub-millisecond remainder does not spin.
    let ms = wake.saturating_duration_since(Instant::now()).as_micros().div_ceil(1000);
    let timeout = PollTimeout::try_from(ms.min(60_000) as u64).unwrap_or(PollTimeout::MAX);
    // EINTR or any poll error: the caller loops and re-checks everything.
    let _ = nix::poll::poll(&mut fds, timeout);
}
