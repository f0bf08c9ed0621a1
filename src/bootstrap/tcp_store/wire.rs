//! The TCP store's wire format (see the module docs of `tcp_store`) and the
//! helpers both ends use to read and write it.

use std::io::{self, Read};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

pub(super) const MAX_KEY: usize = 4 << 10;
pub(super) const MAX_VALUE: usize = 64 << 20;
pub(super) const MAX_WAIT_KEYS: usize = 1 << 16;
/// Error messages (e.g. a long list of missing keys) are cut to this size on the wire.
pub(super) const MAX_MESSAGE: usize = 16 << 10;
/// Deadline for a request that does not itself wait on the store.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) const OP_SET: u8 = 1;
pub(super) const OP_GET: u8 = 2;
pub(super) const OP_ADD: u8 = 3;
pub(super) const OP_DELETE: u8 = 4;
pub(super) const OP_WAIT: u8 = 5;
pub(super) const OP_PING: u8 = 6;

pub(super) const ST_OK: u8 = 0;
pub(super) const ST_ABSENT: u8 = 1;
pub(super) const ST_TIMEOUT: u8 = 2;
pub(super) const ST_ERROR: u8 = 3;

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
}

/// The next request, or None when the peer closed the connection between requests.
pub(super) fn read_request(r: &mut impl Read) -> io::Result<Option<Request>> {
    let mut op = [0u8; 1];
    loop {
        match r.read(&mut op) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(Some(match op[0] {
        OP_SET => Request::Set(read_key(r)?, read_bytes(r, MAX_VALUE, "value")?),
        OP_GET => Request::Get(read_key(r)?),
        OP_ADD => Request::Add(read_key(r)?, i64::from_le_bytes(read_array(r)?)),
        OP_DELETE => Request::Delete(read_key(r)?),
        OP_WAIT => {
            let n = u32::from_le_bytes(read_array(r)?) as usize;
            if n > MAX_WAIT_KEYS {
                return Err(invalid(format!("WAIT for {n} keys exceeds the limit of {MAX_WAIT_KEYS}")));
            }
            let keys = (0..n).map(|_| read_key(r)).collect::<io::Result<Vec<_>>>()?;
            Request::Wait(keys, Duration::from_millis(u64::from_le_bytes(read_array(r)?)))
        }
        OP_PING => Request::Ping,
        other => return Err(invalid(format!("unknown opcode {other:#04x}"))),
    }))
}
