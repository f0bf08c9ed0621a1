//! Abort that cannot hang: `Communicator::abort` from another thread cuts a long
//! all-reduce short on every rank within the 1 s of issue 15 over every transport,
//! refuses queued and later calls at once, and a panic inside a call leaves an
//! error for the next call instead of a hang (those cases drive a hand-made link, so
//! they are unit tests in `src/comm/tests.rs`).

mod common;

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use braid::{Error, ReduceOp};
use common::{comms, on_ranks, Net};

/// The bound issue 15 sets for an abort to reach every rank.
const BOUND: Duration = Duration::from_secs(1);
/// 64 MiB of f32.
const ELEMS: usize = 16 << 20;

/// Rank 0 aborts from a second thread while every rank loops 64 MiB all-reduces.
fn abort_mid_all_reduce(net: Net) {
    let world = 3;
    let aborted_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let all_returned = Arc::new(Barrier::new(world));
    let at = aborted_at.clone();
    let out = on_ranks(comms(net, world, Duration::from_secs(60)), move |c| {
        let mut buf = vec![1.0f32; ELEMS];
        let (err, returned, done) = std::thread::scope(|s| {
            if c.rank() == 0 {
                let at = at.clone();
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(400));
                    *at.lock().unwrap() = Some(Instant::now());
                    c.abort();
                });
            }
            let mut done = 0u32;
            loop {
                match c.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
                    Ok(()) => {
                        // Each finished all-reduce triples every element: exact in f32.
                        done += 1;
                        let want = 3f32.powi(done as i32);
                        assert!(buf.iter().all(|v| *v == want), "rank {}: all-reduce {done}", c.rank());
                    }
                    Err(e) => break (e, Instant::now(), done),
                }
            }
        });
        // Calls after the abort fail at once, without running.
        let t = Instant::now();
        let later = c.barrier().unwrap_err();
        let later_took = t.elapsed();
        // Keep every buffer alive until no rank is inside a call any more.
        all_returned.wait();
        (err, returned, done, later, later_took)
    });
    let t_abort = aborted_at.lock().unwrap().expect("rank 0 aborted");
    for (rank, (err, returned, done, later, later_took)) in out.iter().enumerate() {
        let latency = returned.saturating_duration_since(t_abort);
        println!("{net:?}: rank {rank} returned {latency:?} after abort() ({done} all-reduces done): {err}");
        assert!(latency < BOUND, "{net:?}: rank {rank} took {latency:?} after abort(): {err}");
        if rank == 0 {
            assert!(matches!(err, Error::Aborted { rank: 0, call: Some(_) }), "{err}");
            assert!(matches!(later, Error::Aborted { rank: 0, .. }), "{later}");
        } else {
            // Told by rank 0's abort frame, or by the closed link of a peer that was
            // told before it (a rank that is mid-frame on a link cannot inject the
            // abort frame there and closes it instead): the peers named lead to rank 0.
            let mut at = rank;
            for _ in 0..out.len() {
                at = match &out[at].0 {
                    Error::PeerAborted { peer, .. } | Error::PeerLost { peer, .. } => *peer,
                    other => panic!("{net:?}: rank {at} was not told by a peer: {other}"),
                };
                if at == 0 {
                    break;
                }
            }
            assert_eq!(at, 0, "{net:?}: rank {rank}'s error does not lead back to rank 0: {err}");
            assert!(matches!(later, Error::Broken(_)), "{later}");
        }
        assert!(*later_took < BOUND, "a call after the abort took {later_took:?}");
    }
}

#[test]
fn abort_during_a_64_mib_all_reduce_returns_on_every_rank_within_a_second_inproc() {
    abort_mid_all_reduce(Net::InProc);
}

#[test]
fn abort_during_a_64_mib_all_reduce_returns_on_every_rank_within_a_second_shm() {
    abort_mid_all_reduce(Net::Shm);
}

#[test]
fn abort_during_a_64_mib_all_reduce_returns_on_every_rank_within_a_second_tcp() {
    abort_mid_all_reduce(Net::Tcp);
}

#[test]
fn abort_refuses_queued_async_work_and_calls_waiting_for_their_turn() {
    for net in [Net::InProc, Net::Tcp] {
        let mut cs = comms(net, 2, Duration::from_secs(60));
        // Rank 1 never calls: rank 0's first all-reduce waits for it, the rest queue.
        let idle = cs.pop().unwrap();
        let c = Arc::new(cs.pop().unwrap());
        let works: Vec<_> = (0..4).map(|k| c.all_reduce_async(vec![k as f32; 1 << 16], ReduceOp::Sum)).collect();
        let waiter = {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut b = [0u8; 4];
                let r = c.broadcast(&mut b, 1);
                (r, Instant::now())
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        c.abort();
        assert!(c.is_aborted());
        for (k, w) in works.into_iter().enumerate() {
            let e = w.wait().unwrap_err();
            assert!(matches!(e, Error::Aborted { rank: 0, .. }), "{net:?}: work {k}: {e}");
        }
        let (r, at) = waiter.join().unwrap();
        assert!(matches!(r, Err(Error::Aborted { rank: 0, .. })), "{net:?}: {r:?}");
        let took = at.saturating_duration_since(t0).max(t0.elapsed());
        println!("{net:?}: queued work and waiting call refused {took:?} after abort()");
        assert!(took < BOUND, "{net:?}: {took:?}");
        // The peer learns of it instead of waiting 60 s. Rank 0 may have sent all its
        // data for the call before the abort frame, and the peer's send may have been
        // taken whole before it read that frame (an algorithm that sends and receives
        // at once, chosen by the start-up probe's costs): then the peer's matching call
        // has all it needs and returns the exact sum (rank 0's first call added 0.0),
        // and its next call fails naming rank 0. Either way within the bound.
        let t1 = Instant::now();
        let mut buf = vec![1f32; 1 << 16];
        let e = match idle.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
            Err(e) => e,
            Ok(()) => {
                assert!(buf.iter().all(|&x| x == 1.0), "{net:?}: the peer's call returned a wrong sum");
                idle.barrier().unwrap_err()
            }
        };
        assert!(matches!(e, Error::PeerAborted { peer: 0, .. } | Error::PeerLost { peer: 0, .. }), "{net:?}: {e}");
        assert!(t1.elapsed() < BOUND, "{net:?}: peer took {:?}", t1.elapsed());
    }
}

/// Run `f` on a thread; None when it has not returned within `limit` (a hang).
fn within<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn an_async_call_refused_for_its_arguments_does_not_stall_later_calls() {
    let cs = comms(Net::InProc, 2, Duration::from_secs(20));
    let out = within(Duration::from_secs(10), move || {
        on_ranks(cs, |c| {
            // 3 elements do not split into 2 blocks: refused before it reaches the links.
            let e = c.all_gather_async(vec![1i32; 3]).wait().unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            c.barrier().is_ok()
        })
    });
    assert_eq!(out.expect("later calls must not hang"), vec![true, true]);
}

#[test]
fn a_count_whose_byte_size_overflows_is_refused_and_later_calls_run() {
    let cs = comms(Net::InProc, 2, Duration::from_secs(20));
    let out = within(Duration::from_secs(10), move || {
        on_ranks(cs, |c| {
            let huge = braid::CallSig::new(braid::OpKind::AllGather, braid::DType::F32, 1 << 62, 0, ReduceOp::Sum);
            let e = c.collective_bytes(huge, Some(&[]), &mut []).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            let mut v = vec![c.rank() as i64; 4];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            v
        })
    });
    assert_eq!(out.expect("later calls must not hang"), vec![vec![1i64; 4]; 2]);
}

/// A rank that calls abort is said to have aborted, not to have failed; a rank that
/// failed because of it is still said to have failed.
#[test]
fn a_deliberate_abort_is_named_as_an_abort_not_a_failure() {
    let out = on_ranks(comms(Net::InProc, 3, Duration::from_secs(30)), |c| {
        if c.rank() == 2 {
            c.abort();
            return String::new();
        }
        c.barrier().unwrap_err().to_string()
    });
    for (rank, msg) in out[..2].iter().enumerate() {
        assert!(!msg.contains("rank 2 failed"), "rank {rank}: {msg}");
        // Told by rank 2 itself, or by a rank that was told by it (and failed).
        assert!(msg.contains("rank 2 aborted its communicator"), "rank {rank}: {msg}");
    }
}

/// A rank whose thread panicked while it held its communicator is said to have
/// panicked, with the panic's message, not to have closed its communicator.
#[test]
fn a_rank_that_panicked_is_named_as_panicked_not_closed() {
    for net in [Net::InProc, Net::Tcp] {
        let mut cs = comms(net, 2, Duration::from_secs(30));
        let doomed = cs.pop().unwrap();
        let survivor = cs.pop().unwrap();
        let panicked = std::thread::spawn(move || {
            let _held = doomed;
            panic!("rank 1 gives up (deliberate test panic)");
        })
        .join();
        assert!(panicked.is_err());
        let msg = survivor.barrier().unwrap_err().to_string();
        assert!(msg.contains("rank 1") && msg.contains("panicked"), "{net:?}: {msg}");
        // The panic's own message travels with it (same process or not: it is the
        // reason rank 1 sent).
        assert!(msg.contains("rank 1 gives up (deliberate test panic) at tests/abort.rs:"), "{net:?}: {msg}");
        assert!(!msg.contains("closed its communicator"), "{net:?}: {msg}");
    }
}
