use super::*;
use crate::bootstrap::MemStore;
use crate::{Communicator, ReduceOp};

/// Run agreement 0 over `store` for each `(rank, completed, lost)` on its own thread.
fn agree_all(
    store: &Arc<MemStore>,
    world: usize,
    ranks: Vec<(usize, u64, Vec<usize>)>,
    timeout: Duration,
) -> Vec<Result<Agreement>> {
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|(rank, completed, lost)| {
            let store = store.clone();
            std::thread::spawn(move || {
                let p = Proposer { rank, world, completed, lost: &lost, round: 0, gone: &|_| false };
                agree_through(store.as_ref(), "job/agree0", p, timeout)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("agreement thread")).collect()
}

#[test]
fn every_rank_present_agrees_on_all_and_the_fewest_completed_calls() {
    let store = Arc::new(MemStore::new());
    let got = agree_all(&store, 4, (0..4).map(|r| (r, 10 + r as u64, vec![])).collect(), Duration::from_secs(10));
    for a in got {
        assert_eq!(a.unwrap(), Agreement { round: 0, live: vec![0, 1, 2, 3], completed_calls: 10 });
    }
}

#[test]
fn a_rank_reported_dead_is_left_out_without_waiting_for_the_timeout() {
    let store = Arc::new(MemStore::new());
    let start = Instant::now();
    // Rank 2 never comes; rank 1 saw its link end.
    let got = agree_all(&store, 4, vec![(0, 5, vec![]), (1, 4, vec![2]), (3, 5, vec![])], Duration::from_secs(30));
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    for a in got {
        assert_eq!(a.unwrap(), Agreement { round: 0, live: vec![0, 1, 3], completed_calls: 4 });
    }
}

#[test]
fn a_rank_nobody_reported_is_left_out_at_the_timeout_by_everyone_alike() {
    let store = Arc::new(MemStore::new());
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let got = agree_all(&store, 3, vec![(0, 7, vec![]), (2, 7, vec![])], timeout);
    let spent = start.elapsed();
    assert!(spent >= timeout && spent < timeout * 10, "took {spent:?}");
    for a in got {
        assert_eq!(a.unwrap().live, vec![0, 2]);
    }
}

#[test]
fn a_rank_arriving_after_the_decision_reads_it_and_is_not_in_it() {
    let store = Arc::new(MemStore::new());
    let first = agree_all(&store, 3, vec![(0, 1, vec![2]), (1, 1, vec![])], Duration::from_secs(10));
    assert_eq!(first[0].as_ref().unwrap().live, vec![0, 1]);
    // Rank 2 was only slow: it gets the same decision, which does not list it.
    let late = agree_all(&store, 3, vec![(2, 1, vec![])], Duration::from_secs(10));
    assert_eq!(late[0].as_ref().unwrap().live, vec![0, 1]);
}

#[test]
fn a_forged_decision_is_refused_not_trusted() {
    for bad in ["v1;3;0,0", "v1;3;5", "v1;x;0", "v2;1;0", "v1;1;", "\u{ff}"] {
        let e = parse_decision(bad.as_bytes(), 0, 4, 0).unwrap_err();
        assert!(matches!(e, Error::Store(_)), "{bad}: {e}");
    }
    assert_eq!(parse_decision(b"v1;3;0,2", 1, 4, 0).unwrap().live, vec![0, 2]);
}

/// Four threads; rank 2 leaves after two all-reduces (its communicator is dropped,
/// as a killed process's links end). The rest fail their third call, shrink, and
/// the three-rank communicator sums exactly.
#[test]
fn in_process_survivors_shrink_and_go_on() {
    let mut cfg = crate::config::Config::new(0, 4);
    cfg.timeout = Duration::from_secs(20);
    let comms = Communicator::in_process_with(cfg).unwrap();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|comm| {
            std::thread::spawn(move || -> Option<(usize, Agreement, Vec<i64>)> {
                let rank = comm.rank();
                for _ in 0..2 {
                    let mut v = vec![rank as i64 + 1; 33];
                    comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    assert_eq!(v, vec![10; 33]);
                }
                if rank == 2 {
                    drop(comm);
                    return None;
                }
                let mut v = vec![rank as i64 + 1; 33];
                let failed = comm.all_reduce_in_place(&mut v, ReduceOp::Sum);
                assert!(failed.is_err(), "rank {rank}: a call with a gone peer succeeded");
                let a = comm.agree().unwrap();
                let small = comm.shrink_to(&a).unwrap();
                let mut v = vec![rank as i64 + 1; 1001];
                small.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                Some((small.rank(), a, v))
            })
        })
        .collect();
    let mut new_ranks = Vec::new();
    for h in handles {
        if let Some((new_rank, a, v)) = h.join().expect("rank thread") {
            // Ranks 0, 1 and 3 remain (1 + 2 + 4); two calls completed everywhere.
            assert_eq!(a, Agreement { round: 0, live: vec![0, 1, 3], completed_calls: 2 });
            assert!(v.iter().all(|&x| x == 7), "{:?}", &v[..4]);
            new_ranks.push(new_rank);
        }
    }
    new_ranks.sort_unstable();
    assert_eq!(new_ranks, vec![0, 1, 2]);
}
