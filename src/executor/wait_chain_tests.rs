//! Following chains of answers, and the questions and answers on a real stream
//! channel, with a raw link on the other end sending what a broken or hostile peer
//! might.

use super::*;
use crate::error::{describe_chains, OpContext};
use crate::executor::channel::PeerChannel;
use crate::executor::stream::StreamChannel;
use crate::executor::WaitPolicy;
use crate::frame::HEADER_LEN;
use crate::transport::loopback::LoopbackLink;
use crate::transport::Link;
use crate::types::CallSig;
use crate::types::{DType, OpKind, ReduceOp};

fn call(rank: usize) -> CallInfo {
    let sig = CallSig::new(OpKind::Recv, DType::U8, 4, 1, ReduceOp::Sum);
    CallInfo {
        ctx: OpContext { rank, call: Some(sig), seq: 3 },
        sig,
        send_seq: 3,
        recv_seq: 3,
        comm_id: 7,
        epoch: 0,
        dtype: DType::U8,
        reduce_op: ReduceOp::Sum,
        timeout: Duration::from_secs(10),
        wait: WaitPolicy::for_ranks(1),
        flags: Default::default(),
    }
}

fn answered(w: &[usize]) -> Probe {
    Probe::Answered(w.to_vec())
}

#[test]
fn a_chain_ends_at_the_rank_that_did_not_answer() {
    // Rank 0 waits for 1, 1 for 2, 2 for 3; 3 was asked and said nothing.
    let probes = [answered(&[1]), answered(&[2]), answered(&[3]), Probe::End(ChainEnd::Silent)];
    let c = follow(1, 0, &probes);
    assert_eq!(c, WaitChain { ranks: vec![1, 2, 3], end: ChainEnd::Silent });
    assert_eq!(
        c.to_string(),
        "rank 1 waits for rank 2, which waits for rank 3, which did not answer (stopped, or stuck outside braid)"
    );
    let direct = follow(3, 0, &probes);
    assert_eq!(direct.to_string(), "rank 3 did not answer (stopped, or stuck outside braid)");
    assert_eq!(
        describe_chains(&[c.clone(), direct]),
        format!(": {c}; rank 3 did not answer (stopped, or stuck outside braid)")
    );
    assert_eq!(describe_chains(&[]), "");
}

#[test]
fn the_nearest_end_is_named_and_a_cycle_is_called_one() {
    // Rank 1 waits for this rank (0) and for 2; 2 left: the chain goes 1, 2.
    let probes = [answered(&[1]), answered(&[0, 2]), Probe::End(ChainEnd::Left("it panicked".into()))];
    let c = follow(1, 0, &probes);
    assert_eq!(c.ranks, vec![1, 2]);
    assert_eq!(c.to_string(), "rank 1 waits for rank 2, which stopped waiting: it panicked");
    // Rank 1 waits only for this rank (0): named as such, not followed round again.
    let c = follow(1, 0, &[answered(&[1]), answered(&[0])]);
    assert_eq!(c, WaitChain { ranks: vec![1], end: ChainEnd::WaitsForThisRank });
    assert_eq!(c.to_string(), "rank 1 waits for this rank");
    // 1 and 2 wait for each other (a deadlock of mismatched calls).
    let c = follow(1, 0, &[answered(&[1]), answered(&[2]), answered(&[1])]);
    assert_eq!(c, WaitChain { ranks: vec![1, 2], end: ChainEnd::Cycle(1) });
    assert!(c.to_string().contains("rank 1 waits for rank 2, which waits for rank 1 (a cycle"), "{c}");
}

#[test]
fn the_window_is_a_tenth_of_the_timeout_within_bounds() {
    assert_eq!(window(Duration::from_secs(2)), Duration::from_millis(200));
    assert_eq!(window(Duration::from_secs(300)), Duration::from_secs(1));
    assert_eq!(window(Duration::from_millis(50)), Duration::from_millis(20));
}

/// Rank 0's channel to rank 1, and the raw link rank 1 writes on.
fn asker() -> (Vec<Option<Box<dyn PeerChannel>>>, LoopbackLink) {
    let (a, b) = LoopbackLink::pair(0, 1, 64 << 10);
    (vec![None, Some(Box::new(StreamChannel::new(Box::new(a))) as Box<dyn PeerChannel>)], b)
}

fn reply_bytes(len: u32, ranks: &[u32]) -> Vec<u8> {
    let sig = CallSig::new(OpKind::Send, DType::U8, 4, 0, ReduceOp::Sum);
    let mut f = Header { kind: FrameKind::WaitReply, comm_id: 7, epoch: 0, seq: 9, sig, len }.encode().to_vec();
    for r in ranks {
        f.extend_from_slice(&r.to_le_bytes());
    }
    f
}

fn drive(channels: &mut Channels, call: &CallInfo) -> Result<bool> {
    channels[1].as_mut().unwrap().progress(1, &mut [], call)
}

#[test]
fn a_word_unasked_is_kept_for_the_call_and_an_asked_one_is_checked() {
    let info = call(0);
    let (mut channels, mut peer) = asker();
    // Unasked: kept until the call ends, and it is not progress of the call.
    peer.try_write(&[&reply_bytes(4, &[0])]).unwrap();
    assert!(!drive(&mut channels, &info).unwrap());
    let ch = channels[1].as_mut().unwrap();
    assert_eq!(ch.wait_slot().unwrap().reply.as_ref().map(|r| r.waits.clone()), Some(vec![0]));
    ch.end_call();
    assert!(ch.wait_slot().unwrap().reply.is_none(), "a word of an ended call is stale");
    // Asked: the question goes out, and an answer naming a rank outside the world is invalid.
    let mut probes = vec![answered(&[1]), Probe::Unasked];
    ask_reachable(&mut channels, &info, &mut probes, &[false, false]);
    assert!(matches!(probes[1], Probe::Asked));
    drive(&mut channels, &info).unwrap();
    let mut q = [0u8; HEADER_LEN];
    assert_eq!(peer.try_read(&mut q).unwrap(), HEADER_LEN);
    assert_eq!(Header::decode(&q).unwrap().kind, FrameKind::WaitQuery);
    peer.try_write(&[&reply_bytes(8, &[0, 9])]).unwrap();
    drive(&mut channels, &info).unwrap();
    take_replies(&mut channels, 2, &mut probes);
    match &probes[1] {
        Probe::End(ChainEnd::Invalid(why)) => assert!(why.contains("rank 9") && why.contains("2 ranks"), "{why}"),
        _ => panic!("a reply naming rank 9 of 2 was taken as valid"),
    }
}

#[test]
fn malformed_wait_frames_are_protocol_errors_not_panics() {
    let info = call(0);
    for bad in [reply_bytes(4 * (MAX_LISTED as u32 + 1), &[]), reply_bytes(6, &[]), {
        let mut q = Header::control(FrameKind::WaitQuery, 7, 0, 3).encode().to_vec();
        q.extend_from_slice(b"abc");
        q
    }] {
        let (mut channels, mut peer) = asker();
        peer.try_write(&[&bad]).unwrap();
        match drive(&mut channels, &info) {
            Err(Error::Protocol { peer: 1, detail, .. }) => assert!(detail.contains("wait"), "{detail}"),
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }
}

#[test]
fn a_rank_in_a_call_answers_whom_it_waits_for() {
    // Rank 1 in a call waits for rank 2 (a receive posted on that channel); rank 0 asks.
    let info = call(1);
    let (to_0, from_1) = LoopbackLink::pair(1, 0, 64 << 10);
    let (to_2, _from_1_at_2) = LoopbackLink::pair(1, 2, 64 << 10);
    let mut channels: Vec<Option<Box<dyn PeerChannel>>> = vec![
        Some(Box::new(StreamChannel::new(Box::new(to_0)))),
        None,
        Some(Box::new(StreamChannel::new(Box::new(to_2)))),
    ];
    let mut buf = [0u8; 4];
    let dst = crate::executor::MemRegion { ptr: buf.as_mut_ptr(), len: 4, kind: crate::executor::MemKind::Host };
    channels[2].as_mut().unwrap().post_recv(dst, None, None, &info).unwrap();
    let mut asker_end = StreamChannel::new(Box::new(from_1));
    let slot = asker_end.wait_slot().unwrap();
    slot.awaiting = true;
    slot.queue(&query_frame(&call(0)));
    asker_end.progress(1, &mut [], &call(0)).unwrap();
    for ch in channels.iter_mut().flatten() {
        ch.progress(0, &mut [], &info).unwrap();
    }
    answer_queries(&mut channels, &info);
    channels[0].as_mut().unwrap().progress(0, &mut [], &info).unwrap();
    asker_end.progress(1, &mut [], &call(0)).unwrap();
    let reply = asker_end.wait_slot().unwrap().reply.take().expect("rank 1 answered");
    // A send/recv frame carries its tag where other calls carry the root: the peer
    // is not on the wire (the answering rank's peers are in `waits`).
    let on_wire = CallSig { root: 0, ..info.sig };
    assert_eq!((reply.waits, reply.seq, reply.sig), (vec![2], 3, on_wire));
    for ch in channels.iter_mut().flatten() {
        ch.end_call();
    }
}
