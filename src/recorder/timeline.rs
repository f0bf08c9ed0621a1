//! The timeline (`BRAID_TIMELINE=FILE`): every call of a communicator as a span in
//! Chrome's Trace Event format (JSON array of complete events, `"ph": "X"`), with
//! a nested span per round, loadable in Perfetto and chrome://tracing and drawn by
//! `braid timeline`. Each rank of each communicator writes its own file, named
//! after FILE: `timeline.json` becomes `timeline-<comm>-rank<r>.json` (`{rank}` and
//! `{comm}` in FILE are replaced instead when present), so processes and threads
//! never share one. Times are wall-clock microseconds, so the files of one job's
//! ranks line up on one time axis.
//!
//! Events are kept in memory and written in blocks; the file is a complete JSON
//! array once the communicator is dropped (a file cut short by a crash still loads
//! in both viewers, which accept a missing `]`). Off, it costs nothing: the engine
//! holds no timeline, and the executor's round hook reads one flag.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::json::Json;
use crate::types::CallSig;

/// Events kept before a block is written.
const BLOCK_EVENTS: usize = 4096;

/// An event's name: text, or one of the names every call repeats (written
/// without formatting a string first).
enum Name<'a> {
    Text(&'a str),
    Round(u32),
    Peer(usize),
}

/// One rank's timeline file.
pub struct Timeline {
    path: PathBuf,
    rank: usize,
    tid: u32,
    base: Instant,
    /// Nanoseconds since 1970 at `base`.
    base_ns: u64,
    pending: String,
    events: usize,
    wrote_header: bool,
    failed: bool,
}

/// The file of `rank` of communicator `comm` for `BRAID_TIMELINE=file`.
pub fn file_for(file: &Path, comm: u32, rank: usize) -> PathBuf {
    let text = file.to_string_lossy();
    let comm = format!("{comm:08x}");
    if text.contains("{rank}") || text.contains("{comm}") {
        return PathBuf::from(text.replace("{rank}", &rank.to_string()).replace("{comm}", &comm));
    }
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "timeline".into());
    let ext = file.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_else(|| "json".into());
    file.with_file_name(format!("{stem}-{comm}-rank{rank}.{ext}"))
}

impl Timeline {
    /// A timeline of `rank` in communicator `comm` for `BRAID_TIMELINE=file`.
    pub fn new(file: &Path, comm: u32, rank: usize) -> Timeline {
        let base_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        Timeline {
            path: file_for(file, comm, rank),
            rank,
            tid: comm,
            base: Instant::now(),
            base_ns,
            pending: String::new(),
            events: 0,
            wrote_header: false,
            failed: false,
        }
    }

    /// Nanoseconds of `at` since 1970 (wall clock at the timeline's start, then
    /// the monotonic clock).
    fn ns(&self, at: Instant) -> u64 {
        self.base_ns.saturating_add(at.saturating_duration_since(self.base).as_nanos() as u64)
    }

    /// One complete event, written straight into the pending text: integers only
    /// (times as microseconds with three decimals), no allocation but the text's.
    fn event(&mut self, name: Name<'_>, cat: &str, (start, end): (u64, u64), args: impl FnOnce(&mut String)) {
        let out = &mut self.pending;
        out.push_str("{\"name\":");
        match name {
            Name::Text(t) => super::json::string(t, out),
            Name::Round(k) => {
                let _ = write!(out, "\"round {k}\"");
            }
            Name::Peer(p) => {
                let _ = write!(out, "\"peer {p}\"");
            }
        }
        out.push_str(",\"cat\":");
        super::json::string(cat, out);
        let dur = end.saturating_sub(start);
        let _ = write!(
            out,
            ",\"ph\":\"X\",\"ts\":{}.{:03},\"dur\":{}.{:03},\"pid\":{},\"tid\":{}",
            start / 1000,
            start % 1000,
            dur / 1000,
            dur % 1000,
            self.rank,
            self.tid
        );
        args(out);
        out.push_str("},\n");
        self.events += 1;
        if self.events.is_multiple_of(BLOCK_EVENTS) {
            self.flush(false);
        }
    }

    /// Call `sig` #`seq` ran from `start` to `end`, its rounds starting at
    /// `rounds` (index, time), with `ok` its outcome and `bytes` its message size.
    pub fn call(
        &mut self,
        sig: &CallSig,
        seq: u64,
        bytes: u64,
        ok: bool,
        (start, end): (Instant, Instant),
        (rounds, peers): (&[crate::executor::RoundMark], &[crate::executor::PeerMark]),
    ) {
        let (s, e) = (self.ns(start), self.ns(end));
        let algo = crate::algorithm::Algorithm::from_code(sig.algo & !crate::types::REPRODUCIBLE);
        self.event(Name::Text(sig.op.name()), "call", (s, e), |out| {
            let _ = write!(out, ",\"args\":{{\"seq\":{seq},\"algorithm\":");
            match algo {
                Some(a) => super::json::string(a.name(), out),
                None => out.push_str("null"),
            }
            let (count, dtype, ok) = (sig.count, sig.dtype.name(), if ok { "yes" } else { "no" });
            let _ = write!(out, ",\"bytes\":{bytes},\"count\":{count},\"dtype\":\"{dtype}\",\"ok\":\"{ok}\"}}");
        });
        for (i, &(k, at)) in rounds.iter().enumerate() {
            let until = rounds.get(i + 1).map_or(e, |&(_, next)| self.ns(next));
            let from = self.ns(at);
            self.event(Name::Round(k), "round", (from, until), |_| ());
            // Each peer's transfers of the round, from its start to when they
            // completed: spans that all start together, so they nest.
            for &(_, peer, done) in peers.iter().filter(|p| p.0 == k) {
                let done = self.ns(done).min(until);
                self.event(Name::Peer(peer), "transfer", (from, done), |_| ());
            }
        }
    }

    /// A span of another layer (a fusion bucket, a strategy step) from `start` to `end`.
    pub fn span(&mut self, name: &str, cat: &str, (start, end): (Instant, Instant), args: Option<(&str, u64)>) {
        let (s, e) = (self.ns(start), self.ns(end));
        self.event(Name::Text(name), cat, (s, e), |out| {
            if let Some((k, v)) = args {
                out.push_str(",\"args\":{");
                super::json::string(k, out);
                let _ = write!(out, ":{v}}}");
            }
        });
    }

    /// Write what is pending; with `last`, close the array.
    pub fn flush(&mut self, last: bool) {
        if self.failed || (self.pending.is_empty() && !last) {
            return;
        }
        let mut text = std::mem::take(&mut self.pending);
        if last {
            // The lane's name, and the end of the array (the last event has no comma).
            let mut m = Json::object();
            let mut args = Json::object();
            args.field("name", format!("rank {}", self.rank).as_str());
            m.field("name", "process_name").field("ph", "M").field("pid", self.rank).field("args", args);
            text.push_str(&m.finish());
            text.push_str("\n]\n");
        }
        let header = !self.wrote_header;
        let written = (|| -> std::io::Result<()> {
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(!header)
                .write(true)
                .truncate(header)
                .open(&self.path)?;
            if header {
                f.write_all(b"[\n")?;
            }
            f.write_all(text.as_bytes())
        })();
        match written {
            Ok(()) => self.wrote_header = true,
            Err(e) => {
                self.failed = true;
                tracing::warn!(rank = self.rank, "timeline: cannot write {}: {e}", self.path.display());
            }
        }
    }

    /// The file this timeline writes.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.flush(true);
    }
}
