//! Survivors of lost ranks agree and shrink (issue 38, item 3): over in-process,
//! shared-memory and TCP links, at 3 to 8 ranks, one or two ranks gone before a
//! call, dying inside it at a chosen byte, or gone after it, and processes killed
//! with SIGKILL in the middle of a stream of calls. The shrunk communicator must
//! sum exactly.

mod common;

use std::time::{Duration, Instant};

use braid::algorithm::Algorithm;
use braid::fault::{FaultAction, FaultPlan, FaultPoint};
use braid::{Agreement, ReduceOp};
use common::bounded::{rank_command, spawn_group, wait_bounded};
use common::{comms, comms_with_fault, on_ranks, Net};

/// When the lost ranks go.
#[derive(Clone, Copy, Debug)]
enum Phase {
    /// They never enter call 2: the others are in it, waiting for them.
    Before,
    /// They die inside call 2, at byte 64 of its first frame (`FaultAction::Vanish`:
    /// every link of theirs ends without a word, as a killed process's would).
    During,
    /// They finish call 2 and go: the others' call 3 fails.
    After,
}

/// What a survivor saw: its old rank, the agreement, its new rank and world, the sum.
type Seen = Option<(usize, Agreement, usize, usize, Vec<i64>)>;

fn lose_and_shrink(net: Net, world: usize, lost: &[usize], phase: Phase) {
    let started = Instant::now();
    let lost_list = lost.to_vec();
    let timeout = Duration::from_secs(10);
    let plans = vanish_in_second_call(world, lost);
    let group = match phase {
        Phase::During => {
            let mut all = plans.iter().cloned();
            let first = all.next().expect("a lost rank");
            comms_with_fault(net, world, timeout, all.try_fold(first, |a, p| a.and(p)).unwrap())
        }
        _ => comms(net, world, timeout),
    };
    let seen: Vec<Seen> = on_ranks(group, move |comm| {
        let rank = comm.rank();
        let gone = lost_list.contains(&rank);
        // A ring sends its first frame of a call before it waits for anything, so
        // both lost ranks reach their point whatever the other did.
        if matches!(phase, Phase::During) {
            comm.set_algorithm(Some(Algorithm::Ring));
        }
        let mut v = vec![rank as i64 + 1; 17];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        if gone && matches!(phase, Phase::Before) {
            return None;
        }
        let mut v = vec![rank as i64 + 1; 4099];
        let second = comm.all_reduce_in_place(&mut v, ReduceOp::Sum);
        if gone {
            match phase {
                Phase::During => assert!(second.is_err(), "rank {rank} vanished inside call 2"),
                _ => second.unwrap(),
            }
            return None;
        }
        comm.set_algorithm(None);
        if matches!(phase, Phase::After) && second.is_ok() {
            let mut v = vec![rank as i64 + 1; 17];
            assert!(comm.all_reduce_in_place(&mut v, ReduceOp::Sum).is_err(), "rank {rank}: a call with gone peers");
        }
        let agreement = comm.agree().unwrap();
        let small = comm.shrink_to(&agreement).unwrap();
        let mut v = vec![rank as i64 + 1; 1001];
        small.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        Some((rank, agreement, small.rank(), small.world_size(), v))
    });
    let survivors: Vec<usize> = (0..world).filter(|r| !lost.contains(r)).collect();
    let what = format!("{net:?}, {world} ranks, lost {lost:?} {phase:?}");
    if let Phase::During = phase {
        // Proof that each died where it was told: inside call 2.
        for (p, r) in plans.iter().zip(lost) {
            assert!(p.fired().is_some(), "{what}: rank {r}'s fault never acted");
        }
    }
    let want: i64 = survivors.iter().map(|&r| r as i64 + 1).sum();
    let mut agreements = Vec::new();
    for s in seen.into_iter().flatten() {
        let (old, agreement, new_rank, new_world, v) = s;
        assert_eq!(agreement.live, survivors, "{what}: rank {old}");
        assert_eq!(new_world, survivors.len(), "{what}");
        assert_eq!(survivors[new_rank], old, "{what}: new ranks follow the old order");
        assert!(v.iter().all(|&x| x == want), "{what}: rank {old} summed {} not {want}", v[0]);
        agreements.push(agreement);
    }
    assert_eq!(agreements.len(), survivors.len(), "{what}");
    // One agreement: the same call count everywhere, and at least the first call.
    assert!(agreements.windows(2).all(|w| w[0] == w[1]), "{what}: {agreements:?}");
    assert!(agreements[0].completed_calls >= 1, "{what}: {agreements:?}");
    // Nobody waits for the deadline: every lost rank is seen by its peers' links,
    // a goodbye left unread behind other frames included.
    let spent = started.elapsed();
    assert!(spent < timeout / 2, "{what}: took {spent:?}");
}

/// Each lost rank vanishes at byte 64 of its first frame of call 2: a ring
/// all-reduce sends 2 (n - 1) frames a call, all on one link.
fn vanish_in_second_call(world: usize, lost: &[usize]) -> Vec<FaultPlan> {
    let point = FaultPoint { peer: None, frame: 2 * (world as u64 - 1), offset: FaultPlan::HEADER_BYTES + 64 };
    lost.iter().map(|&r| FaultPlan::new(r, point, FaultAction::Vanish).unwrap()).collect()
}

fn grid(net: Net) {
    for world in [3, 5, 8] {
        for lost in [vec![world - 1], vec![1, world - 2]] {
            if lost.len() + 1 >= world {
                continue;
            }
            for phase in [Phase::Before, Phase::During, Phase::After] {
                lose_and_shrink(net, world, &lost, phase);
            }
        }
    }
}

#[test]
fn survivors_shrink_and_sum_exactly_inproc() {
    grid(Net::InProc);
}

#[test]
fn survivors_shrink_and_sum_exactly_shm() {
    grid(Net::Shm);
}

#[test]
fn survivors_shrink_and_sum_exactly_tcp() {
    grid(Net::Tcp);
}

/// Every rank alive: agreeing lists everyone, and the shrunk communicator is the
/// whole group again with a new id.
#[test]
fn agreeing_without_a_failure_keeps_everyone() {
    let out = on_ranks(comms(Net::InProc, 4, Duration::from_secs(20)), |comm| {
        let mut v = vec![1i32; 5];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        let a = comm.agree().unwrap();
        let again = comm.shrink().unwrap();
        let mut v = vec![comm.rank() as i32; 5];
        again.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        (a, again.rank(), again.id() != comm.id(), v[0])
    });
    for (rank, (a, new_rank, new_id, sum)) in out.into_iter().enumerate() {
        assert_eq!(a, Agreement { round: 0, live: vec![0, 1, 2, 3], completed_calls: 1 });
        assert_eq!((new_rank, new_id, sum), (rank, true, 6));
    }
}

/// Real processes over `transport`, meeting at a file store (which outlives any of
/// them): rank `victim` is killed with SIGKILL while every rank runs a stream of
/// 4 MiB all-reduces; the others shrink (`braid drill --shrink`) and sum exactly.
fn kill_mid_stream(transport: &str, world: usize, victims: &[usize]) {
    let dir = std::env::temp_dir().join(format!("braid-shrink-{transport}-{}-{world}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("file://{}", dir.display());
    let args = ["drill", "--calls", "all-reduce", "--repeat", "100000", "--count", "1048576", "--shrink"];
    let mut children: Vec<_> = (0..world)
        .map(|rank| {
            let mut cmd = rank_command(env!("CARGO_BIN_EXE_braid"), &args, (rank, world), &store, "shrink-test");
            cmd.env("BRAID_TRANSPORTS", transport).env("BRAID_TIMEOUT", "30");
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            Some(spawn_group(&mut cmd))
        })
        .collect();
    // Let the calls run, then kill the victim in the middle of them.
    std::thread::sleep(Duration::from_millis(1500));
    let killed: Vec<_> = victims.iter().map(|&v| children[v].take().unwrap()).collect();
    for child in &killed {
        common::bounded::signal_group(child, libc::SIGKILL);
    }
    for child in killed {
        let _ = wait_bounded(child, Duration::from_secs(10));
    }
    let what = format!("{transport}, {world} processes, ranks {victims:?} killed");
    for (rank, child) in children.into_iter().enumerate() {
        let Some(child) = child else { continue };
        let out = wait_bounded(child, Duration::from_secs(60));
        assert!(out.ok(), "{what}: rank {rank}:\n{}", out.dump());
        let text = out.dump();
        let live: Vec<String> = (0..world).filter(|r| !victims.contains(r)).map(|r| r.to_string()).collect();
        let expected = format!("shrunk to {} ranks [{}]", live.len(), live.join(", "));
        assert!(text.contains(&expected), "{what}: rank {rank}:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_process_killed_mid_stream_is_left_behind_shm() {
    kill_mid_stream("shm", 4, &[2]);
}

#[test]
fn two_processes_killed_mid_stream_are_left_behind_shm() {
    kill_mid_stream("shm", 5, &[1, 3]);
}

#[test]
fn a_process_killed_mid_stream_is_left_behind_tcp() {
    kill_mid_stream("tcp", 3, &[0]);
}

#[test]
fn two_processes_killed_mid_stream_are_left_behind_tcp() {
    kill_mid_stream("tcp", 5, &[0, 4]);
}

/// A rank that fails during the agreement itself: rank 3 is gone before call 2;
/// rank 2 agrees (so the decision lists it) and then goes before the shrunk
/// communicator forms. Forming fails at the deadline, and a second shrink leaves
/// rank 2 out too: the last two agree, never wait past two deadlines, and sum.
fn fail_while_agreeing(net: Net) {
    let timeout = Duration::from_secs(2);
    let started = Instant::now();
    let out = on_ranks(comms(net, 4, timeout), move |comm| {
        let rank = comm.rank();
        let mut v = vec![rank as i64 + 1; 9];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        if rank == 3 {
            return None;
        }
        assert!(comm.all_reduce_in_place(&mut v, ReduceOp::Sum).is_err());
        let first = comm.agree().unwrap();
        assert_eq!(first.live, vec![0, 1, 2], "rank {rank}");
        if rank == 2 {
            return None;
        }
        let formed = comm.shrink_to(&first);
        assert!(formed.is_err(), "rank {rank}: a communicator formed without rank 2");
        let second = comm.agree().unwrap();
        let small = comm.shrink_to(&second).unwrap();
        let mut v = vec![rank as i64 + 1; 1001];
        small.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        Some((second, v[0]))
    });
    let spent = started.elapsed();
    let survivors: Vec<_> = out.into_iter().flatten().collect();
    assert_eq!(survivors.len(), 2, "{net:?}");
    for (second, sum) in survivors {
        assert_eq!((second.round, second.live, sum), (1, vec![0, 1], 3), "{net:?}");
    }
    assert!(spent < 2 * timeout + Duration::from_secs(8), "{net:?}: took {spent:?}");
}

#[test]
fn a_rank_lost_while_agreeing_is_left_out_by_the_next_shrink_shm() {
    fail_while_agreeing(Net::Shm);
}

#[test]
fn a_rank_lost_while_agreeing_is_left_out_by_the_next_shrink_tcp() {
    fail_while_agreeing(Net::Tcp);
}
