//! The TCP store server: an accept loop and one thread per connection, over one
//! map guarded by a mutex and a condition variable that WAIT sleeps on.
//!
//! It does not trust its clients: every connection must prove the job key
//! before any request is read, and is admitted without a thread until it has
//! ([`super::admit`]: a budget of its own and a short proof deadline); every
//! request must arrive within a read deadline counted from its first byte (a
//! client that sends part of one and stops is dropped); a connection idle
//! between requests is closed after an idle limit; connections, stored bytes
//! and WAIT timeouts are capped ([`StoreLimits`]), the connections in
//! proportion to the job's world size ([`StoreLimits::for_world`]).

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags};

use super::admit::{admit, Admission, Pending};
use super::limits::StoreLimits;
use super::wire::*;
use crate::auth::{JobKey, PROOF_LEN};
use crate::error::{Error, Result};

/// How often the accept loop looks at the stop flag and the proof deadlines;
/// bounds how long a drop takes and how late an unproven connection is closed.
const ACCEPT_POLL_MS: u16 = 20;

/// Stack of a connection thread: it parses one request at a time and touches
/// the map, so the 2 MiB default only costs address space at thousands of ranks.
const CONN_STACK: usize = 256 << 10;

/// The stored keys and values, and their size in bytes.
#[derive(Default)]
struct Data {
    map: HashMap<String, Vec<u8>>,
    bytes: usize,
}

impl Data {
    /// Store `value` at `key` unless the total would pass `cap`.
    fn put(&mut self, key: String, value: Vec<u8>, cap: usize) -> std::result::Result<(), String> {
        let old = self.map.get(&key).map_or(0, |v| key.len() + v.len());
        let total = self.bytes - old + key.len() + value.len();
        if total > cap {
            return Err(format!(
                "storing {} bytes at `{}` would pass the store's cap of {cap} bytes ({} in use)",
                key.len() + value.len(),
                key.chars().take(64).collect::<String>(),
                self.bytes
            ));
        }
        self.bytes = total;
        self.map.insert(key, value);
        Ok(())
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.map.remove(key) {
            Some(v) => {
                self.bytes -= key.len() + v.len();
                true
            }
            None => false,
        }
    }
}

/// State shared by the server's threads.
struct Shared {
    data: Mutex<Data>,
    changed: Condvar,
    stop: AtomicBool,
    /// A handle on every open connection, so that stopping can unblock their reads.
    conns: Mutex<HashMap<u64, TcpStream>>,
    key: JobKey,
    limits: StoreLimits,
}

impl Shared {
    fn handle(&self, req: Request) -> (u8, Vec<u8>) {
        let cap = self.limits.max_stored_bytes;
        match req {
            Request::Set(key, value) => {
                let stored = lock(&self.data).put(key, value, cap);
                match stored {
                    Ok(()) => {
                        self.changed.notify_all();
                        (ST_OK, Vec::new())
                    }
                    Err(msg) => (ST_ERROR, msg.into_bytes()),
                }
            }
            Request::Get(key) => match lock(&self.data).map.get(&key) {
                Some(v) => (ST_OK, v.clone()),
                None => (ST_ABSENT, Vec::new()),
            },
            Request::Add(key, delta) => {
                let mut data = lock(&self.data);
                let current = match data.map.get(&key) {
                    None => 0,
                    Some(v) => match std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()) {
                        Some(n) => n,
                        None => return (ST_ERROR, format!("key `{key}` does not hold an integer").into_bytes()),
                    },
                };
                let next = current.wrapping_add(delta);
                if let Err(msg) = data.put(key, next.to_string().into_bytes(), cap) {
                    return (ST_ERROR, msg.into_bytes());
                }
                drop(data);
                self.changed.notify_all();
                (ST_OK, next.to_le_bytes().to_vec())
            }
            Request::Delete(key) => (ST_OK, vec![lock(&self.data).remove(&key) as u8]),
            Request::Wait(keys, timeout) => self.wait(&keys, timeout),
            Request::Ping => (ST_OK, Vec::new()),
            Request::SetIfAbsent(key, value) => {
                let mut data = lock(&self.data);
                if let Some(held) = data.map.get(&key) {
                    return (ST_OK, held.clone());
                }
                if let Err(msg) = data.put(key, value.clone(), cap) {
                    return (ST_ERROR, msg.into_bytes());
                }
                drop(data);
                self.changed.notify_all();
                (ST_OK, value)
            }
        }
    }

    fn wait(&self, keys: &[String], asked: Duration) -> (u8, Vec<u8>) {
        let timeout = asked.min(self.limits.max_wait);
        let deadline = Instant::now() + timeout;
        let mut data = lock(&self.data);
        loop {
            // Checked under the map lock that Drop also takes, so no wakeup is lost.
            if self.stop.load(Ordering::Acquire) {
                return (ST_ERROR, b"the tcp store server is shutting down".to_vec());
            }
            let missing: Vec<&str> = keys.iter().map(String::as_str).filter(|k| !data.map.contains_key(*k)).collect();
            if missing.is_empty() {
                return (ST_OK, Vec::new());
            }
            let now = Instant::now();
            let left = match deadline.checked_duration_since(now) {
                None | Some(Duration::ZERO) => {
                    let limit = if asked > timeout { " (the server's limit)" } else { "" };
                    let mut msg = format!("timed out after {timeout:?}{limit} waiting for keys {missing:?}");
                    if msg.len() > MAX_MESSAGE {
                        let mut cut = MAX_MESSAGE;
                        while !msg.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        msg.truncate(cut);
                        msg.push_str("...");
                    }
                    return (ST_TIMEOUT, msg.into_bytes());
                }
                Some(left) => left,
            };
            data = self.changed.wait_timeout(data, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// The server side of the TCP store: listens, serves each connection on its own
/// thread, and stops (threads joined, listener closed) when dropped.
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Listen on `addr` ("HOST:PORT", `"[::1]:0"` for IPv6; port 0 picks a free port),
    /// serving only clients that prove `key`, with the default [`StoreLimits`].
    pub fn bind(addr: &str, key: JobKey) -> Result<TcpStoreServer> {
        TcpStoreServer::bind_with(addr, key, StoreLimits::default())
    }

    /// Like [`TcpStoreServer::bind`], with the given limits.
    pub fn bind_with(addr: &str, key: JobKey, limits: StoreLimits) -> Result<TcpStoreServer> {
        let listener = bind_listener(addr).map_err(|e| Error::io(format!("binding tcp store server at {addr}"), e))?;
        TcpStoreServer::serve(listener, key, limits)
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the server allows its clients.
    pub fn limits(&self) -> &StoreLimits {
        &self.shared.limits
    }

    pub(super) fn serve(listener: TcpListener, key: JobKey, limits: StoreLimits) -> Result<TcpStoreServer> {
        let local_addr = listener.local_addr().map_err(|e| Error::io("reading tcp store listener address", e))?;
        // Non-blocking so the accept loop can notice the stop flag between polls.
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("configuring tcp store listener at {local_addr}"), e))?;
        // A descriptor per connection, proven or not, plus some for the rest of the process.
        raise_fd_limit(limits.max_connections.saturating_add(limits.max_unproven).saturating_add(256));
        let shared = Arc::new(Shared {
            data: Mutex::new(Data::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            key,
            limits,
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name(format!("braid-store:{}", local_addr.port()))
            .spawn(move || accept_loop(listener, s))
            .map_err(|e| Error::io(format!("spawning tcp store server thread for {local_addr}"), e))?;
        tracing::debug!(%local_addr, "tcp store server listening");
        Ok(TcpStoreServer { local_addr, shared, acceptor: Some(acceptor) })
    }
}

impl std::fmt::Debug for TcpStoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStoreServer").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        drop(lock(&self.shared.data));
        self.shared.changed.notify_all();
        for conn in lock(&self.shared.conns).values() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        tracing::debug!(local_addr = %self.local_addr, "tcp store server stopped");
    }
}

/// Raise this process's soft limit on open files to `needed` where the hard
/// limit allows: the usual soft limit of 1024 would refuse a large job's ranks
/// long before the connection cap does.
fn raise_fd_limit(needed: usize) {
    let needed = needed as libc::rlim_t;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur >= needed {
        return;
    }
    let raised = libc::rlimit { rlim_cur: needed.min(lim.rlim_max), rlim_max: lim.rlim_max };
    // SAFETY: setrlimit only reads the struct it is given; raising the soft limit
    // up to the hard one needs no privilege and lowers nothing.
    let now =
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 { raised.rlim_cur } else { lim.rlim_cur };
    if now < needed {
        tracing::warn!(
            "tcp store server: room for {needed} open files is wanted, the limit is {now} (raise `ulimit -n`)"
        );
    }
}

fn bind_listener(addr: &str) -> io::Result<TcpListener> {
    let mut last = io::Error::new(io::ErrorKind::AddrNotAvailable, "address resolved to nothing");
    for sa in addr.to_socket_addrs()? {
        match bind_one(sa) {
            Ok(l) => return Ok(l),
            // Taken: trying the name's other addresses could start a second server
            // on the same port in another address family, splitting the job in two.
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => return Err(e),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Listen on every address of this host at `port`, as torch's TCPStore master does:
/// dual-stack `[::]` (IPv4 clients arrive as mapped addresses), or `0.0.0.0` where
/// IPv6 is off. A port already taken fails with `AddrInUse` in either family.
pub(super) fn bind_wildcard(port: u16) -> io::Result<TcpListener> {
    match bind_socket(SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)), Some(false)) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(e),
        Err(e) => {
            tracing::debug!(port, "tcp store: cannot listen on [::] ({e}); listening on 0.0.0.0");
            bind_one(SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)))
        }
    }
}

fn bind_one(sa: SocketAddr) -> io::Result<TcpListener> {
    bind_socket(sa, None)
}

/// Bind and listen on `sa`; `only_v6` sets IPV6_V6ONLY on an IPv6 socket.
fn bind_socket(sa: SocketAddr, only_v6: Option<bool>) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    if let Some(v6) = only_v6 {
        sock.set_only_v6(v6)?;
    }
    // A restarted job must be able to take the port while the last one's sockets sit in TIME_WAIT.
    sock.set_reuse_address(true)?;
    sock.bind(&sa.into())?;
    sock.listen(1024)?;
    Ok(sock.into())
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let limits = &shared.limits;
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let mut pending = Pending::default();
    let mut next_id = 0u64;
    let (mut refused, mut evicted) = (0u64, 0u64);
    // A few accepts per turn, then the pending handshakes move: a client that
    // answers within a round trip is read before a burst can push it out.
    let batch = (limits.max_unproven / 4).max(1);
    while !shared.stop.load(Ordering::Acquire) {
        let (listener_ready, ready) = {
            let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
            fds.extend(pending.fds().map(|fd| PollFd::new(fd, PollFlags::POLLIN)));
            match poll(&mut fds, ACCEPT_POLL_MS) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!("tcp store server: poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            }
            let is_ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (is_ready(&fds[0]), fds[1..].iter().map(is_ready).collect::<Vec<bool>>())
        };
        for (stream, peer, proof) in pending.progress(&ready, &shared.key) {
            next_id += 1;
            if let Some(h) = spawn_conn(&shared, stream, peer, next_id, proof) {
                workers.push(h);
            }
        }
        pending.expire(Instant::now());
        if !listener_ready {
            continue;
        }
        workers.retain(|h| !h.is_finished());
        for _ in 0..batch {
            let (stream, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => break,
                Err(e) => {
                    // E.g. out of file descriptors: keep serving the connections we have.
                    tracing::warn!("tcp store server: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
            };
            let open = lock(&shared.conns).len();
            match admit(limits, open, pending.len()) {
                Admission::Refuse => {
                    // Closed before the hello, which the client reads as "full, retry".
                    // Logged once per thousand so that a flood does not flood the log too.
                    if refused % 1000 == 0 {
                        tracing::warn!(
                            %peer,
                            "tcp store server: refusing a connection: {open} open, the cap is {} ({} refused so far)",
                            limits.max_connections,
                            refused + 1
                        );
                    }
                    refused += 1;
                    continue;
                }
                Admission::EvictOldest => {
                    if let Some(old) = pending.evict_oldest() {
                        if evicted % 1000 == 0 {
                            tracing::warn!(
                                peer = %old,
                                "tcp store server: {} connections are proving the job key, the budget: closing the \
                                 oldest ({} so far)",
                                limits.max_unproven,
                                evicted + 1
                            );
                        }
                        evicted += 1;
                    }
                }
                Admission::Admit => {}
            }
            pending.start(stream, peer, Instant::now() + limits.proof_deadline);
        }
    }
    drop(listener);
    drop(pending);
    for h in workers {
        let _ = h.join();
    }
}

/// Serve a connection that proved the job key on its own thread; `proof` is
/// ours, still to be sent.
fn spawn_conn(
    shared: &Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    proof: [u8; PROOF_LEN],
) -> Option<JoinHandle<()>> {
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
        // Frees the thread if a client stops reading its reply.
        .and_then(|()| stream.set_write_timeout(Some(REPLY_TIMEOUT)))
        .and_then(|()| stream.try_clone());
    let handle = match setup {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(%peer, "tcp store server: cannot set up connection: {e}");
            return None;
        }
    };
    {
        let mut conns = lock(&shared.conns);
        // Checked under the lock that Drop takes, so a connection accepted while
        // stopping is either shut down by Drop or never served.
        if shared.stop.load(Ordering::Acquire) {
            return None;
        }
        conns.insert(id, handle);
    }
    let s = shared.clone();
    let spawned = std::thread::Builder::new().name("braid-store-conn".into()).stack_size(CONN_STACK).spawn(move || {
        serve_conn(&s, stream, peer, &proof);
        lock(&s.conns).remove(&id);
    });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(%peer, "tcp store server: cannot spawn a connection thread: {e}");
            lock(&shared.conns).remove(&id);
            None
        }
    }
}

/// A connection's reads, each bounded by one deadline for the whole message
/// being read (a socket timeout alone bounds only the gap between two bytes, so
/// a client sending a byte at a time could hold a thread forever).
struct Deadlined<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "read deadline passed"));
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut s = self.stream;
        s.read(buf).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => io::Error::new(io::ErrorKind::TimedOut, "read deadline passed"),
            _ => e,
        })
    }
}

fn serve_conn(shared: &Shared, stream: TcpStream, peer: SocketAddr, proof: &[u8]) {
    let limits = &shared.limits;
    if let Err(e) = (&stream).write_all(proof) {
        tracing::debug!(%peer, "tcp store server: cannot send our proof of the job key: {e}");
        return;
    }
    let mut reader = BufReader::new(Deadlined { stream: &stream, deadline: Instant::now() + limits.idle_timeout });
    loop {
        reader.get_mut().deadline = Instant::now() + limits.idle_timeout;
        let op = match read_op(&mut reader) {
            Ok(Some(op)) => op,
            Ok(None) => return,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                tracing::debug!(%peer, "tcp store server: closing a connection idle for {:?}", limits.idle_timeout);
                return;
            }
            Err(e) => {
                if !shared.stop.load(Ordering::Acquire) {
                    tracing::debug!(%peer, "tcp store server: connection lost: {e}");
                }
                return;
            }
        };
        reader.get_mut().deadline = Instant::now() + limits.read_deadline;
        let req = match read_body(op, &mut reader) {
            Ok(r) => r,
            Err(e) => {
                if !shared.stop.load(Ordering::Acquire) {
                    tracing::debug!(%peer, "tcp store server: dropping a connection that sent an invalid, partial or slow request: {e}");
                }
                return;
            }
        };
        let (status, body) = shared.handle(req);
        let mut out = Vec::with_capacity(5 + body.len());
        out.push(status);
        put_bytes(&mut out, &body);
        if let Err(e) = (&stream).write_all(&out) {
            tracing::debug!(%peer, "tcp store server: cannot reply: {e}");
            return;
        }
    }
}
