//! Per-communicator counters of calls, bytes, time and bus bandwidth by op, and
//! failures by kind: what [`crate::Communicator::stats`] returns and what the
//! Prometheus exporter ([`super::exporter`]) serves.
//!
//! Off unless asked for (`BRAID_METRICS=1` or `BRAID_METRICS_ADDR`): a call then
//! pays a few relaxed atomic additions and one clock read, with no allocation and
//! no lock. Histograms keep one counter per bucket (not cumulative) and are summed
//! into Prometheus's cumulative `le` buckets when read.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::tuner::bus_factor;
use crate::types::{CallSig, OpKind};

/// Upper bounds (seconds) of the call-time histogram's buckets; one more for +Inf.
pub const TIME_BUCKETS: [f64; 13] = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0];
/// Upper bounds (bytes per second) of the bus-bandwidth histogram's buckets.
pub const BUSBW_BUCKETS: [f64; 11] = [1e6, 1e7, 1e8, 3e8, 1e9, 3e9, 1e10, 3e10, 1e11, 3e11, 1e12];
/// Kinds of failure, as flight records name them ([`super::reason_of`]).
pub const ERROR_KINDS: [&str; 8] =
    ["timeout", "peer-lost", "peer-aborted", "mismatch", "protocol", "aborted", "broken", "other"];

/// Counters of one op.
#[derive(Default)]
struct OpCounters {
    calls: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    time: [AtomicU64; TIME_BUCKETS.len() + 1],
    busbw: [AtomicU64; BUSBW_BUCKETS.len() + 1],
}

/// One communicator's counters.
pub struct Metrics {
    comm_id: u32,
    rank: usize,
    world: usize,
    ops: [OpCounters; OpKind::ALL.len()],
    errors: [AtomicU64; ERROR_KINDS.len()],
}

/// The bytes of a call as nccl-tests counts its size: an all-gather's output, a
/// reduce-scatter's or an all-to-all's input (a block per rank), otherwise the
/// buffer (`count` elements).
pub fn call_bytes(sig: &CallSig, world: usize) -> u64 {
    let one = sig.count.saturating_mul(sig.dtype.size() as u64);
    match sig.op {
        OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll => one.saturating_mul(world as u64),
        _ => one,
    }
}

/// The bucket of `value` among `bounds` (the last for above them all).
fn bucket(bounds: &[f64], value: f64) -> usize {
    bounds.iter().position(|&b| value <= b).unwrap_or(bounds.len())
}

impl Metrics {
    /// Counters for rank `rank` of `world` in communicator `comm_id`.
    pub fn new(comm_id: u32, rank: usize, world: usize) -> Metrics {
        Metrics {
            comm_id,
            rank,
            world,
            ops: std::array::from_fn(|_| OpCounters::default()),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Count one call of `sig` that took `elapsed`; `failure` is its error's kind
    /// (one of [`ERROR_KINDS`]) when it failed. A failed call counts its time but
    /// neither its bytes nor its bandwidth.
    pub fn record(&self, sig: &CallSig, elapsed: Duration, failure: Option<&str>) {
        let Some(c) = self.ops.get(sig.op as usize) else { return };
        c.calls.fetch_add(1, Relaxed);
        c.nanos.fetch_add(elapsed.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
        let secs = elapsed.as_secs_f64();
        c.time[bucket(&TIME_BUCKETS, secs)].fetch_add(1, Relaxed);
        if let Some(kind) = failure {
            c.failed.fetch_add(1, Relaxed);
            let k = ERROR_KINDS.iter().position(|&e| e == kind).unwrap_or(ERROR_KINDS.len() - 1);
            self.errors[k].fetch_add(1, Relaxed);
            return;
        }
        let bytes = call_bytes(sig, self.world);
        c.bytes.fetch_add(bytes, Relaxed);
        if bytes > 0 && secs > 0.0 {
            let busbw = bytes as f64 / secs * bus_factor(sig.op, self.world);
            c.busbw[bucket(&BUSBW_BUCKETS, busbw)].fetch_add(1, Relaxed);
        }
    }

    /// A consistent-enough copy of the counters (each read once, relaxed).
    pub fn snapshot(&self) -> Stats {
        let ops = OpKind::ALL
            .iter()
            .zip(&self.ops)
            .filter(|(_, c)| c.calls.load(Relaxed) > 0)
            .map(|(&op, c)| OpStats {
                op,
                calls: c.calls.load(Relaxed),
                failed: c.failed.load(Relaxed),
                bytes: c.bytes.load(Relaxed),
                seconds: c.nanos.load(Relaxed) as f64 * 1e-9,
                time_buckets: c.time.iter().map(|b| b.load(Relaxed)).collect(),
                busbw_buckets: c.busbw.iter().map(|b| b.load(Relaxed)).collect(),
            })
            .collect();
        let errors = ERROR_KINDS.iter().zip(&self.errors).map(|(&k, n)| (k, n.load(Relaxed))).collect();
        Stats { comm_id: self.comm_id, rank: self.rank, world: self.world, ops, errors }
    }
}

/// What one communicator counted ([`crate::Communicator::stats`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    /// The communicator's id (as flight records and timelines name it).
    pub comm_id: u32,
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub world: usize,
    /// Every op called at least once, in wire-code order.
    pub ops: Vec<OpStats>,
    /// Failed calls by kind (every kind of [`ERROR_KINDS`], in its order).
    pub errors: Vec<(&'static str, u64)>,
}

/// The counters of one op.
#[derive(Clone, Debug, PartialEq)]
pub struct OpStats {
    /// The op.
    pub op: OpKind,
    /// Calls that ended, failed ones included.
    pub calls: u64,
    /// Calls that failed.
    pub failed: u64,
    /// Bytes of the calls that succeeded ([`call_bytes`]).
    pub bytes: u64,
    /// Time spent in all calls.
    pub seconds: f64,
    /// Calls per bucket of [`TIME_BUCKETS`] (not cumulative; the last is above them all).
    pub time_buckets: Vec<u64>,
    /// Succeeded calls of some bytes per bucket of [`BUSBW_BUCKETS`] (likewise).
    pub busbw_buckets: Vec<u64>,
}

impl Stats {
    /// The counters of `op`, if it was called.
    pub fn op(&self, op: OpKind) -> Option<&OpStats> {
        self.ops.iter().find(|o| o.op == op)
    }
}

/// The Prometheus text exposition (format 0.0.4) of `all`, every family once.
pub fn render(all: &[Stats]) -> String {
    let mut out = String::new();
    let labels = |s: &Stats| format!("comm=\"{:08x}\",rank=\"{}\",world=\"{}\"", s.comm_id, s.rank, s.world);
    let counter = |out: &mut String, name: &str, help: &str, value: &dyn Fn(&OpStats) -> String| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for s in all {
            for o in &s.ops {
                let _ = writeln!(out, "{name}{{{},op=\"{}\"}} {}", labels(s), o.op.name(), value(o));
            }
        }
    };
    counter(&mut out, "braid_calls_total", "Collective and point-to-point calls that ended.", &|o| o.calls.to_string());
    counter(&mut out, "braid_failed_calls_total", "Calls that failed.", &|o| o.failed.to_string());
    counter(
        &mut out,
        "braid_bytes_total",
        "Bytes of the calls that succeeded, as nccl-tests counts a call's size.",
        &|o| o.bytes.to_string(),
    );
    let histogram =
        |out: &mut String, name: &str, help: &str, bounds: &[f64], of: &dyn Fn(&OpStats) -> (&[u64], f64)| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for s in all {
                for o in &s.ops {
                    let (counts, sum) = of(o);
                    let l = format!("{},op=\"{}\"", labels(s), o.op.name());
                    let mut total = 0;
                    for (i, n) in counts.iter().enumerate() {
                        total += n;
                        let le = bounds.get(i).map_or("+Inf".to_string(), |b| format!("{b:e}"));
                        let _ = writeln!(out, "{name}_bucket{{{l},le=\"{le}\"}} {total}");
                    }
                    let _ = writeln!(out, "{name}_sum{{{l}}} {sum}\n{name}_count{{{l}}} {total}");
                }
            }
        };
    histogram(&mut out, "braid_call_seconds", "Time of each call, failed ones included.", &TIME_BUCKETS, &|o| {
        (&o.time_buckets, o.seconds)
    });
    histogram(
        &mut out,
        "braid_bus_bandwidth_bytes_per_second",
        "Bus bandwidth of each call that succeeded with some bytes (nccl-tests' busbw).",
        &BUSBW_BUCKETS,
        // The sum of rates is not a quantity anyone reads; Prometheus wants one.
        &|o| (&o.busbw_buckets, 0.0),
    );
    let _ = writeln!(out, "# HELP braid_errors_total Failed calls by kind.\n# TYPE braid_errors_total counter");
    for s in all {
        for (kind, n) in &s.errors {
            let _ = writeln!(out, "braid_errors_total{{{},kind=\"{kind}\"}} {n}", labels(s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DType, ReduceOp};

    fn sig(op: OpKind, count: u64) -> CallSig {
        CallSig::new(op, DType::F32, count, 0, ReduceOp::Sum)
    }

    #[test]
    fn calls_bytes_and_buckets_add_up() {
        let m = Metrics::new(0xab, 1, 4);
        m.record(&sig(OpKind::AllReduce, 256), Duration::from_micros(50), None);
        m.record(&sig(OpKind::AllReduce, 256), Duration::from_millis(2), None);
        m.record(&sig(OpKind::AllGather, 10), Duration::from_micros(5), None);
        m.record(&sig(OpKind::AllReduce, 256), Duration::from_secs(20), Some("timeout"));
        m.record(&sig(OpKind::Barrier, 0), Duration::from_micros(5), Some("made-up"));
        let s = m.snapshot();
        let ar = s.op(OpKind::AllReduce).unwrap();
        assert_eq!((ar.calls, ar.failed, ar.bytes), (3, 1, 2 * 1024));
        assert!((ar.seconds - 20.00205).abs() < 1e-9, "{}", ar.seconds);
        // 50 us is in (30 us, 100 us], 2 ms in (1 ms, 3 ms], 20 s above 10 s.
        assert_eq!(ar.time_buckets.iter().sum::<u64>(), 3);
        assert_eq!((ar.time_buckets[2], ar.time_buckets[5], ar.time_buckets[13]), (1, 1, 1));
        // busbw = 1024 B / 50 us * 2 * 3 / 4 = 30.72 MB/s, in (1e7, 1e8]; the 2 ms call 0.77 MB/s.
        assert_eq!((ar.busbw_buckets[2], ar.busbw_buckets[0]), (1, 1));
        assert_eq!(s.op(OpKind::AllGather).unwrap().bytes, 4 * 10 * 4, "an all-gather counts its output");
        assert!(s.op(OpKind::Broadcast).is_none());
        let errors: Vec<(&str, u64)> = s.errors.iter().copied().filter(|e| e.1 > 0).collect();
        assert_eq!(errors, vec![("timeout", 1), ("other", 1)]);
    }

    #[test]
    fn the_exposition_has_each_family_once_and_cumulative_buckets() {
        let (a, b) = (Metrics::new(1, 0, 2), Metrics::new(1, 1, 2));
        for m in [&a, &b] {
            m.record(&sig(OpKind::AllReduce, 1 << 18), Duration::from_micros(200), None);
            m.record(&sig(OpKind::AllReduce, 1 << 18), Duration::from_millis(5), None);
        }
        let text = render(&[a.snapshot(), b.snapshot()]);
        for family in ["braid_calls_total", "braid_bytes_total", "braid_call_seconds", "braid_errors_total"] {
            assert_eq!(text.matches(&format!("# TYPE {family} ")).count(), 1, "{family}:\n{text}");
        }
        let line = |prefix: &str| {
            text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix} in\n{text}")).to_string()
        };
        let l = "comm=\"00000001\",rank=\"1\",world=\"2\",op=\"all-reduce\"";
        assert_eq!(line(&format!("braid_bytes_total{{{l}}}")), format!("braid_bytes_total{{{l}}} {}", 2 << 20));
        assert!(line(&format!("braid_call_seconds_bucket{{{l},le=\"3e-4\"}}")).ends_with(" 1"));
        assert!(line(&format!("braid_call_seconds_bucket{{{l},le=\"1e-2\"}}")).ends_with(" 2"));
        assert!(line(&format!("braid_call_seconds_bucket{{{l},le=\"+Inf\"}}")).ends_with(" 2"));
        assert!(line(&format!("braid_call_seconds_count{{{l}}}")).ends_with(" 2"));
        let sum: f64 = line(&format!("braid_call_seconds_sum{{{l}}}")).rsplit(' ').next().unwrap().parse().unwrap();
        assert!((sum - 0.0052).abs() < 1e-9);
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let value = l.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "a sample without a number: {l}");
        }
    }
}
