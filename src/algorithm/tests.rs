//! Planner and checker tests: every op x algorithm x world size 1..=64 x awkward
//! counts passes the checker, and hand-broken schedules are caught.

use super::check::{check, check_schedules};
use super::*;
use crate::types::OpKind;

/// Counts that hit the edge cases of chunking: empty, fewer elements than ranks,
/// one more, uneven, and a prime.
pub(super) fn counts(n: usize) -> Vec<usize> {
    let mut c = vec![0, 1, 2, n.saturating_sub(1), n + 1, 3 * n + 2, 97];
    c.sort_unstable();
    c.dedup();
    c
}

/// Tiny chain segments so a chain has many segments in flight.
fn small_segments(bytes: usize) -> PlanParams {
    PlanParams { chain_segment_bytes: bytes, ..PlanParams::default() }
}

fn sweep(op: OpKind, worlds: impl Iterator<Item = usize> + Clone, elem_sizes: &[usize]) {
    for &alg in algorithms_for(op) {
        for n in worlds.clone() {
            for count in counts(n) {
                for &es in elem_sizes {
                    let roots: &[usize] = if op.rooted() { &[0, n / 2, n - 1] } else { &[0] };
                    for &root in roots {
                        // Segment size only matters to the chain.
                        let seg_sizes: &[usize] =
                            if alg == Algorithm::Chain { &[8, 512 * 1024] } else { &[512 * 1024] };
                        for params in seg_sizes.iter().map(|&b| small_segments(b)) {
                            if let Err(e) = check(op, n, count, es, root, Some(alg), &params) {
                                panic!("count={count} es={es} root={root} seg={}: {e}", params.chain_segment_bytes);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn sweep_op(op: OpKind) {
    sweep(op, 1..=64, &[1]);
    sweep(op, (1..=9).chain([16, 17, 31]), &[4, 8]);
}

#[test]
fn all_reduce_all_algorithms_all_worlds() {
    sweep_op(OpKind::AllReduce);
}

#[test]
fn all_gather_all_algorithms_all_worlds() {
    sweep_op(OpKind::AllGather);
}

#[test]
fn reduce_scatter_all_algorithms_all_worlds() {
    sweep_op(OpKind::ReduceScatter);
}

#[test]
fn broadcast_all_algorithms_all_worlds() {
    sweep_op(OpKind::Broadcast);
}

#[test]
fn reduce_all_algorithms_all_worlds() {
    sweep_op(OpKind::Reduce);
}

#[test]
fn gather_all_algorithms_all_worlds() {
    sweep_op(OpKind::Gather);
}

#[test]
fn scatter_all_algorithms_all_worlds() {
    sweep_op(OpKind::Scatter);
}

#[test]
fn barrier_all_worlds() {
    for n in 1..=64 {
        check(OpKind::Barrier, n, 0, 1, 0, None, &PlanParams::default()).unwrap();
    }
    // Beyond one word of the rank bitset.
    for n in [65, 100, 128, 129] {
        check(OpKind::Barrier, n, 0, 1, 0, None, &PlanParams::default()).unwrap();
    }
}

#[test]
fn all_to_all_all_worlds() {
    sweep_op(OpKind::AllToAll);
}

#[test]
fn worlds_beyond_one_bitset_word() {
    let p = small_segments(8);
    for op in [
        OpKind::AllReduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::Gather,
        OpKind::Scatter,
    ] {
        for &alg in algorithms_for(op) {
            check(op, 65, 68, 2, 64, Some(alg), &p).unwrap();
            check(op, 130, 5, 2, 129, Some(alg), &p).unwrap();
        }
    }
}

#[test]
fn default_choice_is_checked_and_follows_thresholds() {
    let p = PlanParams::default();
    for op in [
        OpKind::AllReduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::AllToAll,
        OpKind::Gather,
        OpKind::Scatter,
    ] {
        for n in [1, 2, 5, 8, 9] {
            for count in [0, 3, 1000] {
                check(op, n, count, 4, 0, None, &p).unwrap();
            }
        }
    }
    let req = |op, world, count| PlanRequest {
        op,
        rank: 0,
        world,
        count,
        elem_size: 4,
        root: 0,
        algorithm: None,
        hosts: &[],
        blocks: None,
    };
    let pick = |r: PlanRequest| default_algorithm(&r, &p).unwrap();
    // 64 KiB sent per rank is the Direct limit: 2048 f32 x 8 peers.
    assert_eq!(pick(req(OpKind::AllReduce, 9, 2048)), Algorithm::Ring, "world above direct_max_world");
    assert_eq!(pick(req(OpKind::AllReduce, 8, 2340)), Algorithm::Direct);
    assert_eq!(pick(req(OpKind::AllReduce, 8, 2341)), Algorithm::Ring);
    assert_eq!(pick(req(OpKind::AllGather, 2, 16384)), Algorithm::Direct);
    assert_eq!(pick(req(OpKind::ReduceScatter, 2, 16385)), Algorithm::Ring);
    assert_eq!(pick(req(OpKind::Broadcast, 64, 16384)), Algorithm::Tree);
    assert_eq!(pick(req(OpKind::Reduce, 64, 16385)), Algorithm::Chain);
    assert_eq!(pick(req(OpKind::Barrier, 64, 0)), Algorithm::Dissemination);
    assert_eq!(pick(req(OpKind::AllToAll, 64, 1)), Algorithm::Pairwise);
    assert!(plan(&req(OpKind::Send, 2, 1)).is_err());
}

#[test]
fn unsupported_algorithm_names_both() {
    let req = PlanRequest {
        op: OpKind::AllToAll,
        rank: 0,
        world: 4,
        count: 8,
        elem_size: 4,
        root: 0,
        algorithm: Some(Algorithm::Ring),
        hosts: &[],
        blocks: None,
    };
    let e = plan(&req).unwrap_err();
    assert!(e.contains("ring") && e.contains("all-to-all"), "{e}");
    let bad_rank = PlanRequest { rank: 4, algorithm: None, ..req };
    assert!(plan(&bad_rank).is_err());
    let bad_root = PlanRequest { op: OpKind::Broadcast, root: 9, algorithm: None, ..req };
    assert!(plan(&bad_root).is_err());
}

#[test]
fn ring_all_reduce_rounds_and_bytes() {
    for n in 2..=32 {
        for count in [n, 10 * n + 3, 1000] {
            for rank in 0..n {
                let req = PlanRequest {
                    op: OpKind::AllReduce,
                    rank,
                    world: n,
                    count,
                    elem_size: 4,
                    root: 0,
                    algorithm: Some(Algorithm::Ring),
                    hosts: &[],
                    blocks: None,
                };
                let s = plan(&req).unwrap();
                assert_eq!(s.rounds.len(), 2 * n - 3, "n={n} count={count}");
                assert_eq!(s.scratch_bytes, 0);
                // 2(n-1)/n of the buffer, give or take one element per chunk sent.
                let ideal = 2.0 * (n - 1) as f64 / n as f64 * (count * 4) as f64;
                let slack = (2 * (n - 1) * 4) as f64;
                assert!(
                    (s.bytes_sent() as f64 - ideal).abs() <= slack,
                    "n={n} count={count} sent {} ideal {ideal}",
                    s.bytes_sent()
                );
            }
        }
    }
}

#[test]
fn chain_pipelines_segments() {
    // 10 segments over 5 ranks: S + n - 2 rounds, every non-tail rank sends each byte once.
    let p = small_segments(16);
    for rank in 0..5 {
        for op in [OpKind::Broadcast, OpKind::Reduce] {
            let req = PlanRequest {
                op,
                rank,
                world: 5,
                count: 40,
                elem_size: 4,
                root: 0,
                algorithm: Some(Algorithm::Chain),
                hosts: &[],
                blocks: None,
            };
            let s = plan_with(&req, &p).unwrap();
            let (sends, bytes) = (
                s.rounds.iter().flat_map(|r| &r.steps).filter(|x| matches!(x, Step::Send { .. })).count(),
                s.bytes_sent(),
            );
            let sender = if op == OpKind::Broadcast { rank != 4 } else { rank != 0 };
            assert_eq!((sends, bytes), if sender { (10, 160) } else { (0, 0) }, "{op} rank {rank}");
            assert!(s.rounds.len() <= 10 + 5 - 2);
            assert!(s.scratch_bytes <= 32, "reduce keeps two segments of scratch");
        }
    }
    // A segment smaller than an element still moves one element at a time.
    for op in [OpKind::Broadcast, OpKind::Reduce] {
        check(op, 5, 7, 4, 2, Some(Algorithm::Chain), &small_segments(3)).unwrap();
        check(op, 5, 7, 4, 2, Some(Algorithm::Chain), &small_segments(0)).unwrap();
    }
}

#[test]
fn world_of_one_is_a_copy_or_nothing() {
    for op in [
        OpKind::AllReduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::AllToAll,
        OpKind::Barrier,
        OpKind::Gather,
        OpKind::Scatter,
    ] {
        for &alg in algorithms_for(op) {
            let req = PlanRequest {
                op,
                rank: 0,
                world: 1,
                count: 5,
                elem_size: 4,
                root: 0,
                algorithm: Some(alg),
                hosts: &[],
                blocks: None,
            };
            let s = plan(&req).unwrap();
            assert_eq!(s.transfer_steps(), 0, "{op} {alg}");
            assert!(s.rounds.len() <= 1);
        }
    }
}

// ---- negative tests: the checker catches broken schedules ----

fn plan_all(op: OpKind, world: usize, count: usize, alg: Algorithm) -> Vec<Schedule> {
    (0..world)
        .map(|rank| {
            let req = PlanRequest {
                op,
                rank,
                world,
                count,
                elem_size: 4,
                root: 0,
                algorithm: Some(alg),
                hosts: &[],
                blocks: None,
            };
            plan_with(&req, &small_segments(8)).unwrap()
        })
        .collect()
}

fn expect_err(op: OpKind, count: usize, s: &[Schedule], needle: &str) {
    let e = check_schedules(op, count, 4, 0, s).expect_err("broken schedule passed the checker");
    assert!(e.contains(needle), "expected `{needle}` in: {e}");
    assert!(e.contains(op.name()) && e.contains("world="), "error names op and world: {e}");
}

#[test]
fn catches_dropped_step() {
    let mut s = plan_all(OpKind::AllReduce, 4, 10, Algorithm::Ring);
    let i = s[1].rounds[1].steps.iter().position(|x| matches!(x, Step::RecvReduce { .. })).unwrap();
    s[1].rounds[1].steps.remove(i);
    expect_err(OpKind::AllReduce, 10, &s, "does not receive them in round 1");
}

#[test]
fn catches_duplicated_recv_reduce() {
    // The copy races with the original (same bytes written concurrently)...
    let mut s = plan_all(OpKind::AllReduce, 4, 10, Algorithm::Ring);
    let st = *s[2].rounds[1].steps.iter().find(|x| matches!(x, Step::RecvReduce { .. })).unwrap();
    s[2].rounds[1].steps.push(st);
    expect_err(OpKind::AllReduce, 10, &s, "races with step");
    // ...and in a round of its own it finds no message to receive.
    let mut s = plan_all(OpKind::AllReduce, 4, 10, Algorithm::Ring);
    s[2].rounds.push(Round { steps: vec![st] });
    expect_err(OpKind::AllReduce, 10, &s, "no (further) message");
}

#[test]
fn ring_all_reduce_forwards_each_finished_chunk_in_the_same_round() {
    for n in [2, 3, 5] {
        let s = plan_all(OpKind::AllReduce, n, 7 * n, Algorithm::Ring);
        for (r, sched) in s.iter().enumerate() {
            assert_eq!(sched.rounds.len(), 2 * n - 3, "rank {r} of {n}");
            let fwd = sched.rounds[n - 2].steps.iter().filter(|x| matches!(x, Step::RecvReduceSend { .. })).count();
            assert_eq!(fwd, 1, "rank {r} of {n}: {:?}", sched.rounds[n - 2]);
        }
    }
}

#[test]
fn catches_a_receive_racing_a_send_it_does_not_depend_on() {
    // Two ranks in place. Rank 0 sends its chunk 0 twice (A, then B) and receives
    // the finished chunk 0 into the same bytes. What arrives is rank 1's forward of
    // A, so it may overwrite the bytes only once A was taken — but B, queued after
    // A, may still be unsent: a race, although every value ends up right.
    let (c0, c1) = (|b| Region::new(b, 0, 20), |b| Region::new(b, 20, 20));
    let sched = |steps: Vec<Step>, scratch_bytes| Schedule {
        algorithm: Algorithm::Ring,
        rounds: vec![Round { steps }],
        scratch_bytes,
        finalize: vec![Region::new(BufId::Output, 0, 40)],
    };
    let (i, o) = (BufId::Input, BufId::Output);
    let rank0 = vec![
        Step::Send { peer: 1, src: c0(i) },
        Step::Send { peer: 1, src: c0(i) },
        Step::RecvReduceSend { peer: 1, src: c1(i), dst: c1(o), to: 1 },
        Step::Recv { peer: 1, dst: c0(o) },
    ];
    let rank1 = vec![
        Step::Send { peer: 0, src: c1(i) },
        Step::RecvReduceSend { peer: 0, src: c0(i), dst: c0(o), to: 0 },
        Step::Recv { peer: 0, dst: Region::new(BufId::Scratch, 0, 20) },
        Step::Recv { peer: 0, dst: c1(o) },
    ];
    let s = vec![sched(rank0.clone(), 0), sched(rank1.clone(), 20)];
    expect_err(OpKind::AllReduce, 10, &s, "not the peer's forward");
    // Without the second send the same schedule is fine.
    let mut rank0 = rank0;
    rank0.remove(1);
    let mut rank1 = rank1;
    rank1.remove(2);
    check_schedules(OpKind::AllReduce, 10, 4, 0, &[sched(rank0, 0), sched(rank1, 0)]).unwrap();
}

#[test]
fn catches_forwards_waiting_on_each_other() {
    // Each rank's first message to the other is a forward of what the other sends
    // it: neither can ever be made.
    let whole = Region::new(BufId::Output, 0, 40);
    let input = Region::new(BufId::Input, 0, 40);
    let s: Vec<Schedule> = (0..2)
        .map(|r| Schedule {
            algorithm: Algorithm::Ring,
            rounds: vec![Round {
                steps: vec![
                    Step::Copy { src: input, dst: whole },
                    Step::RecvReduceSend { peer: 1 - r, src: input, dst: whole, to: 1 - r },
                ],
            }],
            scratch_bytes: 0,
            finalize: vec![whole],
        })
        .collect();
    expect_err(OpKind::AllReduce, 10, &s, "cannot be made (a cycle)");
}

#[test]
fn catches_element_reduced_twice() {
    // Direct all-reduce with one local Reduce repeated: a rank's data counted twice.
    let mut s = plan_all(OpKind::AllReduce, 3, 5, Algorithm::Direct);
    let st = *s[0].rounds[1].steps.last().unwrap();
    s[0].rounds[1].steps.push(st);
    expect_err(OpKind::AllReduce, 5, &s, "element reduced twice");
}

/// Apply `f` to the region of step `step` of round `t` on `rank`.
fn tweak(s: &mut [Schedule], rank: usize, t: usize, step: usize, f: impl FnOnce(&mut Region)) {
    match &mut s[rank].rounds[t].steps[step] {
        Step::Send { src: r, .. } | Step::Recv { dst: r, .. } | Step::RecvReduce { src: r, .. } => f(r),
        other => panic!("not a transfer: {other:?}"),
    }
}

#[test]
fn catches_shifted_region() {
    // Ring all-gather, 4 ranks of 6 f32: round 0 is [Copy, Send, Recv].
    let mut s = plan_all(OpKind::AllGather, 4, 6, Algorithm::Ring);
    tweak(&mut s, 0, 0, 1, |r| r.offset += 4);
    expect_err(OpKind::AllGather, 6, &s, "Output element");
    let mut s = plan_all(OpKind::AllGather, 4, 6, Algorithm::Ring);
    tweak(&mut s, 3, 0, 2, |r| r.offset = 4 * 6 * 4 - 4);
    expect_err(OpKind::AllGather, 6, &s, "past the end");
    let mut s = plan_all(OpKind::AllGather, 4, 6, Algorithm::Ring);
    tweak(&mut s, 0, 0, 1, |r| r.offset += 1);
    expect_err(OpKind::AllGather, 6, &s, "not aligned");
}

#[test]
fn catches_mixed_elements() {
    // Reduce the received block with the wrong Input elements.
    let mut s = plan_all(OpKind::ReduceScatter, 3, 4, Algorithm::Ring);
    let i = s[1].rounds[0].steps.iter().position(|x| matches!(x, Step::RecvReduce { .. })).unwrap();
    tweak(&mut s, 1, 0, i, |r| r.offset -= 4);
    expect_err(OpKind::ReduceScatter, 4, &s, "mixed elements");
}

#[test]
fn catches_in_place_clobbering() {
    // A naive direct all-reduce that copies rank 0's slot into Output before
    // reading its own Input is right out of place and wrong in place.
    let mut s = plan_all(OpKind::AllReduce, 3, 4, Algorithm::Direct);
    let (n, bytes, r) = (3, 16, 2);
    let slot = |p: usize| Region::new(BufId::Scratch, (if p < r { p } else { p - 1 }) * bytes, bytes);
    let out = Region::new(BufId::Output, 0, bytes);
    let input = Region::new(BufId::Input, 0, bytes);
    let mut steps = vec![Step::Copy { src: slot(0), dst: out }];
    for p in 1..n {
        steps.push(Step::Reduce { src: if p == r { input } else { slot(p) }, dst: out });
    }
    s[r].rounds[1].steps = steps;
    expect_err(OpKind::AllReduce, 4, &s, "(in place)");
}

#[test]
fn catches_race_within_round() {
    // Ring all-gather receiving into the very block it sends in the same round.
    let mut s = plan_all(OpKind::AllGather, 3, 2, Algorithm::Ring);
    if let Step::Recv { dst, .. } = &mut s[1].rounds[1].steps[1] {
        dst.offset = 0;
    }
    expect_err(OpKind::AllGather, 2, &s, "races with step");
}

#[test]
fn catches_message_received_in_a_later_round() {
    let mut s = plan_all(OpKind::Broadcast, 3, 8, Algorithm::Tree);
    let st = s[2].rounds[1].steps.pop().unwrap();
    s[2].rounds.push(Round { steps: vec![st] });
    expect_err(OpKind::Broadcast, 8, &s, "does not receive them in round 1");
}

#[test]
fn catches_bad_finalize_and_barrier() {
    let mut s = plan_all(OpKind::AllReduce, 2, 6, Algorithm::Ring);
    s[1].finalize.clear();
    expect_err(OpKind::AllReduce, 6, &s, "finalize");
    let mut s = plan_all(OpKind::AllReduce, 2, 6, Algorithm::Ring);
    let f = s[0].finalize[0];
    s[0].finalize.push(f);
    expect_err(OpKind::AllReduce, 6, &s, "finalize");
    // A barrier missing its last round lets ranks leave early.
    let mut s = plan_all(OpKind::Barrier, 5, 0, Algorithm::Dissemination);
    for sched in &mut s {
        sched.rounds.pop();
    }
    expect_err(OpKind::Barrier, 0, &s, "without hearing from");
}

/// Random calls of every planner for worlds up to 1024 ranks, on one host or split
/// over hosts (grouped or interleaved), in both modes. Element counts stay small
/// where the buffers grow with the world (all-gather, reduce-scatter, all-to-all,
/// direct), which keeps the symbolic execution within memory.
mod large_worlds {
    use super::super::check::check_on;
    use super::*;
    use proptest::prelude::*;

    fn call() -> impl Strategy<Value = (OpKind, usize, usize, Vec<usize>, usize, usize, bool)> {
        // The `*v` ops need per-rank counts: vblocks' tests run them.
        let ops = prop::sample::select(
            OpKind::ALL
                .iter()
                .copied()
                .filter(|&op| !algorithms_for(op).is_empty() && !op.varies())
                .collect::<Vec<_>>(),
        );
        let world = prop_oneof![1usize..=64, 65usize..=1024];
        (ops, world, 1usize..=16, any::<bool>(), any::<prop::sample::Index>(), 0usize..=4, any::<bool>()).prop_flat_map(
            |(op, n, hosts, grouped, alg, small, det)| {
                let h = hosts.min(n);
                let layout: Vec<usize> = (0..n).map(|r| if grouped { r * h / n } else { r % h }).collect();
                let alg = alg.index(algorithms_for(op).len());
                // In reproducible mode a symbolic element records the order of its
                // reduction, as many terms as ranks: memory grows as n x n x count
                // there too (all-reduce by doubling, 774 ranks, 204 elements, ran a
                // CI machine out of its 24 GB).
                let grows = matches!(op, OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll)
                    || algorithms_for(op)[alg] == Algorithm::Direct
                    || det;
                // Symbolic elements in all: about n x count, n x n x count where the
                // buffers grow with the world; kept near 2^18 (a few hundred MB of
                // rank sets at 1024 ranks).
                let budget = 1usize << 18;
                let count = if grows {
                    (0..=small.min((budget / (n * n)).max(1))).boxed()
                } else {
                    (0..=(2 * n + 3).min(budget / n)).boxed()
                };
                (Just(op), Just(alg), count, Just(layout), 0..n, Just(det), Just(small))
                    .prop_map(|(op, alg, count, layout, root, det, seg)| (op, alg, count, layout, root, seg + 1, det))
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn every_planner_passes_the_checker((op, alg, count, hosts, root, seg, det) in call()) {
            let alg = algorithms_for(op)[alg];
            let params = PlanParams { chain_segment_bytes: 4 * seg, deterministic: det, ..PlanParams::default() };
            let root = if op.rooted() { root } else { 0 };
            if let Err(e) = check_on(op, &hosts, count, 4, root, Some(alg), &params) {
                panic!("{op} {alg} world={} count={count} root={root} det={det}: {e}", hosts.len());
            }
        }
    }
}
