//! All-gather-v, reduce-scatter-v and all-to-all-v through the executor:
//! transport x world size x uneven counts (zeros, odd, one block over 1 MiB) x
//! algorithm x in place / out of place, on small integers checked element by
//! element; and ranks that pass different counts fail, naming the peer and counts.

mod common;

use std::time::Duration;

use braid::algorithm::{algorithms_for, Algorithm};
use braid::{Communicator, Error, OpKind, ReduceOp};
use common::{comms, on_ranks, Net};

/// Rank `r`'s element `i`: distinct per rank and position.
fn value(r: usize, i: usize) -> i32 {
    ((i * 7 + r * 31) % 1013) as i32 - 500
}

const POISON: i32 = 0x0BAD;

/// A block just over 1 MiB of i32.
const LARGE: usize = (1 << 20) / 4 + 13;

fn compare(what: &str, got: &[i32], want: impl Fn(usize) -> i32) -> Result<(), String> {
    match got.iter().enumerate().find(|(i, g)| **g != want(*i)) {
        Some((i, g)) => Err(format!("{what}: element {i} of {} is {g}, expected {}", got.len(), want(i))),
        None => Ok(()),
    }
}

/// Uneven per-rank counts for `n` ranks: zeros, ones, odd sizes, and (with `large`)
/// one block over 1 MiB.
fn count_sets(n: usize) -> Vec<Vec<usize>> {
    let mut sets = vec![
        vec![0; n],
        (0..n).map(|j| [3, 0, 1, 97, 0, 5, 2, 0][j % 8]).collect(),
        (0..n).map(|j| if j == n - 1 { 0 } else { 2 * j + 1 }).collect(),
    ];
    let mut large: Vec<usize> = (0..n).map(|j| j % 3).collect();
    large[n / 2] = LARGE;
    sets.push(large);
    sets
}

fn starts(counts: &[usize]) -> Vec<usize> {
    counts.iter().scan(0, |a, &c| Some(std::mem::replace(a, *a + c))).collect()
}

/// Rank that owns element `k` of the packed blocks, and the index inside its block.
fn owner(counts: &[usize], k: usize) -> (usize, usize) {
    let d = starts(counts);
    let j = (0..counts.len()).rev().find(|&j| d[j] <= k && counts[j] > 0).unwrap_or(0);
    (j, k - d[j])
}

fn all_gather_v(c: &Communicator, counts: &[usize], in_place: bool, tag: &str) -> Result<(), String> {
    let r = c.rank();
    let total: usize = counts.iter().sum();
    let mine: Vec<i32> = (0..counts[r]).map(|i| value(r, i)).collect();
    let err = |e: Error| format!("{tag}: all-gather-v: {e}");
    let mut out = vec![POISON; total];
    if in_place {
        let at = starts(counts)[r];
        out[at..at + counts[r]].copy_from_slice(&mine);
        c.all_gather_v_in_place(&mut out, counts).map_err(err)?;
    } else {
        c.all_gather_v(&mine, &mut out, counts).map_err(err)?;
    }
    compare(&format!("{tag}: all-gather-v"), &out, |k| {
        let (j, i) = owner(counts, k);
        value(j, i)
    })
}

fn reduce_scatter_v(c: &Communicator, counts: &[usize], in_place: bool, tag: &str) -> Result<(), String> {
    let (r, n) = (c.rank(), c.world_size());
    let total: usize = counts.iter().sum();
    // Element k of every rank's input is value(rank, k): the sum over ranks is exact.
    let input: Vec<i32> = (0..total).map(|k| value(r, k)).collect();
    let err = |e: Error| format!("{tag}: reduce-scatter-v: {e}");
    let at = starts(counts)[r];
    let want = |i: usize| (0..n).map(|q| value(q, at + i)).sum::<i32>();
    if in_place {
        let mut buf = input.clone();
        c.reduce_scatter_v_in_place(&mut buf, counts, ReduceOp::Sum).map_err(err)?;
        compare(&format!("{tag}: reduce-scatter-v (own block)"), &buf[at..at + counts[r]], want)?;
        let outside = |k: usize| k < at || k >= at + counts[r];
        match (0..total).find(|&k| outside(k) && buf[k] != input[k]) {
            Some(k) => Err(format!("{tag}: reduce-scatter-v in place changed element {k} outside block {r}")),
            None => Ok(()),
        }
    } else {
        let mut out = vec![POISON; counts[r]];
        c.reduce_scatter_v(&input, &mut out, counts, ReduceOp::Sum).map_err(err)?;
        compare(&format!("{tag}: reduce-scatter-v"), &out, want)
    }
}

/// Elements rank `from` sends rank `to` in the all-to-all-v grid: uneven, with
/// zeros, and one pair carrying `big`.
fn pair_count(from: usize, to: usize, n: usize, big: usize) -> usize {
    if from == n / 2 && to == (n / 2 + 1) % n {
        return big;
    }
    (from * 5 + to * 3) % 7 % 4
}

fn all_to_all_v(c: &Communicator, big: usize, tag: &str) -> Result<(), String> {
    let (r, n) = (c.rank(), c.world_size());
    let send_counts: Vec<usize> = (0..n).map(|j| pair_count(r, j, n, big)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|j| pair_count(j, r, n, big)).collect();
    // Gaps of 2 between the blocks (displacements not packed), in reverse rank order.
    let mut send_displs = vec![0; n];
    let mut at = 1;
    for j in (0..n).rev() {
        send_displs[j] = at;
        at += send_counts[j] + 2;
    }
    let mut input = vec![POISON; at];
    for j in 0..n {
        for i in 0..send_counts[j] {
            input[send_displs[j] + i] = value(r * n + j, i);
        }
    }
    let recv_displs: Vec<usize> = starts(&recv_counts).iter().enumerate().map(|(j, d)| d + j).collect();
    let len = recv_displs.last().unwrap() + recv_counts[n - 1] + 1;
    let mut out = vec![POISON; len];
    c.all_to_all_v(&input, &send_counts, &send_displs, &mut out, &recv_counts, &recv_displs)
        .map_err(|e| format!("{tag}: all-to-all-v: {e}"))?;
    let mut want = vec![POISON; len];
    for j in 0..n {
        for i in 0..recv_counts[j] {
            want[recv_displs[j] + i] = value(j * n + r, i);
        }
    }
    compare(&format!("{tag}: all-to-all-v"), &out, |k| want[k])
}

fn grid(net: Net, world: usize) {
    let errors = on_ranks(comms(net, world, Duration::from_secs(60)), move |c| {
        let (r, n) = (c.rank(), c.world_size());
        for op in [OpKind::AllGatherV, OpKind::ReduceScatterV] {
            for alg in algorithms_for(op).iter().copied().map(Some).chain([None]) {
                c.set_algorithm(alg);
                let name = alg.map_or("auto", Algorithm::name);
                for counts in count_sets(n) {
                    for in_place in [false, true] {
                        let tag =
                            format!("{net:?} {op} via {name} world={n} rank={r} counts={counts:?} in_place={in_place}");
                        let run = if op == OpKind::AllGatherV { all_gather_v } else { reduce_scatter_v };
                        if let Err(e) = run(c, &counts, in_place, &tag) {
                            return Some(e);
                        }
                    }
                }
            }
        }
        c.set_algorithm(None);
        for big in [0, 1, LARGE] {
            if let Err(e) = all_to_all_v(c, big, &format!("{net:?} world={n} rank={r} big={big}")) {
                return Some(e);
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

/// Rank 1 passes all-gather-v counts that differ from the others' but have the same
/// sum: every rank fails in the call, none by timing out, and the ranks that
/// received a block of the wrong size name the peer and the counts.
#[test]
fn all_gather_v_counts_that_differ_between_ranks_fail_naming_them() {
    for net in [Net::InProc, Net::Shm, Net::Tcp] {
        let errors = on_ranks(comms(net, 3, Duration::from_secs(30)), |c| {
            // Direct: every rank receives rank 1's block straight from it.
            c.set_algorithm(Some(Algorithm::Direct));
            let counts: &[usize] = if c.rank() == 1 { &[2, 1, 3] } else { &[1, 2, 3] };
            let mine = vec![7i32; counts[c.rank()]];
            let mut out = vec![0i32; 6];
            c.all_gather_v(&mine, &mut out, counts).expect_err("finished with counts that differ between ranks")
        });
        for (rank, e) in errors.iter().enumerate() {
            assert!(!matches!(e, Error::Timeout { .. }), "{net:?} rank {rank} timed out: {e}");
        }
        // Ranks 0 and 2 each receive rank 1's block of the wrong size, unless the
        // other's failure reaches them first: at least one names rank 1 and the counts.
        let named = |rank: usize| {
            let msg = errors[rank].to_string();
            matches!(errors[rank], Error::Protocol { peer: 1, .. })
                && msg.contains("rank 1 and rank")
                && msg.contains("passed different counts")
                && msg.contains("[1, 2, 3]")
        };
        assert!(named(0) || named(2), "{net:?}: {errors:?}");
        let msg = errors[1].to_string();
        assert!(msg.contains("[2, 1, 3]") || msg.contains("rank 1"), "{net:?} rank 1: {msg}");
    }
}

/// Counts with different sums: the signatures differ, and each rank names both.
#[test]
fn reduce_scatter_v_counts_with_different_sums_fail_naming_both() {
    let errors = on_ranks(comms(Net::InProc, 2, Duration::from_secs(30)), |c| {
        let counts: &[usize] = if c.rank() == 0 { &[1, 2] } else { &[1, 3] };
        let input = vec![1i32; counts.iter().sum()];
        let mut out = vec![0i32; counts[c.rank()]];
        c.reduce_scatter_v(&input, &mut out, counts, ReduceOp::Sum).expect_err("finished with different counts")
    });
    for (rank, e) in errors.iter().enumerate() {
        let msg = e.to_string();
        assert!(matches!(e, Error::Mismatch { .. } | Error::PeerAborted { .. }), "rank {rank}: {msg}");
        assert!(msg.contains("count=3") && msg.contains("count=4"), "rank {rank}: {msg}");
    }
}

/// Rank 0 sends rank 1 three elements where rank 1's recv_counts[0] says two: rank
/// 1 fails naming rank 0 and both counts' places; the others fail too, in time.
#[test]
fn all_to_all_v_recv_count_that_differs_from_the_senders_names_both() {
    for net in [Net::InProc, Net::Tcp] {
        let errors = on_ranks(comms(net, 3, Duration::from_secs(30)), |c| {
            let r = c.rank();
            let send_counts = if r == 0 { vec![1, 3, 1] } else { vec![1, 1, 1] };
            let recv_counts = if r == 1 { vec![2, 1, 1] } else { vec![1, 1, 1] };
            let input = vec![r as i32; send_counts.iter().sum()];
            let mut out = vec![0i32; recv_counts.iter().sum()];
            let (sd, rd) = (starts(&send_counts), starts(&recv_counts));
            c.all_to_all_v(&input, &send_counts, &sd, &mut out, &recv_counts, &rd)
        });
        // Rank 2's blocks are right, so it may finish before rank 1's abort reaches it.
        for (rank, e) in errors.iter().enumerate().filter_map(|(r, e)| Some((r, e.as_ref().err()?))) {
            assert!(!matches!(e, Error::Timeout { .. }), "{net:?} rank {rank} timed out: {e}");
        }
        assert!(errors[0].is_err(), "{net:?}: rank 0 waits on rank 1, which failed");
        let err = errors[1].as_ref().expect_err("rank 1 received a block of the wrong size");
        let msg = err.to_string();
        assert!(matches!(err, Error::Protocol { peer: 0, .. }), "{net:?}: {msg}");
        assert!(
            msg.contains("rank 0's send_counts[1] differs from this rank's recv_counts[0] = 2")
                && msg.contains("12 bytes"),
            "{net:?}: {msg}"
        );
    }
}
