//! Gather and scatter through the executor: transport x world size x element count
//! x algorithm x root (first and last rank) x in place / out of place, on small
//! integers checked element by element; and ranks that disagree on the root fail
//! in the call, on every rank, naming both roots.

mod common;

use std::time::Duration;

use braid::algorithm::{algorithms_for, Algorithm};
use braid::{CallSig, Communicator, Config, DType, Error, OpKind, ReduceOp};
use common::{comms, comms_checking_roots, on_ranks, Net};

/// Rank `r`'s element `i`: distinct per rank and position, so a block in the wrong
/// place or from the wrong rank shows.
fn value(r: usize, i: usize) -> i32 {
    ((i * 7 + r * 31) % 1013) as i32 - 500
}

const POISON: i32 = 0x0BAD;

fn compare(what: &str, got: &[i32], want: impl Fn(usize) -> i32) -> Result<(), String> {
    match got.iter().enumerate().find(|(i, g)| **g != want(*i)) {
        Some((i, g)) => Err(format!("{what}: element {i} is {g}, expected {}", want(i))),
        None => Ok(()),
    }
}

/// Gather `count` elements per rank to `root` and check the root's buffer (and that
/// other ranks' buffers are left alone).
fn gather(c: &Communicator, count: usize, root: usize, in_place: bool, tag: &str) -> Result<(), String> {
    let (r, n) = (c.rank(), c.world_size());
    let err = |e: Error| format!("{tag}: gather: {e}");
    let mine: Vec<i32> = (0..count).map(|i| value(r, i)).collect();
    let got = if in_place {
        let mut b = if r == root {
            let mut b = vec![POISON; n * count];
            b[root * count..(root + 1) * count].copy_from_slice(&mine);
            b
        } else {
            mine.clone()
        };
        c.gather_in_place(&mut b, root).map_err(err)?;
        b
    } else {
        let mut o = if r == root { vec![POISON; n * count] } else { Vec::new() };
        c.gather(&mine, &mut o, root).map_err(err)?;
        o
    };
    if r == root {
        compare(&format!("{tag}: gather"), &got, |k| value(k / count.max(1), k % count.max(1)))
    } else {
        compare(&format!("{tag}: gather (non-root buffer untouched)"), &got, |i| mine[i])
    }
}

/// Scatter block `j` of the root's buffer to rank `j` and check every rank's block
/// (and, in place, that the root's other blocks stay as they were).
fn scatter(c: &Communicator, count: usize, root: usize, in_place: bool, tag: &str) -> Result<(), String> {
    let (r, n) = (c.rank(), c.world_size());
    let err = |e: Error| format!("{tag}: scatter: {e}");
    // Block j of the root's buffer holds value(j, ..): what rank j must end with.
    let all: Vec<i32> = (0..n * count).map(|k| value(k / count.max(1), k % count.max(1))).collect();
    let block = if in_place {
        if r == root {
            let mut b = all.clone();
            c.scatter_in_place(&mut b, root).map_err(err)?;
            compare(&format!("{tag}: scatter (root buffer unchanged)"), &b, |k| all[k])?;
            b[root * count..(root + 1) * count].to_vec()
        } else {
            let mut b = vec![POISON; count];
            c.scatter_in_place(&mut b, root).map_err(err)?;
            b
        }
    } else {
        let src = if r == root { all.clone() } else { Vec::new() };
        let mut o = vec![POISON; count];
        c.scatter(&src, &mut o, root).map_err(err)?;
        o
    };
    compare(&format!("{tag}: scatter"), &block, |i| value(r, i))
}

/// Counts: empty, one, odd, and one block just over 1 MiB.
const COUNTS: [usize; 4] = [0, 1, 97, (1 << 20) / 4 + 13];

fn grid(net: Net, world: usize) {
    grid_on(comms(net, world, Duration::from_secs(60)), &format!("{net:?}"), None);
}

/// The grid over `comms`, every algorithm and the default, or only `only`.
fn grid_on(comms: Vec<Communicator>, net: &str, only: Option<Algorithm>) {
    let net = net.to_string();
    let errors = on_ranks(comms, move |c| {
        let (r, n) = (c.rank(), c.world_size());
        for op in [OpKind::Gather, OpKind::Scatter] {
            let algs: Vec<Option<Algorithm>> = match only {
                Some(a) => vec![Some(a)],
                None => algorithms_for(op).iter().copied().map(Some).chain([None]).collect(),
            };
            for alg in algs {
                c.set_algorithm(alg);
                if let Some(a) = alg {
                    let planned = c.plan(&CallSig::new(op, DType::I32, 97, 0, ReduceOp::Sum)).map(|s| s.algorithm);
                    if planned.as_ref().ok() != Some(&a) {
                        return Some(format!("{op}: forced {a}, planned {planned:?}"));
                    }
                }
                let name = alg.map_or("auto", Algorithm::name);
                for count in COUNTS {
                    for root in [0, n - 1] {
                        for in_place in [false, true] {
                            let tag = format!(
                                "{net} {op} via {name} world={n} rank={r} count={count} root={root} in_place={in_place}"
                            );
                            let run = if op == OpKind::Gather { gather } else { scatter };
                            if let Err(e) = run(c, count, root, in_place, &tag) {
                                return Some(e);
                            }
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

macro_rules! grid_tests {
    ($($name:ident: $net:expr, $world:expr;)*) => {$(
        #[test]
        fn $name() { grid($net, $world); }
    )*};
}

grid_tests! {
    inproc_w1: Net::InProc, 1;
    inproc_w2: Net::InProc, 2;
    inproc_w3: Net::InProc, 3;
    inproc_w4: Net::InProc, 4;
    inproc_w7: Net::InProc, 7;
    inproc_w8: Net::InProc, 8;
    shm_w1: Net::Shm, 1;
    shm_w2: Net::Shm, 2;
    shm_w3: Net::Shm, 3;
    shm_w4: Net::Shm, 4;
    shm_w7: Net::Shm, 7;
    shm_w8: Net::Shm, 8;
    tcp_w1: Net::Tcp, 1;
    tcp_w2: Net::Tcp, 2;
    tcp_w3: Net::Tcp, 3;
    tcp_w4: Net::Tcp, 4;
    tcp_w7: Net::Tcp, 7;
    tcp_w8: Net::Tcp, 8;
}

/// Hierarchical gather and scatter on in-process ranks labelled with hosts: two
/// hosts of two; hosts of 3, 2 and 1; hosts whose ranks interleave, unevenly.
#[test]
fn hierarchical_on_host_layouts() {
    for labels in [&[0, 0, 1, 1][..], &[0, 0, 0, 1, 1, 2], &[0, 1, 0, 1, 0, 1, 0], &[0, 1, 1, 2, 0, 1, 0]] {
        let mut cfg = Config::new(0, labels.len());
        cfg.timeout = Duration::from_secs(60);
        let comms = Communicator::in_process_on_hosts(cfg, labels).unwrap();
        grid_on(comms, &format!("hosts {labels:?}"), Some(Algorithm::Hierarchical));
    }
}

/// Rank 1 passes root 1 to `op`, every other rank root 0: every rank must fail in
/// that call, naming both roots.
fn roots_disagree(net: Net, world: usize, op: OpKind) {
    let errors = on_ranks(comms_checking_roots(net, world, Duration::from_secs(30), true), move |c| {
        let root = usize::from(c.rank() == 1);
        let n = c.world_size();
        let mine = [c.rank() as i32; 10];
        let mut all = vec![0i32; 10 * n];
        let mut block = [0i32; 10];
        let r = match op {
            OpKind::Gather => c.gather(&mine, if c.rank() == root { &mut all[..] } else { &mut [] }, root),
            _ => c.scatter(if c.rank() == root { &all[..] } else { &[] }, &mut block, root),
        };
        r.expect_err("finished a call whose roots differ between ranks")
    });
    for (rank, e) in errors.iter().enumerate() {
        let msg = e.to_string();
        let what = format!("{net:?} world {world} {op} rank {rank}: {msg}");
        assert!(matches!(e, Error::Mismatch { .. } | Error::PeerAborted { .. }), "{what}");
        assert!(msg.contains("root=0") && msg.contains("root=1"), "both roots must be named: {what}");
    }
    assert!(errors.iter().any(|e| matches!(e, Error::Mismatch { .. })), "{errors:?}");
}

#[test]
fn ranks_with_different_roots_all_fail_naming_both() {
    for net in [Net::InProc, Net::Shm, Net::Tcp] {
        for op in [OpKind::Gather, OpKind::Scatter] {
            for world in [2, 3, 4] {
                roots_disagree(net, world, op);
            }
        }
    }
}
