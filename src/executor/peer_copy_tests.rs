//! The single-copy device channel driven directly, two ranks' channels over an
//! in-process link, each on its own simulated device.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Control, ControlKind, PeerCopyChannel, CONTROL_BYTES};
use crate::device::PeerProcess::This;
use crate::device::{Device, DevicePtr, SimDevice};
use crate::error::{Error, OpContext, Result};
use crate::executor::call_maps::MAX_PEER_ALLOCATIONS_PER_CALL;
use crate::executor::channel::{MemKind, MemRegion, PeerChannel, Reduction, PIECE_BYTES};
use crate::executor::{CallInfo, StreamChannel, WaitPolicy};
use crate::transport::loopback::LoopbackLink;
use crate::types::{CallSig, DType, OpKind, ReduceOp};

fn call(rank: usize, count: usize) -> CallInfo {
    let sig = CallSig::new(OpKind::AllReduce, DType::I32, count as u64, 0, ReduceOp::Sum);
    CallInfo {
        ctx: OpContext { rank, call: Some(sig), seq: 0 },
        sig,
        send_seq: 0,
        recv_seq: 0,
        comm_id: 9,
        epoch: 0,
        dtype: DType::I32,
        reduce_op: ReduceOp::Sum,
        timeout: Duration::from_secs(10),
        wait: WaitPolicy::for_ranks(1),
        flags: Default::default(),
    }
}

fn pair() -> (StreamChannel, StreamChannel) {
    let (a, b) = LoopbackLink::pair(0, 1, 64 << 10);
    (StreamChannel::new(Box::new(a)), StreamChannel::new(Box::new(b)))
}

fn region(p: DevicePtr, len: usize) -> MemRegion {
    MemRegion { ptr: p as usize as *mut u8, len, kind: MemKind::Device }
}

fn ints(v: impl Iterator<Item = i32>) -> Vec<u8> {
    v.flat_map(|x| x.to_le_bytes()).collect()
}

/// Drive `a` (rank 0) and `b` (rank 1) until neither is busy or one fails.
fn drive(a: &mut dyn PeerChannel, b: &mut dyn PeerChannel, gates: &mut [usize], n: usize) -> Result<()> {
    let (ia, ib) = (call(0, n), call(1, n));
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.busy() || b.busy() {
        assert!(Instant::now() < deadline, "transfer stalled");
        a.progress(1, gates, &ia)?;
        b.progress(0, gates, &ib)?;
    }
    Ok(())
}

/// Rank 0's device region is read by rank 1's device and reduced into rank 1's
/// region, piece by piece, with no host staging copy on either device; rank 0's
/// send completes only after rank 1 acknowledged every piece.
#[test]
fn a_receive_reduce_reads_the_peer_device_memory_directly() {
    let n = 2 * (PIECE_BYTES / 4) + 7;
    let (s0, s1) = (Arc::new(SimDevice::new("p0")), Arc::new(SimDevice::new("p1")));
    let (d0, d1): (Arc<dyn Device>, Arc<dyn Device>) = (s0.clone(), s1.clone());
    let src = d0.alloc_device(n * 4).unwrap();
    let (dst, own) = (d1.alloc_device(n * 4).unwrap(), d1.alloc_device(n * 4).unwrap());
    s0.upload(src, &ints((0..n).map(|i| i as i32))).unwrap();
    s1.upload(own, &ints((0..n).map(|_| 5))).unwrap();
    let (mut c0, mut c1) = pair();
    let mut a = PeerCopyChannel::new(&mut c0, d0.clone(), This);
    let mut b = PeerCopyChannel::new(&mut c1, d1.clone(), This);
    let mut gates = Vec::new();
    a.post_send(region(src, n * 4), None, &call(0, n)).unwrap();
    let reduction = Reduction { src: region(own, n * 4), op: ReduceOp::Sum, dtype: DType::I32 };
    b.post_recv(region(dst, n * 4), Some(reduction), Some(&mut gates), &call(1, n)).unwrap();
    assert_eq!(gates.len(), 3, "one gate per piece");
    let ia = call(0, n);
    // Until rank 1 runs its device work and acknowledges, rank 0 stays busy.
    for _ in 0..50 {
        a.progress(1, &mut gates, &ia).unwrap();
    }
    assert!(a.busy(), "a send completes only when the peer acknowledged it");
    drive(&mut a, &mut b, &mut gates, n).unwrap();
    assert_eq!(gates, [PIECE_BYTES, PIECE_BYTES, 28], "every piece's gate opened once its reduction completed");
    drop((a, b));
    let mut out = vec![0u8; n * 4];
    s1.download(dst, &mut out).unwrap();
    assert_eq!(out, ints((0..n).map(|i| i as i32 + 5)));
    let (st0, st1) = (s0.stats(), s1.stats());
    assert_eq!((st0.to_host, st0.to_device, st1.to_host, st1.to_device), (0, 0, 0, 0), "{st0:?} {st1:?}");
    assert_eq!((st1.reductions, st1.peer_maps), (3, 1), "one reduction per piece, one mapping");
    assert_eq!(s1.mapped_allocations(), 0, "closed when the call ended, though rank 0's buffer is still allocated");
}

/// Zero-length regions: one empty piece each way, described and acknowledged,
/// with no device work.
#[test]
fn units_are_runs_of_the_cut_every_channel_uses() {
    let pb = PIECE_BYTES;
    for len in [0, 1, pb - 1, pb, pb + 1, 3 * pb + 5, 8 * pb, 8 * pb + 1, 20 * pb + 3, 512 * pb, 1024 * pb + 9] {
        let cut: Vec<(usize, usize)> = crate::executor::channel::pieces(len).collect();
        let units = super::unit_count(len);
        let mut next_piece = 0;
        for k in 0..units {
            let (off, ulen) = super::unit(len, k);
            let range = super::unit_piece_range(len, k);
            assert_eq!(range.start, next_piece, "{len} unit {k}: contiguous pieces");
            let (first, last) = (cut[range.start], cut[range.end - 1]);
            assert_eq!((off, off + ulen), (first.0, last.0 + last.1), "{len} unit {k}: exactly its pieces");
            for p in range.clone() {
                assert_eq!(super::piece_len(len, p), cut[p].1, "{len} piece {p}");
            }
            next_piece = range.end;
        }
        assert_eq!(next_piece, cut.len(), "{len}: the units cover every piece");
        // Short transfers keep one descriptor per piece; long ones at most
        // UNITS_PER_TRANSFER, but never over MAX_UNIT_PIECES pieces each.
        let want = if cut.len() <= super::UNITS_PER_TRANSFER {
            cut.len()
        } else {
            cut.len().div_ceil(cut.len().div_ceil(super::UNITS_PER_TRANSFER).min(super::MAX_UNIT_PIECES))
        };
        assert_eq!(units, want, "{len}");
    }
    assert_eq!(super::unit_count(1024 * pb), 16, "1 GiB: units of 64 MiB");
    assert_eq!(super::unit_count(128 * pb), 8, "128 MiB: units of 16 MiB");
}

/// A forward through units of several pieces: the receive raises every piece's
/// gate of a unit once its work completed, and a forwarded send describes a unit
/// only when all its pieces are final (here rank 1 receives from rank 0 and
/// forwards to rank 2 on the same gates).
#[test]
fn a_long_forward_moves_in_units_and_opens_every_piece_gate() {
    let n = (20 * PIECE_BYTES + 12) / 4;
    let len = n * 4;
    let devs: Vec<Arc<SimDevice>> = (0..3).map(|r| Arc::new(SimDevice::new(&format!("u{r}")))).collect();
    let d: Vec<Arc<dyn Device>> = devs.iter().map(|s| s.clone() as Arc<dyn Device>).collect();
    let bufs: Vec<DevicePtr> = d.iter().map(|d| d.alloc_device(len).unwrap()).collect();
    devs[0].upload(bufs[0], &ints((0..n as i32).map(|i| i * 3 + 1))).unwrap();
    let (mut c01, mut c10) = pair();
    let (mut c12, mut c21) = pair();
    let mut a = PeerCopyChannel::new(&mut c01, d[0].clone(), This);
    let mut b_in = PeerCopyChannel::new(&mut c10, d[1].clone(), This);
    let mut b_out = PeerCopyChannel::new(&mut c12, d[1].clone(), This);
    let mut c = PeerCopyChannel::new(&mut c21, d[2].clone(), This);
    let mut gates = Vec::new();
    a.post_send(region(bufs[0], len), None, &call(0, n)).unwrap();
    b_in.post_recv(region(bufs[1], len), None, Some(&mut gates), &call(1, n)).unwrap();
    assert_eq!(gates.len(), 21, "one executor gate per piece");
    b_out.post_send(region(bufs[1], len), Some(0), &call(1, n)).unwrap();
    c.post_recv(region(bufs[2], len), None, None, &call(2, n)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut moved = a.progress(1, &mut gates, &call(0, n)).unwrap();
        moved |= b_in.progress(0, &mut gates, &call(1, n)).unwrap();
        moved |= b_out.progress(2, &mut gates, &call(1, n)).unwrap();
        moved |= c.progress(1, &mut [], &call(2, n)).unwrap();
        if !(a.busy() || b_in.busy() || b_out.busy() || c.busy()) {
            break;
        }
        assert!(moved || std::time::Instant::now() < deadline, "no completion within 20 s");
    }
    let want: Vec<usize> = crate::executor::channel::pieces(len).map(|(_, l)| l).collect();
    assert_eq!(gates, want, "every piece's gate opened");
    for (r, s) in devs.iter().enumerate().skip(1) {
        let mut out = vec![0u8; len];
        s.download(bufs[r], &mut out).unwrap();
        assert_eq!(out, ints((0..n as i32).map(|i| i * 3 + 1)), "rank {r}'s copy");
        // 21 pieces in units of 3: 7 device copies where there were 21.
        assert_eq!(s.stats().on_device, 7, "rank {r}: one device copy per unit");
    }
}

#[test]
fn empty_regions_complete_without_device_work() {
    let (s0, s1) = (Arc::new(SimDevice::new("e0")), Arc::new(SimDevice::new("e1")));
    let (d0, d1): (Arc<dyn Device>, Arc<dyn Device>) = (s0.clone(), s1.clone());
    let (p0, p1) = (d0.alloc_device(0).unwrap(), d1.alloc_device(0).unwrap());
    let (mut c0, mut c1) = pair();
    let mut a = PeerCopyChannel::new(&mut c0, d0, This);
    let mut b = PeerCopyChannel::new(&mut c1, d1, This);
    let mut gates = Vec::new();
    a.post_send(region(p0, 0), None, &call(0, 0)).unwrap();
    b.post_recv(region(p1, 0), None, Some(&mut gates), &call(1, 0)).unwrap();
    drive(&mut a, &mut b, &mut gates, 0).unwrap();
    assert_eq!(gates, [0]);
    assert_eq!((s1.stats().on_device, s1.stats().peer_maps), (0, 0));
}

fn descriptor(job: u64, piece: u64, offset: u64, len: u64, handle: Vec<u8>) -> Vec<u8> {
    Control { kind: ControlKind::Describe, job, piece, offset, len, handle }.encode().to_vec()
}

fn protocol_detail(e: Error) -> String {
    match e {
        Error::Protocol { peer: 0, detail, ctx } if ctx.rank == 1 => detail,
        other => panic!("expected a protocol error from rank 0 at rank 1, got {other}"),
    }
}

#[test]
fn corrupted_descriptors_are_protocol_errors_naming_the_peer() {
    let owner = SimDevice::new("o");
    let p = owner.alloc_device(64).unwrap();
    let h = owner.export(p, 64).unwrap().handle;
    // A real handle, and an offset past the end of its 64-byte allocation.
    let e = protocol_detail(corrupt_with(&owner, descriptor(0, 0, 60, 16, h.clone())));
    assert!(e.contains("outside its allocation of 64 bytes"), "{e}");
    let e = protocol_detail(corrupt_with(&owner, descriptor(0, 0, u64::MAX - 4, 16, h.clone())));
    assert!(e.contains("outside"), "{e}");
    let e = protocol_detail(corrupt_with(&owner, descriptor(0, 0, 0, 8, h.clone())));
    assert!(e.contains("8 bytes where this rank expects 16"), "{e}");
    let e = protocol_detail(corrupt_with(&owner, descriptor(0, 1, 0, 16, h.clone())));
    assert!(e.contains("expected piece 0"), "{e}");
    let e = protocol_detail(corrupt_with(&owner, descriptor(3, 0, 0, 16, h.clone())));
    assert!(e.contains("no such receive"), "{e}");
    let e = protocol_detail(corrupt_with(&owner, descriptor(0, 0, 0, 16, vec![7; 32])));
    assert!(e.contains("cannot open"), "{e}");
    let mut bad = descriptor(0, 0, 0, 16, h.clone());
    bad[6..8].copy_from_slice(&500u16.to_le_bytes());
    assert!(protocol_detail(corrupt_with(&owner, bad)).contains("handle of 500 bytes"));
    let e = protocol_detail(corrupt_with(&owner, vec![0xee; CONTROL_BYTES]));
    assert!(e.contains("not a single-copy descriptor"), "{e}");
    let ack = Control { kind: ControlKind::Ack, job: 0, piece: 0, offset: 0, len: 0, handle: vec![] };
    assert!(protocol_detail(corrupt_with(&owner, ack.encode().to_vec())).contains("never posted"));
    // A message of another size (a staging peer's data): the inner channel's size check.
    let e = protocol_detail(corrupt_with(&owner, vec![0; 16]));
    assert!(e.contains("frame of 16 bytes where this rank expects"), "{e}");
}

/// Rank 1 posts a receive of 16 bytes into its device; rank 0's raw host channel
/// sends `msg` in place of a descriptor. Returns rank 1's error, after checking
/// that nothing was written into rank 1's buffer. `_owner` keeps the exported
/// allocation the descriptors name alive.
fn corrupt_with(_owner: &SimDevice, msg: Vec<u8>) -> Error {
    let s1 = Arc::new(SimDevice::new("victim"));
    let d1: Arc<dyn Device> = s1.clone();
    let dst = d1.alloc_device(16).unwrap();
    let (mut c0, mut c1) = pair();
    let mut b = PeerCopyChannel::new(&mut c1, d1.clone(), This);
    b.post_recv(region(dst, 16), None, None, &call(1, 4)).unwrap();
    let mut wire = msg;
    c0.post_send(MemRegion { ptr: wire.as_mut_ptr(), len: wire.len(), kind: MemKind::Host }, None, &call(0, 4))
        .unwrap();
    let e = drive(&mut c0, &mut b, &mut [], 4).unwrap_err();
    drop(b);
    let mut out = [0xaau8; 16];
    s1.download(dst, &mut out).unwrap();
    assert_eq!(out, [0u8; 16], "a refused descriptor writes nothing");
    assert_eq!(s1.stats().on_device, 0);
    e
}

/// Ends that disagree about the path (one stages, the other copies single-copy)
/// fail with a size mismatch naming the peer, in either direction, and write
/// nothing: never a hang, never a stray write.
#[test]
fn a_staging_end_and_a_single_copy_end_fail_cleanly() {
    let n = 1000;
    for staged_sends in [true, false] {
        let (s0, s1) = (Arc::new(SimDevice::new("m0")), Arc::new(SimDevice::new("m1")));
        let (d0, d1): (Arc<dyn Device>, Arc<dyn Device>) = (s0.clone(), s1.clone());
        let (src, dst) = (d0.alloc_device(n * 4).unwrap(), d1.alloc_device(n * 4).unwrap());
        s0.upload(src, &ints((0..n).map(|i| i as i32 + 1))).unwrap();
        let (mut c0, mut c1) = pair();
        let (mut a, mut b): (Box<dyn PeerChannel>, Box<dyn PeerChannel>) = if staged_sends {
            (
                Box::new(crate::executor::staged::StagedChannel::new(&mut c0, d0.clone())),
                Box::new(PeerCopyChannel::new(&mut c1, d1.clone(), This)),
            )
        } else {
            (
                Box::new(PeerCopyChannel::new(&mut c0, d0.clone(), This)),
                Box::new(crate::executor::staged::StagedChannel::new(&mut c1, d1.clone())),
            )
        };
        a.post_send(region(src, n * 4), None, &call(0, n)).unwrap();
        b.post_recv(region(dst, n * 4), None, None, &call(1, n)).unwrap();
        let e = drive(a.as_mut(), b.as_mut(), &mut [], n).unwrap_err();
        let detail = protocol_detail(e);
        let want = if staged_sends {
            format!("frame of {} bytes where this rank expects {CONTROL_BYTES}", n * 4)
        } else {
            format!("frame of {CONTROL_BYTES} bytes where this rank expects {}", n * 4)
        };
        assert!(detail.contains(&want), "{detail}");
        drop((a, b));
        let mut out = vec![0xffu8; n * 4];
        s1.download(dst, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0), "nothing was written");
    }
}

/// Rank 1 posts `receives` receives of `pieces` pieces each (at most
/// UNITS_PER_TRANSFER, so one descriptor per piece) from a forged rank 0 (a raw
/// host channel), whose descriptor for piece k (counted over all receives) is
/// `describe(k)`. Returns rank 1's device, where the receives landed one after
/// the other, and the error (if any) after the channel was dropped.
fn forged_receive(
    victim: &Arc<SimDevice>,
    receives: usize,
    pieces: usize,
    channel: impl FnOnce(&mut crate::executor::StreamChannel, Arc<dyn Device>) -> PeerCopyChannel<'_>,
    describe: impl Fn(usize) -> Vec<u8>,
) -> (DevicePtr, Result<()>) {
    assert!(pieces <= super::UNITS_PER_TRANSFER);
    let d1: Arc<dyn Device> = victim.clone();
    let len = receives * pieces * PIECE_BYTES;
    let dst = d1.alloc_device(len).unwrap();
    let (mut c0, mut c1) = pair();
    let mut b = channel(&mut c1, d1);
    for r in 0..receives {
        let part = region(dst + (r * pieces * PIECE_BYTES) as u64, pieces * PIECE_BYTES);
        b.post_recv(part, None, None, &call(1, len / 4)).unwrap();
    }
    let mut wire: Vec<Vec<u8>> = (0..receives * pieces).map(describe).collect();
    for m in &mut wire {
        let r = MemRegion { ptr: m.as_mut_ptr(), len: m.len(), kind: MemKind::Host };
        c0.post_send(r, None, &call(0, len / 4)).unwrap();
    }
    let r = drive(&mut c0, &mut b, &mut [], len / 4);
    drop(b);
    (dst, r)
}

/// Defect: a peer could name a new allocation in every piece, and each one was
/// mapped (and, on CUDA, the oldest closed past 64 while copies from it were
/// still queued). Now past the per-call bound the descriptor is refused naming
/// rank, peer and call; every mapping the call opened stays open until its
/// queued copies ran, and all are closed when the call ends.
#[test]
fn a_peer_naming_a_new_allocation_every_piece_is_refused_past_the_per_call_bound() {
    let owner = SimDevice::new("many");
    // Three receives of 8 pieces (a unit each): the bound is per call, not per transfer.
    let per = super::UNITS_PER_TRANSFER;
    let n = (MAX_PEER_ALLOCATIONS_PER_CALL + 3).next_multiple_of(per);
    let handles: Vec<Vec<u8>> = (0..n)
        .map(|k| {
            let p = owner.alloc_device(PIECE_BYTES).unwrap();
            owner.upload(p, &vec![k as u8 + 1; PIECE_BYTES]).unwrap();
            owner.export(p, PIECE_BYTES).unwrap().handle
        })
        .collect();
    let victim = Arc::new(SimDevice::new("bounded"));
    let (dst, r) = forged_receive(
        &victim,
        n / per,
        per,
        |c, d| PeerCopyChannel::new(c, d, This),
        |k| descriptor((k / per) as u64, (k % per) as u64, 0, PIECE_BYTES as u64, handles[k].clone()),
    );
    let e = r.expect_err("a new allocation in every piece must be refused");
    let text = e.to_string();
    let detail = protocol_detail(e);
    assert!(detail.contains(&format!("past the {MAX_PEER_ALLOCATIONS_PER_CALL}")), "{detail}");
    let op = format!("rank 1 in {} #0", call(1, n * PIECE_BYTES / 4).sig);
    assert!(text.starts_with(&op) && text.contains("from rank 0"), "{text}");
    assert_eq!(victim.stats().peer_maps, MAX_PEER_ALLOCATIONS_PER_CALL as u64);
    // The copies queued before the refusal read mappings that were still open.
    let mut out = vec![0u8; n * PIECE_BYTES];
    victim.download(dst, &mut out).unwrap();
    for k in 0..MAX_PEER_ALLOCATIONS_PER_CALL {
        assert!(out[k * PIECE_BYTES..(k + 1) * PIECE_BYTES].iter().all(|&x| x == k as u8 + 1), "piece {k}");
    }
    assert!(out[MAX_PEER_ALLOCATIONS_PER_CALL * PIECE_BYTES..].iter().all(|&x| x == 0), "nothing past the bound");
    assert_eq!(victim.mapped_allocations(), 0, "closed when the call ended");
}

/// Defect: a handle's own claim to come from this process made the receiver use
/// its address as one of its own, so a forged peer could make this rank copy
/// its own memory. A peer not established as being of this process (the
/// default) is refused, naming the peer, and nothing is read.
#[test]
fn a_forged_same_process_handle_never_reads_this_ranks_own_memory() {
    let victim = Arc::new(SimDevice::new("own"));
    let secret = victim.alloc_device(PIECE_BYTES).unwrap();
    victim.upload(secret, &vec![0x5e; PIECE_BYTES]).unwrap();
    // The victim exported it to someone: the forger repeats that handle.
    let handle = victim.export(secret, PIECE_BYTES).unwrap().handle;
    let (dst, r) = forged_receive(
        &victim,
        1,
        1,
        |c, d| PeerCopyChannel::new(c, d, crate::device::PeerProcess::Other),
        |_| descriptor(0, 0, 0, PIECE_BYTES as u64, handle.clone()),
    );
    let detail = protocol_detail(r.expect_err("a forged claim of this process must be refused"));
    assert!(detail.contains("cannot open") && detail.contains("claiming this process"), "{detail}");
    let mut out = vec![0xaau8; PIECE_BYTES];
    victim.download(dst, &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 0), "this rank's own memory was not copied");
    assert_eq!(victim.stats().on_device, 0);
}

/// A send region the device cannot export goes through an exportable buffer:
/// whole when final at posting, piece by piece behind a forward's gates; the
/// receiver gets exact data and no host staging happens.
#[test]
fn an_unexportable_send_region_is_staged_through_an_exportable_buffer() {
    let n = 2 * (PIECE_BYTES / 4) + 7;
    for gated in [false, true] {
        let (s0, s1) = (Arc::new(SimDevice::new("x0")), Arc::new(SimDevice::new("x1")));
        let (d0, d1): (Arc<dyn Device>, Arc<dyn Device>) = (s0.clone(), s1.clone());
        let src = s0.alloc_unexportable(n * 4).unwrap();
        let dst = d1.alloc_device(n * 4).unwrap();
        s0.upload(src, &ints((0..n).map(|i| i as i32 * 3))).unwrap();
        let (mut c0, mut c1) = pair();
        let mut a = PeerCopyChannel::new(&mut c0, d0.clone(), This);
        let mut b = PeerCopyChannel::new(&mut c1, d1.clone(), This);
        // A forward's gates, opened one piece at a time below.
        let mut gates = if gated { vec![0; 3] } else { Vec::new() };
        a.post_send(region(src, n * 4), gated.then_some(0), &call(0, n)).unwrap();
        b.post_recv(region(dst, n * 4), None, None, &call(1, n)).unwrap();
        if gated {
            let (ia, ib) = (call(0, n), call(1, n));
            for _ in 0..20 {
                a.progress(1, &mut gates, &ia).unwrap();
                b.progress(0, &mut gates, &ib).unwrap();
            }
            assert_eq!(s1.stats().on_device, 0, "nothing is described before its gate opens");
            gates = vec![PIECE_BYTES, PIECE_BYTES, 28];
        }
        drive(&mut a, &mut b, &mut gates, n).unwrap();
        drop((a, b));
        let mut out = vec![0u8; n * 4];
        s1.download(dst, &mut out).unwrap();
        assert_eq!(out, ints((0..n).map(|i| i as i32 * 3)), "gated: {gated}");
        let (st0, st1) = (s0.stats(), s1.stats());
        assert_eq!((st0.to_host, st0.to_device, st1.to_host, st1.to_device), (0, 0, 0, 0));
        assert_eq!(st0.on_device, if gated { 3 } else { 1 }, "the sender's copies into its exportable buffer");
        assert_eq!((st1.on_device, st1.peer_maps, s1.mapped_allocations()), (3, 1, 0));
        assert_eq!(s0.live_allocations(), 1, "the exportable buffer went with the call");
    }
}

/// Once the executor says the call's last receives from the peer are posted,
/// the receiving channel closes the peer's mappings before the acknowledgement
/// that completes them: the sender stops being busy (its call may return, its
/// user free the buffer) only when none of its memory is mapped on the peer.
/// An earlier round keeps its mapping for the next one.
#[test]
fn the_last_acknowledgement_follows_the_close_of_the_peers_mappings() {
    let n = PIECE_BYTES / 4 + 3;
    let (s0, s1) = (Arc::new(SimDevice::new("l0")), Arc::new(SimDevice::new("l1")));
    let (d0, d1): (Arc<dyn Device>, Arc<dyn Device>) = (s0.clone(), s1.clone());
    let (src, dst) = (d0.alloc_device(n * 4).unwrap(), d1.alloc_device(n * 4).unwrap());
    s0.upload(src, &ints((0..n).map(|i| i as i32))).unwrap();
    let (mut c0, mut c1) = pair();
    let mut a = PeerCopyChannel::new(&mut c0, d0.clone(), This);
    let mut b = PeerCopyChannel::new(&mut c1, d1.clone(), This);
    let (ia, ib) = (call(0, n), call(1, n));
    let mut gates = Vec::new();
    for last in [false, true] {
        a.post_send(region(src, n * 4), None, &ia).unwrap();
        b.post_recv(region(dst, n * 4), None, None, &ib).unwrap();
        if last {
            b.last_receives_posted();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while a.busy() {
            assert!(Instant::now() < deadline, "transfer stalled");
            a.progress(1, &mut gates, &ia).unwrap();
            b.progress(0, &mut gates, &ib).unwrap();
        }
        // Here the sender's call could return.
        assert_eq!(s1.mapped_allocations(), usize::from(!last), "last round: {last}");
        drive(&mut a, &mut b, &mut gates, n).unwrap();
    }
    assert_eq!(s1.stats().peer_maps, 1, "mapped once for the whole call");
    drop((a, b));
    let mut out = vec![0u8; n * 4];
    s1.download(dst, &mut out).unwrap();
    assert_eq!(out, ints((0..n).map(|i| i as i32)));
    // SAFETY: allocated above, freed once, no call uses it any more.
    unsafe { d0.free_device(src, n * 4) };
    assert!(s0.freed_while_mapped().is_empty(), "{:?}", s0.freed_while_mapped());
}
