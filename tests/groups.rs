//! Sub-communicators beside `split`: `dup` (the same ranks again, collectives
//! interleaved with the parent's) and `new_group` (formed by the listed ranks only,
//! renumbered in list order, bad lists refused).

mod common;

use std::time::Duration;

use braid::{Error, ReduceOp};
use common::{comms, on_ranks, Net};

const T: Duration = Duration::from_secs(30);

/// Every rank dups the world; the dup's collectives run interleaved with the
/// parent's (one of them async, in flight across the other's calls) and both give
/// exact results; a second dup differs from the first.
fn dup_interleaved(net: Net) {
    let ids = on_ranks(comms(net, 4, T), |c| {
        let r = c.rank();
        let d = c.dup().unwrap();
        assert_eq!((d.rank(), d.world_size()), (r, 4));
        assert_ne!(d.id(), c.id());
        for i in 0..5i64 {
            let parent = c.all_reduce_async(vec![r as i64 + i; 100_000], ReduceOp::Sum);
            let mut a = vec![(r as i64 + 1) * (i + 1); 70_001];
            d.all_reduce_in_place(&mut a, ReduceOp::Sum).unwrap();
            assert!(a.iter().all(|v| *v == 10 * (i + 1)), "dup all-reduce {i} on rank {r}: {}", a[0]);
            let mut g = vec![0i32; 4 * 3];
            d.all_gather(&[r as i32 * 10 + i as i32; 3], &mut g).unwrap();
            let want: Vec<i32> = (0..4).flat_map(|m| [m * 10 + i as i32; 3]).collect();
            assert_eq!(g, want, "dup all-gather {i} on rank {r}");
            let mut b = vec![r as u8; 999];
            c.broadcast(&mut b, (i as usize) % 4).unwrap();
            assert!(b.iter().all(|v| *v as i64 == i % 4), "parent broadcast {i} on rank {r}");
            let p = parent.wait().unwrap();
            assert!(p.iter().all(|v| *v == 6 + 4 * i), "parent all-reduce {i} on rank {r}: {}", p[0]);
        }
        let again = c.dup().unwrap();
        again.barrier().unwrap();
        (c.id(), d.id(), again.id())
    });
    assert!(ids.iter().all(|x| *x == ids[0]), "every rank's dup has the same id: {ids:?}");
    assert_ne!(ids[0].1, ids[0].2, "two dups of one communicator have different ids");
}

#[test]
fn dup_runs_collectives_interleaved_with_the_parent_inproc() {
    dup_interleaved(Net::InProc);
}

#[test]
fn dup_runs_collectives_interleaved_with_the_parent_tcp() {
    dup_interleaved(Net::Tcp);
}

#[test]
fn dup_runs_collectives_interleaved_with_the_parent_shm() {
    dup_interleaved(Net::Shm);
}

/// Ranks 3 and 1 form a group (3 becomes rank 0) twice, while ranks 0 and 2 only
/// exchange point-to-point messages on the parent; afterwards every rank splits
/// and runs parent collectives, so the groups left the parent's order intact.
fn group_of_listed_ranks(net: Net) {
    on_ranks(comms(net, 4, T), |c| {
        let r = c.rank();
        if r % 2 == 1 {
            for round in 0..2 {
                let g = c.new_group(&[3, 1]).unwrap();
                assert_eq!((g.rank(), g.world_size()), (if r == 3 { 0 } else { 1 }, 2));
                let mut got = vec![0i64; 2];
                g.all_gather(&[r as i64 * 100 + round], &mut got).unwrap();
                assert_eq!(got, vec![300 + round, 100 + round], "group [3,1] in list order, round {round}");
                let mut s = vec![r as f32; 50_000];
                g.all_reduce_in_place(&mut s, ReduceOp::Sum).unwrap();
                assert!(s.iter().all(|v| *v == 4.0));
                g.destroy().unwrap();
            }
        } else {
            let mut buf = vec![r as i32; 10_000];
            if r == 0 {
                c.send(&buf, 2).unwrap();
                c.recv(&mut buf, 2).unwrap();
                assert!(buf.iter().all(|v| *v == 2));
            } else {
                let mut got = vec![0i32; 10_000];
                c.recv(&mut got, 0).unwrap();
                assert!(got.iter().all(|v| *v == 0));
                c.send(&buf, 0).unwrap();
            }
        }
        let half = c.split(Some((r % 2) as u32), r as u32).unwrap().unwrap();
        let mut v = [r as i32 + 1];
        half.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v[0], if r % 2 == 0 { 4 } else { 6 });
        let mut w = [r as i32];
        c.all_reduce_in_place(&mut w, ReduceOp::Sum).unwrap();
        assert_eq!(w[0], 6);
    });
}

#[test]
fn new_group_is_formed_by_the_listed_ranks_alone_inproc() {
    group_of_listed_ranks(Net::InProc);
}

#[test]
fn new_group_is_formed_by_the_listed_ranks_alone_tcp() {
    group_of_listed_ranks(Net::Tcp);
}

#[test]
fn new_group_is_formed_by_the_listed_ranks_alone_shm() {
    group_of_listed_ranks(Net::Shm);
}

/// Empty lists, duplicates, ranks out of range and a caller not in the list are
/// refused at once, naming the fault; the communicator still works afterwards.
#[test]
fn new_group_refuses_bad_lists() {
    on_ranks(comms(Net::InProc, 4, T), |c| {
        let r = c.rank();
        let not_me: Vec<usize> = (0..4).filter(|&x| x != r).collect();
        let bad: [(&[usize], &str); 5] = [
            (&[], "empty"),
            (&[r, 2, r], "listed twice"),
            (&[r, 4], "rank 4 is not a rank of this 4-rank communicator"),
            (&[usize::MAX, r], "is not a rank"),
            (&not_me, "this rank is not listed"),
        ];
        for (list, why) in bad {
            match c.new_group(list) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(why), "rank {r}, {list:?}: {m}"),
                Err(e) => panic!("rank {r}, {list:?}: not an invalid argument: {e}"),
                Ok(_) => panic!("rank {r}, {list:?}: accepted"),
            }
        }
        c.barrier().unwrap();
    });
}
