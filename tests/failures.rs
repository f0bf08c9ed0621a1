//! Bad input never hangs, never corrupts silently: mismatched calls, stuck and dead
//! peers, garbage on a link and wrong arguments all end in errors that name the
//! rank, the peer and the call.

mod common;

use std::time::{Duration, Instant};

use braid::algorithm::Algorithm;
use braid::{Error, ReduceOp};
use common::{comms, on_ranks, Net};

fn mismatch(net: Net) {
    let results = on_ranks(comms(net, 2, Duration::from_secs(20)), |c| {
        let mut buf = vec![1.0f32; 1000];
        let r = if c.rank() == 0 { c.all_reduce_in_place(&mut buf, ReduceOp::Sum) } else { c.broadcast(&mut buf, 0) };
        r.unwrap_err().to_string()
    });
    for (rank, msg) in results.iter().enumerate() {
        assert!(msg.contains("all-reduce(dtype=f32, count=1000, op=sum)"), "rank {rank}: {msg}");
        assert!(msg.contains("broadcast(dtype=f32, count=1000, root=0)"), "rank {rank}: {msg}");
        assert!(msg.contains("rank"), "rank {rank}: {msg}");
    }
}

#[test]
fn mismatched_collectives_fail_on_both_ranks_naming_both_calls_inproc() {
    mismatch(Net::InProc);
}

#[test]
fn mismatched_collectives_fail_on_both_ranks_naming_both_calls_tcp() {
    mismatch(Net::Tcp);
}

#[test]
fn mismatched_collectives_fail_on_both_ranks_naming_both_calls_shm() {
    mismatch(Net::Shm);
}

/// Ranks that force different algorithms for the same call fail naming both.
fn algorithm_mismatch(net: Net) {
    let results = on_ranks(comms(net, 2, Duration::from_secs(20)), |c| {
        let algo = if c.rank() == 0 { Algorithm::Ring } else { Algorithm::Direct };
        c.set_algorithm(Some(algo));
        let mut buf = vec![1i32; 1000];
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap_err().to_string()
    });
    for (rank, msg) in results.iter().enumerate() {
        assert!(msg.contains("all-reduce(dtype=i32, count=1000, op=sum) via ring"), "rank {rank}: {msg}");
        assert!(msg.contains("all-reduce(dtype=i32, count=1000, op=sum) via direct"), "rank {rank}: {msg}");
    }
}

#[test]
fn ranks_running_different_algorithms_fail_naming_both_inproc() {
    algorithm_mismatch(Net::InProc);
}

#[test]
fn ranks_running_different_algorithms_fail_naming_both_shm() {
    algorithm_mismatch(Net::Shm);
}

#[test]
fn mismatched_counts_are_reported_not_corrupted() {
    let results = on_ranks(comms(Net::Tcp, 3, Duration::from_secs(20)), |c| {
        let mut buf = vec![1i32; if c.rank() == 2 { 64 } else { 65 }];
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap_err().to_string()
    });
    assert!(results.iter().any(|m| m.contains("count=64") && m.contains("count=65")), "{results:?}");
}

#[test]
fn a_rank_that_never_arrives_is_named_at_the_deadline() {
    let t0 = Instant::now();
    let results = on_ranks(comms(Net::Tcp, 3, Duration::from_millis(600)), |c| {
        if c.rank() == 2 {
            // Stays silent past the others' deadline, then leaves.
            std::thread::sleep(Duration::from_secs(3));
            return String::new();
        }
        let mut buf = vec![1.0f64; 10];
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap_err().to_string()
    });
    assert!(t0.elapsed() < Duration::from_secs(15));
    let timeouts = results[..2].iter().filter(|m| m.contains("timed out") && m.contains("[2]")).count();
    assert!(timeouts >= 1, "{results:?}");
    for m in &results[..2] {
        assert!(m.contains('2'), "the silent rank must be named: {m}");
    }
}

#[test]
fn a_broken_communicator_refuses_further_calls() {
    let results = on_ranks(comms(Net::InProc, 2, Duration::from_secs(10)), |c| {
        let mut buf = vec![0u8; 8];
        let first = if c.rank() == 0 { c.barrier() } else { c.broadcast(&mut buf, 0) };
        assert!(first.is_err());
        matches!(c.barrier(), Err(Error::Broken(_)))
    });
    assert_eq!(results, vec![true, true]);
}

#[test]
fn wrong_arguments_are_clear_errors() {
    let results = on_ranks(comms(Net::InProc, 2, Duration::from_secs(10)), |c| {
        let mut out = vec![0.0f32; 3];
        let e1 = c.all_reduce(&[1.0f32; 4], &mut out, ReduceOp::Sum).unwrap_err().to_string();
        let e2 = c.broadcast(&mut out, 5).unwrap_err().to_string();
        let e3 = c.all_gather_in_place(&mut out).unwrap_err().to_string();
        let e4 = c.send(&[1u8], c.rank()).unwrap_err().to_string();
        // The communicator is still usable afterwards: argument errors break nothing.
        let mut ok = vec![1u8; 4];
        c.all_reduce_in_place(&mut ok, ReduceOp::Sum).unwrap();
        assert_eq!(ok, vec![2u8; 4]);
        [e1, e2, e3, e4]
    });
    for (rank, errs) in results.iter().enumerate() {
        assert!(errs[0].contains(&format!("rank {rank}")) && errs[0].contains("expected 16"), "{}", errs[0]);
        assert!(errs[1].contains("root 5"), "{}", errs[1]);
        assert!(errs[2].contains("equal blocks"), "{}", errs[2]);
        assert!(errs[3].contains("itself"), "{}", errs[3]);
    }
}

#[test]
fn async_work_overlaps_and_keeps_issue_order() {
    let results = on_ranks(comms(Net::Tcp, 3, Duration::from_secs(20)), |c| {
        let r = c.rank() as i64;
        let mut works: Vec<_> = (0..4).map(|k| c.all_reduce_async(vec![r + k; 1 << 16], ReduceOp::Sum)).collect();
        // A synchronous call issued after the async ones runs after them on every rank.
        let mut b = vec![r; 5];
        c.broadcast(&mut b, 2).unwrap();
        assert_eq!(b, vec![2; 5]);
        let last = works.pop().unwrap();
        while !works[0].clone_probe() {}
        let sums: Vec<i64> = works.into_iter().map(|w| w.wait().unwrap()[0]).collect();
        let g = c.all_gather_async(vec![r; 3 * 2]);
        (sums, last.wait().unwrap()[7], g.wait().unwrap())
    });
    for (sums, last, gathered) in results {
        assert_eq!(sums, vec![3, 6, 9]);
        assert_eq!(last, 12);
        assert_eq!(gathered, vec![0, 0, 1, 1, 2, 2]);
    }
}

/// `Work::test` polled to completion (never blocks).
trait Probe {
    fn clone_probe(&mut self) -> bool;
}
impl<R> Probe for braid::Work<R> {
    fn clone_probe(&mut self) -> bool {
        self.test()
    }
}
