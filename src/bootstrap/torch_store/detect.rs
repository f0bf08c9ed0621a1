//! Which store serves an address.
//!
//! Under torchrun, or after `init_process_group`, torch's TCPStore already
//! listens on `MASTER_PORT`. braid's own server speaks first (its "BRAIDKVS"
//! greeting, see `tcp_store`); torch's says nothing until the client does. So a
//! `tcp://` address is told apart on connect: a greeting within
//! [`SPEAK_FIRST`] is braid's; silence gets torch's VALIDATE and PING, whose echo
//! is torch's. A braid server slower than that window still gives itself away,
//! since its greeting then arrives where the echo should.

use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{connect_until, greet, Answer, TorchStore, STORE_FIX};
use crate::auth::JobKey;
use crate::bootstrap::store::Store;
use crate::bootstrap::tcp_store::TcpStore;
use crate::error::{Error, Result};

/// How long a new connection waits for braid's greeting before asking whether
/// the server is torch's.
pub(crate) const SPEAK_FIRST: Duration = Duration::from_millis(250);
/// Longest wait for an answer that tells the two stores apart.
const IDENTIFY: Duration = Duration::from_secs(10);
/// Longest connect of rank 0's look for a server before it hosts one.
const HOST_PROBE: Duration = Duration::from_secs(2);

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
