//! torch's c10d TCPStore wire format, as torch 2.15's client and both of its servers
//! (libuv and the older poll loop) speak it; the byte transcripts in
//! `transcript.rs` pin every request and reply used here.
//!
//! Every integer is little-endian (torch writes its host's native order, and
//! nothing else runs torch). A request is `op:u8` and a body; a string or byte
//! value is `len:u64` and its bytes; a list is `count:u64` and its items:
//!
//! ```text
//! VALIDATE 0  magic:u32 = 0x3C85F7CE           no reply
//! SET      1  key value                         no reply
//! GET      3  key                               value
//! ADD      4  key delta:i64                     i64 (the new value; stored as decimal text)
//! CHECK    5  count key*count                   u8: 0 READY, 1 NOT_READY
//! WAIT     6  count key*count                   u8: 0 STOP_WAITING (all set)
//! DELETE   8  key                               i64: keys deleted (0 or 1)
//! CANCEL  12                                    u8: 1 WAIT_CANCELED (after a pending
//!                                                 STOP_WAITING, if the wait ended first)
//! PING    13  nonce:u32                         nonce:u32
//! ```
//!
//! The server never speaks first. It does not answer SET, so a SET is followed by a
//! PING in the same write and its echo proves the SET was applied. GET of an
//! absent key is undefined (libuv answers an empty value, the older server closes
//! the connection), so GET is only sent after CHECK says the key is there.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

pub(super) const OP_VALIDATE: u8 = 0;
pub(super) const OP_SET: u8 = 1;
pub(super) const OP_GET: u8 = 3;
pub(super) const OP_ADD: u8 = 4;
pub(super) const OP_CHECK: u8 = 5;
pub(super) const OP_WAIT: u8 = 6;
pub(super) const OP_DELETE: u8 = 8;
pub(super) const OP_CANCEL_WAIT: u8 = 12;
pub(super) const OP_PING: u8 = 13;

/// What VALIDATE carries; a server checks it before serving the connection.
pub(super) const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;

pub(super) const CHECK_READY: u8 = 0;
pub(super) const CHECK_NOT_READY: u8 = 1;
pub(super) const WAIT_STOP_WAITING: u8 = 0;
pub(super) const WAIT_CANCELED: u8 = 1;

/// Longest key this client sends (torch has no limit; braid's keys are short).
pub(super) const MAX_KEY: usize = 4 << 10;
/// Longest value this client sends or accepts from the server.
pub(super) const MAX_VALUE: usize = 64 << 20;
/// Most keys one WAIT names.
pub(super) const MAX_WAIT_KEYS: usize = 1 << 16;

/// The first bytes braid's own store server sends on every connection.
pub(super) const BRAID_HELLO_HEAD: &[u8; 8] = b"BRAIDKVS";

/// A request under construction.
pub(super) struct Request(pub(super) Vec<u8>);

impl Request {
    pub(super) fn new(op: u8) -> Request {
        Request(vec![op])
    }
    pub(super) fn bytes(mut self, b: &[u8]) -> Request {
        self.0.extend_from_slice(&(b.len() as u64).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }
    pub(super) fn u64(mut self, v: u64) -> Request {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn i64(mut self, v: i64) -> Request {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn u32(mut self, v: u32) -> Request {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Another request sent in the same write.
    pub(super) fn then(mut self, next: Request) -> Request {
        self.0.extend_from_slice(&next.0);
        self
    }
}

pub(super) fn validate() -> Request {
    Request::new(OP_VALIDATE).u32(VALIDATE_MAGIC)
}
pub(super) fn ping(nonce: u32) -> Request {
    Request::new(OP_PING).u32(nonce)
}
pub(super) fn set(key: &str, value: &[u8]) -> Request {
    Request::new(OP_SET).bytes(key.as_bytes()).bytes(value)
}
pub(super) fn get(key: &str) -> Request {
    Request::new(OP_GET).bytes(key.as_bytes())
}
pub(super) fn add(key: &str, delta: i64) -> Request {
    Request::new(OP_ADD).bytes(key.as_bytes()).i64(delta)
}
pub(super) fn delete(key: &str) -> Request {
    Request::new(OP_DELETE).bytes(key.as_bytes())
}
/// CHECK and WAIT share their body: a list of keys.
pub(super) fn keys(op: u8, keys: &[&str]) -> Request {
    keys.iter().fold(Request::new(op).u64(keys.len() as u64), |r, k| r.bytes(k.as_bytes()))
}
pub(super) fn cancel_wait() -> Request {
    Request::new(OP_CANCEL_WAIT)
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no reply before the deadline")
}

/// Write all of `msg` by `deadline`.
pub(super) fn write_by(stream: &TcpStream, msg: &[u8], deadline: Instant) -> io::Result<()> {
    let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or_else(timed_out)?;
    stream.set_write_timeout(Some(left))?;
    (&mut &*stream).write_all(msg).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock => timed_out(),
        _ => e,
    })
}

/// Fill `buf` by `deadline`: the socket's timeout is set to what is left before
/// every read, so a server trickling bytes cannot stretch the wait.
pub(super) fn read_by(stream: &TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or_else(timed_out)?;
        stream.set_read_timeout(Some(left))?;
        match (&mut &*stream).read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the server closed the connection ({filled} of {} reply bytes read)", buf.len()),
                ))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(timed_out())
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) fn read_u8(stream: &TcpStream, deadline: Instant) -> io::Result<u8> {
    let mut b = [0u8; 1];
    read_by(stream, &mut b, deadline)?;
    Ok(b[0])
}

pub(super) fn read_u32(stream: &TcpStream, deadline: Instant) -> io::Result<u32> {
    let mut b = [0u8; 4];
    read_by(stream, &mut b, deadline)?;
    Ok(u32::from_le_bytes(b))
}

pub(super) fn read_i64(stream: &TcpStream, deadline: Instant) -> io::Result<i64> {
    let mut b = [0u8; 8];
    read_by(stream, &mut b, deadline)?;
    Ok(i64::from_le_bytes(b))
}

/// A `len:u64` and that many bytes, refusing a length over [`MAX_VALUE`] before
/// reading any of it; memory grows with the bytes that arrive, not the length claimed.
pub(super) fn read_value(stream: &TcpStream, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    read_by(stream, &mut len, deadline)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_VALUE as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the server announced a value of {len} bytes, over the limit of {MAX_VALUE}"),
        ));
    }
    let len = len as usize;
    let mut value = Vec::new();
    while value.len() < len {
        let at = value.len();
        let step = (len - at).min(1 << 20);
        value.resize(at + step, 0);
        read_by(stream, &mut value[at..], deadline)?;
    }
    Ok(value)
}
