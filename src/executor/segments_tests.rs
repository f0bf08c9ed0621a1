use super::*;
use crate::algorithm::{plan, PlanRequest};
use crate::types::OpKind;

/// Parts of these lengths over one backing vector (so the pointers are real).
fn parts_of(backing: &mut [u8], lens: &[usize]) -> Segments {
    let mut rest = backing;
    let mut parts: Vec<&mut [u8]> = Vec::new();
    for &n in lens {
        let (p, r) = std::mem::take(&mut rest).split_at_mut(n);
        parts.push(p);
        rest = r;
    }
    Segments::new(&mut parts)
}

#[test]
fn a_range_is_found_only_inside_one_part() {
    let mut backing = vec![0u8; 20];
    let base = backing.as_mut_ptr() as usize;
    let segs = parts_of(&mut backing, &[4, 0, 6, 10]);
    assert_eq!((segs.count(), segs.total()), (3, 20));
    let at = |o, l| segs.locate(o, l).map(|p| p as usize - base);
    assert_eq!(at(0, 4), Some(0));
    assert_eq!(at(4, 6), Some(4));
    assert_eq!(at(5, 5), Some(5));
    assert_eq!(at(3, 2), None, "crosses the end of the first part");
    assert_eq!(at(10, 10), Some(10));
    assert_eq!(at(20, 0), Some(20), "an empty range at the very end");
    assert_eq!(at(19, 2), None, "past the end");
    assert_eq!(at(usize::MAX, 2), None, "an offset that overflows");
    assert_eq!(segs.cuts_within(0, 20).collect::<Vec<_>>(), [4, 10]);
    assert_eq!(segs.cuts_within(4, 7).collect::<Vec<_>>(), [6]);
    assert_eq!(segs.cuts_within(5, 5).count(), 0);
}

#[test]
fn packing_round_trips_through_the_parts() {
    let mut backing: Vec<u8> = (0..23).collect();
    let segs = parts_of(&mut backing, &[1, 7, 0, 15]);
    let mut packed = vec![0xAA];
    segs.gather_into(&mut packed);
    assert_eq!(&packed[1..], &(0..23).collect::<Vec<u8>>()[..]);
    let reversed: Vec<u8> = (0..23).rev().collect();
    segs.scatter_from(&reversed);
    assert_eq!(backing, reversed);
}

#[test]
fn a_cut_schedule_names_every_byte_once_per_step_and_each_piece_inside_a_part() {
    let lens = [4usize, 12, 4, 36, 8, 4, 0, 60, 4];
    let total: usize = lens.iter().sum();
    let mut backing = vec![0u8; total];
    let segs = parts_of(&mut backing, &lens);
    for world in [2, 3, 4, 7] {
        for algorithm in [Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling] {
            let req = request(world, 1, total / 4, algorithm);
            let s = plan(&req).unwrap();
            let cut = split_schedule(&s, &segs);
            assert_eq!(cut.rounds.len(), s.rounds.len());
            for (whole, pieces) in s.rounds.iter().zip(&cut.rounds) {
                // The pieces, in order, cover each step's regions exactly.
                let mut pieces = pieces.steps.iter().peekable();
                for step in &whole.steps {
                    let len = regions(step)[0].map_or(0, |r| r.len);
                    let mut covered = 0;
                    loop {
                        let p = pieces.next().expect("a piece of the step");
                        assert_eq!(p.peer(), step.peer());
                        for (piece, of) in regions(p).into_iter().zip(regions(step)) {
                            let (Some(piece), Some(of)) = (piece, of) else { continue };
                            assert_eq!(
                                (piece.buf, piece.offset),
                                (of.buf, of.offset + covered),
                                "{algorithm:?} {step:?}"
                            );
                            if piece.buf != BufId::Scratch {
                                assert!(segs.locate(piece.offset, piece.len).is_some(), "{piece:?} crosses a part");
                            }
                        }
                        let n = regions(p)[0].map_or(0, |r| r.len);
                        assert!(n > 0 || len == 0, "no empty pieces of a non-empty step");
                        covered += n;
                        if covered >= len {
                            break;
                        }
                    }
                    assert_eq!(covered, len);
                }
                assert!(pieces.next().is_none());
            }
        }
    }
}

fn request(world: usize, rank: usize, count: usize, algorithm: Algorithm) -> PlanRequest<'static> {
    PlanRequest {
        op: OpKind::AllReduce,
        rank,
        world,
        count,
        elem_size: 4,
        root: 0,
        algorithm: Some(algorithm),
        hosts: &[],
        blocks: None,
    }
}

/// What makes cutting safe: in every listed algorithm's in-place all-reduce, at
/// every world size, each transfer leaves the sender from the same offsets of the
/// caller's buffer as it lands at on the receiver, in the same order on both ends,
/// and never touches scratch. Both ends then cut each transfer alike.
#[test]
fn the_listed_algorithms_move_every_byte_between_equal_offsets_of_the_callers_buffer() {
    for algorithm in Algorithm::ALL {
        for world in (1..=9).filter(|&w| runs_on_segments(algorithm, w)) {
            for count in [0, 1, 5, 64, 1000, 300_001] {
                let schedules: Vec<Schedule> =
                    (0..world).map(|rank| plan(&request(world, rank, count, algorithm)).unwrap()).collect();
                let what = format!("{algorithm:?}, {world} ranks, {count} elements");
                let scratch_on_the_wire = schedules
                    .iter()
                    .flat_map(|s| s.rounds.iter().flat_map(|r| &r.steps))
                    .any(|s| s.peer().is_some() && touches_scratch(s));
                assert!(!scratch_on_the_wire, "{what}: a transfer touches scratch");
                let rounds = schedules.iter().map(|s| s.rounds.len()).max().unwrap_or(0);
                for round in 0..rounds {
                    for from in 0..world {
                        for to in (0..world).filter(|&t| t != from) {
                            let sent: Vec<Region> = steps_in(&schedules[from], round)
                                .filter_map(|s| match *s {
                                    Step::Send { peer, src } if peer == to => Some(src),
                                    Step::RecvReduceSend { dst, to: t, .. } if t == to => Some(dst),
                                    _ => None,
                                })
                                .collect();
                            let landed: Vec<Region> = steps_in(&schedules[to], round)
                                .filter_map(|s| match *s {
                                    Step::Recv { peer, dst }
                                    | Step::RecvReduce { peer, dst, .. }
                                    | Step::RecvReduceSend { peer, dst, .. }
                                        if peer == from =>
                                    {
                                        Some(dst)
                                    }
                                    _ => None,
                                })
                                .collect();
                            let at = |v: &[Region]| v.iter().map(|r| (r.offset, r.len)).collect::<Vec<_>>();
                            assert_eq!(at(&sent), at(&landed), "{what}: round {round}, {from} -> {to}");
                        }
                    }
                }
            }
        }
    }
}

fn steps_in(s: &Schedule, round: usize) -> impl Iterator<Item = &Step> {
    s.rounds.get(round).into_iter().flat_map(|r| &r.steps)
}

fn touches_scratch(step: &Step) -> bool {
    regions(step).iter().flatten().any(|r| r.buf == BufId::Scratch)
}
