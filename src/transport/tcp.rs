//! TCP links: one non-blocking socket per peer, and the mesh setup that makes them.
//!
//! Setup ([`connect_mesh`]): every rank listens on the address of the chosen
//! interface ([`super::ifaces`]) and publishes it in the store under
//! `{key_prefix}/tcp/{rank}`. Rank `i` connects to every `j < i` and accepts one
//! connection from every `j > i`. All of it runs in one `poll` loop, so a slow
//! or refused connect never stops this rank from accepting (and vice versa), and
//! one deadline bounds every wait.
//!
//! Handshake: the connector sends a fixed 32-byte hello (magic, protocol version,
//! kind, communicator id, from rank, to rank); the acceptor checks all of it and
//! answers with an ack of the same shape, which the connector checks in turn. A
//! connection with a wrong hello (a port scanner, another job, a stale rank) is
//! dropped with a warning naming its address, and accepting goes on.

use std::io::{self, IoSlice, Read};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::ifaces::{self, AddrFamily};
use super::{Link, TransportKind};
use crate::bootstrap::Store;
use crate::error::{Error, OpContext, Result};

/// Protocol version carried in the hello; bump on any wire change.
pub const PROTOCOL_VERSION: u32 = 1;

/// First bytes of every hello and ack.
const MAGIC: [u8; 8] = *b"BRAIDTCP";
const KIND_HELLO: u32 = 1;
const KIND_ACK: u32 = 2;
/// Size of a hello or an ack on the wire.
const HANDSHAKE_LEN: usize = 32;

/// Most buffers handed to one `sendmsg`; the kernel's IOV_MAX is 1024, and the
/// executor passes a header plus one or two payload slices, so 64 never binds in practice.
const MAX_IOV: usize = 64;

/// First and longest pause between connect attempts to a rank that is not listening yet.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// How to build a TCP mesh for one communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshOptions {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Store namespace of this communicator (e.g. `comm/0`); addresses go under `{key_prefix}/tcp/{rank}`.
    pub key_prefix: String,
    /// Interface spec in NCCL syntax (`BRAID_SOCKET_IFNAME`); None for the default policy.
    pub ifname: Option<String>,
    /// Restrict the listening address to one family (`BRAID_SOCKET_FAMILY`-like); None prefers IPv4.
    pub family: Option<AddrFamily>,
    /// Deadline for the whole setup: store waits, connects, accepts and handshakes.
    pub timeout: Duration,
    /// Communicator id; a hello carrying another id is refused, so two jobs cannot cross-connect.
    pub comm_id: u64,
    /// Set SO_SNDBUF and SO_RCVBUF to this many bytes. None (the default) keeps
    /// kernel autotuning, which setting them disables.
    pub socket_buffer: Option<usize>,
    /// Link only with the ranks marked true (`world` entries; e.g. the peers on
    /// other hosts when shared memory serves the local ones). None links with all.
    pub peers: Option<Vec<bool>>,
}

impl MeshOptions {
    /// Options for `rank` of `world` under `key_prefix`, every other knob at its default
    /// (default interface policy, 60 s timeout, communicator id 0).
    pub fn new(rank: usize, world: usize, key_prefix: impl Into<String>) -> MeshOptions {
        MeshOptions {
            rank,
            world,
            key_prefix: key_prefix.into(),
            ifname: None,
            family: None,
            timeout: crate::config::DEFAULT_TIMEOUT,
            comm_id: 0,
            socket_buffer: None,
            peers: None,
        }
    }

    /// Whether this rank links with `peer` over TCP (per [`MeshOptions::peers`]).
    pub fn links_to(&self, peer: usize) -> bool {
        peer != self.rank && self.peers.as_ref().map_or(peer < self.world, |p| p.get(peer).copied().unwrap_or(false))
    }
}

/// The store key under which `rank` publishes its listening address.
pub fn address_key(key_prefix: &str, rank: usize) -> String {
    format!("{key_prefix}/tcp/{rank}")
}

/// A connected TCP stream to one peer, non-blocking, with `TCP_NODELAY`.
#[derive(Debug)]
pub struct TcpLink {
    sock: Socket,
    peer: usize,
    peer_addr: SocketAddr,
}

impl TcpLink {
    /// Wrap a connected socket (made non-blocking, `TCP_NODELAY` on) as the link to `peer`.
    pub fn from_socket(sock: Socket, peer: usize) -> io::Result<TcpLink> {
        TcpLink::with_buffer(sock, peer, None)
    }

    fn with_buffer(sock: Socket, peer: usize, buffer: Option<usize>) -> io::Result<TcpLink> {
        configure_stream(&sock, buffer)?;
        let peer_addr = sock.peer_addr()?.as_socket().ok_or_else(|| io::Error::other("peer is not an IP socket"))?;
        Ok(TcpLink { sock, peer, peer_addr })
    }

    /// The peer's socket address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// This end's socket address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()?.as_socket().ok_or_else(|| io::Error::other("not an IP socket"))
    }
}

impl Link for TcpLink {
    fn peer(&self) -> usize {
        self.peer
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn try_write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        // One sendmsg for header and payload (no extra copy, one syscall). MSG_NOSIGNAL:
        // a peer that died must be an EPIPE error, never a SIGPIPE that kills the process.
        let mut iov = [IoSlice::new(&[]); MAX_IOV];
        let mut n = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()).take(MAX_IOV) {
            iov[n] = IoSlice::new(b);
            n += 1;
        }
        if n == 0 {
            return Ok(0);
        }
        loop {
            match self.sock.send_vectored_with_flags(&iov[..n], libc::MSG_NOSIGNAL) {
                Ok(sent) => return Ok(sent),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) => return Err(e),
            }
        }
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match (&self.sock).read(buf) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("rank {} ({}) closed the connection", self.peer, self.peer_addr),
                    ))
                }
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) => return Err(e),
            }
        }
    }

    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.sock.as_raw_fd())
    }

    fn close(&mut self) {
        // ENOTCONN after a reset is fine: the peer is gone either way.
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }
}

/// Stream options every data socket gets.
fn configure_stream(sock: &Socket, buffer: Option<usize>) -> io::Result<()> {
    sock.set_nonblocking(true)?;
    // Small frames (headers, tiny all-reduces) must leave at once, not wait for Nagle.
    sock.set_tcp_nodelay(true)?;
    if let Some(bytes) = buffer {
        sock.set_send_buffer_size(bytes)?;
        sock.set_recv_buffer_size(bytes)?;
    }
    Ok(())
}

/// A hello (connector to acceptor) or ack (acceptor to connector).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Handshake {
    version: u32,
    kind: u32,
    comm_id: u64,
    from: u32,
    to: u32,
}

impl Handshake {
    fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.kind.to_le_bytes());
        b[16..24].copy_from_slice(&self.comm_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.from.to_le_bytes());
        b[28..32].copy_from_slice(&self.to.to_le_bytes());
        b
    }

    /// Decode and check everything but the sender's rank: magic, version, kind,
    /// communicator and target.
    fn decode(b: &[u8; HANDSHAKE_LEN], kind: u32, comm_id: u64, to: usize) -> std::result::Result<Handshake, String> {
        if b[0..8] != MAGIC {
            return Err("not a braid peer (bad magic)".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let h = Handshake {
            version: u32_at(8),
            kind: u32_at(12),
            comm_id: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
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

/// Progress of the connection to one lower rank.
enum Outgoing {
    /// Not connected; try again at this instant.
    Idle(Instant),
    /// Non-blocking connect in flight.
    Connecting(Socket),
    /// Writing the hello; bytes sent so far.
    SendingHello(Socket, usize),
    /// Reading the ack; bytes received so far.
    AwaitingAck(Socket, [u8; HANDSHAKE_LEN], usize),
    /// Link made.
    Done,
}

/// An accepted connection that has not proven who it is yet.
struct Incoming {
    sock: Socket,
    addr: String,
    buf: [u8; HANDSHAKE_LEN],
    got: usize,
    /// Set once the hello checked out: the rank, and how much of the ack is sent.
    accepted: Option<(usize, usize)>,
}

/// What one step of progress on a socket came to.
enum Step<T> {
    /// Not ready yet; poll again.
    Pending,
    /// Finished, with a result.
    Ready(T),
}

/// Connect this rank to every other rank of `opts.world` over TCP.
///
/// Returns one link per peer, `None` at index `opts.rank`. Fails with
/// [`Error::Timeout`] naming the ranks that never connected when `opts.timeout`
/// passes, with [`Error::Config`] when no interface matches `opts.ifname`, and
/// with [`Error::Io`] when the listening socket cannot be made.
pub fn connect_mesh(opts: &MeshOptions, store: &dyn Store) -> Result<Vec<Option<TcpLink>>> {
    if opts.world == 0 || opts.rank >= opts.world {
        return Err(Error::InvalidArgument(format!("rank {} is not below world size {}", opts.rank, opts.world)));
    }
    if opts.world > u32::MAX as usize {
        return Err(Error::InvalidArgument(format!("world size {} does not fit the handshake", opts.world)));
    }
    if opts.peers.as_ref().is_some_and(|p| p.len() != opts.world) {
        return Err(Error::InvalidArgument(format!("tcp peers mask does not have {} entries", opts.world)));
    }
    let deadline = Instant::now() + opts.timeout;
    let (rank, world) = (opts.rank, opts.world);
    let mut links: Vec<Option<TcpLink>> = (0..world).map(|_| None).collect();
    if !(0..world).any(|j| opts.links_to(j)) {
        return Ok(links);
    }

    let local = ifaces::local_address(opts.ifname.as_deref(), opts.family)?;
    let listener = listen(local, world)?;
    let bound = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| Error::io("reading the listening address", io::Error::other("not an IP socket")))?;
    store.set(&address_key(&opts.key_prefix, rank), bound.to_string().as_bytes())?;
    tracing::debug!(rank, %bound, "tcp mesh: listening");

    let mut book = AddressBook::new(opts);
    let mut outgoing: Vec<Outgoing> = (0..rank).map(|_| Outgoing::Idle(Instant::now())).collect();
    let mut backoff = vec![FIRST_BACKOFF; rank];
    let mut incoming: Vec<Incoming> = Vec::new();
    // Ranks whose hello was accepted (linked, or ack in flight): a second claim is a duplicate.
    let mut claimed = vec![false; world];
    let hello_for = |to: usize| {
        Handshake {
            version: PROTOCOL_VERSION,
            kind: KIND_HELLO,
            comm_id: opts.comm_id,
            from: rank as u32,
            to: to as u32,
        }
        .encode()
    };

    loop {
        // Outgoing: learn newly published addresses, start due connects, then push
        // every handshake as far as it goes.
        book.refresh(opts, store)?;
        for j in 0..rank {
            let Some(addr) = book.addrs[j] else { continue };
            let state = std::mem::replace(&mut outgoing[j], Outgoing::Done);
            let failure = match drive_outgoing(state, addr, &hello_for(j), opts, j) {
                Ok(Progress::Waiting(s)) => {
                    outgoing[j] = s;
                    None
                }
                Ok(Progress::Connected(sock)) => match make_link(sock, j, opts) {
                    Ok(link) => {
                        links[j] = Some(link);
                        None
                    }
                    Err(e) => Some(e.to_string()),
                },
                Err(why) => Some(why),
            };
            if let Some(why) = failure {
                outgoing[j] = retry_later(&mut backoff[j], j, addr, &why);
                // The published address may be stale (a previous run's, in a reused
                // store namespace): read it again before the next attempt.
                book.addrs[j] = None;
            }
        }

        // Incoming: take every waiting connection, then read hellos and write acks.
        accept_all(&listener, &mut incoming);
        let mut i = 0;
        while i < incoming.len() {
            match drive_incoming(&mut incoming[i], opts, &mut claimed) {
                Ok(Step::Pending) => i += 1,
                Ok(Step::Ready(from)) => {
                    let inc = incoming.swap_remove(i);
                    match make_link(inc.sock, from, opts) {
                        Ok(link) => links[from] = Some(link),
                        Err(e) => {
                            claimed[from] = false;
                            tracing::warn!(rank, peer = from, addr = %inc.addr, "tcp mesh: {e}");
                        }
                    }
                }
                Err(why) => {
                    let inc = incoming.swap_remove(i);
                    // A rank whose ack could not be sent may try again on a new connection.
                    if let Some((from, _)) = inc.accepted {
                        claimed[from] = false;
                    }
                    tracing::warn!(rank, addr = %inc.addr, "tcp mesh: dropping connection: {why}");
                }
            }
        }

        // Checked after the work and before sleeping: the last step of progress
        // must not be followed by a wait for events that will never come.
        if links.iter().enumerate().all(|(j, l)| !opts.links_to(j) || l.is_some()) {
            return Ok(links);
        }
        if Instant::now() >= deadline {
            let waiting_on: Vec<usize> = (0..world).filter(|&j| opts.links_to(j) && links[j].is_none()).collect();
            return Err(timeout(opts, waiting_on));
        }
        // Wake for the next store lookup or connect retry that is due (ranks whose
        // address is still unknown have nothing due).
        let retry_at = (0..rank)
            .filter(|&j| book.addrs[j].is_some())
            .filter_map(|j| match outgoing[j] {
                Outgoing::Idle(at) => Some(at),
                _ => None,
            })
            .min();
        let wake = retry_at.map_or(book.wake(deadline), |at| at.min(book.wake(deadline)));
        wait_for_progress(&listener, &outgoing, &incoming, wake);
    }
}

/// The listening addresses of the lower ranks, read from the store as they
/// appear. Looking them up one by one (rather than waiting for all) lets this
/// rank connect to the ranks that are there while another is late, so a
/// timeout names only the ranks that are really missing.
struct AddressBook {
    addrs: Vec<Option<SocketAddr>>,
    /// Lower ranks this rank links with; the others are never looked up.
    wanted: Vec<bool>,
    next_try: Instant,
    backoff: Duration,
}

/// Pauses between store lookups while some address is missing: short at first
/// (ranks start together), then longer so a late rank does not flood the store.
const FIRST_LOOKUP_BACKOFF: Duration = Duration::from_millis(1);
const MAX_LOOKUP_BACKOFF: Duration = Duration::from_millis(50);

impl AddressBook {
    fn new(opts: &MeshOptions) -> AddressBook {
        AddressBook {
            addrs: vec![None; opts.rank],
            wanted: (0..opts.rank).map(|j| opts.links_to(j)).collect(),
            next_try: Instant::now(),
            backoff: FIRST_LOOKUP_BACKOFF,
        }
    }

    fn complete(&self) -> bool {
        self.addrs.iter().zip(&self.wanted).all(|(a, &w)| a.is_some() || !w)
    }

    /// Look up every missing address, if a lookup is due.
    fn refresh(&mut self, opts: &MeshOptions, store: &dyn Store) -> Result<()> {
        if self.complete() || Instant::now() < self.next_try {
            return Ok(());
        }
        let mut found = false;
        for j in 0..self.addrs.len() {
            if self.addrs[j].is_some() || !self.wanted[j] {
                continue;
            }
            let key = address_key(&opts.key_prefix, j);
            let Some(raw) = store.get(&key)? else { continue };
            let text = String::from_utf8_lossy(&raw);
            let addr = text.parse::<SocketAddr>().map_err(|_| Error::Protocol {
                ctx: ctx(opts),
                peer: j,
                detail: format!("store key `{key}` holds `{text}`, not a socket address"),
            })?;
            self.addrs[j] = Some(addr);
            found = true;
        }
        self.backoff = if found { FIRST_LOOKUP_BACKOFF } else { (self.backoff * 2).min(MAX_LOOKUP_BACKOFF) };
        self.next_try = Instant::now() + self.backoff;
        Ok(())
    }

    /// When the poll loop must wake up next for this book's sake.
    fn wake(&self, deadline: Instant) -> Instant {
        if self.complete() {
            deadline
        } else {
            deadline.min(self.next_try)
        }
    }
}

fn ctx(opts: &MeshOptions) -> OpContext {
    OpContext { rank: opts.rank, call: None, seq: 0 }
}

fn timeout(opts: &MeshOptions, waiting_on: Vec<usize>) -> Error {
    Error::Timeout { ctx: ctx(opts), timeout: opts.timeout, waiting_on }
}

fn listen(addr: SocketAddr, world: usize) -> Result<Socket> {
    let what = |e| Error::io(format!("listening on {addr}"), e);
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(what)?;
    sock.bind(&SockAddr::from(addr)).map_err(what)?;
    // Every higher rank may connect at once; the kernel clamps to somaxconn.
    sock.listen(world.clamp(128, 4096) as i32).map_err(what)?;
    sock.set_nonblocking(true).map_err(what)?;
    Ok(sock)
}

fn make_link(sock: Socket, peer: usize, opts: &MeshOptions) -> io::Result<TcpLink> {
    TcpLink::with_buffer(sock, peer, opts.socket_buffer)
}

fn retry_later(backoff: &mut Duration, peer: usize, addr: SocketAddr, why: &str) -> Outgoing {
    tracing::debug!(peer, %addr, "tcp mesh: connect attempt failed ({why}); retrying in {backoff:?}");
    let state = Outgoing::Idle(Instant::now() + *backoff);
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    state
}

/// Where the connection to a lower rank stands after [`drive_outgoing`].
enum Progress {
    /// Not finished: keep this state and come back after `poll`.
    Waiting(Outgoing),
    /// Handshake done: the socket is the link.
    Connected(Socket),
}

/// Advance the connection to lower rank `peer` as far as it goes without blocking.
/// `Err(reason)` means this attempt failed and a new one should start after a pause.
fn drive_outgoing(
    mut state: Outgoing,
    addr: SocketAddr,
    hello: &[u8; HANDSHAKE_LEN],
    opts: &MeshOptions,
    peer: usize,
) -> std::result::Result<Progress, String> {
    loop {
        state = match state {
            Outgoing::Idle(at) if Instant::now() < at => return Ok(Progress::Waiting(Outgoing::Idle(at))),
            Outgoing::Idle(_) => {
                let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                    .and_then(|s| s.set_nonblocking(true).map(|_| s))
                    .map_err(|e| format!("socket: {e}"))?;
                match sock.connect(&SockAddr::from(addr)) {
                    Ok(()) => Outgoing::SendingHello(sock, 0),
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == io::ErrorKind::WouldBlock => {
                        Outgoing::Connecting(sock)
                    }
                    Err(e) => return Err(format!("connect: {e}")),
                }
            }
            Outgoing::Connecting(sock) => {
                if let Some(e) = sock.take_error().map_err(|e| e.to_string())? {
                    return Err(format!("connect: {e}"));
                }
                match sock.peer_addr() {
                    Ok(_) => Outgoing::SendingHello(sock, 0),
                    Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                        return Ok(Progress::Waiting(Outgoing::Connecting(sock)))
                    }
                    Err(e) => return Err(format!("connect: {e}")),
                }
            }
            Outgoing::SendingHello(sock, sent) => {
                match write_some(&sock, &hello[sent..]).map_err(|e| format!("sending hello: {e}"))? {
                    Step::Pending => return Ok(Progress::Waiting(Outgoing::SendingHello(sock, sent))),
                    Step::Ready(n) if sent + n == HANDSHAKE_LEN => Outgoing::AwaitingAck(sock, [0; HANDSHAKE_LEN], 0),
                    Step::Ready(n) => Outgoing::SendingHello(sock, sent + n),
                }
            }
            Outgoing::AwaitingAck(sock, mut buf, got) => {
                match read_some(&sock, &mut buf[got..]).map_err(|e| format!("reading ack: {e}"))? {
                    Step::Pending => return Ok(Progress::Waiting(Outgoing::AwaitingAck(sock, buf, got))),
                    Step::Ready(n) if got + n < HANDSHAKE_LEN => Outgoing::AwaitingAck(sock, buf, got + n),
                    Step::Ready(_) => {
                        let ack = Handshake::decode(&buf, KIND_ACK, opts.comm_id, opts.rank)
                            .map_err(|e| format!("bad ack: {e}"))?;
                        if ack.from as usize != peer {
                            return Err(format!("ack from rank {}, expected rank {peer}", ack.from));
                        }
                        return Ok(Progress::Connected(sock));
                    }
                }
            }
            Outgoing::Done => return Ok(Progress::Waiting(Outgoing::Done)),
        };
    }
}

/// Read and check the hello of an accepted connection, then write the ack.
/// `Ready(rank)` when done; `Err(reason)` drops the connection.
fn drive_incoming(
    inc: &mut Incoming,
    opts: &MeshOptions,
    claimed: &mut [bool],
) -> std::result::Result<Step<usize>, String> {
    let (rank, world) = (opts.rank, opts.world);
    while inc.got < HANDSHAKE_LEN {
        // Read no further than the hello: whatever follows belongs to the link.
        match read_some(&inc.sock, &mut inc.buf[inc.got..]).map_err(|e| format!("reading hello: {e}"))? {
            Step::Pending => return Ok(Step::Pending),
            Step::Ready(n) => inc.got += n,
        }
        // Garbage is refused as soon as its first bytes show it, not at the deadline.
        let seen = inc.got.min(MAGIC.len());
        if inc.buf[..seen] != MAGIC[..seen] {
            return Err("not a braid peer (bad magic)".into());
        }
    }
    let (from, mut sent) = match inc.accepted {
        Some(a) => a,
        None => {
            let h = Handshake::decode(&inc.buf, KIND_HELLO, opts.comm_id, rank)?;
            let from = h.from as usize;
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
                return Err(format!("duplicate connection claiming rank {from}"));
            }
            claimed[from] = true;
            // Recorded before any ack byte goes out, so a failed ack releases the claim.
            inc.accepted = Some((from, 0));
            (from, 0)
        }
    };
    let ack = Handshake {
        version: PROTOCOL_VERSION,
        kind: KIND_ACK,
        comm_id: opts.comm_id,
        from: rank as u32,
        to: from as u32,
    }
    .encode();
    while sent < HANDSHAKE_LEN {
        match write_some(&inc.sock, &ack[sent..]).map_err(|e| format!("sending ack: {e}"))? {
            Step::Pending => {
                inc.accepted = Some((from, sent));
                return Ok(Step::Pending);
            }
            Step::Ready(n) => sent += n,
        }
    }
    Ok(Step::Ready(from))
}

fn accept_all(listener: &Socket, incoming: &mut Vec<Incoming>) {
    loop {
        match listener.accept() {
            Ok((sock, addr)) => {
                let addr = addr.as_socket().map_or_else(|| "?".to_owned(), |a| a.to_string());
                if let Err(e) = sock.set_nonblocking(true) {
                    tracing::warn!(%addr, "tcp mesh: dropping connection: {e}");
                    continue;
                }
                incoming.push(Incoming { sock, addr, buf: [0; HANDSHAKE_LEN], got: 0, accepted: None });
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // WouldBlock: none left. Anything else (EMFILE, ECONNABORTED) is transient
            // or will show at the deadline; the poll loop comes back.
            Err(e) => {
                if e.kind() != io::ErrorKind::WouldBlock {
                    tracing::debug!("tcp mesh: accept: {e}");
                }
                return;
            }
        }
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
fn wait_for_progress(listener: &Socket, outgoing: &[Outgoing], incoming: &[Incoming], wake: Instant) {
    let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    for o in outgoing {
        match o {
            Outgoing::Idle(_) | Outgoing::Done => {}
            Outgoing::Connecting(s) | Outgoing::SendingHello(s, _) => {
                fds.push(PollFd::new(s.as_fd(), PollFlags::POLLOUT))
            }
            Outgoing::AwaitingAck(s, ..) => fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN)),
        }
    }
    for i in incoming {
        let ev = if i.accepted.is_some() { PollFlags::POLLOUT } else { PollFlags::POLLIN };
        fds.push(PollFd::new(i.sock.as_fd(), ev));
    }
    // Round up so a sub-millisecond remainder does not spin.
    let ms = wake.saturating_duration_since(Instant::now()).as_micros().div_ceil(1000);
    let timeout = PollTimeout::try_from(ms.min(60_000) as u64).unwrap_or(PollTimeout::MAX);
    // EINTR or any poll error: the caller loops and re-checks everything.
    let _ = nix::poll::poll(&mut fds, timeout);
}

#[cfg(test)]
mod tests;
