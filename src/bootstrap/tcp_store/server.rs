//! The TCP store server: an accept loop and one thread per connection, over one
//! map guarded by a mutex and a condition variable that WAIT sleeps on.

use std::collections::HashMap;
use std::io::{self, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags};

use super::wire::*;
use crate::error::{Error, Result};

/// How often the accept loop looks at the stop flag; bounds how long a drop takes.
const ACCEPT_POLL_MS: u16 = 20;

/// State shared by the server's threads.
struct Shared {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    stop: AtomicBool,
    /// A handle on every open connection, so that stopping can unblock their reads.
    conns: Mutex<HashMap<u64, TcpStream>>,
}

impl Shared {
    fn handle(&self, req: Request) -> (u8, Vec<u8>) {
        match req {
            Request::Set(key, value) => {
                lock(&self.map).insert(key, value);
                self.changed.notify_all();
                (ST_OK, Vec::new())
            }
            Request::Get(key) => match lock(&self.map).get(&key) {
                Some(v) => (ST_OK, v.clone()),
                None => (ST_ABSENT, Vec::new()),
            },
            Request::Add(key, delta) => {
                let mut map = lock(&self.map);
                let current = match map.get(&key) {
                    None => 0,
                    Some(v) => match std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()) {
                        Some(n) => n,
                        None => return (ST_ERROR, format!("key `{key}` does not hold an integer").into_bytes()),
                    },
                };
                let next = current.wrapping_add(delta);
                map.insert(key, next.to_string().into_bytes());
                drop(map);
                self.changed.notify_all();
                (ST_OK, next.to_le_bytes().to_vec())
            }
            Request::Delete(key) => (ST_OK, vec![lock(&self.map).remove(&key).is_some() as u8]),
            Request::Wait(keys, timeout) => self.wait(&keys, timeout),
            Request::Ping => (ST_OK, Vec::new()),
        }
    }

    fn wait(&self, keys: &[String], timeout: Duration) -> (u8, Vec<u8>) {
        let deadline = Instant::now().checked_add(timeout);
        let mut map = lock(&self.map);
        loop {
            // Checked under the map lock that Drop also takes, so no wakeup is lost.
            if self.stop.load(Ordering::Acquire) {
                return (ST_ERROR, b"the tcp store server is shutting down".to_vec());
            }
            let missing: Vec<&str> = keys.iter().map(String::as_str).filter(|k| !map.contains_key(*k)).collect();
            if missing.is_empty() {
                return (ST_OK, Vec::new());
            }
            let now = Instant::now();
            let left = match deadline {
                Some(d) if d <= now => {
                    let mut msg = format!("timed out after {timeout:?} waiting for keys {missing:?}");
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
                Some(d) => d - now,
                None => Duration::from_secs(3600),
            };
            map = self.changed.wait_timeout(map, left).unwrap_or_else(|e| e.into_inner()).0;
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
    /// Listen on `addr` ("HOST:PORT", "[::1]:0" for IPv6; port 0 picks a free port).
    pub fn bind(addr: &str) -> Result<TcpStoreServer> {
        let listener = bind_listener(addr).map_err(|e| Error::io(format!("binding tcp store server at {addr}"), e))?;
        TcpStoreServer::serve(listener)
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub(super) fn serve(listener: TcpListener) -> Result<TcpStoreServer> {
        let local_addr = listener.local_addr().map_err(|e| Error::io("reading tcp store listener address", e))?;
        // Non-blocking so the accept loop can notice the stop flag between polls.
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("configuring tcp store listener at {local_addr}"), e))?;
        let shared = Arc::new(Shared {
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
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
        drop(lock(&self.shared.map));
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
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
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

fn serve_conn(shared: &Shared, stream: TcpStream, peer: SocketAddr) {
    let mut reader = BufReader::new(&stream);
    loop {
        let req = match read_request(&mut reader) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) if matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof) => {
                tracing::warn!(%peer, "tcp store server: dropping a connection that sent an invalid request: {e}");
                return;
            }
            Err(e) => {
                if !shared.stop.load(Ordering::Acquire) {
                    tracing::debug!(%peer, "tcp store server: connection lost: {e}");
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
