//! A TCP key-value store: one process hosts a [`TcpStoreServer`] and every rank
//! talks to it through a [`TcpStore`] client, as torch's TCPStore does.
//!
//! Every connection starts with a handshake proving the job key
//! ([`crate::auth`]; the key never travels). The server speaks first:
//!
//! ```text
//! server hello  = "BRAIDKVS" version:u32 server-challenge[32]                       44 B
//! client hello  = "BRAIDKVS" version:u32 client-challenge[32] client-proof[32]      76 B
//! server proof  = server-proof[32]                                                  32 B
//! ```
//!
//! The client answers as [`crate::auth::Role::Initiator`], the server as
//! [`crate::auth::Role::Responder`], over the context `braid-tcp-store` and both
//! challenges. A client whose proof fails is closed before any request is read;
//! a server whose proof fails is refused by the client.
//!
//! Then requests, little-endian, one request then one reply per round trip:
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
//! so a waiting rank costs one blocked thread, not a stream of polls. The server
//! bounds what a client can cost it ([`StoreLimits`]): a WAIT names at most
//! 65536 keys (16 MiB of them) and blocks at most an hour by default.
//!
//! Retrying: the server may close a pooled connection that sat idle. A request
//! on a pooled connection is therefore sent once more, on a fresh connection,
//! when its connection shows it was closed before the request could have been
//! served: the write failed (broken pipe, reset), or the reply ended (EOF,
//! reset) before its first byte. That is safe even for ADD, because the server
//! never closes a connection between reading a whole request and writing its
//! reply, except when it stops, and then the fresh connection fails too. A
//! timeout is never retried: the request may be in progress.

mod admit;
mod limits;
pub(crate) mod resolve;
mod server;
mod wire;

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::auth::{self, JobKey, PROOF_LEN};
use crate::bootstrap::store::Store;
use crate::error::{Error, Result};
pub use limits::StoreLimits;
pub(crate) use resolve::route_source;
use resolve::{resolve_within, Hosting};
use server::bind_wildcard;
pub use server::TcpStoreServer;
use wire::*;

/// Added to a WAIT's own timeout for the reply to come back.
const WAIT_SLACK: Duration = Duration::from_secs(10);
/// Connections a client keeps open between calls; each holds a server thread,
/// so the server's cap budgets [`StoreLimits::CONNS_PER_RANK`] per rank.
const MAX_IDLE_CONNS: usize = 2;
// A rank's pool alone must leave room in its share of the cap for calls in flight.
const _: () = assert!(MAX_IDLE_CONNS < StoreLimits::CONNS_PER_RANK);
/// First and longest pause before trying again a server at its connection cap.
const FULL_FIRST_BACKOFF: Duration = Duration::from_millis(10);
const FULL_MAX_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait for the resolver when rank 0 decides whether to host, and when the
/// hosting rank looks up the route to its own address.
const HOSTING_RESOLVE_LIMIT: Duration = Duration::from_secs(5);

/// A client of a [`TcpStoreServer`]; `Send + Sync`, share it in an `Arc`.
///
/// Each call borrows a connection from a small pool (opening one when none is idle),
/// so a `wait` blocked in one thread never holds up other threads' calls. A
/// connection whose request failed is discarded, since its framing is then unknown.
/// Every connection proves the job key first; every round trip (but a WAIT, which
/// gets its own timeout) must finish within the timeout the client was made with.
pub struct TcpStore {
    /// The address as the caller gave it, for error messages.
    addr: String,
    /// The resolved address that answered; new pool connections go there.
    peer: SocketAddr,
    /// This end's address on the first connection (a client's route to the server).
    local: Option<IpAddr>,
    key: JobKey,
    /// Deadline of a connect, a handshake and a round trip (`BRAID_TIMEOUT`).
    timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
    /// Declared last so the client's connections close before the server stops.
    server: Option<TcpStoreServer>,
}

impl TcpStore {
    /// Connect to the server at `addr` ("HOST:PORT"), retrying with backoff while it
    /// is not up yet or at its connection cap, and prove `key`; fails once `timeout`
    /// passes, naming the address, or at once when the server and this client hold
    /// different keys. `timeout` also bounds every later round trip.
    pub fn connect(addr: &str, key: JobKey, timeout: Duration) -> Result<TcpStore> {
        // Zero is not a socket timeout (it means none, or is refused).
        let timeout = timeout.max(Duration::from_millis(1));
        let deadline = Instant::now() + timeout;
        let (stream, peer) = connect_retry(addr, timeout)?;
        let local = stream.local_addr().ok().map(|a| a.ip());
        let store =
            TcpStore { addr: addr.to_owned(), peer, local, key, timeout, idle: Mutex::new(Vec::new()), server: None };
        let stream = match store.handshake(&stream) {
            Ok(()) => stream,
            Err(Handshake::Full) => store.open_until("connect", deadline)?,
            Err(Handshake::Failed(e)) => return Err(e),
        };
        lock(&store.idle).push(stream);
        Ok(store)
    }

    /// When `host_if_absent`, host the server for `addr` in this process if the port
    /// is free here, as torch's TCPStore master does: on the wildcard address
    /// (dual-stack `[::]`, else `0.0.0.0`) at `addr`'s port, whatever `HOST` resolves
    /// to here, so a name that maps to loopback on this host (a hostname on
    /// 127.0.1.1) or that resolves only later (a Kubernetes service) still gives a
    /// server every host reaches. The server then lives as long as the returned
    /// client, serves clients proving `key`, and has room for `world_size` ranks
    /// ([`StoreLimits::for_world`]). It connects as a plain client instead when the
    /// port is taken here, or when `HOST` resolves only to other hosts' addresses
    /// (a server run elsewhere). Otherwise, and without `host_if_absent`, connect.
    pub fn connect_or_host(
        addr: &str,
        host_if_absent: bool,
        world_size: usize,
        key: JobKey,
        timeout: Duration,
    ) -> Result<TcpStore> {
        if host_if_absent {
            let (host, port) = resolve::split_host_port(addr)?;
            match resolve::hosting(addr, host, timeout.min(HOSTING_RESOLVE_LIMIT)) {
                Hosting::Elsewhere(resolved) => {
                    tracing::debug!(addr, ?resolved, "not hosting the tcp store: `{host}` is another host; connecting");
                }
                Hosting::Here(why) => match bind_wildcard(port) {
                    Ok(listener) => {
                        let server = TcpStoreServer::serve(listener, key.clone(), StoreLimits::for_world(world_size))?;
                        let target = connectable(server.local_addr());
                        let mut store = TcpStore::connect(&target.to_string(), key, timeout)?;
                        tracing::info!(addr, local_addr = %server.local_addr(), "hosting the tcp store: {why}");
                        store.addr = addr.to_owned();
                        // Its own connection is over loopback: the route to the store
                        // is looked up when asked for (see `Store::route_source`).
                        store.local = None;
                        store.server = Some(server);
                        return Ok(store);
                    }
                    Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                        tracing::debug!(addr, "not hosting the tcp store: port {port} is taken here ({e}); connecting");
                    }
                    Err(e) => {
                        return Err(Error::io(format!("hosting the tcp store for {addr} on port {port} ({why})"), e))
                    }
                },
            }
        }
        TcpStore::connect(addr, key, timeout)
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

    /// Prove the job key on a new connection and check the server's proof.
    fn handshake(&self, stream: &TcpStream) -> std::result::Result<(), Handshake> {
        let fail = |msg: String| Handshake::Failed(Error::Store(format!("tcp store {}: handshake: {msg}", self.addr)));
        let io_fail = |e: io::Error| fail(timed_out(e, self.timeout).to_string());
        stream.set_write_timeout(Some(self.timeout)).map_err(io_fail)?;
        stream.set_read_timeout(Some(self.timeout)).map_err(io_fail)?;
        let mut s = stream;
        let hello = read_array::<SERVER_HELLO_LEN>(&mut s).map_err(|e| match e.kind() {
            // Closed before its hello: the server is at its connection cap.
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => Handshake::Full,
            _ => io_fail(e),
        })?;
        let server = decode_server_hello(&hello).map_err(fail)?;
        let ours = auth::challenge();
        s.write_all(&encode_client_hello(&self.key, &ours, &server)).map_err(io_fail)?;
        let proof = read_array::<PROOF_LEN>(&mut s).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => fail(
                "the server closed the connection: it refused our proof of the job key \
                 (is BRAID_JOB_KEY the same here as where the store is hosted?)"
                    .into(),
            ),
            _ => io_fail(e),
        })?;
        if !verify_server_proof(&self.key, &ours, &server, &proof) {
            return Err(fail(format!(
                "the server {KEY_NOT_PROVEN} (is BRAID_JOB_KEY the same here as where the store is hosted?)"
            )));
        }
        Ok(())
    }

    /// A new connection to the server, past the handshake.
    fn open(&self, what: &str) -> Result<TcpStream> {
        self.open_until(what, Instant::now() + self.timeout)
    }

    /// A new connection to the server, past the handshake, retried with backoff
    /// while the server is at its connection cap, until `deadline`.
    fn open_until(&self, what: &str, deadline: Instant) -> Result<TcpStream> {
        let mut backoff = FULL_FIRST_BACKOFF;
        let mut tries = 0u32;
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let s = TcpStream::connect_timeout(&self.peer, left.min(self.timeout))
                .map_err(|e| Error::io(format!("tcp store {}: {what}: connecting to {}", self.addr, self.peer), e))?;
            let _ = s.set_nodelay(true);
            tries += 1;
            match self.handshake(&s) {
                Ok(()) => return Ok(s),
                Err(Handshake::Failed(e)) => return Err(e),
                Err(Handshake::Full) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.error(
                    what,
                    format!(
                        "the server at {} stayed at its connection cap: it closed all {tries} connections \
                         before its hello (gave up after {:?})",
                        self.peer, self.timeout
                    ),
                ));
            }
            tracing::debug!(addr = %self.addr, "tcp store: {what}: the server is at its connection cap; retrying");
            std::thread::sleep(backoff.min(deadline - now));
            backoff = (backoff * 2).min(FULL_MAX_BACKOFF);
        }
    }

    /// Send `msg` and read the reply, allowing `deadline` for each socket operation.
    /// A pooled connection that turns out closed before the request could be served
    /// gets one retry on a fresh connection (see the module docs).
    fn request(&self, what: &str, msg: &[u8], deadline: Duration) -> Result<(u8, Vec<u8>)> {
        let pooled = lock(&self.idle).pop();
        let reused = pooled.is_some();
        let stream = match pooled {
            Some(s) => s,
            None => self.open(what)?,
        };
        let (stream, result) = match roundtrip(&stream, msg, deadline) {
            Err(RoundTrip::Unserved(e)) if reused => {
                tracing::debug!(addr = %self.addr, "tcp store: {what}: pooled connection was closed ({e}); retrying once");
                let fresh = self.open(what)?;
                let result = roundtrip(&fresh, msg, deadline);
                (fresh, result)
            }
            result => (stream, result),
        };
        match result {
            Ok(reply) => {
                let mut idle = lock(&self.idle);
                if idle.len() < MAX_IDLE_CONNS {
                    idle.push(stream);
                }
                Ok(reply)
            }
            Err(RoundTrip::Unserved(e) | RoundTrip::Failed(e)) => {
                Err(Error::io(format!("tcp store {}: {what}", self.addr), e))
            }
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

/// Connect to `addr`, retrying name resolution (a name may resolve only once the
/// cluster's DNS knows it) and refused or unanswered connects (the server may not be
/// up yet) with backoff until `timeout`.
fn connect_retry(addr: &str, timeout: Duration) -> Result<(TcpStream, SocketAddr)> {
    let (host, _) = resolve::split_host_port(addr)?;
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(10);
    let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
    let mut resolved_once = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        match resolve_within(addr, left) {
            Err(e) => last = e,
            Ok(addrs) => {
                resolved_once |= !addrs.is_empty();
                for sa in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let attempt = left.clamp(Duration::from_millis(1), Duration::from_secs(5));
                    match TcpStream::connect_timeout(&sa, attempt) {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            let local = s.local_addr().map(|a| a.ip().to_string()).unwrap_or_default();
                            tracing::debug!(addr, %sa, local, "connected to the tcp store");
                            return Ok((s, sa));
                        }
                        Err(e) => last = e,
                    }
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let why = if resolved_once {
                "nothing answered there: is rank 0 (which hosts it) running, and the port open?"
            } else {
                "the name never resolved here: check MASTER_ADDR or BRAID_STORE, and this host's DNS"
            };
            return Err(Error::io(
                format!("connecting to the tcp store at {addr} (host `{host}`; gave up after {timeout:?}: {why})"),
                last,
            ));
        }
        std::thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}

/// How a handshake failed.
enum Handshake {
    /// The server closed the connection before its hello: it is at its connection cap.
    Full,
    /// Anything else, with the error to report.
    Failed(Error),
}

/// How a round trip failed.
enum RoundTrip {
    /// The connection was closed before the request could have been served.
    Unserved(io::Error),
    /// Anything else: the request may or may not have been served.
    Failed(io::Error),
}

fn timed_out(e: io::Error, deadline: Duration) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            io::Error::new(io::ErrorKind::TimedOut, format!("no reply within {deadline:?}"))
        }
        _ => e,
    }
}

fn roundtrip(stream: &TcpStream, msg: &[u8], deadline: Duration) -> std::result::Result<(u8, Vec<u8>), RoundTrip> {
    use io::ErrorKind::*;
    let failed = |e| RoundTrip::Failed(timed_out(e, deadline));
    stream.set_write_timeout(Some(deadline)).map_err(failed)?;
    stream.set_read_timeout(Some(deadline)).map_err(failed)?;
    let mut s = stream;
    // The server closed the connection before reading all of the request: not served.
    s.write_all(msg).map_err(|e| match e.kind() {
        BrokenPipe | ConnectionReset | ConnectionAborted | NotConnected => RoundTrip::Unserved(e),
        _ => failed(e),
    })?;
    // No byte of the reply: the server closed without serving (it never closes
    // between reading a whole request and replying, unless it is stopping).
    let status = read_array::<1>(&mut s).map_err(|e| match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted => RoundTrip::Unserved(e),
        _ => failed(e),
    })?[0];
    let body = read_bytes(&mut s, MAX_VALUE.max(MAX_MESSAGE), "reply").map_err(failed)?;
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
        match self.request(&what, &msg, self.timeout)? {
            (ST_OK, _) => Ok(()),
            (st, body) => Err(self.error(&what, unexpected(st, &body))),
        }
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let what = format!("get `{key}`");
        match self.request(&what, &key_msg(OP_GET, key, 0)?, self.timeout)? {
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
        match self.request(&what, &msg, self.timeout)? {
            (ST_OK, body) => match <[u8; 8]>::try_from(body.as_slice()) {
                Ok(b) => Ok(i64::from_le_bytes(b)),
                Err(_) => Err(self.error(&what, format!("malformed reply of {} bytes", body.len()))),
            },
            (st, body) => Err(self.error(&what, unexpected(st, &body))),
        }
    }

    fn set_if_absent(&self, key: &str, value: &[u8]) -> Result<Vec<u8>> {
        let what = format!("set `{key}` if absent");
        if value.len() > MAX_VALUE {
            return Err(self.error(&what, format!("value of {} bytes exceeds {MAX_VALUE}", value.len())));
        }
        let mut msg = key_msg(OP_SET_IF_ABSENT, key, 4 + value.len())?;
        put_bytes(&mut msg, value);
        match self.request(&what, &msg, self.timeout)? {
            (ST_OK, body) => Ok(body),
            (st, body) => Err(self.error(&what, unexpected(st, &body))),
        }
    }

    /// A client's: the local address of its connection. The hosting rank's own
    /// connection is over loopback, so it looks up the route to the address `HOST`
    /// resolves to now (None when it does not resolve yet).
    fn route_source(&self) -> Option<IpAddr> {
        if self.local.is_some() {
            return self.local;
        }
        let resolved = resolve_within(&self.addr, HOSTING_RESOLVE_LIMIT.min(self.timeout)).ok()?;
        resolve::route_source(&resolved)
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let what = format!("delete `{key}`");
        match self.request(&what, &key_msg(OP_DELETE, key, 0)?, self.timeout)? {
            (ST_OK, body) if body.len() == 1 => Ok(body[0] != 0),
            (st, body) => Err(self.error(&what, unexpected(st, &body))),
        }
    }
}

impl TcpStore {
    /// Round-trip a no-op request: checks that the server is alive and answering.
    pub fn ping(&self) -> Result<()> {
        match self.request("ping", &[OP_PING], self.timeout)? {
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
