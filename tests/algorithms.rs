//! Every algorithm through the executor: each collective forced to each algorithm
//! that implements it, world sizes 1 to 8 and 16 (threads over in-memory links),
//! counts from empty to several pipeline segments, in place and out of place, on
//! small integers whose results are exact; and the topology-aware algorithms on
//! emulated host layouts. The planners are proven by the checker; this proves the
//! executor runs what they plan.

mod common;

use std::time::Duration;

use braid::algorithm::{algorithms_for, Algorithm};
use braid::{CallSig, Communicator, Config, DType, OpKind, ReduceOp};
use common::on_ranks;

fn value(r: usize, i: usize) -> i32 {
    ((i * 7 + r * 3) % 13) as i32 - 4
}

/// What rank `r` checks after `op` over `n` ranks with `count` elements.
fn run_op(c: &Communicator, op: OpKind, count: usize, in_place: bool, root: usize) -> Result<(), String> {
    let (r, n) = (c.rank(), c.world_size());
    let tag = |what: &str| format!("{what} world={n} rank={r} count={count} root={root} in_place={in_place}");
    let sum = |i: usize| (0..n).map(|q| value(q, i)).sum::<i32>();
    let max = |i: usize| (0..n).map(|q| value(q, i)).max().unwrap();
    let mine: Vec<i32> = (0..count).map(|i| value(r, i)).collect();
    let compare = |what: &str, got: &[i32], want: &dyn Fn(usize) -> i32| -> Result<(), String> {
        match got.iter().enumerate().find(|(i, g)| **g != want(*i)) {
            Some((i, g)) => Err(format!("{}: element {i} is {g}, expected {}", tag(what), want(i))),
            None => Ok(()),
        }
    };
    let err = |e: braid::Error| format!("{}: {e}", tag("call"));
    match op {
        OpKind::AllReduce => {
            for (rop, want) in [(ReduceOp::Sum, &sum as &dyn Fn(usize) -> i32), (ReduceOp::Max, &max)] {
                let mut out = if in_place { mine.clone() } else { vec![99; count] };
                if in_place {
                    c.all_reduce_in_place(&mut out, rop).map_err(err)?;
                } else {
                    c.all_reduce(&mine, &mut out, rop).map_err(err)?;
                }
                compare(&format!("all-reduce {rop}"), &out, want)?;
            }
        }
        OpKind::Reduce => {
            let mut buf = mine.clone();
            if in_place {
                c.reduce_in_place(&mut buf, ReduceOp::Sum, root).map_err(err)?;
            } else {
                let mut o = if r == root { vec![99; count] } else { Vec::new() };
                c.reduce(&mine, &mut o, ReduceOp::Sum, root).map_err(err)?;
                if r == root {
                    buf = o;
                }
            }
            if r == root {
                compare("reduce", &buf, &sum)?;
            } else {
                compare("reduce (non-root input untouched)", &buf, &|i| value(r, i))?;
            }
        }
        OpKind::ReduceScatter => {
            let full: Vec<i32> = (0..n * count).map(|i| value(r, i)).collect();
            let block = if in_place {
                let mut b = full.clone();
                c.reduce_scatter_in_place(&mut b, ReduceOp::Sum).map_err(err)?;
                b[r * count..(r + 1) * count].to_vec()
            } else {
                let mut o = vec![99; count];
                c.reduce_scatter(&full, &mut o, ReduceOp::Sum).map_err(err)?;
                o
            };
            compare("reduce-scatter", &block, &|i| sum(r * count + i))?;
        }
        OpKind::Broadcast => {
            let data: Vec<i32> = (0..count).map(|i| value(root, i)).collect();
            let got = if in_place {
                let mut b = if r == root { data.clone() } else { vec![99; count] };
                c.broadcast(&mut b, root).map_err(err)?;
                b
            } else {
                let src = if r == root { data.clone() } else { Vec::new() };
                let mut o = vec![99; count];
                c.broadcast_out_of_place(&src, &mut o, root).map_err(err)?;
                o
            };
            compare("broadcast", &got, &|i| data[i])?;
        }
        OpKind::AllGather => {
            let got = if in_place {
                let mut b = vec![99; n * count];
                b[r * count..(r + 1) * count].copy_from_slice(&mine);
                c.all_gather_in_place(&mut b).map_err(err)?;
                b
            } else {
                let mut o = vec![99; n * count];
                c.all_gather(&mine, &mut o).map_err(err)?;
                o
            };
            compare("all-gather", &got, &|k| value(k / count.max(1), k % count.max(1)))?;
        }
        _ => unreachable!("{op}"),
    }
    Ok(())
}

const OPS: [OpKind; 5] =
    [OpKind::AllReduce, OpKind::Reduce, OpKind::ReduceScatter, OpKind::Broadcast, OpKind::AllGather];

/// Counts: empty, one, odd, and (unless `small`) enough for several 512 KiB
/// pipeline segments per half of the buffer (double binary tree, chains).
fn counts(small: bool) -> Vec<usize> {
    if small {
        vec![0, 1, 97]
    } else {
        vec![0, 1, 97, 300_007]
    }
}

/// Which algorithms a test runs.
#[derive(Clone, Copy)]
enum Which {
    /// Each algorithm of each op in turn.
    Every,
    /// One algorithm, on the ops it implements.
    Only(Algorithm),
    /// The tuner's pick.
    Auto,
}

/// Run every op with the algorithms of `which` on `comms`, one rank per thread,
/// and fail with every rank's first error.
fn all_algorithms(comms: Vec<Communicator>, small: bool, which: Which) {
    let errors = on_ranks(comms, move |c| {
        let n = c.world_size();
        for op in OPS {
            let algs: Vec<Option<Algorithm>> = match which {
                Which::Every => algorithms_for(op).iter().copied().map(Some).collect(),
                Which::Only(a) if algorithms_for(op).contains(&a) => vec![Some(a)],
                Which::Only(_) => vec![],
                Which::Auto => vec![None],
            };
            for alg in algs {
                c.set_algorithm(alg);
                if let Some(a) = alg {
                    let sig = CallSig::new(op, DType::I32, 97, 0, ReduceOp::Sum);
                    let planned = c.plan(&sig).map(|s| s.algorithm);
                    if planned.as_ref().ok() != Some(&a) {
                        return Some(format!("{op}: forced {a}, planned {planned:?}"));
                    }
                }
                let alg = alg.map_or("auto", |a| a.name());
                for (case, &count) in counts(small).iter().enumerate() {
                    for in_place in [false, true] {
                        let root = (case * 5 + 3) % n;
                        if let Err(e) = run_op(c, op, count, in_place, root) {
                            return Some(format!("{op} via {alg}: {e}"));
                        }
                    }
                }
            }
        }
        None
    });
    let errors: Vec<String> = errors.into_iter().flatten().collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

fn threads(world: usize) -> Vec<Communicator> {
    let mut cfg = Config::new(0, world);
    cfg.timeout = Duration::from_secs(60);
    Communicator::in_process_with(cfg).unwrap()
}

fn on_hosts(labels: &[usize]) -> Vec<Communicator> {
    let mut cfg = Config::new(0, labels.len());
    cfg.timeout = Duration::from_secs(60);
    Communicator::in_process_on_hosts(cfg, labels).unwrap()
}

macro_rules! world_tests {
    ($($name:ident: $world:expr, $small:expr;)*) => {$(
        #[test]
        fn $name() { all_algorithms(threads($world), $small, Which::Every); }
    )*};
}

world_tests! {
    every_algorithm_world_1: 1, false;
    every_algorithm_world_2: 2, false;
    every_algorithm_world_3: 3, false;
    every_algorithm_world_4: 4, false;
    every_algorithm_world_5: 5, false;
    every_algorithm_world_6: 6, false;
    every_algorithm_world_7: 7, false;
    every_algorithm_world_8: 8, false;
    every_algorithm_world_16: 16, true;
}

#[test]
fn every_algorithm_on_two_hosts_of_two() {
    all_algorithms(on_hosts(&[0, 0, 1, 1]), false, Which::Every);
}

#[test]
fn every_algorithm_on_uneven_hosts() {
    all_algorithms(on_hosts(&[0, 0, 0, 1, 1, 2]), false, Which::Every);
}

#[test]
fn ring_and_hierarchical_on_interleaved_hosts() {
    for only in [Algorithm::Ring, Algorithm::Hierarchical] {
        all_algorithms(on_hosts(&[0, 1, 0, 1, 0, 1, 0]), false, Which::Only(only));
    }
}

#[test]
fn hierarchical_on_four_hosts_of_four() {
    let labels: Vec<usize> = (0..16).map(|r| r / 4).collect();
    all_algorithms(on_hosts(&labels), true, Which::Only(Algorithm::Hierarchical));
}

#[test]
fn auto_picks_run_on_host_layouts_and_one_host() {
    all_algorithms(on_hosts(&[0, 0, 1, 1, 2, 2, 3, 3]), false, Which::Auto);
    all_algorithms(threads(5), false, Which::Auto);
}
