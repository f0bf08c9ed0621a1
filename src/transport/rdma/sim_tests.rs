//! The verbs protocol on simulated queue pairs: a harness plays the NIC, turning
//! one side's writes into the other side's receive completions and ring contents,
//! and its own send completions. What verbs keeps in order stays in order (the
//! writes of a queue pair land in posting order; the send completions of a queue
//! pair come in posting order); everything else is interleaved at random (a send
//! completion may come before or after the peer's credit for the same slot, either
//! side may progress at any time). Nothing is lost.

use std::collections::VecDeque;
use std::time::Duration;

use super::protocol::{imm, Action, Protocol, RingSpec, WriteData};
use crate::error::{Error, OpContext, Result};
use crate::executor::channel::{MemKind, MemRegion, Reduction};
use crate::executor::{CallInfo, WaitPolicy, SEGMENT_BYTES};
use crate::frame::{FrameKind, HEADER_LEN};
use crate::types::{CallSig, DType, OpKind, ReduceOp};

const SMALL: RingSpec = RingSpec { slots: 4, payload_bytes: 256, forward_grain: 64, credit_batch: 2 };

fn call(rank: usize, count: u64) -> CallInfo {
    let sig = CallSig::new(OpKind::AllReduce, DType::I32, count, 0, ReduceOp::Sum);
    CallInfo {
        ctx: OpContext { rank, call: Some(sig), seq: 5 },
        sig,
        send_seq: 5,
        recv_seq: 5,
        comm_id: 0xc0ffee,
        epoch: 1,
        dtype: DType::I32,
        reduce_op: ReduceOp::Sum,
        timeout: Duration::from_secs(10),
        wait: WaitPolicy::for_ranks(1),
        flags: Default::default(),
    }
}

fn host<T>(v: &mut [T]) -> MemRegion {
    MemRegion { ptr: v.as_mut_ptr().cast(), len: std::mem::size_of_val(v), kind: MemKind::Host }
}

/// A write on its way: it lands at the peer, then completes at the sender.
struct InFlight {
    slot: Option<usize>,
    bytes: Vec<u8>,
    imm: u32,
    wr_id: u64,
}

/// One end of a simulated queue pair.
struct End {
    rank: usize,
    peer: usize,
    proto: Protocol,
    ring: Vec<u8>,
    recv_wrs: usize,
    wire: VecDeque<InFlight>,
    completions: VecDeque<u64>,
}

impl End {
    fn new(rank: usize, peer: usize, spec: RingSpec) -> End {
        End {
            rank,
            peer,
            proto: Protocol::new(spec),
            ring: vec![0; spec.ring_bytes()],
            recv_wrs: 0,
            wire: VecDeque::new(),
            completions: VecDeque::new(),
        }
    }
}

/// Ranks joined by simulated queue pairs, each rank with its call and gates.
struct Net {
    ends: Vec<End>,
    calls: Vec<CallInfo>,
    gates: Vec<Vec<usize>>,
    rng: u64,
}

impl Net {
    /// Ranks `0..ranks`, a queue pair for each of `pairs`, all with `spec`.
    fn new(ranks: usize, pairs: &[(usize, usize)], spec: RingSpec, seed: u64) -> Net {
        let ends = pairs.iter().flat_map(|&(a, b)| [End::new(a, b, spec), End::new(b, a, spec)]).collect();
        Net {
            ends,
            calls: (0..ranks).map(|r| call(r, 1)).collect(),
            gates: vec![Vec::new(); ranks],
            rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        }
    }

    fn end(&mut self, rank: usize, peer: usize) -> usize {
        self.ends.iter().position(|e| e.rank == rank && e.peer == peer).expect("a queue pair")
    }

    fn send(&mut self, from: usize, to: usize, src: MemRegion, gate: Option<usize>) {
        let i = self.end(from, to);
        self.ends[i].proto.post_send(src, gate, &self.calls[from]).unwrap();
    }

    fn recv(
        &mut self,
        at: usize,
        from: usize,
        dst: MemRegion,
        reduce: Option<Reduction>,
        forward: bool,
    ) -> Option<usize> {
        let i = self.end(at, from);
        let gates = &mut self.gates[at];
        let first = gates.len();
        let fwd = if forward { Some(gates) } else { None };
        self.ends[i].proto.post_recv(dst, reduce, fwd, from, &self.calls[at]).unwrap();
        forward.then_some(first)
    }

    fn next(&mut self, n: usize) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % n as u64) as usize
    }

    fn progress(&mut self, i: usize) -> Result<()> {
        let mut out = Vec::new();
        let e = &mut self.ends[i];
        let (rank, peer) = (e.rank, e.peer);
        e.proto.progress(&e.ring, &mut self.gates[rank], peer, &self.calls[rank], &mut out)?;
        for a in out {
            match a {
                Action::PostRecvs(n) => e.recv_wrs += n,
                Action::Credit { wr_id, imm } => {
                    e.wire.push_back(InFlight { slot: None, bytes: Vec::new(), imm, wr_id })
                }
                Action::Write { wr_id, slot, header, data, imm } => {
                    let mut bytes = header.to_vec();
                    match data {
                        // SAFETY: the test keeps every posted buffer alive until the
                        // transfers end; the NIC reads it at some point before the
                        // completion, modelled here as at posting.
                        WriteData::Region { addr, len } => {
                            bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(addr, len) })
                        }
                        WriteData::Bytes(b) => bytes.extend_from_slice(&b),
                    }
                    e.wire.push_back(InFlight { slot: Some(slot), bytes, imm, wr_id });
                }
            }
        }
        Ok(())
    }

    /// The oldest write of end `i` lands at its peer (if the peer has a receive posted).
    fn land(&mut self, i: usize) -> Result<bool> {
        let (rank, peer) = (self.ends[i].rank, self.ends[i].peer);
        let j = self.end(peer, rank);
        if self.ends[j].recv_wrs == 0 || self.ends[i].wire.is_empty() {
            return Ok(false);
        }
        let w = self.ends[i].wire.pop_front().expect("a write");
        let t = &mut self.ends[j];
        if let Some(slot) = w.slot {
            let at = slot * t.proto.spec().slot_stride();
            t.ring[at..at + w.bytes.len()].copy_from_slice(&w.bytes);
        }
        t.recv_wrs -= 1;
        t.proto.on_arrival(w.imm, w.bytes.len() as u32, rank, &self.calls[peer])?;
        self.ends[i].completions.push_back(w.wr_id);
        Ok(true)
    }

    fn complete(&mut self, i: usize) -> Result<()> {
        let e = &mut self.ends[i];
        if let Some(wr) = e.completions.pop_front() {
            e.proto.on_send_complete(wr, e.peer, &self.calls[e.rank])?;
        }
        Ok(())
    }

    fn busy(&self) -> bool {
        self.ends.iter().any(|e| e.proto.busy())
    }

    /// Drive everything in random order until no request is pending.
    fn run(&mut self) -> Result<()> {
        for _ in 0..2_000_000 {
            if !self.busy() {
                return Ok(());
            }
            let i = self.next(self.ends.len());
            match self.next(3) {
                0 => self.progress(i)?,
                1 => {
                    self.land(i)?;
                }
                _ => self.complete(i)?,
            }
        }
        panic!("the simulated transfers did not finish");
    }

    fn end_call(&mut self) {
        for e in &mut self.ends {
            e.proto.end_call();
        }
    }
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt)).collect()
}

#[test]
fn plain_receives_of_every_size_arrive_intact() {
    let p = SMALL.payload_bytes;
    for len in [0, 1, 13, 3 * p, 10 * p + 5, 3 * p - 1] {
        for seed in 0..6 {
            let mut net = Net::new(2, &[(0, 1)], SMALL, seed);
            let mut src = pattern(len, 7);
            let mut dst = vec![0xee; len];
            net.send(0, 1, host(&mut src), None);
            net.recv(1, 0, host(&mut dst), None, false);
            net.run().unwrap();
            assert!(dst == src, "{len} bytes, seed {seed}");
        }
    }
}

#[test]
fn several_messages_both_ways_keep_their_order_across_calls() {
    for seed in 0..10 {
        let mut net = Net::new(2, &[(0, 1)], SMALL, seed);
        for round in 0..3u8 {
            let sizes = [5usize, 0, 2000, 256, 1];
            let mut srcs: Vec<Vec<u8>> = sizes.iter().map(|&n| pattern(n, round)).collect();
            let mut back: Vec<Vec<u8>> = sizes.iter().map(|&n| pattern(n, round + 100)).collect();
            let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
            let mut dsts_back: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
            for k in 0..sizes.len() {
                net.send(0, 1, host(&mut srcs[k]), None);
                net.send(1, 0, host(&mut back[k]), None);
                net.recv(1, 0, host(&mut dsts[k]), None, false);
                net.recv(0, 1, host(&mut dsts_back[k]), None, false);
            }
            net.run().unwrap();
            net.end_call();
            assert_eq!(dsts, srcs, "seed {seed} round {round}");
            assert_eq!(dsts_back, back, "seed {seed} round {round}");
        }
    }
}

#[test]
fn receive_reduce_sums_integers_out_of_the_slots() {
    let elems = SMALL.payload_bytes / 4;
    for n in [0usize, 1, 13, 3 * elems, 10 * elems + 1] {
        for (seed, in_place) in [(1, false), (2, true), (3, false)] {
            let mut net = Net::new(2, &[(0, 1)], SMALL, seed);
            let mut x: Vec<i32> = (0..n as i32).collect();
            let mut y: Vec<i32> = (0..n as i32).map(|i| 3 * i + 1).collect();
            let mut out = vec![0i32; n];
            net.send(0, 1, host(&mut x), None);
            let dst = if in_place { host(&mut y) } else { host(&mut out) };
            let reduction = Reduction { src: host(&mut y), op: ReduceOp::Sum, dtype: DType::I32 };
            net.recv(1, 0, dst, Some(reduction), false);
            net.run().unwrap();
            let got = if in_place { &y } else { &out };
            for (i, v) in got.iter().enumerate() {
                assert_eq!(*v, 4 * i as i32 + 1, "element {i} of {n}, in place {in_place}");
            }
        }
    }
}

/// Rank 0 sends x to rank 1, which reduces it into x + y and forwards the sum to
/// rank 2 through its gates: what rank 2 gets is right only if no byte left rank 1
/// before its reduction was final. Long enough to span two pieces.
#[test]
fn forwards_send_only_what_their_gates_say_is_final() {
    let wide = RingSpec { slots: 3, payload_bytes: 64 << 10, forward_grain: 4 << 10, credit_batch: 2 };
    for (spec, n) in
        [(SMALL, 200usize), (SMALL, 1), (wide, SEGMENT_BYTES / 4 + 3), (RingSpec::DEFAULT, SEGMENT_BYTES / 2 + 5)]
    {
        for seed in 0..3 {
            let mut net = Net::new(3, &[(0, 1), (1, 2)], spec, seed);
            let mut x: Vec<i32> = (0..n as i32).map(|i| i % 1000).collect();
            let mut y: Vec<i32> = (0..n as i32).map(|i| 2 * (i % 1000) + 7).collect();
            let mut sum = vec![0i32; n];
            let mut out = vec![0i32; n];
            net.send(0, 1, host(&mut x), None);
            let reduction = Reduction { src: host(&mut y), op: ReduceOp::Sum, dtype: DType::I32 };
            let first = net.recv(1, 0, host(&mut sum), Some(reduction), true).unwrap();
            assert_eq!(net.gates[1].len(), (n * 4).div_ceil(SEGMENT_BYTES), "a gate per piece");
            net.send(1, 2, host(&mut sum), Some(first));
            net.recv(2, 1, host(&mut out), None, false);
            net.run().unwrap();
            assert_eq!(net.gates[1].iter().sum::<usize>(), n * 4, "every gate opens fully");
            for i in 0..n {
                let want = 3 * (i as i32 % 1000) + 7;
                assert_eq!((sum[i], out[i]), (want, want), "element {i} of {n}, seed {seed}");
            }
        }
    }
}

#[test]
fn a_forward_waits_for_its_gate_then_sends_at_least_a_grain() {
    let mut p = Protocol::new(SMALL);
    let c = call(1, 1);
    let mut data = vec![1u8; 200];
    let mut gates = vec![0usize];
    p.post_send(host(&mut data), Some(0), &c).unwrap();
    let ring = vec![0u8; SMALL.ring_bytes()];
    let mut out = Vec::new();
    p.progress(&ring, &mut gates, 2, &c, &mut out).unwrap();
    assert_eq!(out, vec![Action::PostRecvs(SMALL.recv_wrs())], "nothing final: nothing written");
    gates[0] = SMALL.forward_grain - 4;
    out.clear();
    p.progress(&ring, &mut gates, 2, &c, &mut out).unwrap();
    assert!(out.is_empty(), "less than a grain final: still waiting");
    gates[0] = 96;
    p.progress(&ring, &mut gates, 2, &c, &mut out).unwrap();
    match out.as_slice() {
        [Action::Write { data: WriteData::Region { len: 96, .. }, imm, .. }] => assert_eq!(imm & imm::LAST, 0),
        other => panic!("expected one write of the 96 final bytes, got {other:?}"),
    }
    gates[0] = 200;
    out.clear();
    p.progress(&ring, &mut gates, 2, &c, &mut out).unwrap();
    match out.as_slice() {
        [Action::Write { data: WriteData::Region { len: 104, .. }, imm, .. }] => assert_ne!(imm & imm::LAST, 0),
        other => panic!("expected the last 104 bytes, got {other:?}"),
    }
}

#[test]
fn a_call_of_another_signature_is_a_mismatch_naming_both() {
    let mut net = Net::new(2, &[(0, 1)], SMALL, 4);
    net.calls[0] = call(0, 7);
    net.calls[1] = call(1, 8);
    let mut a = vec![1i32; 7];
    let mut b = vec![0i32; 7];
    net.send(0, 1, host(&mut a), None);
    net.recv(1, 0, host(&mut b), None, false);
    match net.run() {
        Err(Error::Mismatch { peer: 0, ours, theirs, .. }) => assert_eq!((ours.count, theirs.count), (8, 7)),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    let mut net = Net::new(2, &[(0, 1)], SMALL, 5);
    net.calls[0].comm_id = 1;
    net.send(0, 1, host(&mut a), None);
    net.recv(1, 0, host(&mut b), None, false);
    let e = net.run().unwrap_err().to_string();
    assert!(e.contains("protocol error from rank 0") && e.contains("communicator 0x1"), "{e}");
}

#[test]
fn messages_of_other_lengths_are_protocol_errors_not_corruption() {
    for (sent, expected) in [(300usize, 200usize), (100, 200), (0, 8), (8, 0)] {
        let mut net = Net::new(2, &[(0, 1)], SMALL, 6);
        let mut a = vec![3u8; sent];
        let mut b = vec![0u8; expected];
        net.send(0, 1, host(&mut a), None);
        net.recv(1, 0, host(&mut b), None, false);
        match net.run() {
            Err(Error::Protocol { peer: 0, detail, .. }) => {
                assert!(detail.contains(&format!("receive of {expected} bytes")), "{detail}")
            }
            other => panic!("{sent} sent, {expected} expected: got {other:?}"),
        }
    }
}

/// A protocol with its receive work requests posted, for feeding it forged completions.
fn ready(spec: RingSpec) -> (Protocol, Vec<u8>, CallInfo) {
    let mut p = Protocol::new(spec);
    let ring = vec![0u8; spec.ring_bytes()];
    let c = call(0, 1);
    p.progress(&ring, &mut [], 3, &c, &mut Vec::new()).unwrap();
    (p, ring, c)
}

fn protocol_detail(r: Result<()>) -> String {
    match r {
        Err(Error::Protocol { peer: 3, detail, ctx }) => {
            assert_eq!(ctx.rank, 0);
            detail
        }
        other => panic!("expected a protocol error naming rank 3, got {other:?}"),
    }
}

#[test]
fn forged_immediates_and_lengths_are_protocol_errors_naming_the_peer() {
    let full = (HEADER_LEN + SMALL.payload_bytes) as u32;
    let cases: [(u32, u32, &str); 8] = [
        (imm::data(9, 0, true), 40, "slot 9 of a ring of 4"),
        (imm::data(1, 1, false), 40, "slot 1 where chunk 0 in slot 0"),
        (imm::data(0, 5, false), 40, "chunk 5 in slot 0"),
        (imm::data(0, 0, true), full + 1, "bytes into a slot of"),
        (imm::data(0, 0, true), 10, "10 bytes into a slot"),
        (imm::data(0, 0, true) | (1 << 25), 40, "malformed data immediate"),
        (imm::credit(1), 0, "1 credits returned where 0 slots are in use"),
        (0, 0, "unknown immediate"),
    ];
    for (imm, len, want) in cases {
        let (mut p, _, c) = ready(SMALL);
        let d = protocol_detail(p.on_arrival(imm, len, 3, &c));
        assert!(d.contains(want), "{imm:#x}: {d}");
    }
    let (mut p, _, c) = ready(SMALL);
    let d = protocol_detail(p.on_arrival(imm::credit(2) | (1 << 20), 0, 3, &c));
    assert!(d.contains("malformed credit"), "{d}");
    let d = protocol_detail(p.on_send_complete(1 << 62, 3, &c));
    assert!(d.contains("idle slot 0"), "{d}");
}

#[test]
fn a_peer_writing_without_a_credit_is_caught() {
    let (mut p, _, c) = ready(SMALL);
    for seq in 0..SMALL.slots as u64 {
        p.on_arrival(imm::data(seq as usize % SMALL.slots, seq, true), HEADER_LEN as u32, 3, &c).unwrap();
    }
    let d = protocol_detail(p.on_arrival(imm::data(0, SMALL.slots as u64, true), HEADER_LEN as u32, 3, &c));
    assert!(d.contains("not yet credited back"), "{d}");
}

#[test]
fn a_garbled_header_in_a_slot_is_a_protocol_error() {
    let (mut p, mut ring, c) = ready(SMALL);
    let mut dst = [0u8; 4];
    p.post_recv(host(&mut dst), None, None, 3, &c).unwrap();
    p.on_arrival(imm::data(0, 0, true), HEADER_LEN as u32 + 4, 3, &c).unwrap();
    ring[..4].copy_from_slice(b"XXXX");
    let d = protocol_detail(p.progress(&ring, &mut [], 3, &c, &mut Vec::new()).map(|_| ()));
    assert!(d.contains("magic"), "{d}");
    assert_eq!(dst, [0; 4], "nothing landed");
}

#[test]
fn an_abort_chunk_reports_the_peers_reason_and_goodbye_is_no_error() {
    let mut net = Net::new(2, &[(0, 1)], SMALL, 8);
    let mut b = vec![0u8; 64];
    net.recv(1, 0, host(&mut b), None, false);
    let i = net.end(0, 1);
    net.progress(i).unwrap();
    let a = net.ends[i].proto.control(FrameKind::Abort, 0xc0ffee, 1, "rank 0 ran out of memory").unwrap();
    assert!(net.ends[i].proto.control(FrameKind::Goodbye, 0xc0ffee, 1, "").is_none(), "one control chunk, then closed");
    if let Action::Write { wr_id, slot, header, data: WriteData::Bytes(b), imm } = a {
        let mut bytes = header.to_vec();
        bytes.extend_from_slice(&b);
        net.ends[i].wire.push_back(InFlight { slot: Some(slot), bytes, imm, wr_id });
    } else {
        panic!("a control chunk is a write");
    }
    match net.run() {
        Err(Error::PeerAborted { peer: 0, reason, .. }) => assert_eq!(reason, "rank 0 ran out of memory"),
        other => panic!("expected the peer's abort, got {other:?}"),
    }

    let (mut p, mut ring, c) = ready(SMALL);
    let mut q = Protocol::new(SMALL);
    let Some(Action::Write { header, imm, .. }) = q.control(FrameKind::Goodbye, 0xc0ffee, 1, "") else {
        panic!("a goodbye write")
    };
    ring[..HEADER_LEN].copy_from_slice(&header);
    p.on_arrival(imm, HEADER_LEN as u32, 3, &c).unwrap();
    p.progress(&ring, &mut [], 3, &c, &mut Vec::new()).unwrap();
    assert!(p.said_goodbye() && !p.busy());
}

/// Issue 31, defect 1: a peer that sent everything this rank's call needed and
/// then aborted fails nothing of that call; only a later request that needs it.
#[test]
fn an_abort_after_everything_the_call_needed_fails_only_later_requests() {
    let mut net = Net::new(2, &[(0, 1)], SMALL, 8);
    let mut src: Vec<u8> = (0..200u8).collect();
    let mut dst = vec![0u8; 200];
    net.send(0, 1, host(&mut src), None);
    net.recv(1, 0, host(&mut dst), None, false);
    net.run().unwrap();
    assert_eq!(dst, src);
    let (i, j) = (net.end(0, 1), net.end(1, 0));
    let a = net.ends[i].proto.control(FrameKind::Abort, 0xc0ffee, 1, "rank 0 was aborted").unwrap();
    let Action::Write { wr_id, slot, header, data: WriteData::Bytes(b), imm } = a else {
        panic!("a control chunk is a write")
    };
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(&b);
    net.ends[i].wire.push_back(InFlight { slot: Some(slot), bytes, imm, wr_id });
    net.progress(j).unwrap();
    assert!(net.land(i).unwrap(), "the abort chunk lands");
    net.progress(j).expect("nothing of rank 1 needs rank 0 any more");
    let mut later = vec![0u8; 8];
    net.recv(1, 0, host(&mut later), None, false);
    match net.progress(j) {
        Err(Error::PeerAborted { peer: 0, reason, .. }) => assert_eq!(reason, "rank 0 was aborted"),
        other => panic!("a receive from the aborted peer must fail with its reason, got {other:?}"),
    }
}

#[test]
fn ring_specs_outside_what_the_immediate_and_slots_carry_are_refused() {
    assert!(RingSpec::DEFAULT.check().is_ok());
    assert_eq!(RingSpec::DEFAULT.ring_bytes(), 8 * ((HEADER_LEN + SEGMENT_BYTES).next_multiple_of(64)));
    for bad in [
        RingSpec { slots: 0, ..SMALL },
        RingSpec { slots: 257, ..SMALL },
        RingSpec { payload_bytes: 12, ..SMALL },
        RingSpec { payload_bytes: SEGMENT_BYTES + 8, ..SMALL },
        RingSpec { credit_batch: 5, ..SMALL },
        RingSpec { credit_batch: 0, ..SMALL },
    ] {
        assert!(bad.check().is_err(), "{bad:?}");
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn spec() -> impl Strategy<Value = RingSpec> {
        (1usize..6, 1usize..40, 1usize..300).prop_flat_map(|(slots, words, grain)| {
            (1..=slots).prop_map(move |credit_batch| RingSpec {
                slots,
                payload_bytes: words * 8,
                forward_grain: grain,
                credit_batch,
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Any ring layout, any sequence of messages both ways (plain receives and
        /// integer sums), any interleaving verbs allows: every byte arrives where it
        /// belongs, and every sum is the closed form.
        #[test]
        fn any_layout_and_interleaving_delivers_every_message(
            spec in spec(),
            sizes in proptest::collection::vec((0usize..700, any::<bool>()), 1..6),
            seed in any::<u64>(),
        ) {
            let mut net = Net::new(2, &[(0, 1)], spec, seed);
            let mut srcs: Vec<Vec<i32>> = Vec::new();
            let mut accs: Vec<Vec<i32>> = Vec::new();
            for (k, &(n, _)) in sizes.iter().enumerate() {
                srcs.push((0..n as i32).map(|i| i * 5 + k as i32).collect());
                accs.push((0..n as i32).map(|i| 1000 - i).collect());
            }
            let mut back: Vec<Vec<i32>> = srcs.iter().map(|s| s.iter().map(|v| v + 1).collect()).collect();
            let mut got: Vec<Vec<i32>> = srcs.iter().map(|s| vec![0; s.len()]).collect();
            for k in 0..sizes.len() {
                net.send(0, 1, host(&mut srcs[k]), None);
                net.send(1, 0, host(&mut back[k]), None);
                let reduction = Reduction { src: host(&mut accs[k]), op: ReduceOp::Sum, dtype: DType::I32 };
                let dst = host(&mut accs[k]);
                net.recv(1, 0, dst, sizes[k].1.then_some(reduction), false);
                net.recv(0, 1, host(&mut got[k]), None, false);
            }
            net.run().unwrap();
            for (k, &(n, reduce)) in sizes.iter().enumerate() {
                for i in 0..n {
                    let sent = i as i32 * 5 + k as i32;
                    let want = if reduce { sent + 1000 - i as i32 } else { sent };
                    prop_assert_eq!(accs[k][i], want, "message {} element {}", k, i);
                    prop_assert_eq!(got[k][i], sent + 1);
                }
            }
        }
    }
}
