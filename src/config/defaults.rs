//! Every default value of the configuration and the typed knobs the layers below
//! it receive ([`Tuning`], [`StreamPolicy`]), with the parsers of sizes, durations
//! and flags. This file imports nothing of the crate but the error type: the
//! executor and the transports read their knobs from values built here, and the
//! environment reader ([`crate::config`]) sits above them all.

use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// Default deadline for every blocking wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a rank with a core of its own polls before it sleeps. Long enough to
/// ride out a peer descheduled for a few scheduler slices by other work on its
/// core (with a busy loop beside a 2-rank job, 2 ms of polling left ranks
/// sleeping every slice and 1 MiB all-reduce took 11x Open MPI's time; 20 ms
/// matched it), short enough that a peer that is really computing costs a
/// waiting rank about this much CPU (then 2 ms of yielding) before it sleeps.
pub const DEFAULT_SPIN: Duration = Duration::from_millis(20);

/// Niceness of a communicator's async worker thread (`BRAID_WORKER_NICE`). The
/// worker moves data behind the caller's back (async calls, overlapped gradient
/// buckets, pipelined fusion) while the caller computes; where they share cores,
/// the computing thread is the step's critical path. A synthetic backward pass
/// over 2 cores overlapped 5-15% better with the worker at 10 than at 0
/// (results/fusion-2026-11-28.md); a waiting caller sleeps, so a lone worker
/// still gets a whole core.
pub const WORKER_NICE: i32 = 10;

/// Smallest default of [`Tuning::stream_recv_bytes`].
pub const STREAM_RECV_MIN: usize = 4 << 20;
/// Largest default of [`Tuning::stream_recv_bytes`].
pub const STREAM_RECV_MAX: usize = 64 << 20;

/// Default of [`Tuning::stream_recv_bytes`]: receives at least this long, whose
/// destination will not stay in cache anyway, are copied out of shared rings with
/// non-temporal stores, which skips reading each destination line before
/// overwriting it (a quarter of the memory traffic) but leaves the data out of
/// the cache. A sixteenth of the last-level cache, between 4 and 64 MiB: on the
/// 2-core VM (480 MiB L3) a 2-rank broadcast of 4 and 16 MiB ran 1.5x and 1.4x
/// slower with them (the destination would have stayed in cache), and 64 MiB 1.2x
/// faster (results/one-host-2026-11-27.md).
pub fn default_stream_recv_bytes() -> usize {
    (last_level_cache_bytes().unwrap_or(0) / 16).clamp(STREAM_RECV_MIN, STREAM_RECV_MAX)
}

/// The size of the largest cache of CPU 0 (Linux sysfs), if it can be read.
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| parse_cache_size(&s))
        .max()
}

/// A sysfs cache size (`491520K`, `2048K`, `32M`).
fn parse_cache_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: usize = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}
/// Transfers at least this long go single-copy on links that can read peer memory
/// (the default of [`Tuning::rendezvous_bytes`]).
pub const RENDEZVOUS_BYTES: usize = 128 << 10;
/// Default of [`Tuning::forward_grain`]: minimum a forward sends at a time on memory
/// links while its reduction goes on (see `outbound.rs` for the measurement).
pub const FORWARD_GRAIN: usize = 16 << 10;
/// Default of [`Tuning::forward_pass_bytes`]: bytes of a forwarded segment reduced
/// per pass before its forward gets a turn. 2 ranks on the 2-core VM, same session:
/// 64 KiB passes gave 9.4–10.6 GB/s at 1 MiB, unbounded ones 3.6–4.5 at 16 MiB;
/// 256 KiB gave 12.3–12.9 and 3.7–5.0.
pub const FORWARD_PASS_BYTES: usize = 256 << 10;
/// Default of [`Tuning::peer_chunk`] (see `single_copy.rs` for the measurement).
pub const PEER_CHUNK: usize = 1 << 20;
/// A boolean variable: `1`, `true`, `on`, `yes` or `0`, `false`, `off`, `no`
/// (any case); None when unset or empty.
pub(crate) fn flag(get: &impl Fn(&str) -> Option<String>, name: &str) -> Result<Option<bool>> {
    match get(name).map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => match v.as_str() {
            "1" | "true" | "on" | "yes" => Ok(Some(true)),
            "0" | "false" | "off" | "no" => Ok(Some(false)),
            _ => Err(Error::Config(format!("{name}=`{v}` is not a boolean (use 1 or 0)"))),
        },
    }
}

/// Parse a duration: plain seconds (`30`, `2.5`) or a number with a unit
/// (`ms`, `s`, `m`, `h`).
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("`{text}` is not a duration (try 30, 500ms, 5m)"))?;
    let secs = match unit.trim() {
        "" | "s" | "sec" | "secs" => value,
        "ms" => value / 1e3,
        "us" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        u => return Err(format!("unknown unit `{u}` in `{text}` (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("`{text}` must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parse a byte size with optional K/M/G suffix (powers of 1024): `4096`, `1K`, `16M`.
pub fn parse_size(text: &str) -> std::result::Result<usize, String> {
    let t = text.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('B') => return parse_size(&t[..t.len() - 1]),
        _ => (t, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("`{text}` is not a size (try 4096, 1K, 16M, 1G)"))
}

/// Whether ring writes use non-temporal stores (`BRAID_NT_STORES`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamPolicy {
    /// Time both kinds of copy and use the faster (the default).
    #[default]
    Auto,
    /// Always stream writes of at least 1 KiB.
    On,
    /// Never stream.
    Off,
}

impl FromStr for StreamPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(StreamPolicy::Auto),
            "1" | "on" | "yes" | "true" => Ok(StreamPolicy::On),
            "0" | "off" | "no" | "false" => Ok(StreamPolicy::Off),
            other => Err(format!("`{other}` is not auto, on or off")),
        }
    }
}

/// Thresholds and grain sizes of the byte-stream channels, measured on one machine
/// and settable per communicator (environment or [`crate::config::Config::tuning`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Transfers at least this long go single-copy on links that can read peer memory.
    pub rendezvous_bytes: usize,
    /// Plain (unregistered) buffers between processes may go single-copy through
    /// `process_vm_readv` (probed at connect time; `BRAID_CMA=0` turns it off).
    pub cma: bool,
    /// With `cma`, plain buffers go single-copy only in exchanges (the default,
    /// `BRAID_CMA=auto` or `exchange`; `1` for every transfer): a one-way transfer
    /// measured faster through the shared ring, whose two copies then run on two
    /// cores at once (2 ranks, 16 MiB: all-gather 1.9x faster single-copy, broadcast
    /// 1.1x slower; results/one-host-2026-11-27.md).
    pub cma_exchanges_only: bool,
    /// With `cma_exchanges_only`, whether each exchange's way is timed rather than
    /// fixed (`BRAID_CMA=auto`, the default): calls are made both ways and the
    /// faster kept per size class, as for [`Tuning::nt_stores`]. Which way wins
    /// flips with the machine's state: all-gather single-copy was 1.9x faster at
    /// 16 MiB one day and 1.3-1.4x slower on another, when `process_vm_readv` ran at
    /// half its usual rate and the cores shared a cache
    /// (results/one-host-2026-11-29.md).
    pub cma_exchanges_timed: bool,
    /// Plain receives at least this long are copied out of shared rings with
    /// non-temporal stores (`BRAID_STREAM_RECV_BYTES`; default a sixteenth of the
    /// last-level cache, between 4 and 64 MiB).
    pub stream_recv_bytes: usize,
    /// Smallest piece of a forward written on memory links while its reduction goes on.
    pub forward_grain: usize,
    /// Bytes of a forwarded segment reduced per pass before its forward gets a turn.
    pub forward_pass_bytes: usize,
    /// Single-copy reductions read the peer's data in chunks of this size.
    pub peer_chunk: usize,
    /// A rank with a core of its own polls its links this long after the last
    /// progress before it yields and then sleeps.
    pub spin: Duration,
    /// Niceness the async worker thread asks for (-20..=19; raising priority needs
    /// the privilege to, and without it the worker keeps the caller's).
    pub worker_nice: i32,
    /// Whether shared-memory ring writes (of at least 1 KiB) use non-temporal stores: `Auto`
    /// times both and keeps the faster.
    pub nt_stores: StreamPolicy,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            rendezvous_bytes: RENDEZVOUS_BYTES,
            cma: true,
            cma_exchanges_only: true,
            cma_exchanges_timed: true,
            stream_recv_bytes: default_stream_recv_bytes(),
            forward_grain: FORWARD_GRAIN,
            forward_pass_bytes: FORWARD_PASS_BYTES,
            peer_chunk: PEER_CHUNK,
            spin: DEFAULT_SPIN,
            worker_nice: WORKER_NICE,
            nt_stores: StreamPolicy::Auto,
        }
    }
}

impl Tuning {
    /// The defaults, overridden by `BRAID_RENDEZVOUS_BYTES`, `BRAID_CMA`,
    /// `BRAID_FORWARD_GRAIN`, `BRAID_FORWARD_PASS_BYTES`, `BRAID_PEER_CHUNK`,
    /// `BRAID_SPIN` and `BRAID_WORKER_NICE`;
    /// a malformed value is an error naming the variable.
    pub fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<Tuning> {
        let mut t = Tuning::default();
        let size = |key: &str, min: usize, slot: &mut usize| -> Result<()> {
            if let Some(v) = get(key).filter(|v| !v.trim().is_empty()) {
                let n = parse_size(&v).map_err(|e| Error::Config(format!("{key}: {e}")))?;
                if n < min || n > 1 << 30 {
                    return Err(Error::Config(format!("{key}: {n} is outside {min}..=1G")));
                }
                *slot = n;
            }
            Ok(())
        };
        size("BRAID_RENDEZVOUS_BYTES", 0, &mut t.rendezvous_bytes)?;
        size("BRAID_FORWARD_GRAIN", 1, &mut t.forward_grain)?;
        size("BRAID_FORWARD_PASS_BYTES", 4096, &mut t.forward_pass_bytes)?;
        size("BRAID_PEER_CHUNK", 4096, &mut t.peer_chunk)?;
        size("BRAID_STREAM_RECV_BYTES", 0, &mut t.stream_recv_bytes)?;
        if let Some(v) = get("BRAID_SPIN").filter(|v| !v.trim().is_empty()) {
            t.spin = parse_duration(&v).map_err(|e| Error::Config(format!("BRAID_SPIN: {e}")))?;
            if t.spin > Duration::from_secs(10) {
                return Err(Error::Config(format!("BRAID_SPIN: {v} is above 10 s")));
            }
        }
        if let Some(v) = get("BRAID_WORKER_NICE").filter(|v| !v.trim().is_empty()) {
            t.worker_nice = v
                .trim()
                .parse()
                .ok()
                .filter(|n| (-20..=19).contains(n))
                .ok_or_else(|| Error::Config(format!("BRAID_WORKER_NICE: {v:?} is not a niceness in -20..=19")))?;
        }
        if let Some(v) = get("BRAID_NT_STORES") {
            t.nt_stores = v.parse().map_err(|e| Error::Config(format!("BRAID_NT_STORES: {e}")))?;
        }
        let cma = get("BRAID_CMA").map(|v| v.trim().to_ascii_lowercase());
        match cma.as_deref() {
            None | Some("" | "auto") => {}
            Some("exchange") => (t.cma, t.cma_exchanges_only, t.cma_exchanges_timed) = (true, true, false),
            Some(v) => {
                let on = flag(get, "BRAID_CMA")
                    .ok()
                    .flatten()
                    .ok_or_else(|| Error::Config(format!("BRAID_CMA=`{v}` is none of auto, exchange, 1 and 0")))?;
                (t.cma, t.cma_exchanges_only, t.cma_exchanges_timed) = (on, false, false);
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("491520K\n"), Some(480 << 20));
        assert_eq!(parse_cache_size("32M"), Some(32 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("lots"), None);
        assert_eq!(parse_cache_size("12Q"), None);
        let d = default_stream_recv_bytes();
        assert!((STREAM_RECV_MIN..=STREAM_RECV_MAX).contains(&d), "{d}");
    }
}
