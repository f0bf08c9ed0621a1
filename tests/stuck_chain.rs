//! A stuck rank is named, not the live rank waiting for it: ranks 0, 1 and 2 each
//! wait for the next (a chain of receives) and rank 3 never enters the call (it
//! sleeps past the deadline holding its communicator, links open, as a stopped
//! process would). At the deadline each rank asks along the chain, so rank 0's
//! timeout names rank 1 and 2 as waiting and rank 3 as the one that did not
//! answer, and every call still ends within the timeout plus a bound.

mod common;

use std::time::{Duration, Instant};

use braid::{ChainEnd, Error};
use common::{comms, on_ranks, Net};

const TIMEOUT: Duration = Duration::from_secs(2);
/// Hang bound, not a speed target: the timeout, the asking window (a tenth of
/// it) and slack for a loaded machine.
const BOUND: Duration = Duration::from_secs(10);

fn chain_of_receives(net: Net) {
    let results = on_ranks(comms(net, 4, TIMEOUT), |c| {
        // Start the chain together, so each rank's deadline falls at the same time.
        c.barrier().expect("barrier");
        let rank = c.rank();
        if rank == 3 {
            std::thread::sleep(TIMEOUT + Duration::from_secs(3));
            return None;
        }
        let t0 = Instant::now();
        let mut buf = [0u8; 16];
        let e = c.recv(&mut buf, rank + 1).expect_err("rank 3 never sends");
        let took = t0.elapsed();
        assert!(took < TIMEOUT + BOUND, "rank {rank} took {took:?} to fail: {e}");
        Some(e)
    });
    let msgs: Vec<String> = results.iter().flatten().map(|e| e.to_string()).collect();
    let e0 = results[0].as_ref().expect("rank 0 failed");
    match e0 {
        Error::Timeout { ctx, waiting_on, chain, .. } => {
            assert_eq!(ctx.rank, 0, "{e0}");
            assert_eq!(waiting_on, &vec![1], "{e0}");
            assert_eq!(chain.len(), 1, "{e0}");
            assert_eq!(chain[0].ranks, vec![1, 2, 3], "{e0}");
            assert_eq!(chain[0].end, ChainEnd::Silent, "{e0}");
        }
        other => panic!("rank 0: expected a timeout, got {other}"),
    }
    assert!(msgs[0].contains("rank 0 in recv"), "the call is named: {}", msgs[0]);
    assert!(
        msgs[0].contains("rank 1 waits for rank 2, which waits for rank 3, which did not answer (stopped"),
        "rank 0: {}",
        msgs[0]
    );
    assert!(msgs[1].contains("rank 2 waits for rank 3, which did not answer"), "rank 1: {}", msgs[1]);
    assert!(msgs[2].contains("[3]: rank 3 did not answer"), "rank 2: {}", msgs[2]);
}

#[test]
fn a_stuck_rank_at_the_end_of_a_chain_is_named_inproc() {
    chain_of_receives(Net::InProc);
}

#[test]
fn a_stuck_rank_at_the_end_of_a_chain_is_named_shm() {
    chain_of_receives(Net::Shm);
}

#[test]
fn a_stuck_rank_at_the_end_of_a_chain_is_named_tcp() {
    chain_of_receives(Net::Tcp);
}
