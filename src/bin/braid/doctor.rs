//! `braid doctor DIR`: read the flight records the ranks of a failed or hung job
//! wrote (`BRAID_TRACE_DIR`, one JSON file per rank and communicator) and say in a
//! few lines which rank to look at, so that nobody has to read N logs side by side.
//!
//! Per communicator (and epoch) the evidence is weighed in this order:
//! 1. the first sequence number at which two ranks called different collectives:
//!    the odd rank out skipped a call or called another one;
//! 2. whom the ranks' errors and in-flight waits name: a rank that stopped, hung or
//!    died is named by the ranks that waited on it or lost it. A blame that only
//!    echoes an earlier failure of the blamed rank (it failed first and left, so its
//!    peers lost it) counts only when nothing else does, and so do aborts a peer
//!    sent, since a rank sends one after *it* gave up on someone else;
//! 3. with neither, the rank that never arrived where the others stopped, or the
//!    one rank that left no record.
//!
//! Exit status: 1 when it finds a fault, 0 when every rank is accounted for and
//! healthy, 2 when DIR cannot be read or holds no flight record.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

/// Arguments of `braid doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Directory the ranks wrote their flight records into (the job's `BRAID_TRACE_DIR`).
    pub dir: PathBuf,
}

/// Ranks past this are taken for a corrupt file rather than a real job.
const MAX_WORLD: usize = 1 << 20;

/// What every rank must agree on for a collective: a difference is a bug in the job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sig {
    pub op: String,
    pub dtype: String,
    pub count: u64,
    pub root: u64,
    pub reduce_op: String,
}

/// One call of a record: the fields the doctor reads.
#[derive(Clone, Debug, Default)]
pub struct Call {
    pub seq: u64,
    pub sig: Sig,
    /// `started` (in flight when dumped), `done` or `failed`.
    pub state: String,
    /// 0-based.
    pub round: u64,
    pub rounds: u64,
    pub waiting_on: Vec<usize>,
    pub end_us: Option<u64>,
    pub error: Option<String>,
    pub error_kind: Option<String>,
    pub blamed: Vec<usize>,
    pub chain_end: Option<String>,
}

/// One rank's flight record.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub rank: usize,
    pub world: usize,
    pub comm: String,
    pub epoch: u64,
    pub pid: Option<u64>,
    pub host: String,
    pub dumped_at_us: Option<u64>,
    /// Oldest first.
    pub calls: Vec<Call>,
}

fn num(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

fn rank_array(v: &Value, key: &str) -> Vec<usize> {
    let ranks = v.get(key).and_then(Value::as_array);
    ranks.map(|a| a.iter().filter_map(Value::as_u64).map(|r| r as usize).collect()).unwrap_or_default()
}

impl Call {
    /// A call as a record writes it; None without a sequence number or an op.
    fn from_json(v: &Value) -> Option<Call> {
        let op = text(v, "op").filter(|op| !op.is_empty())?;
        let (dtype, reduce_op) = (text(v, "dtype").unwrap_or_default(), text(v, "reduce_op").unwrap_or_default());
        let (count, root) = (num(v, "count").unwrap_or(0), num(v, "root").unwrap_or(0));
        Some(Call {
            seq: num(v, "seq")?,
            sig: Sig { op, dtype, count, root, reduce_op },
            state: text(v, "state").unwrap_or_default(),
            round: num(v, "round").unwrap_or(0),
            rounds: num(v, "rounds").unwrap_or(0),
            waiting_on: rank_array(v, "waiting_on"),
            end_us: num(v, "end_us"),
            error: text(v, "error"),
            error_kind: text(v, "error_kind"),
            blamed: rank_array(v, "blamed"),
            chain_end: text(v, "chain_end"),
        })
    }

    /// Point-to-point calls count per link, not per communicator: their `seq` says
    /// nothing about where the collectives are.
    fn is_p2p(&self) -> bool {
        self.sig.op == "send" || self.sig.op == "recv"
    }
}

/// One file's text as a record: `Ok(None)` when it is JSON but not a flight record,
/// `Err` when it cannot be read as one. Unknown fields are ignored, missing optional
/// ones read as empty, and calls without a sequence number or op are left out.
pub fn parse(json: &str) -> Result<Option<Record>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("not valid JSON ({e})"))?;
    match v.get("braid_flight_record") {
        None => return Ok(None),
        Some(version) if version.as_u64() != Some(1) => {
            return Err(format!("flight record version {version}; this braid reads version 1"))
        }
        Some(_) => {}
    }
    let rank = num(&v, "rank").ok_or("no whole-number field `rank`")? as usize;
    let world = num(&v, "world").map_or(0, |w| w as usize).max(rank.saturating_add(1));
    if world > MAX_WORLD {
        return Err(format!("rank {rank} of {world} is not a plausible job"));
    }
    let comm = match v.get("comm") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.as_u64().map_or_else(|| n.to_string(), |n| format!("{n:08x}")),
        _ => "?".to_string(),
    };
    let calls = match v.get("calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().filter_map(Call::from_json).collect(),
        Some(_) => return Err("`calls` is not a list".into()),
    };
    let (epoch, pid, host) = (num(&v, "epoch").unwrap_or(0), num(&v, "pid"), text(&v, "host").unwrap_or_default());
    Ok(Some(Record { rank, world, comm, epoch, pid, host, dumped_at_us: num(&v, "dumped_at_us"), calls }))
}

/// Every flight record among the `*.json` files of `dir` (not its subdirectories),
/// and a note for each file skipped. `Err` when `dir` cannot be listed.
pub fn load(dir: &Path) -> Result<(Vec<Record>, Vec<String>), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let is_json = |p: &PathBuf| p.extension().is_some_and(|x| x == "json") && p.is_file();
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(is_json).collect();
    paths.sort();
    let (mut records, mut notes) = (Vec::new(), Vec::new());
    for path in paths {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match std::fs::read_to_string(&path).map_err(|e| e.to_string()).and_then(|t| parse(&t)) {
            Ok(Some(r)) => records.push(r),
            Ok(None) => notes.push(format!("skipping {name}: not a flight record (no \"braid_flight_record\": 1)")),
            Err(e) => notes.push(format!("skipping {name}: {e}")),
        }
    }
    Ok((records, notes))
}

/// What the doctor concluded about one communicator.
#[derive(Clone, Debug, Default)]
pub struct GroupReport {
    /// Every rank present, agreeing, error-free and done.
    pub healthy: bool,
    /// The single most likely culprit, when the records point at one.
    pub culprit: Option<usize>,
    /// The call the culprit line names: (op, sequence number).
    pub call: Option<(String, u64)>,
    /// Ranks that did not reach the call the others stopped in (missing ones included).
    pub never_arrived: Vec<usize>,
    /// The text printed for the communicator.
    pub lines: Vec<String>,
}

/// What the doctor concluded about a directory's records.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub groups: Vec<GroupReport>,
    /// 1: a fault; 0: healthy; 2: no records.
    pub exit: i32,
}

impl Report {
    /// What `braid doctor` prints: each communicator's lines, a blank line between.
    pub fn text(&self) -> String {
        let each: Vec<String> = self.groups.iter().map(|g| g.lines.join("\n") + "\n").collect();
        if each.is_empty() {
            "braid doctor: no flight records\n".into()
        } else {
            each.join("\n")
        }
    }
}

/// `braid doctor DIR`: the exit status.
pub fn main(args: DoctorArgs) -> i32 {
    let (records, notes) = match load(&args.dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("braid doctor: {e}");
            return 2;
        }
    };
    for n in &notes {
        eprintln!("braid doctor: {n}");
    }
    if records.is_empty() {
        eprintln!("braid doctor: no flight records in {}", args.dir.display());
        return 2;
    }
    let report = diagnose(&records);
    print!("{}", report.text());
    report.exit
}

/// The analysis, records in and conclusions out: one group per (communicator, epoch).
pub fn diagnose(records: &[Record]) -> Report {
    if records.is_empty() {
        return Report { groups: Vec::new(), exit: 2 };
    }
    let mut by_comm: BTreeMap<(&str, u64), Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_comm.entry((r.comm.as_str(), r.epoch)).or_default().push(r);
    }
    let groups: Vec<GroupReport> = by_comm.into_iter().map(|((comm, epoch), recs)| group(comm, epoch, &recs)).collect();
    Report { exit: if groups.iter().all(|g| g.healthy) { 0 } else { 1 }, groups }
}

/// How a rank's error or wait involved the rank it names; the order breaks ties
/// between ways of being named (a lost link says the most).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum How {
    /// Lost its connection (or a wait chain ended at a rank that left).
    Lost,
    /// Timed out waiting on it, or was waiting on it when the record was taken.
    Waited,
    Mismatch,
    Protocol,
    /// Received its abort: weak, the sender usually gave up on someone else.
    Aborted,
}

impl How {
    fn verb(self) -> &'static str {
        match self {
            How::Lost => "lost its connection during",
            How::Waited => "waited on it in",
            How::Mismatch => "saw a different call from it in",
            How::Protocol => "got a protocol error from it in",
            How::Aborted => "got its abort in",
        }
    }
}

/// Rank `from` names rank `on` as a cause, in call `op` #`seq`.
#[derive(Clone, Debug)]
struct Blame {
    from: usize,
    on: usize,
    how: How,
    op: String,
    seq: u64,
    at_us: Option<u64>,
    /// The wait query went unanswered.
    silent: bool,
    /// `on` had already failed, naming someone else, when this was said.
    secondary: bool,
}

/// Where the ranks disagree first: each signature called at `seq` and its ranks,
/// largest group first.
struct Disagreement {
    seq: u64,
    sides: Vec<(Sig, Vec<usize>)>,
}

/// A culprit line: the culprit, the call it names, the text.
type Conclusion = (Option<usize>, Option<(String, u64)>, String);

/// One communicator's records, indexed.
struct View<'a> {
    world: usize,
    recs: BTreeMap<usize, &'a Record>,
    /// Each present rank's collective calls by sequence number.
    coll: BTreeMap<usize, BTreeMap<u64, &'a Call>>,
}

fn group(comm: &str, epoch: u64, records: &[&Record]) -> GroupReport {
    let v = View::new(records);
    let world = v.world;
    let missing: Vec<usize> = (0..world).filter(|r| !v.recs.contains_key(r)).collect();
    let mut report = GroupReport::default();
    let disagreement = v.first_disagreement();
    let clean = v.recs.values().all(|r| {
        r.calls.iter().all(|c| c.error.is_none() && c.error_kind.is_none())
            && r.calls.last().is_none_or(|c| c.state == "done")
    });
    let n = v.recs.len();
    if missing.is_empty() && disagreement.is_none() && clean {
        report.healthy = true;
        let what = format!("communicator {comm}, epoch {epoch}, {world} ranks, every rank's last call done");
        report.lines.push(format!("braid doctor: no fault found in {n} records ({what})"));
        return report;
    }
    let present = match &missing[..] {
        [] => format!("records from all {n}"),
        _ => format!("records from {n} (no record: {})", ranks(&missing)),
    };
    report.lines.push(format!("braid doctor: communicator {comm} (epoch {epoch}), {world} ranks, {present}"));
    let blames = v.blames();
    let (culprit, call, line) = match &disagreement {
        Some(d) => v.disagreement_line(d, &blames),
        None => v.blame_line(&blames).unwrap_or_else(|| v.fallback_line(&missing)),
    };
    (report.culprit, report.call) = (culprit, call);
    report.lines.push(line);
    report.lines.extend((0..world).map(|r| format!("  rank {r}: {}", v.describe(r))));
    if let Some((line, late)) = v.never_arrived_line(&missing) {
        report.lines.push(line);
        report.never_arrived = late;
    }
    report
}

impl<'a> View<'a> {
    /// The records by rank: of two for one rank, the later.
    fn new(records: &[&'a Record]) -> View<'a> {
        let mut recs: BTreeMap<usize, &Record> = BTreeMap::new();
        for &r in records {
            if recs.get(&r.rank).is_none_or(|old| r.dumped_at_us >= old.dumped_at_us) {
                recs.insert(r.rank, r);
            }
        }
        let world = records.iter().map(|r| r.world).max().unwrap_or(0);
        let of = |r: &'a Record| r.calls.iter().filter(|c| !c.is_p2p()).map(|c| (c.seq, c)).collect();
        let coll = recs.iter().map(|(&rank, &r)| (rank, of(r))).collect();
        View { world, recs, coll }
    }

    fn sig_at(&self, rank: usize, seq: u64) -> Option<&Sig> {
        self.coll.get(&rank).and_then(|m| m.get(&seq)).map(|c| &c.sig)
    }

    fn last_coll(&self, rank: usize) -> Option<&'a Call> {
        self.coll.get(&rank).and_then(|m| m.values().next_back().copied())
    }

    /// The smallest sequence number at which two ranks called different collectives.
    fn first_disagreement(&self) -> Option<Disagreement> {
        let seqs: BTreeSet<u64> = self.coll.values().flat_map(|m| m.keys().copied()).collect();
        for seq in seqs {
            let mut sides: Vec<(Sig, Vec<usize>)> = Vec::new();
            for (&rank, sig) in self.coll.iter().filter_map(|(r, m)| Some((r, &m.get(&seq)?.sig))) {
                match sides.iter_mut().find(|(s, _)| s == sig) {
                    Some((_, rs)) => rs.push(rank),
                    None => sides.push((sig.clone(), vec![rank])),
                }
            }
            if sides.len() > 1 {
                sides.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.1[0].cmp(&b.1[0])));
                return Some(Disagreement { seq, sides });
            }
        }
        None
    }

    /// Whether `sig` is what one of `others` called just before or after `seq`: the
    /// rank that called it at `seq` skipped a call or called out of order.
    fn out_of_order(&self, sig: &Sig, seq: u64, others: &[usize]) -> bool {
        let near = [seq.checked_sub(1), seq.checked_add(1)];
        others.iter().any(|&r| near.iter().flatten().any(|&s| self.sig_at(r, s) == Some(sig)))
    }

    /// Who names whom, once per pair of ranks (the earliest).
    fn blames(&self) -> Vec<Blame> {
        let mut out: Vec<Blame> = Vec::new();
        for (&from, rec) in &self.recs {
            for (i, c) in rec.calls.iter().enumerate() {
                let how = match c.error_kind.as_deref() {
                    Some("timeout") if c.chain_end.as_deref() == Some("left") => Some(How::Lost),
                    Some("timeout") => Some(How::Waited),
                    Some("peer-lost") => Some(How::Lost),
                    Some("mismatch") => Some(How::Mismatch),
                    Some("protocol") => Some(How::Protocol),
                    Some("peer-aborted") => Some(How::Aborted),
                    _ => None,
                };
                let mut named: Vec<(usize, How, Option<u64>)> = how
                    .map(|h| c.blamed.iter().map(|&on| (on, h, c.end_us.or(rec.dumped_at_us))).collect())
                    .unwrap_or_default();
                if i + 1 == rec.calls.len() && c.state == "started" {
                    named.extend(c.waiting_on.iter().map(|&on| (on, How::Waited, rec.dumped_at_us)));
                }
                for (on, how, at_us) in named {
                    if on != from && on < self.world && !out.iter().any(|b| b.from == from && b.on == on) {
                        let silent = how == How::Waited && c.chain_end.as_deref() == Some("silent");
                        let (op, seq) = (c.sig.op.clone(), c.seq);
                        out.push(Blame { from, on, how, op, seq, at_us, silent, secondary: false });
                    }
                }
            }
        }
        for b in &mut out {
            let first_failure = self.recs.get(&b.on).and_then(|r| {
                let failures = r.calls.iter().filter(|c| c.error.is_some() && c.blamed.iter().any(|&x| x != b.on));
                failures.filter_map(|c| c.end_us).min()
            });
            b.secondary = matches!((first_failure, b.at_us), (Some(t), Some(at)) if t <= at);
        }
        out
    }

    /// The ranks `keep` accepts that are named, most named first, by the strongest
    /// evidence there is: direct blames, then aborts, then echoes of earlier failures.
    fn suspects<'b>(&self, blames: &'b [Blame], keep: impl Fn(usize) -> bool) -> Vec<(usize, Vec<&'b Blame>)> {
        let tiers: [fn(&Blame) -> bool; 3] = [|b| !b.secondary && b.how != How::Aborted, |b| !b.secondary, |_| true];
        for tier in tiers {
            let mut by: BTreeMap<usize, Vec<&Blame>> = BTreeMap::new();
            for b in blames.iter().filter(|b| tier(b) && keep(b.on)) {
                by.entry(b.on).or_default().push(b);
            }
            if !by.is_empty() {
                let mut v: Vec<_> = by.into_iter().collect();
                v.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
                return v;
            }
        }
        Vec::new()
    }

    /// The culprit line of a disagreement: the odd rank out, or with no majority the
    /// side whose call the others made next to it, else the side the errors name.
    fn disagreement_line(&self, d: &Disagreement, blames: &[Blame]) -> Conclusion {
        let k = d.seq;
        let tied = d.sides.iter().filter(|s| s.1.len() == d.sides[0].1.len()).count();
        let culprit = if tied == 1 {
            d.sides[1..].iter().min_by_key(|s| (s.1.len(), s.1[0])).map(|s| s.1[0])
        } else {
            let tied = &d.sides[..tied];
            let others =
                |sig: &Sig| -> Vec<usize> { tied.iter().filter(|t| &t.0 != sig).flat_map(|t| t.1.clone()).collect() };
            let skipped: Vec<_> = tied.iter().filter(|s| self.out_of_order(&s.0, k, &others(&s.0))).collect();
            let in_tie: Vec<usize> = tied.iter().flat_map(|t| t.1.clone()).collect();
            match (&skipped[..], &self.suspects(blames, |r| in_tie.contains(&r))[..]) {
                ([side], _) => Some(side.1[0]),
                (_, [(r, _)]) => Some(*r),
                (_, [(r, a), (_, b), ..]) if a.len() > b.len() => Some(*r),
                _ => None,
            }
        };
        let Some(culprit) = culprit else {
            let first = &d.sides[0].0;
            let each: Vec<String> =
                d.sides.iter().map(|(sig, rs)| format!("{} called {}", ranks(rs), call_text(sig, first, k))).collect();
            return (None, None, format!("ranks disagree at #{k}: {}; no record says which is wrong", each.join(", ")));
        };
        let mine = d.sides.iter().find(|s| s.1.contains(&culprit)).expect("the culprit called something");
        let theirs = d.sides.iter().find(|s| s.0 != mine.0).expect("two sides");
        let (m, t) = (call_text(&mine.0, &theirs.0, k), call_text(&theirs.0, &mine.0, k));
        let mut line = format!("culprit: rank {culprit} called {m} where {} called {t}", ranks(&theirs.1));
        if self.out_of_order(&mine.0, k, &theirs.1) {
            line += &format!(" (it skipped {} #{k}, or called out of order)", theirs.0.op);
        }
        let also: Vec<usize> = d.sides.iter().filter(|s| s.0 != theirs.0).flat_map(|s| s.1.clone()).collect();
        if also.len() > 1 {
            line +=
                &format!("; {} also differ", ranks(&also.into_iter().filter(|&r| r != culprit).collect::<Vec<_>>()));
        }
        if tied > 1 {
            line += " (no majority)";
        }
        (Some(culprit), Some((mine.0.op.clone(), k)), line)
    }

    /// The culprit line from who names whom, when anyone names anyone.
    fn blame_line(&self, blames: &[Blame]) -> Option<Conclusion> {
        let suspects = self.suspects(blames, |_| true);
        let (culprit, named) = suspects.first()?;
        let culprit = *culprit;
        // The commonest way of being named and call named in: ties go to the way
        // that says most, and to the latest call.
        let how = mode(named.iter().map(|b| std::cmp::Reverse(b.how)))?.0;
        let (seq, op) = mode(named.iter().map(|b| (b.seq, b.op.as_str())))?;
        let from: BTreeSet<usize> = named.iter().map(|b| b.from).collect();
        let who = ranks(&from.into_iter().collect::<Vec<_>>());
        let mut line = match self.recs.get(&culprit) {
            None if how == How::Lost => {
                format!("culprit: rank {culprit} died: {who} lost its connection during {op} #{seq}")
            }
            None if how == How::Waited => {
                let silent = if named.iter().any(|b| b.silent) { "; it did not answer the wait query" } else { "" };
                let what = format!("is stopped or hung (it left no record): {who} waited on it in {op} #{seq}{silent}");
                format!("culprit: rank {culprit} {what}")
            }
            None => format!("culprit: rank {culprit} (it left no record): {who} {} {op} #{seq}", how.verb()),
            Some(rec) => {
                let p2p = op == "send" || op == "recv";
                let place = match self.last_coll(culprit) {
                    Some(c) if c.seq < seq && !p2p => format!("it never arrived at #{seq}: its last call is"),
                    _ => "it is at".into(),
                } + " "
                    + &self.place(culprit);
                let host = if rec.host.is_empty() { "?" } else { &rec.host };
                let on = rec.pid.map(|p| format!(" (pid {p} on {host})")).unwrap_or_default();
                format!("culprit: rank {culprit}: {who} {} {op} #{seq}; {place}{on}", how.verb())
            }
        };
        let elsewhere = named.iter().filter(|b| (b.seq, b.op.as_str()) != (seq, op));
        let elsewhere: Vec<String> = elsewhere.map(|b| format!("rank {} in {} #{}", b.from, b.op, b.seq)).collect();
        if !elsewhere.is_empty() {
            line += &format!(" ({})", elsewhere.join(", "));
        }
        let tied: Vec<usize> = suspects[1..].iter().filter(|s| s.1.len() == named.len()).map(|s| s.0).collect();
        if !tied.is_empty() {
            line += &format!(" (as many ranks name {})", ranks(&tied));
        }
        Some((Some(culprit), Some((op.to_string(), seq)), line))
    }

    /// The furthest collective any rank reached: (op most ranks there called, seq).
    fn furthest(&self) -> Option<(String, u64)> {
        let k = self.coll.values().filter_map(|m| m.keys().next_back()).max().copied()?;
        let op = mode(self.coll.values().filter_map(|m| Some(m.get(&k)?.sig.op.as_str())))?;
        Some((op.to_string(), k))
    }

    /// `op #seq (state)` of the rank's last collective.
    fn place(&self, r: usize) -> String {
        self.last_coll(r).map_or("no collective".into(), |c| format!("{} #{} ({})", c.sig.op, c.seq, c.state))
    }

    /// Present ranks behind call `k`.
    fn laggards(&self, k: u64) -> Vec<usize> {
        self.recs.keys().copied().filter(|&r| self.last_coll(r).is_none_or(|c| c.seq < k)).collect()
    }

    /// No rank names another: the rank that never arrived, or the one without a record.
    fn fallback_line(&self, missing: &[usize]) -> Conclusion {
        let furthest = self.furthest();
        if let Some((op, k)) = &furthest {
            if let Some(&r) = self.laggards(*k).first() {
                let line = format!("culprit: rank {r} never arrived at {op} #{k}: it is at {}", self.place(r));
                return (Some(r), furthest.clone(), line);
            }
        }
        match missing {
            [r] => (Some(*r), furthest, format!("culprit: rank {r} left no record, and no error names another cause")),
            [] => (None, None, "no culprit found: no error names a rank, and no rank is behind".into()),
            _ => {
                (None, None, format!("no culprit found: no error names a rank, and {} left no record", ranks(missing)))
            }
        }
    }

    /// The `never arrived` line and its ranks, when some rank is behind or missing.
    fn never_arrived_line(&self, missing: &[usize]) -> Option<(String, Vec<usize>)> {
        let (op, k) = self.furthest()?;
        let at = |r: usize| self.last_coll(r).map_or("no collective".into(), |c| format!("at {} #{}", c.sig.op, c.seq));
        let mut late: Vec<(usize, String)> = self.laggards(k).into_iter().map(|r| (r, at(r))).collect();
        late.extend(missing.iter().map(|&r| (r, "no record".to_string())));
        late.sort();
        let items: Vec<String> = late.iter().map(|(r, why)| format!("{r} ({why})")).collect();
        let word = if items.len() == 1 { "rank" } else { "ranks" };
        let line = format!("never arrived at {op} #{k}: {word} {}", items.join(", "));
        (!late.is_empty()).then(|| (line, late.into_iter().map(|l| l.0).collect()))
    }

    /// A rank's last collective (its state, round and waits) and the error to read.
    fn describe(&self, r: usize) -> String {
        let Some(rec) = self.recs.get(&r) else { return "no record".into() };
        let Some(c) = self.last_coll(r).or(rec.calls.last()) else { return "no calls recorded".into() };
        let state = if c.state == "started" { "in flight" } else { &c.state };
        let mut s = format!("{} #{} {state}", c.sig.op, c.seq);
        if c.state != "done" && c.rounds > 0 {
            s += &format!(" in round {} of {}", c.round + 1, c.rounds);
        }
        if !c.waiting_on.is_empty() {
            s += &format!(", waiting on {}", list(&c.waiting_on));
        }
        match (&c.error, rec.calls.iter().find(|x| x.error.is_some())) {
            (Some(e), _) => s + ": " + first_line(e, r, c.seq),
            (None, Some(f)) => {
                format!(
                    "{s}; {} #{} failed: {}",
                    f.sig.op,
                    f.seq,
                    first_line(f.error.as_deref().unwrap_or(""), r, f.seq)
                )
            }
            (None, None) => s,
        }
    }
}

/// The commonest item; of equally common ones, the greatest.
fn mode<T: Ord>(items: impl IntoIterator<Item = T>) -> Option<T> {
    let mut counts: BTreeMap<T, usize> = BTreeMap::new();
    for t in items {
        *counts.entry(t).or_default() += 1;
    }
    counts.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0))).map(|(t, _)| t)
}

/// An error's first line, less the `rank R in CALL #K: ` it starts with (the rank's
/// line already says both).
fn first_line(error: &str, rank: usize, seq: u64) -> &str {
    let line = error.lines().next().unwrap_or("").trim_end();
    let tag = format!(" #{seq}: ");
    match line.find(&tag) {
        Some(i) if line.starts_with(&format!("rank {rank} in ")) => &line[i + tag.len()..],
        _ => line,
    }
}

/// `op #k`, with what differs from `other` when the op is the same.
fn call_text(sig: &Sig, other: &Sig, k: u64) -> String {
    let diff: Vec<String> = [
        (sig.dtype != other.dtype, sig.dtype.clone()),
        (sig.count != other.count, format!("count {}", sig.count)),
        (sig.root != other.root, format!("root {}", sig.root)),
        (sig.reduce_op != other.reduce_op, sig.reduce_op.clone()),
    ]
    .into_iter()
    .filter_map(|(differs, s)| differs.then_some(s))
    .collect();
    match sig.op == other.op && !diff.is_empty() {
        true => format!("{} #{k} ({})", sig.op, diff.join(", ")),
        false => format!("{} #{k}", sig.op),
    }
}

/// `2` or `0, 1, 3`; in long lists, runs as ranges (`0-511, 513-1023`).
fn list(rs: &[usize]) -> String {
    let runs = rs.chunk_by(|a, b| *b == a + 1);
    let parts: Vec<String> = runs
        .flat_map(|run| match run {
            [a, .., b] if rs.len() > 8 && run.len() > 2 => vec![format!("{a}-{b}")],
            _ => run.iter().map(usize::to_string).collect(),
        })
        .collect();
    parts.join(", ")
}

/// `rank 2` or `ranks 0, 1, 3`.
fn ranks(rs: &[usize]) -> String {
    format!("{} {}", if rs.len() == 1 { "rank" } else { "ranks" }, list(rs))
}

#[cfg(test)]
#[path = "doctor_tests.rs"]
mod tests;
