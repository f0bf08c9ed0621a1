//! The store torchrun's variables name.

use crate::error::{Error, Result};

/// Longest run id (escaped) in the key prefix.
const MAX_RUN_ID: usize = 1024;

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
///   already there: [`connect_tcp_url`](super::detect::connect_tcp_url)).
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
