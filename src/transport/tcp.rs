//! TCP links: one non-blocking socket per peer, and the mesh setup that makes them.
//!
//! Setup ([`connect_mesh`]): every rank listens where [`ifaces::choose_listen`]
//! says (by default the source address of its route to the store) and publishes
//! that address, then its other qualifying ones, in the store under
//! `{key_prefix}/tcp/{rank}`. Rank `i` connects to every `j < i`, trying `j`'s
//! addresses in turn with short deadlines ([`candidates`]), and accepts one
//! connection from every `j > i`. All of it runs in one `poll` loop, so a slow
//! or refused connect never stops this rank from accepting (and vice versa), and
//! one deadline bounds every wait.
//!
//! Handshake ([`handshake`]): the connector sends a hello naming the
//! communicator, both ranks and a fresh challenge; the acceptor answers with an
//! ack carrying its own challenge and its proof of the job key; the connector
//! checks it and sends its proof, which the acceptor checks before the link
//! counts as made. A connection that fails any step (a port scanner, another
//! job, a stale rank, a client without the key) is dropped and logged at debug
//! level, and accepting goes on: only a rank that proved the key takes its place.

mod candidates;
mod handshake;
mod options;

use std::io::{self, IoSlice, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::ifaces::{self, ListenChoice};
use super::{Link, TransportKind};
use crate::bootstrap::Store;
use crate::error::{Error, OpContext, Result};
use candidates::Attempts;
use handshake::*;
pub use options::MeshOptions;

/// Most buffers handed to one `sendmsg`; the kernel's IOV_MAX is 1024, and the
/// executor passes a header plus one or two payload slices, so 64 never binds in practice.
const MAX_IOV: usize = 64;

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
    fn with_buffer(sock: Socket, peer: usize, buffer: Option<usize>) -> io::Result<TcpLink> {
        configure_stream(&sock, buffer)?;
        let peer_addr = sock.peer_addr()?.as_socket().ok_or_else(|| io::Error::other("peer is not an IP socket"))?;
        Ok(TcpLink { sock, peer, peer_addr })
    }

    /// The peer's socket address.
    #[cfg(test)]
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// This end's socket address.
    #[cfg(test)]
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

    /// Reset, or ended with nothing left to read. A failing peer sends an abort
    /// frame before it ends its side, so that frame is still to read here unless
    /// the channel read it already (and then the channel knows better).
    fn peer_gone(&mut self) -> bool {
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        match self.sock.peek(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted),
        }
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

/// Connect this rank to every other rank of `opts.world` over TCP.
///
/// Returns one link per peer, `None` at index `opts.rank`. Fails when
/// `opts.timeout` passes with [`Error::Timeout`] naming the ranks that never
/// connected, or [`Error::Protocol`] naming one of them when a connection
/// to or from it failed the job-key proof (different keys), with [`Error::Config`] when no interface matches `opts.ifname`, and
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

    if !opts.key.is_set() {
        static UNKEYED: std::sync::Once = std::sync::Once::new();
        UNKEYED.call_once(|| {
            tracing::warn!(
                rank,
                "tcp mesh: no job key (BRAID_JOB_KEY) is set, so anyone who can reach this rank's port can \
                 join the job; `braid run` sets one, or export the same secret on every rank"
            )
        });
    }
    let choice = ifaces::choose_listen(
        &ifaces::list_interfaces()?,
        opts.ifname.as_deref(),
        opts.family,
        opts.store_route,
        opts.spans_hosts,
    )
    .map_err(|e| Error::Config(format!("rank {rank}: choosing where tcp links listen: {e}")))?;
    let (listener, published) = listen_on(&choice, world)?;
    store.set(&address_key(&opts.key_prefix, rank), candidates::encode(&published).as_bytes())?;
    tracing::debug!(rank, published = %candidates::encode(&published), "tcp mesh: listening at {choice}");

    let mut book = AddressBook::new(opts);
    let mut outgoing: Vec<Outgoing> = (0..rank).map(|_| Outgoing::Idle(Instant::now())).collect();
    let mut backoff = vec![FIRST_BACKOFF; rank];
    let mut attempts: Vec<Attempts> = (0..rank).map(|_| Attempts::default()).collect();
    let mut incoming: Vec<Incoming> = Vec::new();
    // Ranks that proved the job key on an accepted connection: a second claim is a duplicate.
    let mut claimed = vec![false; world];
    // Per peer, the last failed job-key proof seen for it: a setup that times out
    // says so instead of only naming the rank.
    let mut key_failures: Vec<Option<String>> = vec![None; world];

    loop {
        // Outgoing: learn newly published addresses, start due connects, then push
        // every handshake as far as it goes.
        book.refresh(opts, store)?;
        for j in 0..rank {
            let Some(list) = book.addrs[j].as_deref() else { continue };
            let (addr, n) = (attempts[j].current(list), list.len());
            let state = std::mem::replace(&mut outgoing[j], Outgoing::Done);
            if matches!(state, Outgoing::Idle(at) if Instant::now() >= at) {
                attempts[j].start(Instant::now());
            }
            let failure = match drive_outgoing(state, addr, opts, j) {
                Ok(Progress::Waiting(s)) => {
                    let in_flight = !matches!(s, Outgoing::Idle(_) | Outgoing::Done);
                    match attempts[j].deadline() {
                        // Dropping the state closes the socket.
                        Some(at) if in_flight && Instant::now() >= at => {
                            Some((format!("no answer within {:?}", attempts[j].limit()), true))
                        }
                        _ => {
                            outgoing[j] = s;
                            None
                        }
                    }
                }
                Ok(Progress::Connected(sock)) => match make_link(sock, j, opts) {
                    Ok(link) => {
                        tracing::debug!(rank, peer = j, %addr, "tcp mesh: linked");
                        links[j] = Some(link);
                        None
                    }
                    Err(e) => Some((e.to_string(), false)),
                },
                Err(why) => Some((why, false)),
            };
            if let Some((why, silent)) = failure {
                if why.contains(KEY_NOT_PROVEN) {
                    key_failures[j] = Some(why.clone());
                }
                if attempts[j].failed(addr, &why, n, silent) {
                    outgoing[j] = retry_later(&mut backoff[j], j, addr, &why);
                    // The published addresses may be stale (a previous run's, in a
                    // reused store namespace): read them again before the next pass.
                    book.addrs[j] = None;
                } else {
                    tracing::debug!(rank, peer = j, %addr, "tcp mesh: {why}; trying the peer's next published address");
                    outgoing[j] = Outgoing::Idle(Instant::now());
                }
            }
        }

        // Incoming: take the waiting connections, move every handshake along, then
        // shed the unproven past the cap (so a new one's hello is read first).
        accept_some(&listener, &mut incoming, rank, opts.max_pending);
        let mut i = 0;
        while i < incoming.len() {
            match drive_incoming(&mut incoming[i], opts, &mut claimed) {
                Ok(Step::Pending) => i += 1,
                Ok(Step::Ready(from)) => {
                    // `remove`, not `swap_remove`: shedding needs oldest first.
                    let inc = incoming.remove(i);
                    match make_link(inc.sock, from, opts) {
                        Ok(link) => links[from] = Some(link),
                        Err(e) => {
                            claimed[from] = false;
                            tracing::warn!(rank, peer = from, addr = %inc.addr, "tcp mesh: {e}");
                        }
                    }
                }
                Err(why) => {
                    // Strangers and garbage are routine on an open port: debug, not warn.
                    let inc = incoming.remove(i);
                    tracing::debug!(rank, addr = %inc.addr, "tcp mesh: dropping connection: {why}");
                    if let Some(from) = inc.claims().filter(|_| why.contains(KEY_NOT_PROVEN)) {
                        key_failures[from] = Some(format!("{why} ({})", inc.addr));
                    }
                }
            }
        }
        shed_pending(&mut incoming, rank, opts.max_pending);

        // Checked after the work and before sleeping: the last step of progress
        // must not be followed by a wait for events that will never come.
        if links.iter().enumerate().all(|(j, l)| !opts.links_to(j) || l.is_some()) {
            return Ok(links);
        }
        if Instant::now() >= deadline {
            let waiting_on: Vec<usize> = (0..world).filter(|&j| opts.links_to(j) && links[j].is_none()).collect();
            if let Some((peer, why)) = waiting_on.iter().find_map(|&j| key_failures[j].as_ref().map(|w| (j, w))) {
                return Err(Error::Protocol {
                    ctx: ctx(opts),
                    peer,
                    detail: format!(
                        "no authenticated tcp link within {:?} (still waiting for rank(s) {waiting_on:?}): {why}",
                        opts.timeout
                    ),
                });
            }
            for &j in waiting_on.iter().filter(|&&j| j < rank) {
                let report = attempts[j].report();
                if !report.is_empty() {
                    tracing::warn!(
                        rank,
                        peer = j,
                        "tcp mesh: no link to rank {j} within {:?}; this rank listens at {choice}; \
                         what rank {j}'s published addresses answered: {report}",
                        opts.timeout
                    );
                }
            }
            return Err(timeout(opts, waiting_on));
        }
        // Wake for the next store lookup or connect retry that is due (ranks whose
        // address is still unknown have nothing due).
        let retry_at = (0..rank)
            .filter(|&j| book.addrs[j].is_some())
            .filter_map(|j| match outgoing[j] {
                Outgoing::Idle(at) => Some(at),
                Outgoing::Done => None,
                // An attempt in flight is given up at its deadline.
                _ => attempts[j].deadline(),
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
    addrs: Vec<Option<Vec<SocketAddr>>>,
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
            let addrs = candidates::decode(&text).map_err(|why| Error::Protocol {
                ctx: ctx(opts),
                peer: j,
                detail: format!("store key `{key}` does not hold the rank's listening addresses: {why}"),
            })?;
            self.addrs[j] = Some(addrs);
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
    Error::Timeout { ctx: ctx(opts), timeout: opts.timeout, waiting_on, chain: Vec::new() }
}

/// Listen where `choice` says, and the addresses to publish (the chosen one first).
/// With alternatives the socket listens on the wildcard address of the chosen
/// family, so every published address reaches it.
fn listen_on(choice: &ListenChoice, world: usize) -> Result<(Socket, Vec<SocketAddr>)> {
    if choice.others.is_empty() {
        let sock = listen(choice.chosen.socket_addr(0), world)?;
        let bound = bound_addr(&sock)?;
        return Ok((sock, vec![bound]));
    }
    let any: IpAddr =
        if choice.chosen.addr.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let sock = listen(SocketAddr::new(any, 0), world)?;
    let port = bound_addr(&sock)?.port();
    let published = std::iter::once(&choice.chosen).chain(&choice.others).map(|i| i.socket_addr(port)).collect();
    Ok((sock, published))
}

fn bound_addr(sock: &Socket) -> Result<SocketAddr> {
    sock.local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| Error::io("reading the listening address", io::Error::other("not an IP socket")))
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

#[cfg(test)]
mod failover_tests;
#[cfg(test)]
mod tests;
