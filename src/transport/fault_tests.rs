use std::time::{Duration, Instant};

use super::*;
use crate::frame::Header;
use crate::transport::loopback::LoopbackLink;
use crate::types::{CallSig, DType, OpKind, ReduceOp};

/// A frame of `kind` with a payload of `len` bytes (`fill`), padded as the executor pads it.
fn frame(kind: FrameKind, len: usize, fill: u8) -> Vec<u8> {
    let sig = CallSig::new(OpKind::AllReduce, DType::U8, len as u64, 0, ReduceOp::Sum);
    let hdr = Header { kind, comm_id: 7, epoch: 0, seq: 3, sig, len: len as u32 };
    let mut f = hdr.encode().to_vec();
    f.extend(std::iter::repeat_n(fill, len));
    f.extend(std::iter::repeat_n(0, padding(kind, len)));
    f
}

fn plan(frame: u64, offset: usize, action: FaultAction) -> FaultPlan {
    FaultPlan::new(0, FaultPoint { peer: None, frame, offset }, action).unwrap()
}

/// Rank 0's end (wrapped by `plan`) and rank 1's end of a link.
fn wrapped(plan: &FaultPlan) -> (Box<dyn Link>, LoopbackLink) {
    let (a, b) = LoopbackLink::pair(0, 1, 1 << 16);
    (wrap(Some(plan), 0, Box::new(a)), b)
}

/// Write all of `bytes`, `piece` bytes per call at most, as three slices a call.
fn write_all(l: &mut dyn Link, bytes: &[u8], piece: usize) -> io::Result<()> {
    let mut at = 0;
    while at < bytes.len() {
        let end = (at + piece).min(bytes.len());
        let mid = at + (end - at) / 3;
        let n = l.try_write(&[&bytes[at..mid], &[], &bytes[mid..end]])?;
        assert!(n > 0, "the link took nothing at byte {at}");
        at += n;
    }
    Ok(())
}

/// Everything readable at `l` now (until it has nothing, or an error).
fn read_now(l: &mut dyn Link) -> (Vec<u8>, Option<io::Error>) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match l.try_read(&mut buf) {
            Ok(0) => return (out, None),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return (out, Some(e)),
        }
    }
}

#[test]
fn frames_pass_unchanged_in_any_pieces_until_the_point() {
    let p = plan(9, 0, FaultAction::Stall);
    let (mut a, mut b) = wrapped(&p);
    let mut sent = Vec::new();
    let kinds = [(FrameKind::Data, 7usize), (FrameKind::Ack, 3), (FrameKind::Rendezvous, 100), (FrameKind::Data, 41)];
    for (k, (kind, piece)) in kinds.into_iter().enumerate() {
        let f = frame(kind, 13 * k + 1, k as u8);
        write_all(a.as_mut(), &f, piece).unwrap();
        sent.extend(f);
    }
    assert_eq!(read_now(&mut b).0, sent);
    assert_eq!(p.fired(), None);
}

#[test]
fn a_header_corruption_flips_one_byte_of_the_chosen_data_frame_only() {
    let p = plan(1, 9, FaultAction::CorruptHeader { xor: 0x40 });
    let (mut a, mut b) = wrapped(&p);
    // Control frames are not counted: the second data frame is the fourth frame.
    let frames = [frame(FrameKind::Data, 5, 1), frame(FrameKind::Ack, 0, 0), frame(FrameKind::Goodbye, 0, 0)];
    let (target, last) = (frame(FrameKind::Data, 300, 2), frame(FrameKind::Data, 8, 3));
    let mut want = Vec::new();
    // In pieces that show each header whole, as the executor's writes do.
    for f in frames.iter().chain([&target, &last]) {
        write_all(a.as_mut(), f, HEADER_LEN + 1).unwrap();
        want.extend_from_slice(f);
    }
    let at = frames.iter().map(Vec::len).sum::<usize>() + 9;
    want[at] ^= 0x40;
    assert_eq!(read_now(&mut b).0, want);
    assert_eq!(p.fired(), Some(1));
}

#[test]
fn a_cut_delivers_the_bytes_before_it_then_both_ends_fail() {
    let p = plan(0, 50, FaultAction::Cut);
    let (mut a, mut b) = wrapped(&p);
    let f = frame(FrameKind::Data, 100, 9);
    assert_eq!(a.try_write(&[&f]).unwrap(), 50, "written up to the point");
    assert_eq!(a.try_write(&[&f[50..]]).unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    assert_eq!(a.try_write(&[&f[50..]]).unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    assert!(a.try_read(&mut [0u8; 8]).is_err());
    assert!(a.poll_fd().is_none());
    let (got, err) = read_now(&mut b);
    assert_eq!(got, f[..50]);
    assert_eq!(err.expect("the peer sees the link closed").kind(), io::ErrorKind::UnexpectedEof);
    assert!(b.try_write(&[b"late"]).is_err(), "and cannot write to it");
    assert_eq!(p.fired(), Some(1));
}

/// Rank 0 vanishes on its link to rank 1 at byte 50 of the first data frame; its
/// link to rank 2, which carried a frame before, ends the next time it is touched,
/// its goodbye never leaving. Both peers find their links ended without a word.
#[test]
fn a_vanishing_rank_ends_all_its_links_unannounced() {
    let p = FaultPlan::new(0, FaultPoint { peer: Some(1), frame: 0, offset: 50 }, FaultAction::Vanish).unwrap();
    let (a1, mut b1) = LoopbackLink::pair(0, 1, 1 << 16);
    let (a2, mut b2) = LoopbackLink::pair(0, 2, 1 << 16);
    let (mut a1, mut a2) = (wrap(Some(&p), 0, Box::new(a1)), wrap(Some(&p), 0, Box::new(a2)));
    // Rank 2's link is not the point's: its first data frame passes whole.
    let before = frame(FrameKind::Data, 100, 5);
    write_all(a2.as_mut(), &before, 1000).unwrap();
    let f = frame(FrameKind::Data, 100, 9);
    assert_eq!(a1.try_write(&[&f]).unwrap(), 50, "written up to the point");
    assert_eq!(a1.try_write(&[&f[50..]]).unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    assert_eq!(p.fired(), Some(1));
    assert!(a2.try_write(&[&frame(FrameKind::Goodbye, 0, 0)]).is_err(), "nothing leaves a vanished rank");
    a2.close();
    let (got, err) = read_now(&mut b1);
    assert_eq!(got, f[..50]);
    assert_eq!(err.expect("rank 1 sees its link end").kind(), io::ErrorKind::UnexpectedEof);
    let (got, err) = read_now(&mut b2);
    assert_eq!(got, before, "rank 2 gets what went before, and no goodbye");
    assert_eq!(err.expect("rank 2 sees its link end").kind(), io::ErrorKind::UnexpectedEof);
    assert!(b1.peer_gone() && b2.peer_gone());
}

/// Plans of several ranks ride together; each rank's links get only its own, and
/// a second plan for one rank is refused.
#[test]
fn plans_of_several_ranks_ride_together() {
    let at = |frame| FaultPoint { peer: None, frame, offset: 0 };
    let p1 = FaultPlan::new(1, at(0), FaultAction::Vanish).unwrap();
    let p3 = FaultPlan::new(3, at(2), FaultAction::Vanish).unwrap();
    let both = p1.clone().and(p3.clone()).unwrap();
    assert_eq!(both.for_rank(3), Some(&p3));
    assert_eq!(both.for_rank(1), Some(&p1));
    assert_eq!(both.for_rank(0), None);
    assert!(both.clone().and(FaultPlan::new(3, at(1), FaultAction::Cut).unwrap()).is_err());
    // The rank-3 plan inside shares its firing with the caller's copy.
    let (a, mut b) = LoopbackLink::pair(3, 0, 1 << 16);
    let mut a = wrap(Some(&both), 3, Box::new(a));
    for k in 0..3 {
        let r = a.try_write(&[&frame(FrameKind::Data, 8, k)]);
        assert_eq!(r.is_err(), k == 2, "frame {k}");
    }
    assert_eq!((p3.fired(), p1.fired()), (Some(0), None));
    assert_eq!(read_now(&mut b).0.len(), 2 * frame(FrameKind::Data, 8, 0).len());
}

#[test]
fn a_stall_holds_everything_from_the_point_and_keeps_the_link_open() {
    let p = plan(1, 0, FaultAction::Stall);
    let (mut a, mut b) = wrapped(&p);
    let first = frame(FrameKind::Data, 16, 1);
    write_all(a.as_mut(), &first, 1000).unwrap();
    let second = frame(FrameKind::Data, 16, 2);
    for _ in 0..3 {
        assert_eq!(a.try_write(&[&second]).unwrap(), 0);
    }
    // Control frames after the point are held too, and a close is swallowed.
    assert_eq!(a.try_write(&[&frame(FrameKind::Abort, 4, b'x')]).unwrap(), 0);
    a.close();
    let (got, err) = read_now(&mut b);
    assert_eq!(got, first);
    assert!(err.is_none(), "the stalled link must look open: {err:?}");
    // The other direction still flows.
    b.try_write(&[b"back"]).unwrap();
    assert_eq!(read_now(a.as_mut()).0, b"back");
    assert_eq!(p.fired(), Some(1));
}

#[test]
fn a_delay_holds_the_bytes_then_delivers_them_unchanged() {
    // Long enough that the writes right after it are certainly held.
    let held = plan(0, 45, FaultAction::Delay(Duration::from_secs(600)));
    let (mut a, _b) = wrapped(&held);
    let f = frame(FrameKind::Data, 64, 4);
    assert_eq!(a.try_write(&[&f]).unwrap(), 45);
    assert_eq!(a.try_write(&[&f[45..]]).unwrap(), 0);
    assert_eq!(a.try_write(&[&f[45..]]).unwrap(), 0);
    assert!(a.poll_fd().is_none());

    let short = plan(0, 45, FaultAction::Delay(Duration::from_millis(5)));
    let (mut a, mut b) = wrapped(&short);
    let mut at = 0;
    let give_up = Instant::now() + Duration::from_secs(20);
    while at < f.len() {
        assert!(Instant::now() < give_up, "the delayed bytes never went");
        at += a.try_write(&[&f[at..]]).unwrap();
        std::thread::yield_now();
    }
    assert_eq!(read_now(&mut b).0, f);
    assert_eq!(short.fired(), Some(1));
}

#[test]
fn a_plan_for_any_peer_acts_on_one_link_of_its_rank_only() {
    let p = plan(0, 0, FaultAction::Stall);
    let (a1, mut b1) = LoopbackLink::pair(0, 1, 1 << 16);
    let (a2, mut b2) = LoopbackLink::pair(0, 2, 1 << 16);
    let (mut a1, mut a2) = (wrap(Some(&p), 0, Box::new(a1)), wrap(Some(&p), 0, Box::new(a2)));
    let f = frame(FrameKind::Data, 8, 5);
    assert_eq!(a2.try_write(&[&f]).unwrap(), 0, "the first link to reach the point stalls");
    write_all(a1.as_mut(), &f, 1000).unwrap();
    assert_eq!(read_now(&mut b1).0, f);
    assert!(read_now(&mut b2).0.is_empty());
    assert_eq!(p.fired(), Some(2));
    // Another rank's links, and links to other peers, are not wrapped.
    let only_1 = FaultPlan::new(0, FaultPoint { peer: Some(1), frame: 0, offset: 0 }, FaultAction::Stall).unwrap();
    let (c, mut d) = LoopbackLink::pair(0, 2, 1 << 16);
    let mut c = wrap(Some(&only_1), 0, Box::new(c));
    write_all(c.as_mut(), &f, 1000).unwrap();
    let (e, mut g) = LoopbackLink::pair(1, 0, 1 << 16);
    let mut e = wrap(Some(&p), 1, Box::new(e));
    write_all(e.as_mut(), &f, 1000).unwrap();
    assert_eq!((read_now(&mut d).0, read_now(&mut g).0), (f.clone(), f));
}

#[test]
fn corruptions_outside_the_header_or_of_no_bit_are_refused() {
    let at = |offset| FaultPoint { peer: None, frame: 0, offset };
    let e = FaultPlan::new(0, at(HEADER_LEN), FaultAction::CorruptHeader { xor: 1 }).unwrap_err().to_string();
    assert!(e.contains("payload"), "{e}");
    assert!(FaultPlan::new(0, at(3), FaultAction::CorruptHeader { xor: 0 }).is_err());
    assert!(FaultPlan::new(0, at(HEADER_LEN - 1), FaultAction::CorruptHeader { xor: 0x80 }).is_ok());
    assert!(FaultPlan::new(0, at(1 << 20), FaultAction::Cut).is_ok());
}
