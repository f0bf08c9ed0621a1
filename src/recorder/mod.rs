//! The flight recorder: every communicator keeps its last calls in a fixed ring
//! (`BRAID_TRACE_BUFFER`, default [`DEFAULT_CALLS`]; 0: none), so that after a
//! hang or a failure each rank can say what it was doing, and `braid doctor` can
//! read all ranks' records and name the rank the others waited on.
//!
//! What a call costs when the recorder is on: two reads of the time-stamp counter
//! and a dozen relaxed atomic stores into its slot; nothing allocates or locks
//! unless the call fails or waits idle. The engine is the only writer (it holds
//! its lock through the call); readers (a dump on failure, on SIGUSR1, or on
//! demand from another thread while a call hangs) never wait for it: each slot is
//! a sequence lock over atomics, and a slot being written while read is read
//! again.
//!
//! A record is one JSON object (see [`FlightRecorder::to_json`] for the fields),
//! written as `braid-<comm>-e<epoch>-rank<r>.json` into `BRAID_TRACE_DIR` when a
//! call fails (timeout, peer lost or aborted, mismatched calls, protocol error),
//! when the communicator is aborted, on SIGUSR1 and on SIGTERM ([`signals`]), and
//! returned by [`crate::Communicator::flight_record`] at any time.

pub mod exporter;
mod json;
pub mod metrics;
pub mod signals;
#[cfg(test)]
mod tests;
pub mod timeline;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::algorithm::Algorithm;
use crate::error::Error;
use crate::executor::{CallFlags, ChainEnd};
use crate::types::{CallSig, DType, OpKind, ReduceOp};

use json::Json;

/// Calls a communicator's recorder keeps unless `BRAID_TRACE_BUFFER` says otherwise.
pub const DEFAULT_CALLS: usize = 2000;
/// Most calls a recorder keeps (its slots are 64 bytes each).
pub const MAX_CALLS: usize = 1 << 20;
/// Failures whose details (error text, blamed ranks) a recorder keeps.
const FAILURES_KEPT: usize = 16;

/// Where a recorded call got to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallState {
    /// Running (or stuck) when read.
    Started,
    /// Returned successfully.
    Done,
    /// Returned an error.
    Failed,
}

impl CallState {
    fn code(self) -> u32 {
        match self {
            CallState::Started => 1,
            CallState::Done => 2,
            CallState::Failed => 3,
        }
    }
    fn from_code(c: u32) -> Option<CallState> {
        match c {
            1 => Some(CallState::Started),
            2 => Some(CallState::Done),
            3 => Some(CallState::Failed),
            _ => None,
        }
    }
    /// Name in a record.
    pub fn name(self) -> &'static str {
        match self {
            CallState::Started => "started",
            CallState::Done => "done",
            CallState::Failed => "failed",
        }
    }
}

/// One call's slot: a sequence lock (`version` odd while written) over atomics,
/// one cache line each (a slot across two lines costs a call two line fills).
#[derive(Default)]
#[repr(align(64))]
struct Slot {
    version: AtomicU64,
    seq: AtomicU64,
    /// op | dtype << 8 | reduce_op << 16 | algo << 24 | root << 32.
    sig: AtomicU64,
    count: AtomicU64,
    tag: AtomicU32,
    state: AtomicU32,
    rounds: AtomicU32,
    start: AtomicU64,
    end: AtomicU64,
}

/// A slot read consistently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CallRecord {
    seq: u64,
    sig: CallSig,
    state: CallState,
    rounds: u32,
    start: u64,
    end: u64,
}

fn pack(sig: &CallSig) -> u64 {
    sig.op as u64
        | (sig.dtype as u64) << 8
        | (sig.reduce_op as u64) << 16
        | (sig.algo as u64) << 24
        | (sig.root as u64) << 32
}

fn unpack(word: u64, count: u64, tag: u32) -> Option<CallSig> {
    Some(CallSig {
        op: OpKind::from_code(word as u8)?,
        dtype: DType::from_code((word >> 8) as u8)?,
        reduce_op: ReduceOp::from_code((word >> 16) as u8)?,
        algo: (word >> 24) as u8,
        root: (word >> 32) as u32,
        count,
        tag,
    })
}

impl Slot {
    /// Write with `f` inside the sequence lock (one writer: the engine).
    fn write(&self, f: impl FnOnce(&Slot)) {
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        f(self);
        self.version.store(v.wrapping_add(2), Ordering::Release);
    }

    /// The slot's call, or None while it is empty or kept being rewritten.
    fn read(&self) -> Option<CallRecord> {
        for _ in 0..64 {
            let v1 = self.version.load(Ordering::Acquire);
            if v1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let seq = self.seq.load(Ordering::Relaxed);
            let sig = self.sig.load(Ordering::Relaxed);
            let count = self.count.load(Ordering::Relaxed);
            let tag = self.tag.load(Ordering::Relaxed);
            let state = self.state.load(Ordering::Relaxed);
            let rounds = self.rounds.load(Ordering::Relaxed);
            let start = self.start.load(Ordering::Relaxed);
            let end = self.end.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.version.load(Ordering::Relaxed) != v1 {
                continue;
            }
            let state = CallState::from_code(state)?;
            return Some(CallRecord { seq, sig: unpack(sig, count, tag)?, state, rounds, start, end });
        }
        None
    }
}

/// What a failed call's error says, kept apart from the slots (failures are rare).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Failure {
    /// Index of the call (in [`FlightRecorder::next`]'s count).
    index: u64,
    text: String,
    blame: Blame,
}

/// What an error says about who caused it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Blame {
    kind: &'static str,
    blamed: Vec<usize>,
    /// A mismatch: the peer, its sequence number and its call.
    mismatch: Option<(usize, u64, CallSig)>,
    /// How a timeout's first chain of waits ended.
    chain_end: Option<&'static str>,
}

fn describe_error(e: &Error) -> Blame {
    let (kind, blamed, mismatch, chain_end) = match e {
        Error::Timeout { waiting_on, chain, .. } => {
            // The rank to look at ends each chain where it went silent or left; a
            // chain that ends otherwise (a cycle, a rank waiting for nobody) blames
            // the ranks this one waited on.
            let mut blamed: Vec<usize> = chain
                .iter()
                .filter(|c| matches!(c.end, ChainEnd::Silent | ChainEnd::Left(_) | ChainEnd::NotAsked(_)))
                .filter_map(|c| c.ranks.last().copied())
                .collect();
            if blamed.is_empty() {
                blamed = waiting_on.clone();
            }
            blamed.sort_unstable();
            blamed.dedup();
            let end = chain.first().map(|c| chain_end_name(&c.end));
            ("timeout", blamed, None, end)
        }
        Error::PeerLost { peer, .. } => ("peer-lost", vec![*peer], None, None),
        Error::PeerAborted { peer, .. } => ("peer-aborted", vec![*peer], None, None),
        Error::Mismatch { peer, theirs, their_seq, .. } => {
            ("mismatch", vec![*peer], Some((*peer, *their_seq, *theirs)), None)
        }
        Error::Protocol { peer, .. } => ("protocol", vec![*peer], None, None),
        Error::Aborted { .. } => ("aborted", vec![], None, None),
        Error::Broken(_) => ("broken", vec![], None, None),
        _ => ("other", vec![], None, None),
    };
    Blame { kind, blamed, mismatch, chain_end }
}

fn chain_end_name(end: &ChainEnd) -> &'static str {
    match end {
        ChainEnd::Silent => "silent",
        ChainEnd::NotAsked(_) => "not-asked",
        ChainEnd::Left(_) => "left",
        ChainEnd::WaitsForNobody => "waits-for-nobody",
        ChainEnd::Cycle(_) => "cycle",
        ChainEnd::WaitsForThisRank => "waits-for-this-rank",
        ChainEnd::Invalid(_) => "invalid",
    }
}

/// Who a record belongs to.
#[derive(Clone, Debug)]
pub struct Identity {
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub world: usize,
    /// The communicator's id (as in its frames).
    pub comm_id: u32,
    /// Its epoch.
    pub epoch: u8,
}

/// A communicator's flight recorder (see the module docs).
pub struct FlightRecorder {
    who: Identity,
    slots: Box<[Slot]>,
    /// Calls recorded so far: the next call's index (its slot is `index % len`).
    next: AtomicU64,
    /// The communicator's abort flag, which carries the in-flight call's round
    /// and whom it waited on when it last went idle.
    flags: Arc<CallFlags>,
    failures: Mutex<VecDeque<Failure>>,
    clock: clock::Clock,
    dir: Option<PathBuf>,
    /// Peers of each round of the last call that failed or was in flight when it
    /// went idle (written off the hot path).
    peers: Mutex<Option<(u64, Vec<Vec<usize>>)>>,
}

impl FlightRecorder {
    /// A recorder of the last `calls` calls (at most [`MAX_CALLS`]; None for 0),
    /// writing its record into `dir` on failure, abort and signals.
    pub(crate) fn new(
        who: Identity,
        calls: usize,
        dir: Option<PathBuf>,
        flags: Arc<CallFlags>,
    ) -> Option<FlightRecorder> {
        if calls == 0 {
            return None;
        }
        let slots: Vec<Slot> = (0..calls.min(MAX_CALLS)).map(|_| Slot::default()).collect();
        Some(FlightRecorder {
            who,
            slots: slots.into_boxed_slice(),
            next: AtomicU64::new(0),
            flags,
            failures: Mutex::new(VecDeque::new()),
            clock: clock::Clock::new(),
            dir,
            peers: Mutex::new(None),
        })
    }

    /// Where records are written, if anywhere.
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref()
    }

    /// A call starts: its slot index. The same call again right after it finished
    /// (a rooted call's agreement, then its data) reuses its slot.
    pub fn begin(&self, seq: u64, sig: &CallSig, rounds: usize) -> u64 {
        self.flags.start_call();
        let next = self.next.load(Ordering::Relaxed);
        let now = self.clock.now();
        let packed = pack(sig);
        if let Some(last) = next.checked_sub(1) {
            let s = &self.slots[(last % self.slots.len() as u64) as usize];
            if s.seq.load(Ordering::Relaxed) == seq
                && s.sig.load(Ordering::Relaxed) & 0xff_ff_ff == packed & 0xff_ff_ff
                && s.state.load(Ordering::Relaxed) == CallState::Done.code()
            {
                s.write(|s| {
                    s.sig.store(packed, Ordering::Relaxed);
                    s.rounds.store(rounds as u32, Ordering::Relaxed);
                    s.state.store(CallState::Started.code(), Ordering::Relaxed);
                });
                return last;
            }
        }
        let s = &self.slots[(next % self.slots.len() as u64) as usize];
        s.write(|s| {
            s.seq.store(seq, Ordering::Relaxed);
            s.sig.store(packed, Ordering::Relaxed);
            s.count.store(sig.count, Ordering::Relaxed);
            s.tag.store(sig.tag, Ordering::Relaxed);
            s.state.store(CallState::Started.code(), Ordering::Relaxed);
            s.rounds.store(rounds as u32, Ordering::Relaxed);
            s.start.store(now, Ordering::Relaxed);
            s.end.store(0, Ordering::Relaxed);
        });
        self.next.store(next + 1, Ordering::Release);
        next
    }

    /// The peers of each round of call `index` (kept for the failed or idle call).
    pub fn round_peers(&self, index: u64, schedule: &crate::algorithm::Schedule) {
        let peers = schedule
            .rounds
            .iter()
            .map(|r| {
                let mut p: Vec<usize> = r.steps.iter().filter_map(|s| s.peer()).collect();
                p.sort_unstable();
                p.dedup();
                p
            })
            .collect();
        if let Ok(mut slot) = self.peers.lock() {
            *slot = Some((index, peers));
        }
    }

    /// Call `index` ended with `result`.
    pub fn end(&self, index: u64, result: Result<(), &Error>) {
        let next = self.next.load(Ordering::Relaxed);
        if next.saturating_sub(index) > self.slots.len() as u64 {
            return;
        }
        let now = self.clock.now();
        let state = if result.is_ok() { CallState::Done } else { CallState::Failed };
        let s = &self.slots[(index % self.slots.len() as u64) as usize];
        s.write(|s| {
            s.state.store(state.code(), Ordering::Relaxed);
            s.end.store(now, Ordering::Relaxed);
        });
        if let Err(e) = result {
            let blame = describe_error(e);
            let text = e.to_string();
            if let Ok(mut f) = self.failures.lock() {
                if f.len() == FAILURES_KEPT {
                    f.pop_front();
                }
                f.push_back(Failure { index, text, blame });
            }
        }
    }

    /// The record as JSON text (one object; fields in the module docs of
    /// `braid doctor` and below), `reason` saying why it was taken.
    ///
    /// Top level: `braid_flight_record` (1), `rank`, `world`, `comm` (hex id),
    /// `epoch`, `pid`, `host`, `reason`, `dumped_at_us`, `capacity`, `dropped`,
    /// `calls` (oldest first). Each call: `seq`, `op`, `dtype`, `reduce_op`,
    /// `count`, `root`, `tag`, `algorithm` (or null), `state` (`started`, `done`,
    /// `failed`), `round`, `rounds`, `waiting_on`, `start_us`, `end_us` (null while
    /// started), `error`, `error_kind` (`timeout`, `peer-lost`, `peer-aborted`,
    /// `mismatch`, `protocol`, `aborted`, `broken`, `other`, or null), `blamed`
    /// (the ranks its error names as the cause), and where known `mismatch` (`peer`,
    /// `their_seq`, `theirs`), `chain_end` and `peers` (of each round).
    pub fn to_json(&self, reason: &str) -> String {
        let next = self.next.load(Ordering::Acquire);
        let len = self.slots.len() as u64;
        let first = next.saturating_sub(len);
        let failures: Vec<Failure> = self.failures.lock().map(|f| f.iter().cloned().collect()).unwrap_or_default();
        let (round, waiting) = self.flags.progress();
        let peers = self.peers.lock().ok().and_then(|p| p.clone());
        let to_us = self.clock.converter();
        let mut calls = Vec::with_capacity((next - first) as usize);
        for index in first..next {
            let Some(c) = self.slots[(index % len) as usize].read() else { continue };
            let failure = failures.iter().rev().find(|f| f.index == index);
            let last = index + 1 == next;
            let mut o = Json::object();
            o.field("seq", c.seq)
                .field("op", c.sig.op.name())
                .field("dtype", c.sig.dtype.name())
                .field("reduce_op", c.sig.reduce_op.name())
                .field("count", c.sig.count)
                .field("root", c.sig.root as u64)
                .field("tag", c.sig.tag as u64);
            let algo = Algorithm::from_code(c.sig.algo & !crate::types::REPRODUCIBLE);
            o.field("algorithm", algo.map(|a| a.name()));
            o.field("state", c.state.name());
            let reached = match c.state {
                CallState::Done => c.rounds.saturating_sub(1),
                _ if last => round as u32,
                _ => 0,
            };
            o.field("round", reached as u64).field("rounds", c.rounds as u64);
            let waited: &[usize] = if last && c.state != CallState::Done { &waiting } else { &[] };
            o.field("waiting_on", waited);
            o.field("start_us", to_us(c.start)).field("end_us", (c.state != CallState::Started).then(|| to_us(c.end)));
            o.field("error", failure.map(|f| f.text.as_str()));
            o.field("error_kind", failure.map(|f| f.blame.kind));
            o.field("blamed", failure.map(|f| f.blame.blamed.as_slice()).unwrap_or(&[]));
            if let Some((peer, their_seq, theirs)) = failure.and_then(|f| f.blame.mismatch) {
                let mut t = Json::object();
                t.field("op", theirs.op.name())
                    .field("dtype", theirs.dtype.name())
                    .field("reduce_op", theirs.reduce_op.name())
                    .field("count", theirs.count)
                    .field("root", theirs.root as u64);
                let mut m = Json::object();
                m.field("peer", peer).field("their_seq", their_seq).field("theirs", t);
                o.field("mismatch", m);
            }
            if let Some(end) = failure.and_then(|f| f.blame.chain_end) {
                o.field("chain_end", end);
            }
            if let Some((_, p)) = peers.as_ref().filter(|(i, _)| *i == index) {
                o.field("peers", p.as_slice());
            }
            calls.push(o);
        }
        let mut top = Json::object();
        top.field("braid_flight_record", 1u64)
            .field("rank", self.who.rank)
            .field("world", self.who.world)
            .field("comm", format!("{:08x}", self.who.comm_id).as_str())
            .field("epoch", self.who.epoch as u64)
            .field("pid", std::process::id() as u64)
            .field("host", hostname().as_str())
            .field("reason", reason)
            .field("dumped_at_us", clock::unix_us())
            .field("capacity", len)
            .field("dropped", first)
            .field("calls", calls);
        top.finish()
    }

    /// The file this rank's record goes to in `dir`.
    pub fn file_name(&self) -> String {
        format!("braid-{:08x}-e{}-rank{}.json", self.who.comm_id, self.who.epoch, self.who.rank)
    }

    /// Write the record into the trace directory (if one is set), replacing an
    /// earlier one whole (written aside, then renamed): the path, or why not.
    pub fn dump(&self, reason: &str) -> Option<std::io::Result<PathBuf>> {
        let dir = self.dir.as_ref()?;
        Some(self.dump_to(dir, reason))
    }

    /// Write the record into `dir` (created if missing) as [`FlightRecorder::dump`] does.
    pub fn dump_to(&self, dir: &std::path::Path, reason: &str) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(self.file_name());
        let aside = dir.join(format!(".{}.{}.tmp", self.file_name(), std::process::id()));
        std::fs::write(&aside, self.to_json(reason))?;
        std::fs::rename(&aside, &path)?;
        Ok(path)
    }

    /// Write the record where it goes, logging the outcome (a failing job's last word).
    pub fn dump_logged(&self, reason: &str) {
        match self.dump(reason) {
            Some(Ok(path)) => {
                tracing::info!(rank = self.who.rank, "flight record ({reason}) written to {}", path.display())
            }
            Some(Err(e)) => tracing::warn!(rank = self.who.rank, "cannot write the flight record ({reason}): {e}"),
            None => {}
        }
    }
}

/// The error kind a dump on failure names as its reason.
pub fn reason_of(e: &Error) -> &'static str {
    describe_error(e).kind
}

fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default()
}

mod clock {
    //! Time stamps cheap enough for every call: the time-stamp counter where the
    //! kernel trusts it as its clock (x86-64 with `tsc` as the clock source), else
    //! the monotonic clock; turned into wall-clock microseconds when a record is read.

    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    pub(super) fn unix_us() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
    }

    pub(super) struct Clock {
        base: Instant,
        base_unix_us: u64,
        /// The counter at `base`, when it is used.
        tsc_base: Option<u64>,
    }

    #[cfg(target_arch = "x86_64")]
    fn tsc() -> u64 {
        // SAFETY: RDTSC is part of the x86-64 baseline and reads a counter only.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    fn tsc_is_the_clock() -> bool {
        cfg!(target_arch = "x86_64")
            && std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                .is_ok_and(|s| s.trim() == "tsc")
    }

    impl Clock {
        pub(super) fn new() -> Clock {
            #[cfg(target_arch = "x86_64")]
            let tsc_base = tsc_is_the_clock().then(tsc);
            #[cfg(not(target_arch = "x86_64"))]
            let tsc_base = None;
            Clock { base: Instant::now(), base_unix_us: unix_us(), tsc_base }
        }

        /// A raw stamp: counter ticks, or nanoseconds since `base`.
        #[inline]
        pub(super) fn now(&self) -> u64 {
            #[cfg(target_arch = "x86_64")]
            if self.tsc_base.is_some() {
                return tsc();
            }
            self.base.elapsed().as_nanos() as u64
        }

        /// Raw stamps to wall-clock microseconds, the counter's rate measured
        /// against the monotonic clock since `base` (at least 10 ms of it).
        pub(super) fn converter(&self) -> impl Fn(u64) -> u64 + '_ {
            let per_ns = self.tsc_base.map(|t0| {
                let mut elapsed = self.base.elapsed();
                if elapsed.as_millis() < 10 {
                    std::thread::sleep(std::time::Duration::from_millis(10) - elapsed);
                    elapsed = self.base.elapsed();
                }
                (self.now().wrapping_sub(t0) as f64 / elapsed.as_nanos().max(1) as f64, t0)
            });
            move |raw| {
                let ns = match per_ns {
                    Some((rate, t0)) if rate > 0.0 => (raw.wrapping_sub(t0) as i64 as f64 / rate) as i64,
                    _ => raw as i64,
                };
                (self.base_unix_us as i64 + ns / 1000).max(0) as u64
            }
        }
    }
}
