//! Slurm without PMIx: the store's address from the job's own variables.
//!
//! The host is the first host of `SLURM_STEP_NODELIST` (else `SLURM_JOB_NODELIST`,
//! else `SLURM_NODELIST`), in Slurm's hostlist syntax: `node[01-04,07]`,
//! `a[1-2],b3`, `gpu-a[01-02]-ib`, `r[1-2]-n[3-4]` (several brackets expand with the
//! first outermost; a range keeps the zero padding of its first bound). Only the
//! first host is built, and the count is computed without expanding, so a hostile
//! list cannot make a rank allocate more than the list's own length.
//!
//! The port is the first of `SLURM_STEP_RESV_PORTS` (`12000-12010`: Slurm reserves
//! them for the step when `MpiParams=ports=` is configured), else derived from
//! `SLURM_JOB_ID` and `SLURM_STEP_ID` into [`DERIVED_PORTS`], below Linux's
//! ephemeral range so an outgoing connection rarely holds it.
//!
//! Store URL `slurm://HOST:PORT`: rank 0 first checks that it runs on HOST
//! (`SLURMD_NODENAME`, else the host name, short or fully qualified), then hosts the
//! store on every interface at PORT; the others connect to HOST:PORT.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::JobKey;
use crate::bootstrap::hosted_store::HostedStore;
use crate::bootstrap::mpi::Derived;
use crate::bootstrap::store::Store;
use crate::bootstrap::tcp_store::{StoreLimits, TcpStore, TcpStoreServer};
use crate::error::{Error, Result};

/// Ports a derived port falls in (unprivileged, below the usual ephemeral range 32768-60999).
pub const DERIVED_PORTS: Range<u16> = 10000..32000;
/// Longest nodelist read (Slurm's own lists of thousands of hosts fit).
pub const MAX_NODELIST: usize = 1 << 20;
/// Most digits in one bound of a range.
const MAX_DIGITS: usize = 18;

/// One piece of a host pattern: literal text, or a bracket of ranges.
#[derive(Debug, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    /// Ranges `lo..=hi`, each with the zero-padded width of its first bound.
    Ranges(Vec<(u64, u64, usize)>),
}

/// Split a nodelist at the commas outside brackets.
fn split_top(list: &str) -> std::result::Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("nested `[` at byte {i}")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("`]` without `[` at byte {i}")),
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unclosed `[`".into());
    }
    out.push(&list[start..]);
    Ok(out)
}

fn parse_bound(s: &str) -> std::result::Result<u64, String> {
    if s.is_empty() || s.len() > MAX_DIGITS || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{s}` is not a number of at most {MAX_DIGITS} digits"));
    }
    s.parse().map_err(|_| format!("`{s}` is not a number"))
}

/// Parse one host pattern (no top-level comma) into pieces.
fn parse_pattern(p: &str) -> std::result::Result<Vec<Piece<'_>>, String> {
    if p.is_empty() {
        return Err("empty host name".into());
    }
    let mut pieces = Vec::new();
    let mut rest = p;
    while !rest.is_empty() {
        match rest.find('[') {
            None => {
                pieces.push(Piece::Text(rest));
                break;
            }
            Some(open) => {
                if open > 0 {
                    pieces.push(Piece::Text(&rest[..open]));
                }
                let close = rest[open..].find(']').ok_or("unclosed `[`")? + open;
                let mut ranges = Vec::new();
                for item in rest[open + 1..close].split(',') {
                    let (lo, hi) = item.split_once('-').unwrap_or((item, item));
                    let (l, h) = (parse_bound(lo)?, parse_bound(hi)?);
                    if l > h {
                        return Err(format!("range `{item}` runs backwards"));
                    }
                    ranges.push((l, h, lo.len()));
                }
                pieces.push(Piece::Ranges(ranges));
                rest = &rest[close + 1..];
            }
        }
    }
    for piece in &pieces {
        if let Piece::Text(t) = piece {
            if !t.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')) {
                return Err(format!("`{}` is not part of a host name", t.escape_debug()));
            }
        }
    }
    Ok(pieces)
}

fn parse_list(list: &str) -> std::result::Result<Vec<Vec<Piece<'_>>>, String> {
    let list = list.trim();
    if list.is_empty() {
        return Err("the list is empty".into());
    }
    if list.len() > MAX_NODELIST {
        return Err(format!("the list is {} bytes long (at most {MAX_NODELIST})", list.len()));
    }
    split_top(list)?.into_iter().map(parse_pattern).collect()
}

/// The first host of a Slurm nodelist.
pub fn first_host(list: &str) -> std::result::Result<String, String> {
    let patterns = parse_list(list)?;
    let mut host = String::new();
    for piece in &patterns[0] {
        match piece {
            Piece::Text(t) => host.push_str(t),
            Piece::Ranges(r) => {
                let (lo, _, width) = r[0];
                host.push_str(&format!("{lo:0width$}"));
            }
        }
    }
    Ok(host)
}

/// How many hosts a Slurm nodelist names (saturating at `u64::MAX`), without
/// expanding it.
pub fn host_count(list: &str) -> std::result::Result<u64, String> {
    let mut total = 0u64;
    for pattern in parse_list(list)? {
        let mut n = 1u64;
        for piece in &pattern {
            if let Piece::Ranges(r) = piece {
                let here = r.iter().fold(0u64, |acc, &(lo, hi, _)| acc.saturating_add(hi - lo).saturating_add(1));
                n = n.saturating_mul(here);
            }
        }
        total = total.saturating_add(n);
    }
    Ok(total)
}

/// The first port of `SLURM_STEP_RESV_PORTS` (`12000-12010`, `12000`, or a list).
pub fn reserved_port(text: &str) -> std::result::Result<u16, String> {
    let first = text.trim().split([',', '-']).next().unwrap_or("");
    match first.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("SLURM_STEP_RESV_PORTS=`{}` does not start with a port", text.escape_debug())),
    }
}

/// A port for the job's step, the same on every rank: `job * 7919 + step * 104729`
/// folded into [`DERIVED_PORTS`] (primes, so neighbouring jobs and steps differ).
pub fn derived_port(job: u64, step: u64) -> u16 {
    let span = u64::from(DERIVED_PORTS.end - DERIVED_PORTS.start);
    let mixed = job.wrapping_mul(7919).wrapping_add(step.wrapping_mul(104729));
    DERIVED_PORTS.start + (mixed % span) as u16
}

/// The store of a Slurm step without `BRAID_STORE`: PMIx when srun started the step
/// with it (the nodelist's store as fallback), else the nodelist's.
pub fn slurm_store(get: &impl Fn(&str) -> Option<String>, rank: usize) -> Result<Derived> {
    let nodelist = derive_from_nodelist(get, rank);
    let fallback = nodelist.as_ref().ok().map(|d| d.store.clone());
    if let Some(url) = crate::bootstrap::mpi::pmix_url(get, fallback.as_deref()) {
        let how = match &nodelist {
            Ok(d) => format!(
                "launcher slurm with PMIx (srun --mpi=pmix): rank 0 publishes the store through PMIx, else {}",
                d.how
            ),
            Err(_) => "launcher slurm with PMIx (srun --mpi=pmix): rank 0 publishes the store through PMIx".into(),
        };
        return Ok(Derived { store: url, how });
    }
    nodelist
}

fn derive_from_nodelist(get: &impl Fn(&str) -> Option<String>, rank: usize) -> Result<Derived> {
    let fail = |what: String| {
        Error::Config(format!(
            "rank {rank}: launcher slurm (SLURM_PROCID) without PMIx and without BRAID_STORE: {what}; \
             or pass the store: `srun --export=ALL,BRAID_STORE=tcp://HOST:PORT ...`"
        ))
    };
    let var = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .into_iter()
        .find(|v| get(v).is_some_and(|s| !s.trim().is_empty()))
        .ok_or_else(|| {
            fail("no nodelist (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST unset) to find rank 0's host".into())
        })?;
    let list = get(var).unwrap_or_default();
    let host = first_host(&list).map_err(|e| fail(format!("{var}: {e}")))?;
    let hosts = host_count(&list).map_err(|e| fail(format!("{var}: {e}")))?;
    let (port, port_how) = match get("SLURM_STEP_RESV_PORTS").filter(|s| !s.trim().is_empty()) {
        Some(p) => (reserved_port(&p).map_err(fail)?, "the first of SLURM_STEP_RESV_PORTS".to_string()),
        None => {
            let num = |names: [&str; 2]| names.iter().find_map(|n| get(n)).and_then(|s| s.trim().parse::<u64>().ok());
            let job = num(["SLURM_JOB_ID", "SLURM_JOBID"]).ok_or_else(|| {
                fail("neither SLURM_STEP_RESV_PORTS nor a numeric SLURM_JOB_ID to choose the store's port".into())
            })?;
            let step = num(["SLURM_STEP_ID", "SLURM_STEPID"]).unwrap_or(0);
            (derived_port(job, step), format!("derived from SLURM_JOB_ID={job} and SLURM_STEP_ID={step}"))
        }
    };
    let store = if host.contains(':') { format!("slurm://[{host}]:{port}") } else { format!("slurm://{host}:{port}") };
    Ok(Derived {
        how: format!(
            "launcher slurm without PMIx: the store's host {host} is the first of {var} ({hosts} host{}), the port {port} {port_how}",
            if hosts == 1 { "" } else { "s" }
        ),
        store,
    })
}

/// Whether `url` names a nodelist-derived store; returns `HOST:PORT`.
pub fn parse_url(url: &str) -> Option<&str> {
    url.strip_prefix("slurm://")
}

/// Whether the node called `node` (Slurm's name) is `me` (this host's name): equal,
/// or one the other's first label (short against fully qualified), ignoring case.
pub fn same_host(node: &str, me: &str) -> bool {
    let short = |s: &str| s.split('.').next().unwrap_or("").to_ascii_lowercase();
    node.eq_ignore_ascii_case(me)
        || (!node.contains('.') && short(me) == node.to_ascii_lowercase())
        || (!me.contains('.') && short(node) == me.to_ascii_lowercase())
}

/// This host's name as Slurm calls it (`SLURMD_NODENAME`), else the kernel's.
fn my_name() -> String {
    std::env::var("SLURMD_NODENAME").ok().filter(|s| !s.is_empty()).unwrap_or_else(kernel_host_name)
}

/// `gethostname(2)`, empty when it fails.
pub(crate) fn kernel_host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; the result is NUL-terminated
    // within it when the call succeeds (the last byte stays 0 otherwise).
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) } != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Connect to the nodelist-derived store at `addr` (`HOST:PORT`); rank 0 hosts it.
pub fn connect(addr: &str, rank0: bool, world_size: usize, key: JobKey, timeout: Duration) -> Result<Arc<dyn Store>> {
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_start_matches('[').trim_end_matches(']'), p.parse::<u16>().ok()?)))
        .ok_or_else(|| Error::Config(format!("slurm store `{addr}` is not HOST:PORT")))?;
    let fix = "set BRAID_STORE=tcp://HOST:PORT for every rank (`srun --export=ALL,BRAID_STORE=...`)";
    if rank0 {
        let me = my_name();
        if !same_host(host, &me) {
            return Err(Error::Config(format!(
                "rank 0 (launcher slurm) runs on `{me}` but the store's host, the first of the step's nodelist, is `{host}`: \
                 Slurm placed rank 0 elsewhere (a task distribution such as --distribution=cyclic or arbitrary?); {fix}"
            )));
        }
        let limits = StoreLimits::for_world(world_size);
        let server = TcpStoreServer::bind_with(&format!("[::]:{port}"), key.clone(), limits.clone())
            .or_else(|_| TcpStoreServer::bind_with(&format!("0.0.0.0:{port}"), key.clone(), limits))
            .map_err(|e| {
                Error::Store(format!(
                    "rank 0 (launcher slurm): cannot host the store on port {port} of {host}: {e}; {fix}"
                ))
            })?;
        let client = TcpStore::connect(&format!("127.0.0.1:{port}"), key, timeout)?;
        tracing::debug!(host, port, "hosting the store derived from the Slurm nodelist");
        return Ok(Arc::new(HostedStore::new(client, server)));
    }
    let rank = crate::bootstrap::mpi::rank_label(&["SLURM_PROCID", "PMIX_RANK"]);
    let client = TcpStore::connect(addr, key, timeout).map_err(|e| {
        Error::Store(format!(
            "rank {rank} (launcher slurm, store {addr} from the nodelist): {e}; is rank 0 running on {host}? Or {fix}"
        ))
    })?;
    Ok(Arc::new(client))
}

#[cfg(test)]
mod tests;
