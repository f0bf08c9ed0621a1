use super::super::check::{check_agreed_on, check_on};
use super::super::{plan_ranks, Step};
use super::*;
use crate::types::OpKind;

const OPS: [OpKind; 2] = [OpKind::Gather, OpKind::Scatter];

/// One host; one rank per host; consecutive hosts of 2 and 3 ranks (the last one
/// shorter); hosts of 3, 1, 2, 3, 1, 2... consecutive ranks; ranks interleaved over
/// 2 and 3 hosts; and hosts of uneven sizes whose ranks interleave.
fn layouts(n: usize) -> Vec<Vec<usize>> {
    let sizes = [3, 1, 2];
    let mut uneven = Vec::new();
    let mut h = 0;
    while uneven.len() < n {
        uneven.extend(std::iter::repeat_n(h, sizes[h % 3]));
        h += 1;
    }
    uneven.truncate(n);
    // Ranks 0, 3, 4, 7, 8... on host 0 and the rest on host 1, or with n > 5 rank 5
    // alone on host 2: interleaved, uneven, and the root's host may be any of them.
    let mixed: Vec<usize> = (0..n).map(|r| if r == 5 { 2 } else { usize::from(r % 4 == 1 || r % 4 == 2) }).collect();
    let mut out = vec![vec![0; n], (0..n).collect(), uneven, renumbered(&mixed)];
    out.extend([2, 3].map(|b| (0..n).map(|r| r / b).collect()));
    out.extend([2, 3].map(|h| (0..n).map(|r| r % h).collect()));
    out
}

/// Host numbers in order of first appearance, as `PlanRequest::hosts` wants them.
fn renumbered(raw: &[usize]) -> Vec<usize> {
    let mut seen = Vec::new();
    raw.iter()
        .map(|&h| match seen.iter().position(|&x| x == h) {
            Some(i) => i,
            None => {
                seen.push(h);
                seen.len() - 1
            }
        })
        .collect()
}

/// Every layout of worlds 1..=16, every root, counts 0, 1, 7, bytes and words:
/// the root ends with every block in rank order (gather), every rank with its
/// block (scatter), in place and not, alone and merged with the root agreement.
#[test]
fn every_layout_root_and_count_is_exact() {
    let p = PlanParams::default();
    let alg = Some(Algorithm::Hierarchical);
    for n in 1..=16 {
        for hosts in layouts(n) {
            for op in OPS {
                for root in 0..n {
                    for count in [0, 1, 7] {
                        for es in [1, 4] {
                            let at = || format!("{op} hosts={hosts:?} root={root} count={count} es={es}");
                            check_on(op, &hosts, count, es, root, alg, &p).unwrap_or_else(|e| panic!("{}: {e}", at()));
                            check_agreed_on(op, &hosts, count, es, root, alg, &p)
                                .unwrap_or_else(|e| panic!("{} (agreed): {e}", at()));
                        }
                    }
                }
            }
        }
    }
}

fn schedules(op: OpKind, hosts: &[usize], count: usize, root: usize) -> Vec<Schedule> {
    let req = PlanRequest {
        op,
        rank: 0,
        world: hosts.len(),
        count,
        elem_size: 4,
        root,
        algorithm: Some(Algorithm::Hierarchical),
        hosts,
        blocks: None,
    };
    plan_ranks(&req, &PlanParams::default()).unwrap()
}

/// Messages each rank sends to, and receives from, ranks on other hosts.
fn cross_messages(scheds: &[Schedule], hosts: &[usize]) -> Vec<usize> {
    (0..scheds.len())
        .map(|rank| {
            let steps = scheds[rank].rounds.iter().flat_map(|r| &r.steps);
            steps
                .filter(
                    |s| matches!(s, Step::Send { peer, .. } | Step::Recv { peer, .. } if hosts[*peer] != hosts[rank]),
                )
                .count()
        })
        .collect()
}

/// Bytes each rank sends to ranks on other hosts.
fn cross_bytes(scheds: &[Schedule], hosts: &[usize]) -> usize {
    let mut total = 0;
    for (rank, s) in scheds.iter().enumerate() {
        for step in s.rounds.iter().flat_map(|r| &r.steps) {
            if let Step::Send { peer, src } = step {
                if hosts[*peer] != hosts[rank] {
                    total += src.len;
                }
            }
        }
    }
    total
}

#[test]
fn blocks_cross_once_in_one_message_per_host() {
    // Hosts of 4, 3 and 5 consecutive ranks: the root exchanges one message with each
    // other host's leader and nothing else crosses; each block outside the root's
    // host crosses exactly once; two rounds.
    let hosts: Vec<usize> = [4, 3, 5].iter().enumerate().flat_map(|(h, &l)| std::iter::repeat_n(h, l)).collect();
    for op in OPS {
        for root in [0, 2, 5, 11] {
            let s = schedules(op, &hosts, 10, root);
            let x = cross_messages(&s, &hosts);
            let leaders: Vec<usize> = [0, 4, 7].into_iter().filter(|&l| hosts[l] != hosts[root]).collect();
            for (r, &m) in x.iter().enumerate() {
                let want = if r == root { 2 } else { usize::from(leaders.contains(&r)) };
                assert_eq!(m, want, "{op} root {root} rank {r}: {x:?}");
            }
            let outside = hosts.iter().filter(|&&h| h != hosts[root]).count();
            assert_eq!(cross_bytes(&s, &hosts), outside * 40, "{op} root {root}");
            assert!(s.iter().all(|s| s.rounds.len() <= 2), "{op} root {root}");
        }
    }
}

#[test]
fn one_level_layouts_are_direct() {
    for n in 1..=6 {
        for hosts in [vec![0; n], (0..n).collect()] {
            for (op, direct) in
                [(OpKind::Gather, gather_direct as fn(&PlanRequest) -> Schedule), (OpKind::Scatter, scatter_direct)]
            {
                for root in 0..n {
                    for (rank, s) in schedules(op, &hosts, 3, root).into_iter().enumerate() {
                        let req = PlanRequest {
                            op,
                            rank,
                            world: n,
                            count: 3,
                            elem_size: 4,
                            root,
                            algorithm: Some(Algorithm::Direct),
                            hosts: &hosts,
                            blocks: None,
                        };
                        assert_eq!(s, Schedule { algorithm: Algorithm::Hierarchical, ..direct(&req) });
                    }
                }
            }
        }
    }
}
