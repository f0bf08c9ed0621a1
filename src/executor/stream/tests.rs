//! The stream channel through the request interface alone, as the executor uses it.

use std::time::{Duration, Instant};

use super::StreamChannel;
use crate::error::{Error, OpContext};
use crate::executor::channel::{MemKind, MemRegion, PeerChannel, Reduction};
use crate::executor::{CallInfo, WaitPolicy};
use crate::transport::loopback::LoopbackLink;
use crate::types::{CallSig, DType, OpKind, ReduceOp};

pub(super) fn call(rank: usize, count: usize) -> CallInfo {
    let sig = CallSig::new(OpKind::AllReduce, DType::F32, count as u64, 0, ReduceOp::Sum);
    CallInfo {
        ctx: OpContext { rank, call: Some(sig), seq: 0 },
        sig,
        send_seq: 0,
        recv_seq: 0,
        comm_id: 7,
        epoch: 0,
        dtype: DType::F32,
        reduce_op: ReduceOp::Sum,
        timeout: Duration::from_secs(10),
        wait: WaitPolicy::for_ranks(1),
        flags: Default::default(),
    }
}

fn host(v: &mut [f32]) -> MemRegion {
    MemRegion { ptr: v.as_mut_ptr().cast(), len: std::mem::size_of_val(v), kind: MemKind::Host }
}

fn pair() -> (StreamChannel, StreamChannel) {
    let (a, b) = LoopbackLink::pair(0, 1, 64 << 10);
    (StreamChannel::new(Box::new(a)), StreamChannel::new(Box::new(b)))
}

#[test]
fn device_regions_are_refused_cleanly() {
    let (mut a, _b) = pair();
    let info = call(0, 16);
    let mut buf = [0f32; 16];
    let dev = MemRegion { kind: MemKind::Device, ..host(&mut buf) };
    let unsupported = |r: crate::error::Result<()>| match r {
        Err(Error::Unsupported(why)) => {
            assert!(why.contains("device memory") && why.contains("rank 1") && why.contains("rank 0"), "{why}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    };
    unsupported(a.post_send(dev, None, &info));
    unsupported(a.post_recv(dev, None, None, &info));
    let reduction = Reduction { src: dev, op: ReduceOp::Sum, dtype: DType::F32 };
    unsupported(a.post_recv(host(&mut buf), Some(reduction), None, &info));
    assert!(!a.busy(), "a refused request must leave nothing posted");
}

/// A plain receive posted with gates raises each piece's gate, in bytes, as the
/// piece lands (a staged device receive moves pieces on by them).
#[test]
fn a_plain_receive_raises_its_gates_as_pieces_land() {
    let n = (crate::executor::channel::PIECE_BYTES / 4) + 10;
    let (mut a, mut b) = pair();
    let info = call(0, n);
    let mut src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0f32; n];
    let mut gates = Vec::new();
    b.post_recv(host(&mut dst), None, Some(&mut gates), &info).unwrap();
    assert_eq!(gates, [0, 0], "one gate per piece, closed");
    a.post_send(host(&mut src), None, &info).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen_partial = false;
    while a.busy() || b.busy() {
        assert!(Instant::now() < deadline, "transfer stalled");
        a.progress(1, &mut [], &info).unwrap();
        b.progress(0, &mut gates, &info).unwrap();
        seen_partial |= gates[0] > 0 && gates[1] == 0;
        assert!(gates[0] <= crate::executor::channel::PIECE_BYTES && gates[1] <= 40);
    }
    assert_eq!(gates, [crate::executor::channel::PIECE_BYTES, 40]);
    assert!(seen_partial, "the first piece's gate rose before the second piece landed");
    assert_eq!(dst, src);
}

/// Rank 0 sends x to rank 1, which reduces it into x + y and forwards the sum to
/// rank 2 through a gate, piece by piece, all driven through the trait; small
/// transfers go as data frames, long ones (several segments) as rendezvous.
#[test]
fn receive_reduce_forwards_through_gates_across_channels() {
    for n in [1024usize, (3 << 18) + 16] {
        let (mut c01, mut c10) = pair();
        let (mut c12, mut c21) = pair();
        let infos = [call(0, n), call(1, n), call(2, n)];
        let mut x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
        let mut y = vec![2.0f32; n];
        let mut sum = vec![0f32; n];
        let mut out = vec![0f32; n];
        let mut gates = Vec::new();
        c01.post_send(host(&mut x), None, &infos[0]).unwrap();
        let reduction = Reduction { src: host(&mut y), op: ReduceOp::Sum, dtype: DType::F32 };
        c10.post_recv(host(&mut sum), Some(reduction), Some(&mut gates), &infos[1]).unwrap();
        assert!(!gates.is_empty() && gates.iter().all(|&g| g == 0));
        c12.post_send(host(&mut sum), Some(0), &infos[1]).unwrap();
        c21.post_recv(host(&mut out), None, None, &infos[2]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            c01.progress(1, &mut gates, &infos[0]).unwrap();
            c10.progress(0, &mut gates, &infos[1]).unwrap();
            c12.progress(2, &mut gates, &infos[1]).unwrap();
            c21.progress(1, &mut gates, &infos[2]).unwrap();
            if ![&c01, &c10, &c12, &c21].iter().any(|c| c.busy()) {
                break;
            }
            assert!(Instant::now() < deadline, "transfers of {n} elements did not finish");
        }
        for ch in [&mut c01, &mut c10, &mut c12, &mut c21] {
            ch.end_call();
        }
        let total: usize = gates.iter().sum();
        assert_eq!(total, n * 4, "every gate opens fully");
        for i in 0..n {
            let want = (i % 1000) as f32 + 2.0;
            assert_eq!((sum[i], out[i]), (want, want), "element {i} of {n}");
        }
    }
}

/// Small plain sends are written when posted; one the link cannot take whole (a
/// 4 KiB ring) is finished by `progress`, and a send posted behind it queues
/// after it, so the bytes arrive in order.
#[test]
fn sends_written_at_post_finish_in_order_when_the_link_is_full() {
    let (a, b) = LoopbackLink::pair(0, 1, 4 << 10);
    let (mut a, mut b) = (StreamChannel::new(Box::new(a)), StreamChannel::new(Box::new(b)));
    let n = 1500; // 6000 bytes: more than the ring holds
    let info = call(0, n);
    let mut first: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut second: Vec<f32> = (0..n).map(|i| (2 * i) as f32).collect();
    let (mut got1, mut got2) = (vec![0f32; n], vec![0f32; n]);
    a.post_send(host(&mut first), None, &info).unwrap();
    assert!(a.busy(), "the part the ring could not take stays queued");
    a.post_send(host(&mut second), None, &info).unwrap();
    b.post_recv(host(&mut got1), None, None, &info).unwrap();
    b.post_recv(host(&mut got2), None, None, &info).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.busy() || b.busy() {
        assert!(Instant::now() < deadline, "transfer stalled");
        a.progress(1, &mut [], &info).unwrap();
        b.progress(0, &mut [], &info).unwrap();
    }
    assert_eq!((got1, got2), (first, second));
    // With room in the ring, a small send is complete once posted.
    let mut small = [5f32; 8];
    let mut got = [0f32; 8];
    a.post_send(host(&mut small), None, &info).unwrap();
    assert!(!a.busy(), "a small send into an empty ring is written at post");
    b.post_recv(host(&mut got), None, None, &info).unwrap();
    while b.busy() {
        assert!(Instant::now() < deadline, "transfer stalled");
        b.progress(0, &mut [], &info).unwrap();
    }
    assert_eq!(got, small);
}

/// Small receives on a peekable link take a whole frame in one look when it is
/// there; frames that straddle the end of a small ring, or arrive in parts, go the
/// general way. Either way the bytes arrive in order, and a frame of the wrong
/// length is still an error naming the peer.
#[test]
fn small_frames_arrive_whole_or_in_parts_across_the_ring_end() {
    let (a, b) = LoopbackLink::pair(0, 1, 4 << 10);
    let (mut a, mut b) = (StreamChannel::new(Box::new(a)), StreamChannel::new(Box::new(b)));
    let deadline = Instant::now() + Duration::from_secs(10);
    // Lengths chosen so successive frames start at many offsets of the 4 KiB ring.
    for (round, n) in [1usize, 7, 250, 333, 900, 17, 1000, 64, 513, 3].into_iter().cycle().take(60).enumerate() {
        let info = call(0, n);
        let mut src: Vec<f32> = (0..n).map(|i| (round * 1000 + i) as f32).collect();
        let mut got = vec![0f32; n];
        // Alternate: receive posted before the frame arrives, and after.
        if round % 2 == 0 {
            b.post_recv(host(&mut got), None, None, &info).unwrap();
            a.post_send(host(&mut src), None, &info).unwrap();
        } else {
            a.post_send(host(&mut src), None, &info).unwrap();
            b.post_recv(host(&mut got), None, None, &info).unwrap();
        }
        while a.busy() || b.busy() {
            assert!(Instant::now() < deadline, "round {round} ({n} elements) stalled");
            a.progress(1, &mut [], &info).unwrap();
            b.progress(0, &mut [], &info).unwrap();
        }
        assert_eq!(got, src, "round {round}, {n} elements");
    }
    // The sender's call says 8 elements, the receiver expects 4 bytes fewer.
    let mut src = [1f32; 8];
    let mut got = [0f32; 7];
    a.post_send(host(&mut src), None, &call(0, 8)).unwrap();
    let short = call(1, 8);
    b.post_recv(host(&mut got), None, None, &short).unwrap();
    let err = loop {
        assert!(Instant::now() < deadline, "the wrong length was never noticed");
        if let Err(e) = b.progress(0, &mut [], &short) {
            break e.to_string();
        }
    };
    assert!(err.contains("32 bytes") && err.contains("expects 28") && err.contains("rank 0"), "{err}");
}
