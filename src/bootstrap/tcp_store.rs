//! A TCP key-value store: one process hosts a [`TcpStoreServer`] and every rank
//! talks to it through a [`TcpStore`] client, as torch's TCPStore does.
//!
//! Wire protocol, little-endian, one request then one reply per round trip:
//!
//! ```text
//! request = op:u8 body       key   = len:u32 (<= 4 KiB) utf8-bytes
//!   SET 1: key value         value = len:u32 (<= 64 MiB) bytes
//!   GET 2: key               reply = status:u8 len:u32 bytes
//!   ADD 3: key delta:i64       status 0 OK, 1 ABSENT, 2 TIMEOUT, 3 ERROR
//!   DEL 4: key                 GET: value | ADD: i64 | DEL: u8 existed
//!   WAIT 5: n:u32 key*n timeout_ms:u64    TIMEOUT/ERROR: message
//!   PING 6
//! ```
//!
//! WAIT is served by the server (a condition variable woken on every SET and ADD),
//! so a waiting rank costs one blocked thread, not a stream of polls.

mod server;
mod wire;

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::bootstrap::Store;
use crate::error::{Error, Result};
use server::bind_listener;
pub use server::TcpStoreServer;
use wire::*;

/// Added to a WAIT's own timeout for the reply to come back.
const WAIT_SLACK: Duration = Duration::from_secs(10);
const MAX_IDLE_CONNS: usize = 8;

/// A client of a [`TcpStoreServer`]; `Send + Sync`, share it in an `Arc`.
///
/// Each call borrows a connection from a small pool (opening one when none is idle),
/// so a `wait` blocked in one thread never holds up other threads' calls. A
/// connection whose request failed is discarded, since its framing is then unknown.
pub struct TcpStore {
    /// The address as the caller gave it, for error messages.
    addr: String,
    /// The resolved address that answered; new pool connections go there.
    peer: SocketAddr,
    idle: Mutex<Vec<TcpStream>>,
    /// Declared last so the client's connections close before the server stops.
    server: Option<TcpStoreServer>,
}

impl TcpStore {
    /// Connect to the server at `addr` ("HOST:PORT"), retrying with backoff while it
    /// is not up yet; fails once `timeout` passes, naming the address.
    pub fn connect(addr: &str, timeout: Duration) -> Result<TcpStore> {
        let (stream, peer) = connect_retry(addr, timeout)?;
        Ok(TcpStore { addr: addr.to_owned(), peer, idle: Mutex::new(vec![stream]), server: None })
    }

    /// When `host_if_absent`, host the server at `addr` in this process if the port
    /// is free (the server then lives as long as the returned client), and connect
    /// as a plain client if it is taken or the address is not local. Otherwise connect.
    pub fn connect_or_host(addr: &str, host_if_absent: bool, timeout: Duration) -> Result<TcpStore> {
        if host_if_absent {
            match bind_listener(addr) {
                Ok(listener) => {
                    let server = TcpStoreServer::serve(listener)?;
                    let target = connectable(server.local_addr());
                    let (stream, peer) = connect_retry(&target.to_string(), timeout)?;
                    tracing::info!(addr, local_addr = %server.local_addr(), "hosting the tcp store");
                    return Ok(TcpStore {
                        addr: addr.to_owned(),
                        peer,
                        idle: Mutex::new(vec![stream]),
                        server: Some(server),
                    });
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::AddrInUse | io::ErrorKind::AddrNotAvailable) => {
                    tracing::debug!(addr, "not hosting the tcp store ({e}); connecting as a client");
                }
                Err(e) => return Err(Error::io(format!("hosting the tcp store at {addr}"), e)),
            }
        }
        TcpStore::connect(addr, timeout)
    }

    /// Whether this client hosts the server it talks to.
    pub fn hosts_server(&self) -> bool {
        self.server.is_some()
    }

    /// The address the hosted server listens on, when this client hosts one.
    pub fn hosted_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(TcpStoreServer::local_addr)
    }

    /// The server address as given to `connect`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn error(&self, what: &str, msg: impl std::fmt::Display) -> Error {
        Error::Store(format!("tcp store {}: {what}: {msg}", self.addr))
    }

    /// Send `msg` and read the reply, allowing `deadline` for each socket operation.
    fn request(&self, what: &str, msg: &[u8], deadline: Duration) -> Result<(u8, Vec<u8>)> {
        let pooled = lock(&self.idle).pop();
        let stream = match pooled {
            Some(s) => s,
            None => {
                let s = TcpStream::connect_timeout(&self.peer, IO_TIMEOUT).map_err(|e| {
                    Error::io(format!("tcp store {}: {what}: connecting to {}", self.addr, self.peer), e)
                })?;
                let _ = s.set_nodelay(true);
                s
            }
        };
        match roundtrip(&stream, msg, deadline) {
            Ok(reply) => {
                let mut idle = lock(&self.idle);
                if idle.len() < MAX_IDLE_CONNS {
                    idle.push(stream);
                }
                Ok(reply)
            }
            Err(e) => Err(Error::io(format!("tcp store {}: {what}", self.addr), e)),
        }
    }
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStore")
            .field("addr", &self.addr)
            .field("peer", &self.peer)
            .field("hosts_server", &self.hosts_server())
            .finish_non_exhaustive()
    }
}

/// The address to dial for a server bound to `local`: a wildcard bind is reached
/// through loopback of the same family.
fn connectable(local: SocketAddr) -> SocketAddr {
    match local.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), local.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), local.port()),
        _ => local,
    }
}

fn connect_retry(addr: &str, timeout: Duration) -> Result<(TcpStream, SocketAddr)> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(10);
    let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
    loop {
        match addr.to_socket_addrs() {
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(Error::Config(format!("tcp store address `{addr}` is not HOST:PORT: {e}")));
            }
            // Name resolution may fail while the cluster's DNS is still settling: retry.
            Err(e) => last = e,
            Ok(addrs) => {
                for sa in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let attempt = left.clamp(Duration::from_millis(1), Duration::from_secs(5));
                    match TcpStream::connect_timeout(&sa, attempt) {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            tracing::debug!(addr, %sa, "connected to the tcp store");
                            return Ok((s, sa));
                        }
                        Err(e) => last = e,
                    }
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::io(format!("connecting to the tcp store at {addr} (gave up after {timeout:?})"), last));
        }
        std::thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}

fn roundtrip(stream: &TcpStream, msg: &[u8], deadline: Duration) -> io::Result<(u8, Vec<u8>)> {
    let timed_out = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            io::Error::new(io::ErrorKind::TimedOut, format!("no reply within {deadline:?}"))
        }
        _ => e,
    };
    stream.set_write_timeout(Some(deadline))?;
    stream.set_read_timeout(Some(deadline))?;
    let mut s = stream;
    s.write_all(msg).map_err(timed_out)?;
    let status = read_array::<1>(&mut s).map_err(timed_out)?[0];
    let body = read_bytes(&mut s, MAX_VALUE.max(MAX_MESSAGE), "reply").map_err(timed_out)?;
    Ok((status, body))
}

fn check_key(key: &str) -> Result<()> {
    if key.len() > MAX_KEY {
        let head: String = key.chars().take(64).collect();
        return Err(Error::Store(format!(
            "key `{head}...` is {} bytes, over the tcp store limit of {MAX_KEY}",
            key.len()
        )));
    }
    Ok(())
}

fn key_msg(op: u8, key: &str, extra: usize) -> Result<Vec<u8>> {
    check_key(key)?;
    let mut msg = Vec::with_capacity(5 + key.len() + extra);
    msg.push(op);
    put_bytes(&mut msg, key.as_bytes());
    Ok(msg)
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        if value.len() > MAX_VALUE {
            return Err(
                self.error(&format!("set `{key}`"), format!("value of {} bytes exceeds {MAX_VALUE}", value.len()))
            );
        }
        let mut msg = key_msg(OP_SET, key, 4 + value.len())?;
        put_bytes(&mut msg, value);
        let what = format!("set `{key}`");
        match self.request(&what, &msg, IO_TIMEOUT)? {
            (ST_OK, _) => Ok(()),
            (st, body) => Err(self.error(&what, unexpected(st, &body))),
        }
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let what = format!("get `{key}`");
        match self.request(&what, &key_msg(OP_GET, key, 0)?, IO_TIMEOUT)? {
            (ST_OK, body) => Ok(Some(body)),
            (ST_ABSENT, _) => Ok(None),
            (st, body) => Err(self.error(&what, unexpected(st, &body))),
        }
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        if keys.len() > MAX_WAIT_KEYS {
            return Err(self.error("wait", format!("{} keys exceed the limit of {MAX_WAIT_KEYS}", keys.len())));
        }
        let mut msg = vec![OP_WAIT];
        msg.extend_from_slice(&(keys.len() as u32).to_le_bytes());
        for key in keys {
            check_key(key)?;
            put_bytes(&mut msg, key.as_bytes());
        }
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        msg.extend_from_slice(&millis.to_le_bytes());
        let deadline = timeout.saturating_add(WAIT_SLACK);
        match self.request("wait", &msg, deadline)? {
            (ST_OK, _) => Ok(()),
            (ST_TIMEOUT, body) => {
                Err(Error::Store(format!("tcp store {}: {}", self.addr, String::from_utf8_lossy(&body))))
            }
            (st, body) => Err(self.error(&format!("wait for {keys:?}"), unexpected(st, &body))),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut msg = key_msg(OP_ADD, key, 8)?;
        msg.extend_from_slice(&delta.to_le_bytes());
        let what = format!("add `{key}`");
        match self.request(&what, &msg, IO_TIMEOUT)? {
            (ST_OK, body) => match <[u8; 8]>::try_from(body.as_slice()) {
                Ok(b) => Ok(i64::from_le_bytes(b)),
                Err(_) => Err(self.error(&what, format!("malformed reply of {} bytes", body.len()))),
            },
            (st, body) => Err(self.error(&what, unexpected(st, &body))),
        }
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let what = format!("delete `{key}`");
        match self.request(&what, &key_msg(OP_DELETE, key, 0)?, IO_TIMEOUT)? {
            (ST_OK, body) if body.len() == 1 => Ok(body[0] != 0),
            (st, body) => Err(self.error(&what, unexpected(st, &body))),
        }
    }
}

impl TcpStore {
    /// Round-trip a no-op request: checks that the server is alive and answering.
    pub fn ping(&self) -> Result<()> {
        match self.request("ping", &[OP_PING], IO_TIMEOUT)? {
            (ST_OK, _) => Ok(()),
            (st, body) => Err(self.error("ping", unexpected(st, &body))),
        }
    }
}

fn unexpected(status: u8, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_MESSAGE)]);
    match status {
        ST_ERROR => format!("server error: {text}"),
        other => format!("unexpected reply status {other} ({} bytes)", body.len()),
    }
}

#[cfg(test)]
mod tests;
