//! Which store serves an address, and the store torchrun's variables name.
//!
//! Under torchrun, or after `init_process_group`, torch's TCPStore already
//! listens on `MASTER_PORT`. braid's own server speaks first (its "BRAIDKVS"
//! greeting, see `tcp_store`); torch's says nothing until the client does. So a
//! `tcp://` address is told apart on connect: a greeting within
//! [`SPEAK_FIRST`] is braid's; silence gets torch's VALIDATE and PING, whose echo
//! is torch's. A braid server slower than that window still gives itself away,
//! since its greeting then arrives where the echo should.

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{greet, Answer, TorchStore, STORE_FIX};
use crate::auth::JobKey;
use crate::bootstrap::{Store, TcpStore};
use crate::error::{Error, Result};

/// How long a new connection waits for braid's greeting before asking whether
/// the server is torch's.
pub(crate) const SPEAK_FIRST: Duration = Duration::from_millis(250);
/// Longest wait for an answer that tells the two stores apart.
const IDENTIFY: Duration = Duration::from_secs(10);
/// Longest connect of rank 0's look for a server before it hosts one.
const HOST_PROBE: Duration = Duration::from_secs(2);
/// Longest run id (escaped) in the key prefix.
const MAX_RUN_ID: usize = 1024;

/// Connect to `addr` ("HOST:PORT") by `deadline`: with `retry`, again with backoff
/// while the name does not resolve or nothing accepts; without, one try of each
/// address. None when nothing accepted; a configuration error when `addr` is not
/// HOST:PORT.
pub(super) fn connect_until(addr: &str, deadline: Instant, retry: bool) -> Result<Option<(TcpStream, SocketAddr)>> {
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

/// Who serves an address.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Server {
    Braid,
    Torch,
}

/// Tell braid's store from torch's on a new connection to `addr`; an error names
/// what answered and the fix.
pub(crate) fn identify(stream: &TcpStream, addr: &str, timeout: Duration) -> Result<Server> {
    let answer_by = Instant::now() + timeout.min(IDENTIFY);
    let fail = |msg: String| Error::Store(format!("store {addr}: {msg}; {STORE_FIX}"));
    let mut head = [0u8; 8];
    match super::wire::read_by(stream, &mut head[..1], Instant::now() + timeout.min(SPEAK_FIRST)) {
        Ok(()) => {
            super::wire::read_by(stream, &mut head[1..], answer_by)
                .map_err(|e| fail(format!("the server spoke first, then: {e}")))?;
            if &head == super::wire::BRAID_HELLO_HEAD {
                return Ok(Server::Braid);
            }
            Err(fail(format!(
                "the server spoke first with {head:02x?}: not braid's store greeting, and torch's store never speaks first"
            )))
        }
        // braid's server closes a connection over its cap before greeting;
        // torch's never closes a connection that sent nothing.
        Err(e) if matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset) => {
            Ok(Server::Braid)
        }
        Err(e) if e.kind() == io::ErrorKind::TimedOut => match greet(stream, answer_by) {
            Ok(Answer::Torch) => Ok(Server::Torch),
            Ok(Answer::Braid) => Ok(Server::Braid),
            Ok(Answer::Other(b)) => Err(fail(format!(
                "the server did not greet as braid's store does, and answered torch's ping with {b:02x?}, not its nonce"
            ))),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(fail(format!(
                "the server neither greeted as braid's store does nor answered torch's ping within {:?}",
                timeout.min(IDENTIFY)
            ))),
            Err(e) => {
                Err(fail(format!("the server did not greet as braid's store does, and torch's ping failed: {e}")))
            }
        },
        Err(e) => Err(fail(format!("reading from the server: {e}"))),
    }
}

/// Open a `tcp://` store at `addr`: braid's own (hosted here when
/// `host_if_absent` and nothing listens, see [`TcpStore::connect_or_host`]), or
/// torch's TCPStore when that is what listens there.
pub(crate) fn connect_tcp_url(
    addr: &str,
    host_if_absent: bool,
    world_size: usize,
    key: JobKey,
    timeout: Duration,
) -> Result<Arc<dyn Store>> {
    // Checked before any connection is tried: a rank that is not rank 0 would retry
    // an unusable address until its deadline.
    crate::bootstrap::tcp_store::resolve::split_host_port(addr)?;
    let timeout = timeout.max(Duration::from_millis(1));
    let start = Instant::now();
    let found = if host_if_absent {
        connect_until(addr, start + timeout.min(HOST_PROBE), false)?
    } else {
        connect_until(addr, start + timeout, true)?
    };
    let Some((stream, peer)) = found else {
        if host_if_absent {
            return Ok(Arc::new(TcpStore::connect_or_host(addr, true, world_size, key, timeout)?));
        }
        return Err(Error::Store(format!(
            "store {addr}: nothing accepted a connection within {timeout:?} (is rank 0 running? it hosts the \
             store when nothing listens there)"
        )));
    };
    match identify(&stream, addr, timeout)? {
        Server::Braid => {
            drop(stream);
            Ok(Arc::new(TcpStore::connect_or_host(addr, host_if_absent, world_size, key, timeout)?))
        }
        Server::Torch => {
            tracing::info!(
                addr,
                %peer,
                "the store address is served by torch's TCPStore (torchrun's agent, or init_process_group): \
                 joining it as a client instead of hosting braid's store"
            );
            let store = TorchStore::adopt(addr, peer, timeout);
            store.idle.lock().unwrap_or_else(|e| e.into_inner()).push(stream);
            Ok(Arc::new(store))
        }
    }
}

/// Bytes of a run id kept as they are in the key prefix; others are %-escaped.
fn escape_run_id(id: &str) -> Result<String> {
    let mut out = String::new();
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() > MAX_RUN_ID {
        return Err(Error::Config(format!(
            "torchrun: TORCHELASTIC_RUN_ID is {} bytes escaped, over the {MAX_RUN_ID} braid keys its store \
             under (pass a shorter --rdzv-id, or set BRAID_STORE)",
            out.len()
        )));
    }
    Ok(out)
}

/// The store torchrun's variables name, when `MASTER_ADDR` and `MASTER_PORT` are set:
/// - with `TORCHELASTIC_USE_AGENT_STORE=True` (torchrun's agent hosts torch's
///   TCPStore there, and every rank is its client), `torch://HOST:PORT` with keys
///   under `braid/{TORCHELASTIC_RUN_ID}/{TORCHELASTIC_RESTART_COUNT}`, since the
///   agent's store outlives a failed attempt and a restarted group must not meet
///   the keys of the last one;
/// - otherwise `tcp://HOST:PORT` (rank 0 hosts braid's store unless torch's is
///   already there: [`connect_tcp_url`]).
pub fn torchrun_store_url(get: &impl Fn(&str) -> Option<String>) -> Result<Option<String>> {
    let (Some(host), Some(port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) else {
        return Ok(None);
    };
    let host = host.trim();
    if host.is_empty() {
        return Err(Error::Config("torchrun: MASTER_ADDR is empty (set it, or set BRAID_STORE)".into()));
    }
    let port = port.trim().parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| {
        Error::Config(format!("torchrun: MASTER_PORT=`{port}` is not a port (1-65535; set it, or set BRAID_STORE)"))
    })?;
    // An IPv6 literal needs brackets before its port.
    let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_owned() };
    let agent = get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| {
        let v = v.trim();
        v.eq_ignore_ascii_case("true") || v == "1"
    });
    if !agent {
        let url = format!("tcp://{host}:{port}");
        tracing::debug!(store = url, "torchrun: store from MASTER_ADDR/MASTER_PORT (no agent store)");
        return Ok(Some(url));
    }
    let run = get("TORCHELASTIC_RUN_ID").map(|r| r.trim().to_owned()).filter(|r| !r.is_empty());
    let run = run.unwrap_or_else(|| "none".into());
    let restart = match get("TORCHELASTIC_RESTART_COUNT") {
        None => 0,
        Some(v) => v.trim().parse::<u64>().map_err(|_| {
            Error::Config(format!("torchrun: TORCHELASTIC_RESTART_COUNT=`{v}` is not a non-negative integer"))
        })?,
    };
    let url = format!("torch://{host}:{port}?prefix=braid/{}/{restart}", escape_run_id(&run)?);
    tracing::debug!(
        store = url,
        run_id = run,
        restart,
        "torchrun: TORCHELASTIC_USE_AGENT_STORE=True, so every rank is a client of the agent's torch TCPStore \
         at MASTER_ADDR:MASTER_PORT, keyed by run id and restart count"
    );
    Ok(Some(url))
}
