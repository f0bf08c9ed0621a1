//! A stand-in for torch's TCPStore server, for tests without torch: it answers
//! the requests of [`super::wire`] as torch 2.15's servers do (the transcripts
//! in `transcript.rs` check it byte for byte), and can misbehave on purpose.
//!
//! Where torch's two servers differ it takes the stricter one: a wrong VALIDATE
//! magic, an unknown op or GET of an absent key close the connection.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::wire::*;

/// How the mock misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MockFault {
    /// None: it serves as torch does.
    None,
    /// Accepts connections and never answers.
    Silent,
    /// Answers a PING with bytes other than its nonce.
    WrongEcho,
    /// Answers GET with a length of 2^62 bytes.
    HugeValue,
    /// Closes the connection 100 ms into a WAIT whose keys are not set.
    CloseInWait,
    /// Answers WAIT (whose keys are not set) at once with an unknown code.
    GarbageWait,
}

#[derive(Default)]
struct Data {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
}

/// A mock torch TCPStore server on a loopback port; it stops when dropped.
pub struct MockTorchServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl MockTorchServer {
    /// Start a mock on `127.0.0.1` at a free port.
    pub fn start(fault: MockFault) -> io::Result<MockTorchServer> {
        MockTorchServer::serve(TcpListener::bind("127.0.0.1:0")?, fault)
    }

    /// Serve on `listener`.
    pub fn serve(listener: TcpListener, fault: MockFault) -> io::Result<MockTorchServer> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let data = Arc::new(Data::default());
        let (stop2, conns2) = (stop.clone(), conns.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                if let Ok(copy) = stream.try_clone() {
                    conns2.lock().unwrap_or_else(|e| e.into_inner()).push(copy);
                }
                let (data, stop) = (data.clone(), stop2.clone());
                std::thread::spawn(move || {
                    let _ = serve_conn(stream, &data, fault, &stop);
                });
            }
        });
        Ok(MockTorchServer { addr, stop, conns })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop as a killed server would: every connection is closed at once.
    pub fn kill(&self) {
        if self.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        for c in self.conns.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

impl Drop for MockTorchServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

fn read_n<const N: usize>(s: &mut TcpStream) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

fn read_u64(s: &mut TcpStream) -> io::Result<u64> {
    Ok(u64::from_le_bytes(read_n::<8>(s)?))
}

fn read_blob(s: &mut TcpStream, max: usize) -> io::Result<Vec<u8>> {
    let len = read_u64(s)?;
    if len > max as u64 {
        return Err(bad("length over the limit"));
    }
    let mut v = vec![0u8; len as usize];
    s.read_exact(&mut v)?;
    Ok(v)
}

fn read_keys(s: &mut TcpStream) -> io::Result<Vec<Vec<u8>>> {
    let n = read_u64(s)?;
    if n > MAX_WAIT_KEYS as u64 {
        return Err(bad("too many keys"));
    }
    (0..n).map(|_| read_blob(s, MAX_KEY)).collect()
}

fn value_reply(v: &[u8]) -> Vec<u8> {
    let mut out = (v.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(v);
    out
}

fn serve_conn(mut s: TcpStream, data: &Data, fault: MockFault, stop: &AtomicBool) -> io::Result<()> {
    if fault == MockFault::Silent {
        let mut sink = [0u8; 256];
        while s.read(&mut sink)? > 0 {}
        return Ok(());
    }
    loop {
        let op = read_n::<1>(&mut s)?[0];
        let reply: Vec<u8> = match op {
            OP_VALIDATE => {
                if u32::from_le_bytes(read_n::<4>(&mut s)?) != VALIDATE_MAGIC {
                    return Err(bad("wrong validation magic"));
                }
                continue;
            }
            OP_PING => {
                let nonce = read_n::<4>(&mut s)?;
                if fault == MockFault::WrongEcho {
                    nonce.map(|b| b ^ 0x5a).to_vec()
                } else {
                    nonce.to_vec()
                }
            }
            OP_SET => {
                let (k, v) = (read_blob(&mut s, MAX_KEY)?, read_blob(&mut s, MAX_VALUE)?);
                data.map.lock().unwrap_or_else(|e| e.into_inner()).insert(k, v);
                data.changed.notify_all();
                continue;
            }
            OP_GET => {
                let k = read_blob(&mut s, MAX_KEY)?;
                if fault == MockFault::HugeValue {
                    (1u64 << 62).to_le_bytes().to_vec()
                } else {
                    let map = data.map.lock().unwrap_or_else(|e| e.into_inner());
                    value_reply(map.get(&k).ok_or_else(|| bad("GET of an absent key"))?)
                }
            }
            OP_ADD => {
                let k = read_blob(&mut s, MAX_KEY)?;
                let delta = i64::from_le_bytes(read_n::<8>(&mut s)?);
                let mut map = data.map.lock().unwrap_or_else(|e| e.into_inner());
                let old = match map.get(&k) {
                    None => 0,
                    Some(v) => std::str::from_utf8(v)
                        .ok()
                        .and_then(|t| t.parse::<i64>().ok())
                        .ok_or_else(|| bad("not a number"))?,
                };
                let new = old.wrapping_add(delta);
                map.insert(k, new.to_string().into_bytes());
                data.changed.notify_all();
                new.to_le_bytes().to_vec()
            }
            OP_CHECK => {
                let keys = read_keys(&mut s)?;
                let map = data.map.lock().unwrap_or_else(|e| e.into_inner());
                vec![if keys.iter().all(|k| map.contains_key(k)) { CHECK_READY } else { CHECK_NOT_READY }]
            }
            OP_DELETE => {
                let k = read_blob(&mut s, MAX_KEY)?;
                let existed = data.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&k).is_some();
                (existed as i64).to_le_bytes().to_vec()
            }
            OP_CANCEL_WAIT => vec![WAIT_CANCELED],
            OP_WAIT => {
                let keys = read_keys(&mut s)?;
                wait(&mut s, data, &keys, fault, stop)?
            }
            _ => return Err(bad("unknown op")),
        };
        s.write_all(&reply)?;
    }
}

/// Serve a WAIT: STOP_WAITING once every key is set, or WAIT_CANCELED when the
/// client cancels first.
fn wait(s: &mut TcpStream, data: &Data, keys: &[Vec<u8>], fault: MockFault, stop: &AtomicBool) -> io::Result<Vec<u8>> {
    let all_set = || {
        let map = data.map.lock().unwrap_or_else(|e| e.into_inner());
        keys.iter().all(|k| map.contains_key(k))
    };
    if all_set() {
        return Ok(vec![WAIT_STOP_WAITING]);
    }
    match fault {
        MockFault::GarbageWait => return Ok(vec![7]),
        MockFault::CloseInWait => {
            std::thread::sleep(Duration::from_millis(100));
            s.shutdown(Shutdown::Both)?;
            return Err(bad("closed in a wait, on purpose"));
        }
        _ => {}
    }
    s.set_read_timeout(Some(Duration::from_millis(5)))?;
    let result = loop {
        if stop.load(Ordering::SeqCst) {
            break Err(bad("stopped"));
        }
        if all_set() {
            break Ok(vec![WAIT_STOP_WAITING]);
        }
        let mut op = [0u8; 1];
        match s.read(&mut op) {
            Ok(0) => break Err(bad("closed")),
            Ok(_) if op[0] == OP_CANCEL_WAIT => break Ok(vec![WAIT_CANCELED]),
            Ok(_) => break Err(bad("a request other than CANCEL_WAIT during a WAIT")),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => break Err(e),
        }
        let map = data.map.lock().unwrap_or_else(|e| e.into_inner());
        let _ = data.changed.wait_timeout(map, Duration::from_millis(5));
    };
    s.set_read_timeout(None)?;
    result
}
