//! Ending a call and a communicator with an answer: `Work::wait_timeout` says
//! "still running" and later gives the result; `Communicator::destroy` is `Ok` when
//! every rank closes in order and names the peer that died, left without
//! `destroy`, or never came.

mod common;

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use braid::fault::{FaultAction, FaultPlan, FaultPoint};
use braid::{Communicator, Config, Error, ReduceOp};
use common::{comms, on_ranks, Net};

const T: Duration = Duration::from_secs(30);

/// Rank 0's async all-reduce cannot finish before rank 1 issues its own, which
/// rank 1 does only once rank 0 has seen it pending: the timed wait reports it
/// pending, then returns the exact result, then refuses to give it twice.
#[test]
fn wait_timeout_reports_pending_then_the_result() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go = (Mutex::new(Some(go_tx)), Mutex::new(Some(go_rx)));
    let go = Arc::new(go);
    on_ranks(comms(Net::InProc, 2, T), move |c| {
        let r = c.rank();
        if r == 1 {
            let rx = go.1.lock().unwrap().take().unwrap();
            rx.recv_timeout(T).expect("rank 0 saw its call pending");
            let mut v = vec![2i64; 1000];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            assert!(v.iter().all(|x| *x == 3));
            return;
        }
        let mut w = c.all_reduce_async(vec![1i64; 1000], ReduceOp::Sum);
        assert!(w.wait_timeout(Duration::from_millis(50)).unwrap().is_none(), "done before rank 1 took part");
        assert!(w.wait_timeout(Duration::ZERO).unwrap().is_none());
        assert!(!w.test());
        go.0.lock().unwrap().take().unwrap().send(()).unwrap();
        let v = w.wait_timeout(T).unwrap().expect("done within the timeout once rank 1 took part");
        assert!(v.iter().all(|x| *x == 3), "{}", v[0]);
        assert!(w.test(), "a spent work is done");
        match w.wait_timeout(T) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("already returned"), "{m}"),
            other => panic!("the result given twice: {other:?}"),
        }
    });
}

fn destroy_in_order(net: Net) {
    let results = on_ranks(comms(net, 3, T), |c| {
        let c = Communicator::dup(c).unwrap();
        let w = c.barrier_async();
        let r = c.rank();
        if r == 1 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let destroyed = c.destroy();
        (destroyed.map_err(|e| e.to_string()), w.wait().is_ok())
    });
    assert!(results.iter().all(|r| *r == (Ok(()), true)), "{results:?}");
}

#[test]
fn destroy_is_ok_when_every_rank_destroys_inproc() {
    destroy_in_order(Net::InProc);
}

#[test]
fn destroy_is_ok_when_every_rank_destroys_tcp() {
    destroy_in_order(Net::Tcp);
}

#[test]
fn destroy_is_ok_when_every_rank_destroys_shm() {
    destroy_in_order(Net::Shm);
}

/// Rank 1's link is cut at its first frame (as when its process dies): rank 0's
/// destroy fails naming rank 1 and a connection closed without goodbye.
#[test]
fn destroy_names_a_peer_whose_connection_died() {
    let mut cfg = Config::new(0, 2);
    cfg.timeout = T;
    cfg.fault = Some(FaultPlan::new(1, FaultPoint { peer: None, frame: 0, offset: 0 }, FaultAction::Cut).unwrap());
    let ranks: Vec<_> = Communicator::in_process_with(cfg)
        .unwrap()
        .into_iter()
        .map(|c| std::thread::spawn(move || c.destroy()))
        .collect();
    let results: Vec<_> = ranks.into_iter().map(|h| h.join().expect("rank thread")).collect();
    match &results[0] {
        // The link reports the cut as a closed connection, or, when rank 0 was
        // writing as rank 1's end went away, as the peer dropping its link.
        Err(Error::PeerLost { peer: 1, detail, .. }) => {
            assert!(detail.contains("connection closed") || detail.contains("dropped its link"), "{detail}")
        }
        other => panic!("rank 0's destroy: {other:?}"),
    }
    assert!(results[1].is_err(), "rank 1 cut its own link: {:?}", results[1]);
}

/// Rank 1 drops its communicator without `destroy` (it said goodbye, but did not
/// confirm the close): rank 0's destroy names it.
#[test]
fn destroy_names_a_peer_that_dropped_instead() {
    let results = on_ranks(comms(Net::Tcp, 2, T), |c| {
        let c = c.dup().unwrap();
        if c.rank() == 1 {
            drop(c);
            return Ok(());
        }
        c.destroy()
    });
    match &results[0] {
        Err(Error::PeerLost { peer: 1, .. }) => {}
        other => panic!("rank 0's destroy: {other:?}"),
    }
}

/// Rank 1 neither destroys nor drops (its communicator is leaked, its links stay
/// open and silent): rank 0's destroy times out naming it.
#[test]
fn destroy_names_a_peer_that_never_came() {
    let results = on_ranks(comms(Net::InProc, 2, Duration::from_millis(500)), |c| {
        let c = c.dup().unwrap();
        if c.rank() == 1 {
            std::mem::forget(c);
            return Ok(());
        }
        c.destroy()
    });
    match &results[0] {
        Err(Error::Timeout { waiting_on, .. }) => assert_eq!(waiting_on, &vec![1]),
        other => panic!("rank 0's destroy: {other:?}"),
    }
}
