//! The fault grid: one fault — a delay, a stall, a cut or a corrupted header — at
//! a chosen frame and byte of one rank's outgoing stream (`braid::fault`), under
//! every collective and send/recv, over every stream transport, at 2 to 8 ranks.
//! Each rank runs the call twice on integer data whose result has a closed form.
//! Every case must end, on every rank, in the exact result or an error that names
//! the right rank and peer, within a bound: never a hang, a panic or a wrong result.
//!
//! - delay (shorter than the deadline): every rank gets the exact result;
//! - stall: the stalled rank fails naming a peer, someone waited out a deadline, and
//!   every error leads back to the stalled link;
//! - cut: the cutting rank fails naming the peer it lost;
//! - corrupted header: the receiving rank fails with a protocol or mismatch error
//!   naming the sender.
//!
//! In all, a rank that fails names the faulty link's ends or a rank that failed
//! before it, following such names back to the faulty link (a peer's abort
//! cascades); a rank that returns Ok holds the exact result. Payload bytes are never
//! corrupted: no receiver checks them (see `braid::fault`).
//!
//! The full grid is 3 transports x 7 world sizes x 8 calls x 4 faults x 3 points
//! (2016 cases, each stall costing a deadline); CI runs a deterministic sample that
//! covers every transport x call x fault once, world sizes and points varying
//! between them. `BRAID_FAULT_GRID=full` runs the full grid; any other value runs
//! the cases of the full grid whose name contains it (a name is printed with every
//! failure, e.g. `tcp/n=5/all-gather/stall/p1`). `BRAID_FAULT_GRID_JOBS` sets how many
//! cases run at once per transport (default 1).

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use braid::bootstrap::{MemStore, Store};
use braid::fault::{FaultAction, FaultPlan, FaultPoint};
use braid::{Communicator, Config, Error, ReduceOp, TransportKind};
use common::{Call, Net, CALLS_ALL};

/// Every wait's deadline: each stall case costs about one.
const TIMEOUT: Duration = Duration::from_millis(1500);
/// A delay well inside the deadline.
const DELAY: Duration = Duration::from_millis(300);
/// A case whose ranks have not all returned by then hangs (a bound on the deadline
/// and its cascades, not a speed measurement).
const HANG_BOUND: Duration = Duration::from_secs(30);
/// Calls per case: a fault may land in either, and the second shows the streams
/// still in step after a delay.
const CALLS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Delay,
    Stall,
    Cut,
    Corrupt,
}

const FAULTS: [Fault; 4] = [Fault::Delay, Fault::Stall, Fault::Cut, Fault::Corrupt];

/// Header bytes every receiver checks, whatever the call (magic, version, id,
/// sequence number, dtype, epoch, count, length): flipping one must be an error.
const CHECKED_HEADER_BYTES: [usize; 8] = [0, 2, 5, 9, 17, 19, 25, 33];

#[derive(Clone, Copy, Debug)]
struct Case {
    net: Net,
    world: usize,
    call: Call,
    fault: Fault,
    /// Which of the three points (and data sizes) of the grid.
    point: usize,
}

impl Case {
    fn name(&self) -> String {
        let net = match self.net {
            Net::InProc => "inproc",
            Net::Shm => "shm",
            Net::Tcp => "tcp",
        };
        let fault = format!("{:?}", self.fault).to_lowercase();
        format!("{net}/n={}/{}/{fault}/p{}", self.world, self.call.name(), self.point)
    }

    /// Elements per block: small calls (one frame per message) and, at point 2,
    /// blocks above the single-copy threshold (rendezvous frames where links can
    /// read the peer's memory).
    fn block(&self) -> usize {
        if self.point == 2 {
            40_000
        } else {
            3 + self.point * 2
        }
    }

    /// The fault: point 0 at the start of a rank's first data frame on any link;
    /// point 1 inside the header of the last rank's second frame; point 2 inside the
    /// payload of the first frame from the middle rank to the next.
    fn plan(&self) -> FaultPlan {
        let n = self.world;
        let (rank, peer, frame, offset) = match self.point {
            0 => (0, None, 0, 0),
            1 => (n - 1, None, 1, 17),
            _ => (n / 2, Some((n / 2 + 1) % n), 0, 64),
        };
        let action = match self.fault {
            Fault::Delay => FaultAction::Delay(DELAY),
            Fault::Stall => FaultAction::Stall,
            Fault::Cut => FaultAction::Cut,
            Fault::Corrupt => FaultAction::CorruptHeader { xor: 0x21 },
        };
        let offset = match self.fault {
            Fault::Corrupt => CHECKED_HEADER_BYTES[(self.world * 3 + self.point + self.call as usize) % 8],
            _ => offset,
        };
        FaultPlan::new(rank, FaultPoint { peer, frame, offset }, action).expect("a valid plan")
    }
}

/// Rank r's element i in call c: small integers, so every sum is exact.
fn x(r: usize, i: usize, c: usize) -> i32 {
    ((r + 1) * 3 + i % 97 + 11 * c) as i32
}

/// Element i of the sum over `n` ranks in call c.
fn sum(n: usize, i: usize, c: usize) -> i32 {
    (0..n).map(|r| x(r, i, c)).sum()
}

/// What one call on one rank came to.
enum Outcome {
    /// The exact result.
    Ok,
    /// A result that is not the expected one (what differed).
    Wrong(String),
    Err(Error),
}

fn compare(got: &[i32], want: impl Fn(usize) -> i32) -> Outcome {
    match got.iter().enumerate().find(|&(i, v)| *v != want(i)) {
        None => Outcome::Ok,
        Some((i, v)) => Outcome::Wrong(format!("element {i} of {} is {v}, expected {}", got.len(), want(i))),
    }
}

/// Call `c` of the case on rank `comm`, its result checked.
fn run_call(comm: &Communicator, case: &Case, c: usize) -> Outcome {
    let (n, r, m) = (comm.world_size(), comm.rank(), case.block());
    let input: Vec<i32> = (0..n * m).map(|i| x(r, i, c)).collect();
    let root = (c + case.point) % n;
    let result = match case.call {
        Call::AllReduce => {
            let mut buf = input;
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).map(|()| compare(&buf, |i| sum(n, i, c)))
        }
        Call::Broadcast => {
            let mut buf = if r == root { (0..n * m).map(|i| x(root, i, c)).collect() } else { vec![-1; n * m] };
            comm.broadcast(&mut buf, root).map(|()| compare(&buf, |i| x(root, i, c)))
        }
        Call::AllGather => {
            let mut out = vec![-1; n * m];
            comm.all_gather(&input[..m], &mut out).map(|()| compare(&out, |i| x(i / m, i % m, c)))
        }
        Call::ReduceScatter => {
            let mut out = vec![-1; m];
            comm.reduce_scatter(&input, &mut out, ReduceOp::Sum).map(|()| compare(&out, |i| sum(n, r * m + i, c)))
        }
        Call::Reduce => {
            let mut out = if r == root { vec![-1; n * m] } else { Vec::new() };
            comm.reduce(&input, &mut out, ReduceOp::Sum, root).map(|()| compare(&out, |i| sum(n, i, c)))
        }
        Call::Barrier => comm.barrier().map(|()| Outcome::Ok),
        Call::AllToAll => {
            let mut out = vec![-1; n * m];
            comm.all_to_all(&input, &mut out).map(|()| compare(&out, |i| x(i / m, r * m + i % m, c)))
        }
        Call::SendRecv => {
            // A ring: even ranks send first, odd ones receive first, so no rank
            // waits on a peer that waits on it.
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let mut got = vec![-1; n * m];
            let r = if r % 2 == 0 {
                comm.send(&input, next).and_then(|()| comm.recv(&mut got, prev))
            } else {
                comm.recv(&mut got, prev).and_then(|()| comm.send(&input, next))
            };
            r.map(|()| compare(&got, |i| x(prev, i, c)))
        }
    };
    result.unwrap_or_else(Outcome::Err)
}

/// The case's communicators, the plan given to every rank.
fn communicators(case: &Case, plan: &FaultPlan) -> Result<Vec<Communicator>, String> {
    let world = case.world;
    let kind = match case.net {
        Net::InProc => {
            let mut cfg = Config::new(0, world);
            cfg.timeout = TIMEOUT;
            cfg.fault = Some(plan.clone());
            return Communicator::in_process_with(cfg).map_err(|e| format!("in-process communicators: {e}"));
        }
        Net::Tcp => TransportKind::Tcp,
        Net::Shm => TransportKind::Shm,
    };
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (store, plan) = (store.clone(), plan.clone());
            std::thread::spawn(move || {
                Communicator::builder(rank, world)
                    .store(store)
                    .socket_ifname("lo")
                    .transports(vec![kind])
                    .timeout(TIMEOUT)
                    // The probe's traffic would shift the frames the plan counts.
                    .tuner_probe(false)
                    .fault_plan(plan)
                    .build()
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().map_err(|_| "a builder panicked".to_string())?.map_err(|e| format!("build: {e}")))
        .collect()
}

/// Run the case on every rank, each in its own thread; each rank's outcomes, or
/// why they did not all come back.
fn run_ranks(case: &Case, comms: Vec<Communicator>) -> Result<Vec<Vec<Outcome>>, String> {
    let world = comms.len();
    let (tx, rx) = mpsc::channel();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|comm| {
            let (tx, case) = (tx.clone(), *case);
            std::thread::Builder::new()
                .name(format!("rank-{}", comm.rank()))
                .spawn(move || {
                    let rank = comm.rank();
                    let mut outcomes = Vec::new();
                    for c in 0..CALLS {
                        let o = run_call(&comm, &case, c);
                        let failed = matches!(o, Outcome::Err(_));
                        outcomes.push(o);
                        if failed {
                            break;
                        }
                    }
                    // Closing is part of the case: it must not hang either.
                    drop(comm);
                    let _ = tx.send((rank, outcomes));
                })
                .expect("spawn a rank thread")
        })
        .collect();
    drop(tx);
    let give_up = Instant::now() + HANG_BOUND;
    let mut results: Vec<Option<Vec<Outcome>>> = (0..world).map(|_| None).collect();
    let mut timed_out = false;
    while results.iter().any(Option::is_none) {
        let left = give_up.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((rank, o)) => results[rank] = Some(o),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
            // Every rank thread is gone: those that did not answer panicked.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let missing: Vec<usize> = (0..world).filter(|&r| results[r].is_none()).collect();
    if missing.is_empty() {
        return Ok(results.into_iter().map(|o| o.expect("every rank answered")).collect());
    }
    let (panicked, hung): (Vec<usize>, Vec<usize>) =
        missing.into_iter().partition(|&r| !timed_out || handles[r].is_finished());
    // Hung threads are left behind: the test fails anyway.
    Err(format!("ranks {panicked:?} panicked, ranks {hung:?} had not returned after {HANG_BOUND:?}"))
}

/// The ranks an error names as the cause.
fn named(e: &Error) -> Vec<usize> {
    match e {
        Error::Timeout { waiting_on, .. } => waiting_on.clone(),
        Error::PeerLost { peer, .. }
        | Error::PeerAborted { peer, .. }
        | Error::Protocol { peer, .. }
        | Error::Mismatch { peer, .. } => vec![*peer],
        _ => Vec::new(),
    }
}

/// The rank an error says reported it.
fn reporter(e: &Error) -> Option<usize> {
    match e {
        Error::Timeout { ctx, .. }
        | Error::PeerLost { ctx, .. }
        | Error::PeerAborted { ctx, .. }
        | Error::Protocol { ctx, .. }
        | Error::Mismatch { ctx, .. } => Some(ctx.rank),
        _ => None,
    }
}

/// Whether rank `at`'s error leads back to the faulty link `ends`. A peer's abort
/// passes on that peer's error: follow it, to an error seen first hand — a
/// deadline waiting on an end or on a rank that failed too (a stall holds up
/// everyone waiting on a waiting rank), a closed link to an end or to a failed
/// rank (a failing rank mid-frame closes instead of sending its abort), or a
/// protocol error between the two ends.
fn leads_to_fault(at: usize, errors: &[Option<&Error>], ends: [usize; 2], seen: &mut BTreeSet<usize>) -> bool {
    if !seen.insert(at) {
        return false;
    }
    let Some(e) = errors[at] else { return false };
    let known = |p: &usize| ends.contains(p) || errors[*p].is_some();
    match e {
        Error::PeerAborted { peer, .. } => leads_to_fault(*peer, errors, ends, seen),
        Error::Timeout { waiting_on, .. } => waiting_on.iter().any(known),
        Error::PeerLost { peer, .. } => known(peer),
        Error::Protocol { peer, .. } | Error::Mismatch { peer, .. } => ends.contains(&at) && ends.contains(peer),
        _ => false,
    }
}

/// Judge the outcomes of a case whose plan fired on the link to `fired` (or never).
fn judge(case: &Case, plan: &FaultPlan, results: &[Vec<Outcome>]) -> Result<(), String> {
    let mut errors: Vec<Option<&Error>> = vec![None; results.len()];
    for (rank, outcomes) in results.iter().enumerate() {
        for (c, o) in outcomes.iter().enumerate() {
            match o {
                Outcome::Ok => {}
                Outcome::Wrong(what) => return Err(format!("rank {rank}, call {c}: WRONG RESULT: {what}")),
                Outcome::Err(e) => errors[rank] = Some(e),
            }
        }
    }
    let show = |rank: usize| errors[rank].map_or("Ok".to_string(), |e| e.to_string());
    let Some(peer) = plan.fired() else {
        // The link carried fewer frames than the point: nothing may have failed.
        return match (0..results.len()).find(|&r| errors[r].is_some()) {
            None => Ok(()),
            Some(r) => Err(format!("the fault never acted, yet rank {r} failed: {}", show(r))),
        };
    };
    let rank = plan.rank();
    let ends = [rank, peer];
    for (r, e) in errors.iter().enumerate() {
        let Some(e) = e else { continue };
        if reporter(e) != Some(r) {
            return Err(format!("rank {r} returned an error of the wrong kind or naming another rank: {e}"));
        }
        let corrupt_kind = matches!(e, Error::Protocol { .. } | Error::Mismatch { .. });
        if corrupt_kind && case.fault != Fault::Corrupt {
            return Err(format!("rank {r}: a protocol error where no byte was corrupted: {e}"));
        }
        if !leads_to_fault(r, &errors, ends, &mut BTreeSet::new()) {
            return Err(format!("rank {r}'s error does not lead back to the faulty link {rank} -> {peer}: {e}"));
        }
    }
    match case.fault {
        Fault::Delay => {
            if let Some(r) = (0..results.len()).find(|&r| errors[r].is_some()) {
                return Err(format!("a delay inside the deadline failed rank {r}: {}", show(r)));
            }
        }
        Fault::Stall => {
            if errors[rank].is_none_or(|e| named(e).is_empty()) {
                return Err(format!("the stalled rank {rank} did not fail naming a peer: {}", show(rank)));
            }
            if !errors.iter().flatten().any(|e| matches!(e, Error::Timeout { .. })) {
                return Err("a stall was reported without any rank waiting out its deadline".into());
            }
        }
        Fault::Cut => {
            if !errors[rank].is_some_and(|e| named(e).contains(&peer)) {
                return Err(format!("rank {rank} cut its link to {peer} but does not name it: {}", show(rank)));
            }
        }
        Fault::Corrupt => {
            let direct = errors[peer]
                .is_some_and(|e| matches!(e, Error::Protocol { .. } | Error::Mismatch { .. }) && named(e) == [rank]);
            if !direct {
                return Err(format!(
                    "rank {peer} received a corrupted header from rank {rank} but did not report it: {}",
                    show(peer)
                ));
            }
        }
    }
    Ok(())
}

/// Run one case: whether the fault acted, and what went wrong if anything did.
fn run_case(case: &Case) -> (bool, Option<String>) {
    let plan = case.plan();
    let verdict = communicators(case, &plan)
        .and_then(|comms| run_ranks(case, comms))
        .and_then(|results| judge(case, &plan, &results).map_err(|e| format!("{e} [{}]", summary(&results))));
    let failure = verdict.err().map(|e| format!("{} ({plan:?}): {e}", case.name()));
    (plan.fired().is_some(), failure)
}

/// Each rank's last outcome, in one line.
fn summary(results: &[Vec<Outcome>]) -> String {
    let each = results.iter().enumerate().map(|(r, o)| match o.last() {
        Some(Outcome::Err(e)) => format!("rank {r}: {e}"),
        Some(Outcome::Wrong(w)) => format!("rank {r}: wrong: {w}"),
        _ => format!("rank {r}: ok"),
    });
    each.collect::<Vec<_>>().join("; ")
}

/// The full grid over one transport.
fn full_grid(net: Net) -> Vec<Case> {
    let mut cases = Vec::new();
    for world in 2..=8 {
        for call in CALLS_ALL {
            for fault in FAULTS {
                for point in 0..3 {
                    cases.push(Case { net, world, call, fault, point });
                }
            }
        }
    }
    cases
}

/// What `BRAID_FAULT_GRID` asks for.
enum Mode {
    /// Unset, empty or `sample`.
    Sample,
    /// `full`.
    Full,
    /// Anything else: the cases whose name contains it.
    Filter(String),
}

fn mode() -> Mode {
    match std::env::var("BRAID_FAULT_GRID").unwrap_or_default().as_str() {
        "" | "sample" => Mode::Sample,
        "full" => Mode::Full,
        filter => Mode::Filter(filter.to_string()),
    }
}

/// The cases to run over `net`, in groups whose cases after the first run only
/// while the fault has not acted: a deterministic sample covering every call x
/// fault (world size and first point drawn from a hash of them; a point whose
/// link carries too few frames under the algorithm the tuner picks gives way to
/// the next), the full grid, or the full grid's cases whose name contains the filter.
fn selected(net: Net) -> Vec<Vec<Case>> {
    let all = full_grid(net);
    match mode() {
        Mode::Full => all.into_iter().map(|c| vec![c]).collect(),
        Mode::Filter(filter) => all.into_iter().filter(|c| c.name().contains(&filter)).map(|c| vec![c]).collect(),
        Mode::Sample => {
            let mut groups = Vec::new();
            for (i, call) in CALLS_ALL.into_iter().enumerate() {
                for (j, fault) in FAULTS.into_iter().enumerate() {
                    // An odd multiplier mixes the indices so every world size and point shows up.
                    let h = (net as usize * 97 + i * 31 + j * 7).wrapping_mul(0x9e37_79b9) >> 7;
                    let world = 2 + h % 7;
                    groups.push((0..3).map(|k| Case { net, world, call, fault, point: (h / 7 + k) % 3 }).collect());
                }
            }
            groups
        }
    }
}

/// Cases run and cases whose fault acted.
#[derive(Default)]
struct Counts {
    ran: AtomicUsize,
    acted: AtomicUsize,
}

/// Run a group's cases until one's fault acts, recording which call x fault acted
/// and every failure.
fn run_group(group: &[Case], fired: &Mutex<BTreeSet<(usize, usize)>>, failures: &Mutex<Vec<String>>, n: &Counts) {
    for case in group {
        let (acted, failure) = run_case(case);
        n.ran.fetch_add(1, Ordering::Relaxed);
        n.acted.fetch_add(acted as usize, Ordering::Relaxed);
        if let Some(f) = failure {
            eprintln!("FAILED {f}");
            failures.lock().unwrap().push(f);
        }
        if acted {
            fired.lock().unwrap().insert((case.call as usize, case.fault as usize));
            break;
        }
    }
}

fn grid(net: Net) {
    let groups = selected(net);
    let jobs = std::env::var("BRAID_FAULT_GRID_JOBS").ok().and_then(|j| j.parse().ok()).unwrap_or(1usize).max(1);
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let fired = Mutex::new(BTreeSet::new());
    let counts = Counts::default();
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                while let Some(group) = groups.get(next.fetch_add(1, Ordering::Relaxed)) {
                    run_group(group, &fired, &failures, &counts);
                }
            });
        }
    });
    let (failures, fired) = (failures.into_inner().unwrap(), fired.into_inner().unwrap());
    let (n, acted, took) = (counts.ran.into_inner(), counts.acted.into_inner(), started.elapsed());
    println!(
        "{net:?}: {n} cases in {took:?}, the fault acted in {acted}, {} failed; {} call x fault pairs acted",
        failures.len(),
        fired.len()
    );
    assert!(failures.is_empty(), "{} of {n} cases failed:\n{}", failures.len(), failures.join("\n"));
    // A grid whose faults never act tests nothing: each call meets each fault.
    let all = !matches!(mode(), Mode::Filter(_));
    for (call, fault) in CALLS_ALL.iter().flat_map(|c| FAULTS.iter().map(move |f| (*c, *f))) {
        let acted = fired.contains(&(call as usize, fault as usize));
        assert!(acted || !all, "{net:?}: no {fault:?} ever acted under {}", call.name());
    }
}

#[test]
fn fault_grid_inproc() {
    grid(Net::InProc);
}

#[test]
fn fault_grid_shm() {
    grid(Net::Shm);
}

#[test]
fn fault_grid_tcp() {
    grid(Net::Tcp);
}

/// The sample is not empty, covers every call and fault once per transport, and
/// every world size and point over the three transports.
#[test]
fn the_sample_covers_every_call_fault_world_size_and_point() {
    if !matches!(mode(), Mode::Sample) {
        return;
    }
    let cases: Vec<Case> = [Net::InProc, Net::Shm, Net::Tcp].into_iter().flat_map(selected).map(|g| g[0]).collect();
    assert_eq!(cases.len(), 3 * CALLS_ALL.len() * FAULTS.len());
    let worlds: BTreeSet<usize> = cases.iter().map(|c| c.world).collect();
    let points: BTreeSet<usize> = cases.iter().map(|c| c.point).collect();
    assert_eq!(worlds, (2..=8).collect(), "world sizes in the sample");
    assert_eq!(points, (0..3).collect(), "points in the sample");
}
