//! Reproducible mode through the executor: random f32 inputs of mixed magnitudes
//! give bit-identical all-reduce (and reduce-scatter, reduce) results for every
//! algorithm, host split and channel chunking, equal to the rank-order fold
//! `((x_0 + x_1) + x_2) + ...` computed here; and a rank in the mode meets a rank
//! outside it with an error naming both.

mod common;

use std::sync::Arc;
use std::time::Duration;

use braid::algorithm::{algorithms_for, Algorithm};
use braid::bootstrap::MemStore;
use braid::config::Tuning;
use braid::TransportKind;
use braid::{Communicator, Config, OpKind, ReduceOp};
use common::on_ranks;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A deterministic pseudo-random f32 of rank `r`, element `i`: magnitudes spread
/// over ten orders so that the order of a sum changes its rounding.
fn input(r: usize, i: usize) -> f32 {
    let mut x = (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 29;
    let mantissa = (x & 0xFFFF) as f32 / 65536.0 - 0.5;
    let exponent = ((x >> 16) % 10) as i32 - 5;
    mantissa * 10f32.powi(exponent)
}

fn inputs(r: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| input(r, i)).collect()
}

/// The reference: every element folded in rank order.
fn rank_order_sum(n: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| (1..n).fold(input(0, i), |acc, r| acc + input(r, i))).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// All-reduce on every rank of `comms`; every rank's result, in place when asked.
fn all_reduce(comms: Vec<Communicator>, count: usize, in_place: bool) -> Vec<Vec<u32>> {
    on_ranks(comms, move |c| {
        let mine = inputs(c.rank(), count);
        let mut out = if in_place { mine.clone() } else { vec![0.0; count] };
        if in_place {
            c.all_reduce_in_place(&mut out, ReduceOp::Sum).expect("all-reduce");
        } else {
            c.all_reduce(&mine, &mut out, ReduceOp::Sum).expect("all-reduce");
        }
        bits(&out)
    })
}

fn config(n: usize, alg: Algorithm, deterministic: bool) -> Config {
    let mut cfg = Config::new(0, n);
    cfg.timeout = TIMEOUT;
    cfg.algorithms = braid::tuner::AlgoPolicy::only(alg);
    cfg.deterministic = deterministic;
    cfg
}

/// Host splits to try for `n` ranks: one host, two halves, interleaved, one per rank.
fn layouts(n: usize) -> Vec<Vec<usize>> {
    let mut l = vec![vec![0; n], (0..n).map(|r| usize::from(r >= n.div_ceil(2))).collect()];
    if n >= 3 {
        l.push((0..n).map(|r| r % 2).collect());
        l.push((0..n).collect());
    }
    l.dedup();
    l
}

/// World sizes 1 to 8, every all-reduce algorithm, every host split, in and out of
/// place, counts below the world size to several chunks per rank: one bit pattern.
#[test]
fn all_reduce_is_bitwise_identical_across_algorithms_and_host_splits() {
    for n in 1..=8 {
        for count in [1, n + 1, 1000, 40_003] {
            let want = bits(&rank_order_sum(n, count));
            for &alg in algorithms_for(OpKind::AllReduce) {
                for hosts in layouts(n) {
                    for in_place in [false, true] {
                        let comms = Communicator::in_process_on_hosts(config(n, alg, true), &hosts).unwrap();
                        for (r, got) in all_reduce(comms, count, in_place).into_iter().enumerate() {
                            if let Some(i) = (0..count).find(|&i| got[i] != want[i]) {
                                panic!(
                                    "{alg} n={n} count={count} hosts={hosts:?} in_place={in_place} rank {r}: \
                                     element {i} is {:e}, the rank-order fold gives {:e}",
                                    f32::from_bits(got[i]),
                                    f32::from_bits(want[i])
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The inputs are sensitive to order: without reproducible mode the ring (which
/// starts each chunk's sum at a different rank) differs from the rank-order fold.
/// Without this, the test above could pass on data where order never matters.
#[test]
fn the_inputs_expose_a_different_order() {
    let (n, count) = (4, 40_003);
    let comms = Communicator::in_process_with(config(n, Algorithm::Ring, false)).unwrap();
    let got = &all_reduce(comms, count, false)[0];
    let want = bits(&rank_order_sum(n, count));
    let differing = (0..count).filter(|&i| got[i] != want[i]).count();
    assert!(differing > 0, "ring matched the rank-order fold on every element: the data cannot tell orders apart");
}

/// Shared-memory links with very different chunking (tiny rings, pieces and
/// single-copy thresholds against the defaults): the same bits as in-process.
#[test]
fn chunking_of_the_links_does_not_change_the_bits() {
    let n = 3;
    let count = 300_007;
    let want = bits(&rank_order_sum(n, count));
    let tiny = Tuning { rendezvous_bytes: 4096, peer_chunk: 4096, forward_grain: 4096, ..Tuning::default() };
    for tuning in [Tuning::default(), tiny] {
        for alg in [Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling] {
            let store: Arc<dyn braid::bootstrap::Store> = Arc::new(MemStore::new());
            let comms: Vec<Communicator> = (0..n)
                .map(|rank| {
                    let (store, t) = (store.clone(), tuning);
                    std::thread::spawn(move || {
                        Communicator::builder(rank, n)
                            .store(store)
                            .transports(vec![TransportKind::Shm])
                            .timeout(TIMEOUT)
                            .tuning(t)
                            .algorithm(Some(alg))
                            .deterministic(true)
                            .tuner_probe(false)
                            .build()
                            .expect("shared-memory communicator")
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            for (r, got) in all_reduce(comms, count, true).into_iter().enumerate() {
                assert!(got == want, "{alg} rank {r} with {tuning:?}: bits differ from the rank-order fold");
            }
        }
    }
}

/// Reduce-scatter and reduce follow the same order.
#[test]
fn reduce_scatter_and_reduce_fold_in_rank_order() {
    for n in [2, 3, 5, 8] {
        let count = 1001;
        let want = rank_order_sum(n, n * count);
        for &alg in algorithms_for(OpKind::ReduceScatter) {
            let comms = Communicator::in_process_with(config(n, alg, true)).unwrap();
            let got = on_ranks(comms, move |c| {
                let mut out = vec![0.0; count];
                c.reduce_scatter(&inputs(c.rank(), n * count), &mut out, ReduceOp::Sum).unwrap();
                bits(&out)
            });
            for (r, g) in got.iter().enumerate() {
                assert!(*g == bits(&want[r * count..(r + 1) * count]), "reduce-scatter {alg} n={n} rank {r}");
            }
        }
        for &alg in algorithms_for(OpKind::Reduce) {
            let root = n - 1;
            let comms = Communicator::in_process_with(config(n, alg, true)).unwrap();
            let got = on_ranks(comms, move |c| {
                let mut out = if c.rank() == root { vec![0.0; n * count] } else { Vec::new() };
                c.reduce(&inputs(c.rank(), n * count), &mut out, ReduceOp::Sum, root).unwrap();
                bits(&out)
            });
            assert!(got[root] == bits(&want), "reduce {alg} n={n}");
        }
    }
}

/// A rank in reproducible mode and one outside it: both fail naming the mode.
#[test]
fn ranks_in_different_modes_fail_naming_both() {
    let comms = Communicator::in_process_with(config(2, Algorithm::Ring, false)).unwrap();
    let results = on_ranks(comms, |c| {
        if c.rank() == 1 {
            c.set_deterministic(true);
        }
        let mut v = vec![1.0f32; 64];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).map(|_| ()).map_err(|e| e.to_string())
    });
    for (r, res) in results.iter().enumerate() {
        let e = res.as_ref().expect_err("mismatched modes must fail");
        assert!(e.contains("(reproducible)"), "rank {r}: {e}");
    }
}
