//! `braid doctor` names the rank that broke a job from the ranks' flight records
//! alone: a rank stopped with SIGSTOP during an all-reduce, one that skips a
//! broadcast, one that calls all-gather where the others call all-reduce, and one
//! killed with SIGKILL; 4 ranks of `braid drill`, over shared memory and TCP.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use braid::bootstrap::TcpStoreServer;
use braid::JobKey;
use common::bounded::{rank_command, run_bounded, spawn_group, wait_bounded, without_braid_env, Ranks};
use common::hosts::die_with_parent;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const KEY: &str = "doctor-test-key";
const WORLD: usize = 4;
/// The rank that misbehaves in every case.
const CULPRIT: usize = 2;
/// Bounds on a loaded machine, not speed targets: connecting and a first call; the
/// others' failure after the culprit misbehaves (`BRAID_TIMEOUT` is 2 s).
const START_BOUND: Duration = Duration::from_secs(60);
const FAIL_BOUND: Duration = Duration::from_secs(40);

/// A fresh trace directory for one case, removed when the case passes.
struct TraceDir(PathBuf);

impl TraceDir {
    fn new(case: &str, transport: &str) -> TraceDir {
        let dir = std::env::temp_dir().join(format!("braid-doctor-{case}-{transport}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TraceDir(dir)
    }
}

/// Start the 4 ranks of `braid drill ARGS` writing records into `dir`.
fn start(transport: &str, dir: &Path, args: &[&str]) -> (Ranks, TcpStoreServer) {
    let server = TcpStoreServer::bind("127.0.0.1:0", JobKey::from_text(KEY)).unwrap();
    let store = format!("tcp://{}", server.local_addr());
    let ranks = (0..WORLD)
        .map(|rank| {
            let args: Vec<&str> = ["drill"].into_iter().chain(args.iter().copied()).collect();
            let mut cmd = rank_command(BRAID, &args, (rank, WORLD), &store, KEY);
            cmd.env("BRAID_TIMEOUT", "2").env("BRAID_TRANSPORTS", transport).env("BRAID_TRACE_DIR", dir);
            Some(spawn_group(die_with_parent(&mut cmd)))
        })
        .collect();
    (Ranks(ranks), server)
}

/// Wait until rank 0 says the job runs (every rank connected, a call done).
fn wait_running(ranks: &mut Ranks, what: &str) {
    let out = ranks.0[0].as_mut().unwrap().stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains("running") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(START_BOUND).unwrap_or_else(|_| panic!("{what}: rank 0 never ran a call"));
}

/// Wait for every rank but `except` to end, each with a failure.
fn others_fail(ranks: &mut Ranks, except: Option<usize>, what: &str) {
    for rank in (0..WORLD).filter(|&r| Some(r) != except) {
        let o = wait_bounded(ranks.0[rank].take().unwrap(), FAIL_BOUND);
        let status = o.status.unwrap_or_else(|| panic!("{what}: rank {rank} still running: {}", o.dump()));
        assert!(!status.success(), "{what}: rank {rank} must fail: {}", o.dump());
    }
}

/// Run `braid doctor` on `dir`: it must exit 1 and its culprit line must name
/// rank 2 and contain every one of `words`. The doctor's output.
fn doctor_names_culprit(dir: &TraceDir, words: &[&str], what: &str) -> String {
    let mut cmd = Command::new(BRAID);
    let o = run_bounded(without_braid_env(&mut cmd).arg("doctor").arg(&dir.0), Duration::from_secs(30));
    let files: Vec<String> = std::fs::read_dir(&dir.0)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert_eq!(o.status.and_then(|s| s.code()), Some(1), "{what}: doctor must find a fault ({files:?}): {}", o.dump());
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("culprit: "))
        .unwrap_or_else(|| panic!("{what}: no culprit line ({files:?}): {}", o.dump()));
    assert!(line.starts_with(&format!("culprit: rank {CULPRIT}")), "{what}: wrong culprit: {}", o.dump());
    for w in words {
        assert!(line.contains(w), "{what}: the culprit line lacks `{w}`: {}", o.dump());
    }
    let _ = std::fs::remove_dir_all(&dir.0);
    o.stdout
}

fn stopped_rank(transport: &str) {
    let what = format!("SIGSTOP over {transport}");
    let dir = TraceDir::new("stop", transport);
    let (mut ranks, _server) = start(transport, &dir.0, &["--calls", "all-reduce", "--repeat", "1000000"]);
    wait_running(&mut ranks, &what);
    let stopped = ranks.0[CULPRIT].as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on a child this test started.
    assert_eq!(unsafe { libc::kill(stopped, libc::SIGSTOP) }, 0);
    others_fail(&mut ranks, Some(CULPRIT), &what);
    let out = doctor_names_culprit(&dir, &["all-reduce #", "stopped or hung"], &what);
    assert!(out.contains(&format!("rank {CULPRIT}: no record")), "{what}: {out}");
}

fn killed_rank(transport: &str) {
    let what = format!("SIGKILL over {transport}");
    let dir = TraceDir::new("kill", transport);
    let (mut ranks, _server) = start(transport, &dir.0, &["--calls", "all-reduce", "--repeat", "1000000"]);
    wait_running(&mut ranks, &what);
    let mut victim = ranks.0[CULPRIT].take().unwrap();
    victim.kill().unwrap();
    victim.wait().unwrap();
    others_fail(&mut ranks, Some(CULPRIT), &what);
    doctor_names_culprit(&dir, &["died", "all-reduce #"], &what);
}

fn skipped_broadcast(transport: &str) {
    let what = format!("skipped broadcast over {transport}");
    let dir = TraceDir::new("skip", transport);
    let skip = format!("{CULPRIT}:3");
    let args = ["--calls", "all-reduce,broadcast", "--repeat", "3", "--skip", &skip];
    let (mut ranks, _server) = start(transport, &dir.0, &args);
    others_fail(&mut ranks, None, &what);
    // Call 3 is the second pass's broadcast: sequence number 3 on every rank.
    doctor_names_culprit(&dir, &["broadcast", "#3", "all-reduce"], &what);
}

fn different_collective(transport: &str) {
    let what = format!("all-gather for all-reduce over {transport}");
    let dir = TraceDir::new("replace", transport);
    let replace = format!("{CULPRIT}:2:all-gather");
    let args = ["--calls", "all-reduce", "--repeat", "4", "--replace", &replace];
    let (mut ranks, _server) = start(transport, &dir.0, &args);
    others_fail(&mut ranks, None, &what);
    doctor_names_culprit(&dir, &["all-gather", "#2", "all-reduce"], &what);
}

#[test]
fn doctor_names_a_stopped_rank_shm() {
    stopped_rank("shm");
}

#[test]
fn doctor_names_a_stopped_rank_tcp() {
    stopped_rank("tcp");
}

#[test]
fn doctor_names_a_killed_rank_shm() {
    killed_rank("shm");
}

#[test]
fn doctor_names_a_killed_rank_tcp() {
    killed_rank("tcp");
}

#[test]
fn doctor_names_a_rank_that_skipped_a_broadcast_shm() {
    skipped_broadcast("shm");
}

#[test]
fn doctor_names_a_rank_that_skipped_a_broadcast_tcp() {
    skipped_broadcast("tcp");
}

#[test]
fn doctor_names_a_rank_that_called_another_collective_shm() {
    different_collective("shm");
}

#[test]
fn doctor_names_a_rank_that_called_another_collective_tcp() {
    different_collective("tcp");
}

/// Wait (bounded) for `path` to hold a record, and parse it.
fn record_at(path: &Path, what: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + FAIL_BOUND;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
        }
        assert!(std::time::Instant::now() < deadline, "{what}: no record at {}", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGUSR1 has a rank write its record and go on; SIGTERM has it write its record
/// and end as SIGTERM ends a process.
#[test]
fn signals_write_records() {
    use std::os::unix::process::ExitStatusExt;
    let dir = TraceDir::new("signals", "shm");
    let (mut ranks, _server) = start("shm", &dir.0, &["--calls", "all-reduce", "--repeat", "1000000"]);
    wait_running(&mut ranks, "signals");
    let file = |rank: usize| {
        std::fs::read_dir(&dir.0)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(&format!("-rank{rank}.json")))
    };
    let pids: Vec<i32> = ranks.0.iter().map(|c| c.as_ref().unwrap().id() as i32).collect();
    // SAFETY: kill(2) on children this test started.
    assert_eq!(unsafe { libc::kill(pids[1], libc::SIGUSR1) }, 0);
    let deadline = std::time::Instant::now() + FAIL_BOUND;
    let path = loop {
        if let Some(p) = file(1) {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "SIGUSR1: no record from rank 1");
        std::thread::sleep(Duration::from_millis(50));
    };
    let v = record_at(&path, "SIGUSR1");
    assert_eq!((v["rank"].as_u64(), v["reason"].as_str()), (Some(1), Some("signal SIGUSR1")));
    assert!(v["calls"].as_array().is_some_and(|c| !c.is_empty()), "{v}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(ranks.0[1].as_mut().unwrap().try_wait().unwrap().is_none(), "SIGUSR1 must not end the rank");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pids[3], libc::SIGTERM) }, 0);
    let o = wait_bounded(ranks.0[3].take().unwrap(), FAIL_BOUND);
    assert_eq!(o.status.and_then(|s| s.signal()), Some(libc::SIGTERM), "{}", o.dump());
    let v = record_at(&file(3).expect("a record from rank 3"), "SIGTERM");
    assert_eq!((v["rank"].as_u64(), v["reason"].as_str()), (Some(3), Some("signal SIGTERM")));
    drop(ranks);
    let _ = std::fs::remove_dir_all(&dir.0);
}

/// SIGINT (a ^C at the launcher) and SIGHUP (a lost terminal) write the record and
/// end the rank as the signal does. One job each: the first rank to die takes the
/// others' calls down with it.
#[test]
fn interrupts_and_hangups_write_records() {
    use std::os::unix::process::ExitStatusExt;
    for (rank, sig, name) in [(0, libc::SIGINT, "SIGINT"), (2, libc::SIGHUP, "SIGHUP")] {
        let dir = TraceDir::new(name, "shm");
        let (mut ranks, _server) = start("shm", &dir.0, &["--calls", "all-reduce", "--repeat", "1000000"]);
        wait_running(&mut ranks, name);
        let pid = ranks.0[rank].as_ref().unwrap().id() as i32;
        // SAFETY: kill(2) on a child this test started.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        let o = wait_bounded(ranks.0[rank].take().unwrap(), FAIL_BOUND);
        assert_eq!(o.status.and_then(|s| s.signal()), Some(sig), "{name}: {}", o.dump());
        let path = std::fs::read_dir(&dir.0)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(&format!("-rank{rank}.json")))
            .unwrap_or_else(|| panic!("{name}: a record from rank {rank}"));
        let v = record_at(&path, name);
        let reason = format!("signal {name}");
        assert_eq!((v["rank"].as_u64(), v["reason"].as_str()), (Some(rank as u64), Some(reason.as_str())));
        drop(ranks);
        let _ = std::fs::remove_dir_all(&dir.0);
    }
}
