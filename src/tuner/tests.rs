//! Tuner tests: the policy syntax, the cost model's arithmetic on schedules whose
//! critical path is known by hand, and picks that follow from it.

use super::*;
use crate::algorithm::{BufId, Region, Round, Step};

fn policy(s: &str) -> AlgoPolicy {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn policy_syntax_follows_nccl() {
    assert!(policy("auto").is_auto() && policy("").is_auto());
    // The listed algorithms, in the tuner's order of preference (not the list's).
    let p = policy("allreduce:ring,direct;broadcast:chain");
    assert_eq!(p.allowed(OpKind::AllReduce), vec![Algorithm::Direct, Algorithm::Ring]);
    assert_eq!(p.allowed(OpKind::Broadcast), vec![Algorithm::Chain]);
    assert_eq!(p.allowed(OpKind::AllGather), algorithms_for(OpKind::AllGather).to_vec(), "unnamed ops keep all");
    // Excluding, per op and globally.
    let p = policy("all-reduce:^ring");
    assert!(!p.allowed(OpKind::AllReduce).contains(&Algorithm::Ring));
    assert!(p.allowed(OpKind::AllReduce).contains(&Algorithm::Direct));
    let p = policy("^chain");
    assert_eq!(p.allowed(OpKind::Reduce), vec![Algorithm::Tree, Algorithm::Hierarchical]);
    // A global list applies where it can and leaves the rest alone.
    let p = policy("ring");
    assert_eq!(p.allowed(OpKind::AllReduce), vec![Algorithm::Ring]);
    assert_eq!(p.allowed(OpKind::Broadcast), algorithms_for(OpKind::Broadcast).to_vec());
    // The op's own rule beats the global one.
    let p = policy("ring;broadcast:tree");
    assert_eq!(p.allowed(OpKind::Broadcast), vec![Algorithm::Tree]);
    assert_eq!(p.allowed(OpKind::AllGather), vec![Algorithm::Ring]);
    // Round trip through Display.
    for s in ["allreduce:ring,direct;broadcast:^tree", "ring", "^chain"] {
        assert_eq!(policy(&policy(s).to_string()), policy(s), "{s}");
    }
    assert_eq!(AlgoPolicy::only(Algorithm::Direct), policy("direct"));
}

#[test]
fn policy_errors_name_the_problem() {
    let err = |s: &str| s.parse::<AlgoPolicy>().expect_err(s);
    assert!(err("allreduce:chain").contains("chain cannot run all-reduce"), "{}", err("allreduce:chain"));
    assert!(err("broadcast:ring").contains("broadcast"));
    assert!(err("allreduce:warp").contains("unknown algorithm `warp`"));
    assert!(err("allgatherz:ring").contains("allgatherz"));
    assert!(err("alltoall:^pairwise").contains("leaves all-to-all no algorithm"));
    assert!(err("send:ring").contains("point-to-point"));
    assert!(err("allreduce:ring;allreduce:direct").contains("named twice"));
    assert!(err("ring;direct").contains("only one list"));
    assert!(err("allreduce:").contains("no algorithm named"));
}

fn terms(schedules: &[Schedule], local: LinkClass, model: &CostModel) -> Terms {
    predict(
        schedules,
        &Links { hosts: &[], local, remote: LinkClass::Tcp, busy: &[], single_copy_exchanges: None },
        model,
    )
}

fn sched(rounds: Vec<Vec<Step>>) -> Schedule {
    Schedule {
        algorithm: Algorithm::Direct,
        rounds: rounds.into_iter().map(|steps| Round { steps }).collect(),
        scratch_bytes: 0,
        finalize: vec![],
    }
}

fn unit_model() -> CostModel {
    let mut m = CostModel::default();
    let c = LinkCost { alpha: 1.0, beta: 0.01, gamma: 0.001, duplex: false, per_host: false, far: 1.0 };
    m.set(LinkClass::SharedMemory, c);
    m.set(LinkClass::Tcp, LinkCost { duplex: true, per_host: true, ..c });
    m
}

#[test]
fn critical_path_waits_for_the_slowest_peer() {
    // Rank 1 first spends a long local copy; rank 0's round-1 exchange with it waits.
    let r = |len| Region::new(BufId::Output, 0, len);
    let s0 = sched(vec![vec![], vec![Step::Send { peer: 1, src: r(100) }]]);
    let s1 = sched(vec![
        vec![Step::Copy { src: Region::new(BufId::Input, 0, 5000), dst: r(5000) }],
        vec![Step::Recv { peer: 0, dst: r(100) }],
    ]);
    let t = terms(&[s0, s1], LinkClass::SharedMemory, &unit_model());
    // Path: rank 1's copy (5 s of gamma), then one message of 100 bytes (1 + 1 s).
    assert_eq!(t.steps, 1);
    assert_eq!(t.wire_bytes, 100);
    assert_eq!(t.reduced_bytes, 5000);
    assert!((t.seconds() - 7.0).abs() < 1e-9, "{t:?}");
}

#[test]
fn memory_links_pay_both_directions_and_nics_are_shared_by_a_host() {
    let r = |len| Region::new(BufId::Output, 0, len);
    let swap = |peer| sched(vec![vec![Step::Send { peer, src: r(100) }, Step::Recv { peer, dst: r(100) }]]);
    let m = unit_model();
    // Shared memory: a rank copies out and in (200 bytes); TCP is duplex (100).
    let shm = terms(&[swap(1), swap(0)], LinkClass::SharedMemory, &m);
    assert!((shm.seconds() - (2.0 + 2.0)).abs() < 1e-9, "{shm:?}");
    let hosts = [0, 1];
    let tcp = predict(
        &[swap(1), swap(0)],
        &Links {
            hosts: &hosts,
            local: LinkClass::SharedMemory,
            remote: LinkClass::Tcp,
            busy: &[],
            single_copy_exchanges: None,
        },
        &m,
    );
    assert!((tcp.seconds() - (2.0 + 1.0)).abs() < 1e-9, "{tcp:?}");
    // Two ranks of host 0 crossing in the same round share its NIC: twice the beta.
    let hosts = [0, 0, 1, 1];
    let s = vec![swap(2), swap(3), swap(0), swap(1)];
    let shared = predict(
        &s,
        &Links {
            hosts: &hosts,
            local: LinkClass::SharedMemory,
            remote: LinkClass::Tcp,
            busy: &[],
            single_copy_exchanges: None,
        },
        &m,
    );
    assert!((shared.seconds() - (2.0 + 2.0)).abs() < 1e-9, "{shared:?}");
}

/// A NIC's directions are shared apart: one rank of a host sending across while
/// another receives do not slow each other. A host-ordered ring over two hosts
/// sends `1.5 S` each way through each NIC, hierarchical `S` (its two lanes share
/// each direction): on the wire alone, the ring takes 1.5x as long.
#[test]
fn nic_directions_are_shared_apart_and_a_ring_across_hosts_pays_one_and_a_half() {
    let r = |len| Region::new(BufId::Output, 0, len);
    let m = unit_model();
    let hosts = [0, 0, 1, 1];
    let links = Links {
        hosts: &hosts,
        local: LinkClass::SharedMemory,
        remote: LinkClass::Tcp,
        busy: &[],
        single_copy_exchanges: None,
    };
    // Rank 1 sends to host 1 while rank 0 receives from it: 100 bytes each way.
    let s = vec![
        sched(vec![vec![Step::Recv { peer: 3, dst: r(100) }]]),
        sched(vec![vec![Step::Send { peer: 2, src: r(100) }]]),
        sched(vec![vec![Step::Recv { peer: 1, dst: r(100) }]]),
        sched(vec![vec![Step::Send { peer: 0, src: r(100) }]]),
    ];
    let t = predict(&s, &links, &m);
    assert!((t.seconds() - (1.0 + 1.0)).abs() < 1e-9, "{t:?}");
    // Ranks 0 and 1 both send across, 100 and 300 bytes: shared fairly, the larger
    // ends when the NIC has carried all 400, the smaller after 200.
    let to = |peer, len| sched(vec![vec![Step::Send { peer, src: r(len) }]]);
    let from = |peer, len| sched(vec![vec![Step::Recv { peer, dst: r(len) }]]);
    let s = vec![to(2, 100), to(3, 300), from(0, 100), from(1, 300)];
    let t = predict(&s, &links, &m);
    assert!((t.seconds() - (1.0 + 4.0)).abs() < 1e-9, "{t:?}");
    // The smaller one's 200 shows where it is on the path: a second round after it.
    let then = |peer, len| {
        sched(vec![vec![Step::Send { peer, src: r(len) }], vec![Step::Copy { src: r(3000), dst: r(3000) }]])
    };
    let s = vec![then(2, 100), to(3, 300), from(0, 100), from(1, 300)];
    let t = predict(&s, &links, &m);
    assert!((t.seconds() - (1.0 + 2.0 + 3.0)).abs() < 1e-9, "{t:?}");
    // Wire costs only: the ring against hierarchical.
    let mut wire = CostModel::default();
    let tcp = wire.cost(LinkClass::Tcp);
    wire.set(LinkClass::Tcp, LinkCost { alpha: 0.0, gamma: 0.0, ..tcp });
    let shm = wire.cost(LinkClass::SharedMemory);
    wire.set(LinkClass::SharedMemory, LinkCost { alpha: 0.0, beta: 0.0, gamma: 0.0, ..shm });
    let call = Call { op: OpKind::AllReduce, count: 1 << 22, elem_size: 4, root: 0, hosts: &hosts, busy: &[] };
    let beta = |a| {
        let s = plan_all(&call, a, &PlanParams::default()).unwrap();
        predict(&s, &links, &wire).beta_s / ((4usize << 22) as f64 * tcp.beta)
    };
    let (ring, hier) = (beta(Algorithm::Ring), beta(Algorithm::Hierarchical));
    assert!((ring - 1.5).abs() < 1e-6, "ring sends {ring} S each way");
    assert!((hier - 1.0).abs() < 1e-6, "hierarchical sends {hier} S each way");
    // A busy host's shared cores slow its copies, not its NIC.
    let busy_links = Links { busy: &[true, true], ..links };
    let s = plan_all(&call, Algorithm::Ring, &PlanParams::default()).unwrap();
    assert_eq!(predict(&s, &busy_links, &wire).beta_s, predict(&s, &links, &wire).beta_s);
}

fn pick(op: OpKind, bytes: usize, hosts: &[usize], local: LinkClass) -> Algorithm {
    let tuner = Tuner::new(AlgoPolicy::auto(), LinkPair::new(local, LinkClass::Tcp));
    tuner.pick(&Call { op, count: bytes / 4, elem_size: 4, root: 0, hosts, busy: &[] }).unwrap()
}

#[test]
fn ring_wins_large_all_reduce_and_many_ranks_do_not_pick_direct() {
    for n in [2, 4, 8] {
        let a = pick(OpKind::AllReduce, 64 << 20, &vec![0; n], LinkClass::SharedMemory);
        assert!(!matches!(a, Algorithm::Direct | Algorithm::Doubling), "{n} ranks, 64 MiB: {a}");
    }
    let a = pick(OpKind::AllGather, 4 << 20, &[0; 16], LinkClass::InProcess);
    assert_ne!(a, Algorithm::Direct);
}

/// Gather and scatter are priced like the others: direct moves every block once,
/// the tree forwards blocks through inner ranks but the root handles `log2 n`
/// messages instead of `n - 1`, which pays only where latency dominates.
#[test]
fn gather_and_scatter_are_priced_and_large_ones_go_direct() {
    let links = LinkPair::new(LinkClass::SharedMemory, LinkClass::Tcp);
    for op in [OpKind::Gather, OpKind::Scatter] {
        let call = Call { op, count: 1000, elem_size: 4, root: 3, hosts: &[0; 16], busy: &[] };
        let ranked = rank_candidates(&call, algorithms_for(op), links, &CostModel::default(), &PlanParams::default());
        let ranked = ranked.unwrap();
        assert_eq!(ranked.len(), 3, "{op}: {ranked:?}");
        assert!(ranked.iter().all(|c| c.terms.seconds() > 0.0), "{op}: {ranked:?}");
        for n in [4, 16] {
            assert_eq!(pick(op, 64 << 20, &vec![0; n], LinkClass::SharedMemory), Algorithm::Direct, "{op} {n} ranks");
        }
        // 63 messages into (or out of) one root against 6 rounds of one message.
        assert_eq!(pick(op, 4, &[0; 64], LinkClass::Tcp), Algorithm::Tree, "{op}: 64 ranks, 4 bytes");
    }
}

/// Across hosts, hierarchical gather and scatter send one message per host over
/// the network where direct sends one per rank: over 4 hosts of 16 ranks a small
/// call is priced far below direct, near the tree (two rounds against six, but
/// the root's host's 15 messages in one of them).
#[test]
fn gather_and_scatter_across_hosts_price_hierarchical_below_direct() {
    let hosts: Vec<usize> = (0..64).map(|r| r / 16).collect();
    let links = LinkPair::new(LinkClass::SharedMemory, LinkClass::Tcp);
    for op in [OpKind::Gather, OpKind::Scatter] {
        let call = Call { op, count: 1, elem_size: 4, root: 0, hosts: &hosts, busy: &[] };
        let ranked = rank_candidates(&call, algorithms_for(op), links, &CostModel::default(), &PlanParams::default());
        let ranked = ranked.unwrap();
        let seconds = |a| ranked.iter().find(|c| c.algorithm == a).map(|c| c.terms.seconds());
        let (hier, direct, tree) =
            (seconds(Algorithm::Hierarchical), seconds(Algorithm::Direct), seconds(Algorithm::Tree));
        let (hier, direct, tree) = (hier.expect("hierarchical priced"), direct.unwrap(), tree.unwrap());
        assert!(hier * 4.0 < direct, "{op}: {ranked:?}");
        assert!(hier < tree * 2.0, "{op}: {ranked:?}");
    }
}

#[test]
fn the_only_allowed_algorithm_is_taken_without_pricing() {
    let tuner = Tuner::new(policy("allreduce:direct"), LinkPair::new(LinkClass::Tcp, LinkClass::Tcp));
    let call = Call { op: OpKind::AllReduce, count: 1 << 24, elem_size: 4, root: 0, hosts: &[0; 8], busy: &[] };
    assert_eq!(tuner.pick(&call).unwrap(), Algorithm::Direct);
    let call = Call { op: OpKind::Send, ..call };
    assert!(tuner.pick(&call).is_err());
}

#[test]
fn ranking_is_sorted_and_deterministic() {
    let call = Call { op: OpKind::AllReduce, count: 1000, elem_size: 4, root: 0, hosts: &[0; 5], busy: &[] };
    let links = LinkPair::new(LinkClass::SharedMemory, LinkClass::Tcp);
    let all = algorithms_for(OpKind::AllReduce);
    let a = rank_candidates(&call, all, links, &CostModel::default(), &PlanParams::default()).unwrap();
    let b = rank_candidates(&call, all, links, &CostModel::default(), &PlanParams::default()).unwrap();
    assert_eq!(a.len(), all.len());
    assert!(a.windows(2).all(|w| w[0].terms.seconds() <= w[1].terms.seconds()));
    let names = |v: &[Candidate]| v.iter().map(|c| c.algorithm).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b));
    for c in &a {
        assert!(c.terms.seconds() > 0.0 && c.terms.steps > 0, "{c:?}");
    }
}

use crate::algorithm::algorithms_for;

#[test]
fn the_ring_leads_ties_over_networks_and_across_hosts() {
    let allowed = algorithms_for(OpKind::AllReduce);
    let call = |hosts| Call { op: OpKind::AllReduce, count: 1 << 18, elem_size: 4, root: 0, hosts, busy: &[] };
    let shm = LinkPair::new(LinkClass::SharedMemory, LinkClass::Tcp);
    let tcp = LinkPair::new(LinkClass::Tcp, LinkClass::Tcp);
    assert_eq!(tie_order(allowed, &call(&[0, 0]), shm), allowed.to_vec());
    assert_ne!(allowed[0], Algorithm::Ring);
    for order in [tie_order(allowed, &call(&[0, 0]), tcp), tie_order(allowed, &call(&[0, 0, 1, 1]), shm)] {
        assert_eq!(order[0], Algorithm::Ring, "{order:?}");
        let rest: Vec<Algorithm> = allowed.iter().copied().filter(|&a| a != Algorithm::Ring).collect();
        assert_eq!(order[1..], rest[..], "the others keep their order");
    }
}

/// Direct's factors come from the one-shot all-reduce, whose bytes no other op's
/// direct schedule moves: a factor that makes it cheap (or dear) at 64 MiB must not
/// carry to a reduce-scatter or an all-gather (2-rank reduce-scatter: picked
/// direct, 2.03x slower than the ring). Nor do its fixed costs, timed on a round of
/// whole-buffer reductions (4-rank all-gather of 4 KiB: picked bruck at 1.25x
/// direct's time), nor the fixed costs of the tree's pipelined double binary tree,
/// which a binomial broadcast's two rounds do not have (4-rank broadcast of 16 KiB:
/// picked the chain at 1.30x the tree's time). The tree's bandwidth factors still
/// price broadcast: without them the chain was picked at 16 MiB at 1.32x.
#[test]
fn all_reduce_factors_price_other_ops_only_where_their_schedules_match() {
    let links = LinkPair::new(LinkClass::SharedMemory, LinkClass::Tcp);
    let seconds = |op: OpKind, algorithm: Algorithm, model: &CostModel| {
        let call = Call { op, count: 16 << 20, elem_size: 4, root: 0, hosts: &[0; 4], busy: &[] };
        let ranked = rank_candidates(&call, algorithms_for(op), links, model, &PlanParams::default()).unwrap();
        ranked.iter().find(|c| c.algorithm == algorithm).unwrap().terms.seconds()
    };
    let plain = CostModel::default();
    let scaled = |algorithm: Algorithm, bandwidth: f64, latency: f64| {
        let mut model = CostModel::default();
        for at in 0..cost::AlgoFar::SIZES.len() {
            model.algo_far.set_at(algorithm, at, bandwidth);
        }
        model.algo_far.set_latency(algorithm, latency);
        model
    };
    let cases = [
        (Algorithm::Direct, OpKind::ReduceScatter),
        (Algorithm::Direct, OpKind::AllGather),
        (Algorithm::Tree, OpKind::Broadcast),
    ];
    for (algorithm, other_op) in cases {
        let dear = scaled(algorithm, 5.0, 1000.0);
        assert!(seconds(OpKind::AllReduce, algorithm, &dear) > 2.0 * seconds(OpKind::AllReduce, algorithm, &plain));
        // Fixed costs are the all-reduce's own.
        let slow_start = scaled(algorithm, 1.0, 1000.0);
        assert_eq!(seconds(other_op, algorithm, &slow_start), seconds(other_op, algorithm, &plain), "{algorithm}");
        let wide = scaled(algorithm, 5.0, 1.0);
        let carried = seconds(other_op, algorithm, &wide) > 2.0 * seconds(other_op, algorithm, &plain);
        assert_eq!(carried, algorithm == Algorithm::Tree, "{algorithm} {other_op}: bandwidth factor carried");
    }
    // Doubling's exchanges are all-reduce's: its factors carry to all-gather.
    let dear = scaled(Algorithm::Doubling, 5.0, 1000.0);
    let doubling = |m: &CostModel| seconds(OpKind::AllGather, Algorithm::Doubling, m);
    assert!(doubling(&dear) > 2.0 * doubling(&plain));
}

/// Where exchanges of plain data go single-copy (the receiver reads the sender's
/// buffer), the sender of each exchange copies nothing: recursive doubling's
/// all-gather, all exchanges, moves half the ring's bytes through each rank, and
/// the cost model says so (4 ranks, 4 MiB: it picked the ring at 1.46x doubling's
/// time, results/one-host-2026-11-27.md). A ring's sends go to a peer it does not
/// receive from, and a reduction's sends carry fresh results: both keep both copies.
#[test]
fn single_copy_exchanges_free_the_sender_only_in_exchanges_of_plain_data() {
    let beta = |op: OpKind, algorithm: Algorithm, single: Option<usize>| {
        let links =
            LinkPair { single_copy_exchanges: single, ..LinkPair::new(LinkClass::SharedMemory, LinkClass::Tcp) };
        let call = Call { op, count: 1 << 20, elem_size: 4, root: 0, hosts: &[0; 4], busy: &[] };
        let ranked = rank_candidates(&call, &[algorithm], links, &CostModel::default(), &PlanParams::default());
        ranked.unwrap()[0].terms.beta_s
    };
    let (ring, doubling) = (Algorithm::Ring, Algorithm::Doubling);
    let on = Some(128 << 10);
    let gather = OpKind::AllGather;
    assert!((beta(gather, doubling, on) / beta(gather, doubling, None) - 0.5).abs() < 1e-9);
    assert_eq!(beta(gather, ring, on), beta(gather, ring, None));
    assert_eq!(beta(OpKind::AllReduce, doubling, on), beta(OpKind::AllReduce, doubling, None));
    // Below the threshold both ends copy.
    assert_eq!(beta(gather, doubling, Some(64 << 20)), beta(gather, doubling, None));
    let call = Call { op: gather, count: 1 << 20, elem_size: 4, root: 0, hosts: &[0; 4], busy: &[] };
    let pick = |single| {
        let links =
            LinkPair { single_copy_exchanges: single, ..LinkPair::new(LinkClass::SharedMemory, LinkClass::Tcp) };
        let ranked = rank_candidates(&call, &[ring, doubling], links, &CostModel::default(), &PlanParams::default());
        ranked.unwrap()[0].algorithm
    };
    assert_eq!(pick(on), doubling);
}
