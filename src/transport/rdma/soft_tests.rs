//! [`RdmaChannel`] on the software adapter ([`super::soft_nic`]), set up by
//! [`connect_over`] as over hardware: writes gather their entries from registered
//! local memory, land in the peer's ring through its key in the domain of the
//! queue pair they arrive on, consume one of the peer's posted receives, and
//! complete at both ends. The channels run under the real executor through
//! [`Communicator::from_channels`], one thread per rank, or are driven by hand
//! with a forged peer.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::channel::{Pinned, RdmaChannel};
use super::endpoint;
use super::nic::{Completion, Nic, Sge};
use super::protocol::{imm, RingSpec};
use super::setup::connect_over;
use super::soft_nic::{Fabric, SoftAdapter, SoftNic};
use crate::algorithm::Algorithm;
use crate::bootstrap::{MemStore, Store};
use crate::comm::tests::on_ranks;
use crate::comm::Communicator;
use crate::config::Config;
use crate::error::Error;
use crate::executor::{PeerChannel, WaitPolicy, CONTROL_GRACE};
use crate::frame::FrameKind;
use crate::types::ReduceOp;

type Rows = Vec<Vec<Option<RdmaChannel<SoftNic>>>>;

/// `world` ranks, each linked to every other by channels set up by [`connect_over`]
/// on its own adapter (host) of one fabric, endpoints exchanged through a store.
fn connect_soft(world: usize, spec: RingSpec) -> (Arc<Mutex<Fabric>>, Rows, Arc<MemStore>) {
    let fabric = Fabric::shared();
    let store = Arc::new(MemStore::new());
    let rows = std::thread::scope(|s| {
        let joins: Vec<_> = (0..world)
            .map(|rank| {
                let (fabric, store) = (fabric.clone(), store.clone());
                s.spawn(move || {
                    let adapter = SoftAdapter { fabric, host: rank };
                    let peers = vec![true; world];
                    connect_over(&adapter, rank, world, &peers, spec, store.as_ref(), Duration::from_secs(20)).unwrap()
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    (fabric, rows, store)
}

/// Channels `(0 to 1, 1 to 0)`.
fn pair(spec: RingSpec) -> (Arc<Mutex<Fabric>>, RdmaChannel<SoftNic>, RdmaChannel<SoftNic>) {
    let (fabric, mut rows, _) = connect_soft(2, spec);
    let a = rows[0][1].take().unwrap();
    let b = rows[1][0].take().unwrap();
    (fabric, a, b)
}

/// Communicators of `world` ranks whose every pair is linked by rdma channels.
fn mesh(world: usize, spec: RingSpec) -> Vec<Communicator> {
    let (_, rows, _) = connect_soft(world, spec);
    rows.into_iter()
        .enumerate()
        .map(|(rank, row)| {
            let row = row.into_iter().map(|c| c.map(|c| Box::new(c) as Box<dyn PeerChannel>)).collect();
            let mut cfg = Config::new(rank, world);
            cfg.timeout = Duration::from_secs(20);
            Communicator::from_channels(rank, world, row, 0xabc, &cfg, WaitPolicy::for_ranks(world))
        })
        .collect()
}

#[test]
fn collectives_run_over_rdma_channels_under_the_executor() {
    let small = RingSpec { slots: 4, payload_bytes: 4096, forward_grain: 1024, credit_batch: 2 };
    for (world, spec) in [(2, small), (3, small), (3, RingSpec::DEFAULT)] {
        let comms = mesh(world, spec);
        assert!(comms[0].transports().iter().flatten().all(|k| *k == crate::transport::TransportKind::Rdma));
        let results = on_ranks(comms, move |c| {
            let (r, w) = (c.rank() as i32, c.world_size() as i32);
            for (algo, n) in [(None, 1usize), (None, 1000), (None, 300_001), (Some(Algorithm::Ring), 300_001)] {
                c.set_algorithm(algo);
                let mut buf: Vec<i32> = (0..n as i32).map(|i| i % 977 + r).collect();
                c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                for (i, v) in buf.iter().enumerate() {
                    assert_eq!(*v, w * (i as i32 % 977) + w * (w - 1) / 2, "all-reduce of {n}, element {i}");
                }
                let mut b: Vec<i32> = if r == 1 { (0..n as i32).collect() } else { vec![-1; n] };
                c.broadcast(&mut b, 1).unwrap();
                assert!(b.iter().enumerate().all(|(i, v)| *v == i as i32), "broadcast of {n}");
                let mine: Vec<i32> = (0..n as i32).map(|i| i * w + r).collect();
                let mut all = vec![0i32; n * w as usize];
                c.all_gather(&mine, &mut all).unwrap();
                for (k, v) in all.iter().enumerate() {
                    let (from, i) = ((k / n) as i32, (k % n) as i32);
                    assert_eq!(*v, i * w + from, "all-gather of {n}, element {k}");
                }
            }
            c.barrier().unwrap();
            c.rank()
        });
        assert_eq!(results, (0..world).collect::<Vec<_>>());
    }
}

#[test]
fn a_mismatched_call_is_an_error_on_both_ranks_over_rdma() {
    let comms = mesh(2, RingSpec::DEFAULT);
    let errors = on_ranks(comms, |c| {
        let mut buf = vec![1i32; 10 + c.rank()];
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap_err().to_string()
    });
    for e in &errors {
        assert!(e.contains("mismatched collective calls") || e.contains("aborted because rank"), "{e}");
    }
    assert!(errors.iter().any(|e| e.contains("AllReduce") || e.contains("all-reduce")), "{errors:?}");
}

fn call_info(rank: usize) -> crate::executor::CallInfo {
    let sig = crate::types::CallSig::new(crate::types::OpKind::AllReduce, crate::types::DType::U8, 8, 0, ReduceOp::Sum);
    crate::executor::CallInfo {
        ctx: crate::error::OpContext { rank, call: Some(sig), seq: 0 },
        sig,
        send_seq: 0,
        recv_seq: 0,
        comm_id: 1,
        epoch: 0,
        dtype: crate::types::DType::U8,
        reduce_op: ReduceOp::Sum,
        timeout: Duration::from_secs(5),
        wait: WaitPolicy::for_ranks(2),
        flags: Default::default(),
    }
}

fn host(v: &mut [u8]) -> crate::executor::MemRegion {
    crate::executor::MemRegion { ptr: v.as_mut_ptr(), len: v.len(), kind: crate::executor::MemKind::Host }
}

/// A peer that finished its last call and closed (its ring deregistered) fails the
/// credits still owed to it: harmless while nothing more is wanted from it, an
/// error naming it as soon as something is.
#[test]
fn a_peer_gone_after_its_last_call_is_an_error_only_when_needed() {
    let spec = RingSpec { slots: 2, payload_bytes: 64, forward_grain: 8, credit_batch: 1 };
    let (_, mut a, mut b) = pair(spec);
    let (ca, cb) = (call_info(0), call_info(1));
    let mut src = *b"12345678";
    let mut dst = [0u8; 8];
    a.post_send(host(&mut src), None, &ca).unwrap();
    b.post_recv(host(&mut dst), None, None, &cb).unwrap();
    while a.busy() {
        a.progress(1, &mut [], &ca).unwrap();
    }
    a.end_call();
    drop(a);
    // The data landed before the peer left: the receive completes, and the credit
    // it then owes cannot be delivered.
    while b.busy() {
        b.progress(0, &mut [], &cb).unwrap();
    }
    assert_eq!(&dst, b"12345678");
    b.progress(0, &mut [], &cb).unwrap();
    b.end_call();
    b.post_recv(host(&mut dst), None, None, &cb).unwrap();
    match b.progress(0, &mut [], &cb) {
        Err(crate::error::Error::PeerLost { peer: 0, detail, .. }) => {
            assert!(detail.contains("remote access error"), "{detail}")
        }
        other => panic!("expected the peer to be lost, got {other:?}"),
    }
}

/// Defect 6 of issue 31: every rank can read the record `rdma/0`, which lists the
/// ring and key rank 0 gives each peer. Rank 2, writing over its own queue pair to
/// rank 0 with the key and address published for rank 1, must be refused by the
/// adapter, and rank 1's ring at rank 0 stay untouched.
#[test]
fn a_peer_cannot_write_into_the_ring_kept_for_another_with_its_key() {
    let spec = RingSpec { slots: 2, payload_bytes: 64, forward_grain: 8, credit_batch: 1 };
    let (_fabric, mut rows, store) = connect_soft(3, spec);
    let raw = store.get("rdma/0").unwrap().unwrap();
    let stolen = endpoint::decode_for(&raw, 3, 1, &spec).unwrap();
    let mut junk = Pinned::new(64);
    // SAFETY: 64 bytes of `junk`, which outlives every use below.
    unsafe { std::ptr::write_bytes(junk.ptr(), 0xee, 64) };
    let forger = rows[2][0].as_mut().unwrap().nic_mut();
    // SAFETY: `junk` outlives the registration (dropped first, declared after).
    let mr = unsafe { forger.register(junk.ptr() as usize, 64) }.unwrap();
    let sge = Sge { addr: junk.ptr() as u64, len: 64, lkey: SoftNic::lkey(&mr) };
    // SAFETY: the entry lies in a live registration of this adapter; `junk` stays.
    unsafe { forger.post_write(7, &[sge], imm::data(0, 0, true), stolen.ring_addr, stolen.rkey) }.unwrap();
    let mut got = Vec::new();
    forger.poll(&mut got).unwrap();
    assert!(
        matches!(got.as_slice(), [Completion::Failed { wr_id: 7, status }] if status.contains("remote access error")),
        "a write with the key rank 0 gave rank 1, over rank 2's queue pair: {got:?}"
    );
    let ring = rows[0][1].as_mut().unwrap().ring_bytes();
    assert!(ring.iter().all(|&b| b == 0), "rank 2 wrote into the ring rank 0 keeps for rank 1");
}

/// Defect 9 of issue 31: a call that fails with writes in flight must not drop
/// their registrations under them (on hardware a local protection error that
/// breaks the queue pair, the abort behind them flushed, the peer waiting out its
/// whole timeout). The writes complete first; the abort then reaches the peer,
/// whose next request that needs this rank fails at once, naming it.
#[test]
fn after_a_failed_call_its_writes_complete_and_the_abort_reaches_the_peer() {
    let spec = RingSpec { slots: 4, payload_bytes: 64, forward_grain: 8, credit_batch: 1 };
    let (fabric, mut a, mut b) = pair(spec);
    let (ca, cb) = (call_info(0), call_info(1));
    let mut src: Vec<u8> = (0..150u8).collect();
    let mut dst = vec![0u8; 150];
    a.post_send(host(&mut src), None, &ca).unwrap();
    b.post_recv(host(&mut dst), None, None, &cb).unwrap();
    a.progress(1, &mut [], &ca).unwrap();
    assert_eq!(fabric.lock().unwrap().in_flight(), 3, "three chunks in flight");
    // Rank 0's call fails here (say another peer aborted): the executor ends it,
    // then the engine tells every peer why.
    a.end_call();
    a.send_control_and_close(FrameKind::Abort, ca.comm_id, ca.epoch, "rank 0 gave up", Instant::now() + CONTROL_GRACE);
    // Everything rank 1's receive needs was written before the abort: it completes
    // (defect 1), and the abort fails the next request that needs rank 0.
    for _ in 0..1000 {
        b.progress(0, &mut [], &cb).expect("rank 1's receive needs nothing rank 0 did not send");
        if !b.busy() {
            break;
        }
    }
    assert_eq!(dst, src, "the chunks in flight landed intact");
    let mut later = vec![0u8; 8];
    let heard = b
        .post_recv(host(&mut later), None, None, &cb)
        .err()
        .or_else(|| (0..1000).find_map(|_| b.progress(0, &mut [], &cb).err()));
    match heard {
        Some(Error::PeerAborted { peer: 0, reason, .. }) => assert!(reason.contains("rank 0 gave up"), "{reason}"),
        other => panic!("rank 1 should fail with rank 0's abort, got {other:?} after 1000 passes"),
    }
    let f = fabric.lock().unwrap();
    assert!(f.dropped_in_flight.is_empty(), "{:?}", f.dropped_in_flight);
}

/// Defect 9, when the writes cannot complete (the peer's adapter does not
/// answer): the queue pair is stopped so that they complete flushed, and only then
/// do their registrations go; the peer is then lost, by name.
#[test]
fn writes_that_cannot_complete_are_flushed_before_their_registrations_go() {
    let spec = RingSpec { slots: 4, payload_bytes: 64, forward_grain: 8, credit_batch: 1 };
    let (fabric, mut a, _b) = pair(spec);
    let ca = call_info(0);
    let mut src: Vec<u8> = (0..150u8).collect();
    fabric.lock().unwrap().stall_host(1, true);
    a.post_send(host(&mut src), None, &ca).unwrap();
    a.progress(1, &mut [], &ca).unwrap();
    a.progress(1, &mut [], &ca).unwrap();
    assert_eq!(fabric.lock().unwrap().in_flight(), 3, "three chunks in flight");
    a.end_call();
    {
        let f = fabric.lock().unwrap();
        assert!(f.dropped_in_flight.is_empty(), "{:?}", f.dropped_in_flight);
        assert_eq!(f.in_flight(), 0, "the stopped queue pair flushed its writes");
    }
    let mut dst = [0u8; 8];
    a.post_recv(host(&mut dst), None, None, &ca).unwrap();
    match a.progress(1, &mut [], &ca) {
        Err(Error::PeerLost { peer: 1, .. }) => {}
        other => panic!("expected rank 1 to be lost, got {other:?}"),
    }
}
