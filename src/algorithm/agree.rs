//! A rooted call's signature agreed in the call's own rounds.
//!
//! A root only sends (and so does a leaf of a reduce), so a rank given another root
//! than the rest can finish its call and leave the error to its next one. For every
//! rank to fail in the call itself, each must hear, transitively, from every other:
//! a dissemination exchange of empty frames carrying the call's signature, which
//! takes `ceil(log2 n)` rounds. Run before the data, those rounds add to every
//! rooted call; run in the data's own rounds (round `k` of the exchange beside round
//! `k` of the data) the call takes `max(data rounds, ceil(log2 n))` rounds and a few
//! empty frames more.
//!
//! Why it stays correct: in each round the exchange's steps go after the data's
//! local steps and before its transfers, on every rank alike, so the messages of any
//! ordered pair of ranks are posted in the same order on both sides (the executor
//! matches them in order). A round ends when all its receives arrived, so a rank
//! leaves only after the exchange's last round: having heard from every rank.

use super::{pairwise, Algorithm, PlanRequest, Round, Schedule};
use crate::types::OpKind;

/// `data` (rank `rank`'s plan of a rooted call in a world of `world`) with a
/// dissemination exchange of empty frames merged into its rounds.
pub fn with_agreement(data: &Schedule, rank: usize, world: usize) -> Schedule {
    let exchange = pairwise::barrier(&PlanRequest {
        op: OpKind::Barrier,
        rank,
        world,
        count: 0,
        elem_size: 1,
        root: 0,
        algorithm: Some(Algorithm::Dissemination),
        hosts: &[],
        blocks: None,
    });
    let rounds = (0..data.rounds.len().max(exchange.rounds.len()))
        .map(|i| {
            let data_steps = data.rounds.get(i).map_or(&[][..], |r| &r.steps[..]);
            let exchange_steps = exchange.rounds.get(i).map_or(&[][..], |r| &r.steps[..]);
            let locals = data_steps.iter().take_while(|s| s.peer().is_none()).count();
            let mut steps = Vec::with_capacity(data_steps.len() + exchange_steps.len());
            steps.extend_from_slice(&data_steps[..locals]);
            steps.extend_from_slice(exchange_steps);
            steps.extend_from_slice(&data_steps[locals..]);
            Round { steps }
        })
        .collect();
    Schedule { rounds, ..data.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::check::{check_agreed, check_schedules_agreed};
    use crate::algorithm::{algorithms_for, PlanParams};

    /// Every rooted op, every algorithm that implements it, worlds 1..=17, every
    /// root, counts that leave ranks with nothing and with uneven shares: the data
    /// is exact and every rank hears from every other.
    #[test]
    fn agreed_rooted_calls_stay_exact_and_every_rank_hears_from_all() {
        let params = PlanParams::default();
        for op in [OpKind::Broadcast, OpKind::Reduce, OpKind::Gather, OpKind::Scatter] {
            let mut checked = std::collections::BTreeSet::new();
            for &alg in algorithms_for(op) {
                for world in 1..=17 {
                    for count in [0, 1, 7, 1000] {
                        for root in 0..world {
                            if let Err(e) = check_agreed(op, world, count, 4, root, Some(alg), &params) {
                                if e.contains("does not implement") || e.contains("not implement") {
                                    continue;
                                }
                                panic!("{op} {alg} world {world} count {count} root {root}: {e}");
                            }
                            checked.insert(alg.to_string());
                        }
                    }
                }
            }
            assert!(checked.len() >= 2, "{op}: only {checked:?} checked");
            eprintln!("{op}: {checked:?}");
        }
    }

    /// Without the exchange a broadcast's root hears from no one, the failure the
    /// exchange exists for: the checker must reject the plain plans it accepts merged.
    #[test]
    fn the_checker_rejects_rooted_plans_without_the_exchange() {
        let params = PlanParams::default();
        let hosts = vec![0; 4];
        for op in [OpKind::Broadcast, OpKind::Reduce, OpKind::Gather, OpKind::Scatter] {
            let req = PlanRequest {
                op,
                rank: 0,
                world: 4,
                count: 8,
                elem_size: 4,
                root: 0,
                algorithm: None,
                hosts: &hosts,
                blocks: None,
            };
            let plain = crate::algorithm::plan_ranks(&req, &params).unwrap();
            let e = check_schedules_agreed(op, 8, 4, 0, &plain, false).expect_err("plain plans hear from all");
            assert!(e.contains("without hearing from ranks"), "{op}: {e}");
            let merged: Vec<Schedule> = plain.iter().enumerate().map(|(r, s)| with_agreement(s, r, 4)).collect();
            check_schedules_agreed(op, 8, 4, 0, &merged, false).unwrap();
        }
    }
}
