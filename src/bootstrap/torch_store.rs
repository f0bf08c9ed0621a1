//! A client of torch's c10d TCPStore, so braid meets where torch already does:
//! torchrun's agent store, or the store `init_process_group` started.
//!
//! Reached through `torch://HOST:PORT[?prefix=P]` (keys are then stored under `P/`),
//! through torchrun's variables (every rank, rank 0 included, is a client of
//! the agent's store at `MASTER_ADDR:MASTER_PORT`, keyed under the run id and
//! restart count: [`torchrun_store_url`]), and whenever a `tcp://` address turns
//! out to be served by torch ([`detect`]).
//!
//! Every connection starts with torch's VALIDATE and a PING whose random nonce
//! must come back: a server that does not echo it is refused, naming
//! `BRAID_STORE` as the fix. Every read has a deadline; lengths from the server are
//! bounded ([`wire`]). Like [`crate::bootstrap::TcpStore`], each call borrows a
//! connection from a small pool, so a WAIT blocked in one thread (torch answers a
//! WAIT only once its keys are set) never holds up calls in others.
//!
//! torch's protocol carries no job key: anyone who reaches the port can read and
//! write the store, as for torch itself. The job key still guards every link.

pub(crate) mod detect;
#[doc(hidden)]
pub mod mock;
mod torchrun;
mod wire;

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bootstrap::prefix_store::PrefixStore;
use crate::bootstrap::store::Store;
use crate::error::{Error, Result};

pub use torchrun::torchrun_store_url;

/// Connections a client keeps open between calls.
const MAX_IDLE_CONNS: usize = 2;
/// CHECKs sent in one write when naming the keys a timed-out WAIT still misses
/// (each answer is one byte, so a batch never fills the socket's buffers).
const CHECK_BATCH: usize = 256;
/// The fix named when a server is not the store it was taken for.
pub(crate) const STORE_FIX: &str = "set BRAID_STORE to the store's URL: tcp://HOST:PORT for braid's own store \
     (which rank 0 hosts), torch://HOST:PORT for torch's TCPStore";

/// A client of torch's TCPStore; `Send + Sync`, share it in an `Arc`.
pub struct TorchStore {
    /// The address as the caller gave it, for error messages.
    addr: String,
    /// The resolved address that answered; new pool connections go there.
    peer: SocketAddr,
    /// Deadline of a connect, a handshake and every round trip but a WAIT's.
    timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
}

/// What a server answered to torch's VALIDATE and PING.
pub(crate) enum Answer {
    /// The nonce came back: torch's TCPStore.
    Torch,
    /// braid's store greeting: its server speaks first.
    Braid,
    /// Four other bytes.
    Other([u8; 4]),
}

impl TorchStore {
    /// Connect to torch's store at `addr` ("HOST:PORT"), retrying while the name
    /// does not resolve or nothing listens yet, and check that it answers torch's
    /// ping; fails once `timeout` passes. `timeout` also bounds every later round
    /// trip but a WAIT's, which has its own.
    pub fn connect(addr: &str, timeout: Duration) -> Result<TorchStore> {
        let timeout = timeout.max(Duration::from_millis(1));
        let deadline = Instant::now() + timeout;
        let (stream, peer) = connect_until(addr, deadline, true)?.ok_or_else(|| {
            Error::Store(format!(
                "torch store {addr}: nothing accepted a connection within {timeout:?} (is torchrun's agent, or \
                 the process that called init_process_group, running? otherwise {STORE_FIX})"
            ))
        })?;
        let store = TorchStore::adopt(addr, peer, timeout);
        store.greet(&stream, Instant::now() + timeout)?;
        store.idle.lock().unwrap_or_else(|e| e.into_inner()).push(stream);
        Ok(store)
    }

    /// A client of the store at `peer` whose pool starts with `stream`, already
    /// past its greeting.
    fn adopt(addr: &str, peer: SocketAddr, timeout: Duration) -> TorchStore {
        TorchStore { addr: addr.to_owned(), peer, timeout, idle: Mutex::new(Vec::new()) }
    }

    /// The server address as given to `connect`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Round-trip a PING: checks that the server is alive and answering.
    pub fn ping(&self) -> Result<()> {
        self.call("ping", |s, deadline| {
            let nonce = nonce();
            wire::write_by(s, &wire::ping(nonce).0, deadline)?;
            expect_echo(s, nonce, deadline)
        })
    }

    fn error(&self, what: &str, msg: impl std::fmt::Display) -> Error {
        Error::Store(format!("torch store {}: {what}: {msg}", self.addr))
    }

    /// VALIDATE and PING a new connection; refuse a server that does not echo.
    fn greet(&self, stream: &TcpStream, deadline: Instant) -> Result<()> {
        let fail = |msg: String| self.error("connect", format!("{msg}; {STORE_FIX}"));
        match greet(stream, deadline) {
            Ok(Answer::Torch) => Ok(()),
            Ok(Answer::Braid) => Err(fail("the server is braid's own store, not torch's".into())),
            Ok(Answer::Other(b)) => Err(fail(format!("the server answered torch's ping with {b:02x?}, not its nonce"))),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(fail(format!(
                "the server did not answer torch's ping within {:?} (is it torch's TCPStore?)",
                self.timeout
            ))),
            Err(e) => Err(fail(format!("torch's ping failed: {e}"))),
        }
    }

    /// Run `f` on a pooled connection (or a new one), with the client's deadline
    /// for the round trip; a connection whose call failed is dropped, since its
    /// framing is then unknown.
    fn call<T>(&self, what: &str, f: impl FnOnce(&TcpStream, Instant) -> io::Result<T>) -> Result<T> {
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let stream = match pooled {
            Some(s) => s,
            None => {
                let s = TcpStream::connect_timeout(&self.peer, self.timeout)
                    .map_err(|e| self.error(what, format!("connecting to {}: {e}", self.peer)))?;
                let _ = s.set_nodelay(true);
                self.greet(&s, Instant::now() + self.timeout)?;
                s
            }
        };
        let result = f(&stream, Instant::now() + self.timeout).map_err(|e| match e.kind() {
            io::ErrorKind::TimedOut => self.error(what, format!("no reply within {:?}", self.timeout)),
            _ => self.error(what, e),
        })?;
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_CONNS {
            idle.push(stream);
        }
        Ok(result)
    }

    /// Which of `keys` are not set, asked one CHECK per key, pipelined in batches.
    fn missing<'k>(&self, keys: &[&'k str]) -> Result<Vec<&'k str>> {
        self.call("check", |s, deadline| {
            let mut missing = Vec::new();
            for batch in keys.chunks(CHECK_BATCH) {
                let msg: Vec<u8> = batch.iter().flat_map(|k| wire::keys(wire::OP_CHECK, &[k]).0).collect();
                wire::write_by(s, &msg, deadline)?;
                for key in batch {
                    if !check_reply(wire::read_u8(s, deadline)?)? {
                        missing.push(*key);
                    }
                }
            }
            Ok(missing)
        })
    }
}

impl std::fmt::Debug for TorchStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchStore").field("addr", &self.addr).field("peer", &self.peer).finish_non_exhaustive()
    }
}

/// Connect to `addr` ("HOST:PORT") by `deadline`: with `retry`, again with backoff
/// while the name does not resolve or nothing accepts; without, one try of each
/// address. None when nothing accepted; a configuration error when `addr` is not
/// HOST:PORT.
fn connect_until(addr: &str, deadline: Instant, retry: bool) -> Result<Option<(TcpStream, SocketAddr)>> {
    let mut backoff = Duration::from_millis(10);
    loop {
        match addr.to_socket_addrs() {
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(Error::Config(format!("store address `{addr}` is not HOST:PORT: {e}")));
            }
            Err(e) => tracing::debug!(addr, "store address does not resolve yet: {e}"),
            Ok(addrs) => {
                for sa in addrs {
                    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                    if let Ok(s) = TcpStream::connect_timeout(&sa, left.min(Duration::from_secs(5))) {
                        let _ = s.set_nodelay(true);
                        return Ok(Some((s, sa)));
                    }
                }
            }
        }
        let now = Instant::now();
        if !retry || now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}

/// A random ping nonce, never the first bytes of braid's greeting (so a braid
/// server's greeting is never taken for an echo).
fn nonce() -> u32 {
    let braid = u32::from_le_bytes([b'B', b'R', b'A', b'I']);
    loop {
        let n = u32::from_le_bytes(crate::auth::random_bytes::<4>());
        if n != braid {
            return n;
        }
    }
}

/// Send VALIDATE and PING on a new connection and say what answered.
pub(crate) fn greet(stream: &TcpStream, deadline: Instant) -> io::Result<Answer> {
    let nonce = nonce();
    wire::write_by(stream, &wire::validate().then(wire::ping(nonce)).0, deadline)?;
    let mut echo = [0u8; 4];
    wire::read_by(stream, &mut echo, deadline)?;
    Ok(if u32::from_le_bytes(echo) == nonce {
        Answer::Torch
    } else if echo == wire::BRAID_HELLO_HEAD[..4] {
        Answer::Braid
    } else {
        Answer::Other(echo)
    })
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn expect_echo(s: &TcpStream, nonce: u32, deadline: Instant) -> io::Result<()> {
    match wire::read_u32(s, deadline)? {
        n if n == nonce => Ok(()),
        n => Err(invalid(format!("the ping's echo is {n:#010x}, not its nonce {nonce:#010x}"))),
    }
}

fn check_reply(b: u8) -> io::Result<bool> {
    match b {
        wire::CHECK_READY => Ok(true),
        wire::CHECK_NOT_READY => Ok(false),
        other => Err(invalid(format!("CHECK answered {other}, not READY (0) or NOT_READY (1)"))),
    }
}

fn check_key(key: &str) -> Result<()> {
    if key.len() > wire::MAX_KEY {
        let head: String = key.chars().take(64).collect();
        return Err(Error::Store(format!(
            "key `{head}...` is {} bytes, over the torch store client's limit of {}",
            key.len(),
            wire::MAX_KEY
        )));
    }
    Ok(())
}

/// How a WAIT ended.
enum Waited {
    AllSet,
    TimedOut,
}

impl Store for TorchStore {
    /// The local address of the route to torch's server: TCP links listen there by
    /// default (under torchrun every rank reaches the agent's store, so its peers
    /// reach that address too).
    fn route_source(&self) -> Option<std::net::IpAddr> {
        crate::bootstrap::tcp_store::route_source(&[self.peer])
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        if value.len() > wire::MAX_VALUE {
            return Err(self.error(
                &format!("set `{key}`"),
                format!("value of {} bytes exceeds {}", value.len(), wire::MAX_VALUE),
            ));
        }
        self.call(&format!("set `{key}`"), |s, deadline| {
            // torch does not answer SET: the echo of the PING behind it says it was applied.
            let nonce = nonce();
            wire::write_by(s, &wire::set(key, value).then(wire::ping(nonce)).0, deadline)?;
            expect_echo(s, nonce, deadline)
        })
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        self.call(&format!("get `{key}`"), |s, deadline| {
            wire::write_by(s, &wire::keys(wire::OP_CHECK, &[key]).0, deadline)?;
            if !check_reply(wire::read_u8(s, deadline)?)? {
                return Ok(None);
            }
            wire::write_by(s, &wire::get(key).0, deadline)?;
            wire::read_value(s, deadline).map(Some)
        })
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        if keys.len() > wire::MAX_WAIT_KEYS {
            return Err(self.error("wait", format!("{} keys exceed the limit of {}", keys.len(), wire::MAX_WAIT_KEYS)));
        }
        for key in keys {
            check_key(key)?;
        }
        let until = Instant::now() + timeout.max(Duration::from_millis(1));
        let waited = self.call("wait", |s, deadline| {
            // The request gets the client's deadline even when the wait's own is
            // (nearly) over: keys already set then come back through the cancel.
            wire::write_by(s, &wire::keys(wire::OP_WAIT, keys).0, deadline)?;
            match wire::read_u8(s, until) {
                Ok(wire::WAIT_STOP_WAITING) => return Ok(Waited::AllSet),
                Ok(other) => return Err(invalid(format!("WAIT answered {other}, not STOP_WAITING (0)"))),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e),
            }
            // Cancel, then the server owes one WAIT_CANCELED, after a STOP_WAITING
            // when the keys came just before the cancel did.
            let deadline = Instant::now() + self.timeout;
            wire::write_by(s, &wire::cancel_wait().0, deadline)?;
            match wire::read_u8(s, deadline)? {
                wire::WAIT_CANCELED => Ok(Waited::TimedOut),
                wire::WAIT_STOP_WAITING => match wire::read_u8(s, deadline)? {
                    wire::WAIT_CANCELED => Ok(Waited::AllSet),
                    other => Err(invalid(format!("CANCEL_WAIT answered {other}, not WAIT_CANCELED (1)"))),
                },
                other => Err(invalid(format!("CANCEL_WAIT answered {other}, not WAIT_CANCELED (1)"))),
            }
        })?;
        match waited {
            Waited::AllSet => Ok(()),
            Waited::TimedOut => {
                let missing = self.missing(keys)?;
                if missing.is_empty() {
                    // Set between the cancel and the checks: the wait is over.
                    return Ok(());
                }
                Err(Error::Store(format!(
                    "torch store {}: timed out after {timeout:?} waiting for keys {missing:?}",
                    self.addr
                )))
            }
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        check_key(key)?;
        self.call(&format!("add `{key}`"), |s, deadline| {
            wire::write_by(s, &wire::add(key, delta).0, deadline)?;
            wire::read_i64(s, deadline)
        })
    }

    fn delete(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        self.call(&format!("delete `{key}`"), |s, deadline| {
            wire::write_by(s, &wire::delete(key).0, deadline)?;
            match wire::read_i64(s, deadline)? {
                0 => Ok(false),
                1 => Ok(true),
                n => Err(invalid(format!("DELETE of one key answered {n} keys deleted"))),
            }
        })
    }
}

/// Open `torch://HOST:PORT[?prefix=P]` (`rest` is what follows the scheme): a
/// [`TorchStore`], under a [`PrefixStore`] of `P` when given (taken literally).
pub(crate) fn open_url(rest: &str, timeout: Duration) -> Result<Arc<dyn Store>> {
    let (addr, query) = rest.split_once('?').unwrap_or((rest, ""));
    let addr = addr.trim_end_matches('/');
    let mut prefix = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("prefix", p)) if !p.is_empty() => prefix = Some(p.to_owned()),
            _ => {
                return Err(Error::Config(format!(
                    "store URL `torch://{rest}`: unknown parameter `{pair}` (torch://HOST:PORT takes only ?prefix=P)"
                )))
            }
        }
    }
    let port_ok = addr.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if !port_ok {
        return Err(Error::Config(format!("store URL `torch://{rest}` is not torch://HOST:PORT[?prefix=P]")));
    }
    let store: Arc<dyn Store> = Arc::new(TorchStore::connect(addr, timeout)?);
    tracing::info!(addr, prefix = prefix.as_deref().unwrap_or(""), "joined torch's TCPStore as a client");
    Ok(match prefix {
        Some(p) => Arc::new(PrefixStore::new(p, store)),
        None => store,
    })
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod transcript;
