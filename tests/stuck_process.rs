//! A rank process stopped with SIGSTOP in the middle of a ring all-reduce (its
//! links stay open, it reads nothing) is named by every other rank as the end of
//! the chain of waits, over shared memory and TCP: a rank whose ring neighbour
//! waits for the stopped one reports that chain, not the live neighbour alone.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use braid::bootstrap::TcpStoreServer;
use braid::JobKey;
use common::bounded::{spawn_group, wait_bounded, Ranks};
use common::hosts::die_with_parent;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const KEY: &str = "stuck-process-test-key";
const WORLD: usize = 4;
const STOPPED: usize = 3;
/// For the ranks to connect and finish their first size (bootstrap included).
const START_BOUND: Duration = Duration::from_secs(60);
/// Hang bound once the rank is stopped: `BRAID_TIMEOUT` (2 s), the asking window
/// and a loaded machine's slack. Not a speed target.
const FAIL_BOUND: Duration = Duration::from_secs(30);

/// Whether every "did not answer" in `text` is said of rank `r` (at the end of a
/// chain, "..., which waits for rank r, which did not answer", or directly), and
/// there is at least one.
fn names_silent_rank(text: &str, r: usize) -> bool {
    let mut found = false;
    for (at, _) in text.match_indices("did not answer (stopped") {
        let before = &text[..at];
        if !(before.ends_with(&format!("rank {r} ")) || before.ends_with(&format!("rank {r}, which "))) {
            return false;
        }
        found = true;
    }
    found
}

fn stopped_rank_in_a_ring(transport: &str) {
    let server = TcpStoreServer::bind("127.0.0.1:0", JobKey::from_text(KEY)).unwrap();
    let store = format!("tcp://{}", server.local_addr());
    let mut ranks = Ranks(
        (0..WORLD)
            .map(|rank| {
                let mut cmd = Command::new(BRAID);
                cmd.args(["perf", "--op", "all-reduce", "--algo", "ring", "-b", "4K", "-e", "64M", "-n", "200"])
                    .env("BRAID_RANK", rank.to_string())
                    .env("BRAID_WORLD_SIZE", WORLD.to_string())
                    .env("BRAID_STORE", &store)
                    .env("BRAID_JOB_KEY", KEY)
                    .env("BRAID_TIMEOUT", "2")
                    .env("BRAID_TRANSPORTS", transport);
                Some(spawn_group(die_with_parent(&mut cmd)))
            })
            .collect(),
    );
    // Stop the rank once the sweep is under way: rank 0 printed its first row.
    let out = ranks.0[0].as_mut().unwrap().stdout.take().unwrap();
    let (row_tx, row_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.split_whitespace().next().is_some_and(|w| w.parse::<u64>().is_ok()) {
                let _ = row_tx.send(());
            }
        }
    });
    row_rx.recv_timeout(START_BOUND).unwrap_or_else(|_| panic!("{transport}: no row from rank 0"));
    let stopped = ranks.0[STOPPED].as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on a child this test started.
    assert_eq!(unsafe { libc::kill(stopped, libc::SIGSTOP) }, 0);
    for rank in (0..WORLD).filter(|&r| r != STOPPED) {
        let o = wait_bounded(ranks.0[rank].take().unwrap(), FAIL_BOUND);
        let status = o.status.unwrap_or_else(|| panic!("{transport}: rank {rank} still running: {}", o.dump()));
        assert!(!status.success(), "{transport}: rank {rank} must fail: {}", o.dump());
        assert!(o.stderr.contains("timed out after 2s"), "{transport}: rank {rank}: {}", o.dump());
        assert!(names_silent_rank(&o.stderr, STOPPED), "{transport}: rank {rank} must name rank 3: {}", o.dump());
    }
}

#[test]
fn a_stopped_rank_is_named_at_the_end_of_the_chain_shm() {
    stopped_rank_in_a_ring("shm");
}

#[test]
fn a_stopped_rank_is_named_at_the_end_of_the_chain_tcp() {
    stopped_rank_in_a_ring("tcp");
}
