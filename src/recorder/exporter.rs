//! The Prometheus endpoint: one small HTTP responder per process, serving every
//! live communicator's [`Metrics`] as text on `GET /metrics`.
//!
//! `BRAID_METRICS_ADDR=HOST:PORT` starts it with the process's first communicator
//! that asks, on PORT plus that communicator's local rank (so the ranks of one host,
//! one process each, listen on PORT, PORT+1, ...; threads of one process share the
//! first one's). Later communicators register with it. A request is read with a
//! deadline and at most `MAX_REQUEST` bytes; anything but `GET /metrics` (or `/`)
//! gets 404 or 400. The responder thread never touches a communicator's lock: it
//! reads the counters' atomics.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::metrics::{render, Metrics};
use crate::error::{Error, Result};

/// Longest request head read.
const MAX_REQUEST: usize = 8192;
/// How long a client may take to send its request.
const READ_DEADLINE: Duration = Duration::from_secs(2);

struct Exporter {
    addr: SocketAddr,
    live: Vec<Weak<Metrics>>,
}

fn exporter() -> &'static Mutex<Option<Exporter>> {
    static E: OnceLock<Mutex<Option<Exporter>>> = OnceLock::new();
    E.get_or_init(|| Mutex::new(None))
}

/// The address of `spec` (`HOST:PORT`) for the process whose first asking
/// communicator has local rank `local_rank`: PORT plus it (PORT 0: any free port).
pub fn address_for(spec: &str, local_rank: usize) -> Result<SocketAddr> {
    let bad = |why: String| Error::Config(format!("BRAID_METRICS_ADDR: `{spec}` {why}"));
    let mut addr = spec
        .to_socket_addrs()
        .map_err(|e| bad(format!("is not HOST:PORT ({e})")))?
        .next()
        .ok_or_else(|| bad("resolves to no address".into()))?;
    if addr.port() != 0 {
        let port = u16::try_from(addr.port() as usize + local_rank)
            .map_err(|_| bad(format!("plus local rank {local_rank} is past port 65535")))?;
        addr.set_port(port);
    }
    Ok(addr)
}

/// Serve `metrics` (with every other live communicator's) at `spec` for a rank of
/// local rank `local_rank`; the address the process serves on.
pub fn register(spec: &str, local_rank: usize, metrics: &Arc<Metrics>) -> Result<SocketAddr> {
    let mut guard = exporter().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = guard.as_mut() {
        e.live.retain(|w| w.strong_count() > 0);
        e.live.push(Arc::downgrade(metrics));
        return Ok(e.addr);
    }
    let want = address_for(spec, local_rank)?;
    let listener = TcpListener::bind(want)
        .map_err(|e| Error::Config(format!("BRAID_METRICS_ADDR: listening on {want} for metrics: {e}")))?;
    let addr = listener.local_addr().map_err(|e| Error::io("metrics listener address", e))?;
    std::thread::Builder::new()
        .name("braid-metrics".into())
        .spawn(move || serve(listener))
        .map_err(|e| Error::io("starting the metrics responder", e))?;
    tracing::info!(%addr, "serving Prometheus metrics on http://{addr}/metrics");
    *guard = Some(Exporter { addr, live: vec![Arc::downgrade(metrics)] });
    Ok(addr)
}

/// The exposition of every live communicator.
fn exposition() -> String {
    let stats: Vec<_> = {
        let guard = exporter().lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().map(|e| e.live.iter().filter_map(Weak::upgrade).collect::<Vec<_>>()).unwrap_or_default()
    }
    .iter()
    .map(|m| m.snapshot())
    .collect();
    render(&stats)
}

fn serve(listener: TcpListener) {
    for conn in listener.incoming() {
        match conn {
            Ok(c) => {
                if let Err(e) = answer(c) {
                    tracing::debug!(error = %e, "metrics request dropped");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// What a request head asks for: the path of a GET, or why it is refused.
fn requested(head: &[u8]) -> std::result::Result<&str, (u16, &'static str)> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = std::str::from_utf8(line).map_err(|_| (400, "Bad Request"))?.trim_end();
    let mut parts = line.split(' ');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("GET"), Some(path), Some(v)) if v.starts_with("HTTP/1.") => Ok(path),
        (Some(_), Some(_), Some(v)) if v.starts_with("HTTP/1.") => Err((405, "Method Not Allowed")),
        _ => Err((400, "Bad Request")),
    }
}

fn answer(mut c: TcpStream) -> std::io::Result<()> {
    c.set_read_timeout(Some(READ_DEADLINE))?;
    c.set_write_timeout(Some(READ_DEADLINE))?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST {
            return respond(&mut c, 431, "Request Header Fields Too Large", "text/plain", "request too long\n");
        }
    }
    match requested(&head) {
        Ok(path) if path == "/metrics" || path.starts_with("/metrics?") || path == "/" => {
            respond(&mut c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", &exposition())
        }
        Ok(_) => respond(&mut c, 404, "Not Found", "text/plain", "braid serves /metrics\n"),
        Err((code, why)) => respond(&mut c, code, why, "text/plain", "\n"),
    }
}

fn respond(c: &mut TcpStream, code: u16, why: &str, kind: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {code} {why}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes())?;
    c.write_all(body.as_bytes())?;
    c.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_as_untrusted_text() {
        assert_eq!(requested(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Ok("/metrics"));
        assert_eq!(requested(b"POST /metrics HTTP/1.1\r\n\r\n"), Err((405, "Method Not Allowed")));
        assert_eq!(requested(b"\xff\xfe garbage"), Err((400, "Bad Request")));
        assert_eq!(requested(b""), Err((400, "Bad Request")));
        assert_eq!(requested(b"GET /metrics SPDY/3\r\n\r\n"), Err((400, "Bad Request")));
    }

    #[test]
    fn the_port_follows_the_local_rank() {
        assert_eq!(address_for("127.0.0.1:9400", 3).unwrap(), "127.0.0.1:9403".parse().unwrap());
        assert_eq!(address_for("127.0.0.1:0", 3).unwrap().port(), 0);
        let e = address_for("127.0.0.1:65535", 1).unwrap_err().to_string();
        assert!(e.contains("BRAID_METRICS_ADDR") && e.contains("65535"), "{e}");
        assert!(address_for("no port here", 0).unwrap_err().to_string().contains("HOST:PORT"));
    }
}
