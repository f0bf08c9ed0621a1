//! The TCP store's wire format (see the module docs of `tcp_store`) and the
//! helpers both ends use to read and write it.

use std::io::{self, Read};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::auth::{Challenge, JobKey, Role, CHALLENGE_LEN, PROOF_LEN};

pub(super) const MAX_KEY: usize = 4 << 10;
pub(super) const MAX_VALUE: usize = 64 << 20;
pub(super) const MAX_WAIT_KEYS: usize = 1 << 16;
/// Most key bytes one WAIT may name in all (its keys are held while it waits).
pub(super) const MAX_WAIT_BYTES: usize = 16 << 20;
/// Error messages (e.g. a long list of missing keys) are cut to this size on the wire.
pub(super) const MAX_MESSAGE: usize = 16 << 10;
/// The server's cap on writing one reply to a client that stopped reading.
pub(super) const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// First bytes of the server's and the client's hello.
pub(super) const STORE_MAGIC: [u8; 8] = *b"BRAIDKVS";
/// Version of the store protocol; bump on any wire change.
pub(super) const STORE_VERSION: u32 = 1;
/// Server hello: magic, version, server challenge.
pub(super) const SERVER_HELLO_LEN: usize = 12 + CHALLENGE_LEN;
/// Client hello: magic, version, client challenge, client proof.
pub(super) const CLIENT_HELLO_LEN: usize = 12 + CHALLENGE_LEN + PROOF_LEN;
/// What both proofs of a store connection are bound to.
const STORE_CONTEXT: &[u8] = b"braid-tcp-store";
/// Part of every error for a failed job-key proof.
pub(super) const KEY_NOT_PROVEN: &str = "did not prove the job key";

pub(super) const OP_SET: u8 = 1;
pub(super) const OP_GET: u8 = 2;
pub(super) const OP_ADD: u8 = 3;
pub(super) const OP_DELETE: u8 = 4;
pub(super) const OP_WAIT: u8 = 5;
pub(super) const OP_PING: u8 = 6;
/// Set a key only if it is absent; the reply holds the key's value afterwards.
pub(super) const OP_SET_IF_ABSENT: u8 = 7;

pub(super) const ST_OK: u8 = 0;
pub(super) const ST_ABSENT: u8 = 1;
pub(super) const ST_TIMEOUT: u8 = 2;
pub(super) const ST_ERROR: u8 = 3;

fn prefix(b: &mut [u8]) {
    b[..8].copy_from_slice(&STORE_MAGIC);
    b[8..12].copy_from_slice(&STORE_VERSION.to_le_bytes());
}

pub(super) fn check_prefix(b: &[u8], what: &str) -> Result<(), String> {
    if b.len() < 12 || b[..8] != STORE_MAGIC {
        return Err(format!("{what}: not a braid tcp store peer (bad magic)"));
    }
    let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if version != STORE_VERSION {
        return Err(format!("{what}: store protocol version {version} (this build speaks {STORE_VERSION})"));
    }
    Ok(())
}

fn challenge_at(b: &[u8], at: usize) -> Challenge {
    let mut c = [0u8; CHALLENGE_LEN];
    c.copy_from_slice(&b[at..at + CHALLENGE_LEN]);
    c
}

pub(super) fn encode_server_hello(server: &Challenge) -> [u8; SERVER_HELLO_LEN] {
    let mut b = [0u8; SERVER_HELLO_LEN];
    prefix(&mut b);
    b[12..].copy_from_slice(server);
    b
}

/// The server's challenge.
pub(super) fn decode_server_hello(b: &[u8]) -> Result<Challenge, String> {
    if b.len() != SERVER_HELLO_LEN {
        return Err(format!("server hello of {} bytes, expected {SERVER_HELLO_LEN}", b.len()));
    }
    check_prefix(b, "server hello")?;
    Ok(challenge_at(b, 12))
}

/// The client's hello: its challenge and its answer to the server's.
pub(super) fn encode_client_hello(key: &JobKey, client: &Challenge, server: &Challenge) -> [u8; CLIENT_HELLO_LEN] {
    let mut b = [0u8; CLIENT_HELLO_LEN];
    prefix(&mut b);
    b[12..12 + CHALLENGE_LEN].copy_from_slice(client);
    b[12 + CHALLENGE_LEN..].copy_from_slice(&key.prove(Role::Initiator, STORE_CONTEXT, client, server));
    b
}

/// The client's challenge, once its proof of the key checks out against our `server` challenge.
pub(super) fn decode_client_hello(b: &[u8], key: &JobKey, server: &Challenge) -> Result<Challenge, String> {
    if b.len() != CLIENT_HELLO_LEN {
        return Err(format!("client hello of {} bytes, expected {CLIENT_HELLO_LEN}", b.len()));
    }
    check_prefix(b, "client hello")?;
    let client = challenge_at(b, 12);
    if !key.verify(Role::Initiator, STORE_CONTEXT, server, &client, &b[12 + CHALLENGE_LEN..]) {
        return Err(format!("the client {KEY_NOT_PROVEN}"));
    }
    Ok(client)
}

pub(super) fn server_proof(key: &JobKey, server: &Challenge, client: &Challenge) -> [u8; PROOF_LEN] {
    key.prove(Role::Responder, STORE_CONTEXT, server, client)
}

pub(super) fn verify_server_proof(key: &JobKey, client: &Challenge, server: &Challenge, proof: &[u8]) -> bool {
    key.verify(Role::Responder, STORE_CONTEXT, client, server, proof)
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking thread must not wedge the store: every guarded value stays valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

pub(super) fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    buf.extend_from_slice(bytes);
}

pub(super) fn read_array<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// A length-prefixed byte string of at most `max` bytes. Memory grows with the bytes
/// that actually arrive, so a lying length prefix cannot make us allocate `max`.
pub(super) fn read_bytes(r: &mut impl Read, max: usize, what: &str) -> io::Result<Vec<u8>> {
    let len = u32::from_le_bytes(read_array(r)?) as usize;
    if len > max {
        return Err(invalid(format!("{what} length {len} exceeds the limit of {max} bytes")));
    }
    let mut buf = Vec::with_capacity(len.min(64 << 10));
    r.take(len as u64).read_to_end(&mut buf)?;
    if buf.len() < len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{what} cut short")));
    }
    Ok(buf)
}

pub(super) fn read_key(r: &mut impl Read) -> io::Result<String> {
    String::from_utf8(read_bytes(r, MAX_KEY, "key")?).map_err(|_| invalid("key is not UTF-8".into()))
}

pub(super) enum Request {
    Set(String, Vec<u8>),
    Get(String),
    Add(String, i64),
    Delete(String),
    Wait(Vec<String>, Duration),
    Ping,
    SetIfAbsent(String, Vec<u8>),
}

/// The next request, or None when the peer closed the connection between requests.
/// (The server reads the opcode and the body apart, under different deadlines.)
#[cfg(test)]
pub(super) fn read_request(r: &mut impl Read) -> io::Result<Option<Request>> {
    match read_op(r)? {
        None => Ok(None),
        Some(op) => read_body(op, r).map(Some),
    }
}

/// The opcode that starts the next request, or None when the peer closed the
/// connection between requests.
pub(super) fn read_op(r: &mut impl Read) -> io::Result<Option<u8>> {
    let mut op = [0u8; 1];
    loop {
        match r.read(&mut op) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(op[0])),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The rest of a request that started with `op`. Memory grows with the bytes
/// that arrive (plus at most one 64 KiB chunk and one key), whatever the
/// lengths the peer claims.
pub(super) fn read_body(op: u8, r: &mut impl Read) -> io::Result<Request> {
    Ok(match op {
        OP_SET => Request::Set(read_key(r)?, read_bytes(r, MAX_VALUE, "value")?),
        OP_GET => Request::Get(read_key(r)?),
        OP_ADD => Request::Add(read_key(r)?, i64::from_le_bytes(read_array(r)?)),
        OP_DELETE => Request::Delete(read_key(r)?),
        OP_WAIT => {
            let n = u32::from_le_bytes(read_array(r)?) as usize;
            if n > MAX_WAIT_KEYS {
                return Err(invalid(format!("WAIT for {n} keys exceeds the limit of {MAX_WAIT_KEYS}")));
            }
            // Grown as keys arrive: a claimed count reserves nothing.
            let mut keys = Vec::new();
            let mut bytes = 0usize;
            for _ in 0..n {
                let key = read_key(r)?;
                bytes += key.len();
                if bytes > MAX_WAIT_BYTES {
                    return Err(invalid(format!("WAIT names over {MAX_WAIT_BYTES} bytes of keys")));
                }
                keys.push(key);
            }
            Request::Wait(keys, Duration::from_millis(u64::from_le_bytes(read_array(r)?)))
        }
        OP_PING => Request::Ping,
        OP_SET_IF_ABSENT => Request::SetIfAbsent(read_key(r)?, read_bytes(r, MAX_VALUE, "value")?),
        other => return Err(invalid(format!("unknown opcode {other:#04x}"))),
    })
}
