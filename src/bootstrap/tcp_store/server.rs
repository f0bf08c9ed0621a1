//! The TCP store server: an accept loop and one thread per connection, over one
//! map guarded by a mutex and a condition variable that WAIT sleeps on.
//!
//! It does not trust its clients: every connection must prove the job key
//! before any request is read; the handshake and every request must arrive
//! within a read deadline counted from their first byte (a client that sends
//! part of one and stops is dropped); a connection idle between requests is
//! closed after an idle limit; connections, stored bytes and WAIT timeouts are
//! capped ([`StoreLimits`]).

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

use super::wire::*;
use crate::auth::{self, JobKey};
use crate::error::{Error, Result};

/// How often the accept loop looks at the stop flag; bounds how long a drop takes.
const ACCEPT_POLL_MS: u16 = 20;

/// What a [`TcpStoreServer`] allows its clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Open connections at most; more are closed at once, with a log line.
    pub max_connections: usize,
    /// Bytes of keys plus values stored at most; a SET or ADD past it fails naming the cap.
    pub max_stored_bytes: usize,
    /// The handshake, and each request from its first byte, must arrive within this.
    pub read_deadline: Duration,
    /// A connection with no request for this long is closed (clients reconnect).
    pub idle_timeout: Duration,
    /// The longest a WAIT may block; longer timeouts are cut to it.
    pub max_wait: Duration,
}

impl Default for StoreLimits {
    /// 4096 connections, 1 GiB stored, 30 s read deadline, 10 min idle, 1 h WAIT.
    fn default() -> StoreLimits {
        StoreLimits {
            max_connections: 4096,
            max_stored_bytes: 1 << 30,
            read_deadline: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(600),
            max_wait: Duration::from_secs(3600),
        }
    }
}

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

    pub(super) fn serve(listener: TcpListener, key: JobKey, limits: StoreLimits) -> Result<TcpStoreServer> {
        let local_addr = listener.local_addr().map_err(|e| Error::io("reading tcp store listener address", e))?;
        // Non-blocking so the accept loop can notice the stop flag between polls.
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("configuring tcp store listener at {local_addr}"), e))?;
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

pub(super) fn bind_listener(addr: &str) -> io::Result<TcpListener> {
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

fn bind_one(sa: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    // A restarted job must be able to take the port while the last one's sockets sit in TIME_WAIT.
    sock.set_reuse_address(true)?;
    sock.bind(&sa.into())?;
    sock.listen(1024)?;
    Ok(sock.into())
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    let mut refused = 0u64;
    while !shared.stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ACCEPT_POLL_MS) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("tcp store server: poll failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                workers.retain(|h| !h.is_finished());
                let open = lock(&shared.conns).len();
                if open >= shared.limits.max_connections {
                    // Closed before a byte is read or a thread spent on it. Logged
                    // once per thousand so that a flood does not flood the log too.
                    if refused % 1000 == 0 {
                        tracing::warn!(
                            %peer,
                            "tcp store server: refusing a connection: {open} open, the cap is {} ({} refused so far)",
                            shared.limits.max_connections,
                            refused + 1
                        );
                    }
                    refused += 1;
                    drop(stream);
                    continue;
                }
                next_id += 1;
                if let Some(h) = spawn_conn(&shared, stream, peer, next_id) {
                    workers.push(h);
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => {
                // E.g. out of file descriptors: keep serving the connections we have.
                tracing::warn!("tcp store server: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    drop(listener);
    for h in workers {
        let _ = h.join();
    }
}

fn spawn_conn(shared: &Arc<Shared>, stream: TcpStream, peer: SocketAddr, id: u64) -> Option<JoinHandle<()>> {
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
    let spawned = std::thread::Builder::new().name("braid-store-conn".into()).spawn(move || {
        serve_conn(&s, stream, peer);
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

/// Challenge the client and check its proof of the job key; then prove ours.
fn handshake(shared: &Shared, reader: &mut BufReader<Deadlined<'_>>, stream: &TcpStream) -> io::Result<()> {
    let ours = auth::challenge();
    (&*stream).write_all(&encode_server_hello(&ours))?;
    let mut hello = [0u8; CLIENT_HELLO_LEN];
    // Garbage is dropped as soon as its first bytes show it, not at the deadline.
    let mut got = 0;
    while got < 12 {
        match reader.read(&mut hello[got..12]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed during the handshake")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let seen = got.min(STORE_MAGIC.len());
        if hello[..seen] != STORE_MAGIC[..seen] {
            return Err(invalid("not a braid tcp store client (bad magic)".into()));
        }
    }
    check_prefix(&hello[..12], "client hello").map_err(invalid)?;
    reader.read_exact(&mut hello[12..])?;
    let theirs = decode_client_hello(&hello, &shared.key, &ours).map_err(invalid)?;
    (&*stream).write_all(&server_proof(&shared.key, &ours, &theirs))
}

fn serve_conn(shared: &Shared, stream: TcpStream, peer: SocketAddr) {
    let limits = &shared.limits;
    let mut reader = BufReader::new(Deadlined { stream: &stream, deadline: Instant::now() + limits.read_deadline });
    if let Err(e) = handshake(shared, &mut reader, &stream) {
        // Strangers and scanners are routine on an open port: debug, not warn.
        tracing::debug!(%peer, "tcp store server: dropping a connection that failed the handshake: {e}");
        return;
    }
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
