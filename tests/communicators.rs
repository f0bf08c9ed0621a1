//! Communicators that coexist: unique ids, several on one store (at once and one
//! after another), jobs that share a store by mistake, and `split` into halves
//! whose collectives run at the same time as each other and as the parent's.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use braid::bootstrap::{MemStore, Store};
use braid::TransportKind;
use braid::{Communicator, ReduceOp};
use common::{comms, on_ranks, Net};

const T: Duration = Duration::from_secs(30);

fn builder(rank: usize, world: usize, store: &Arc<dyn Store>, kind: TransportKind) -> braid::CommunicatorBuilder {
    Communicator::builder(rank, world).store(store.clone()).socket_ifname("lo").transports(vec![kind]).timeout(T)
}

/// Run `f(rank)` on `world` threads and collect the results in rank order.
fn threads<R: Send + 'static>(world: usize, f: impl Fn(usize) -> R + Send + Sync + 'static) -> Vec<R> {
    let f = Arc::new(f);
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || f(r))
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

/// The collectives a half runs: exact closed-form results for members `members`
/// (parent ranks, in child rank order) of a child with parent rank `pr`.
fn run_half(child: &Communicator, pr: usize, members: &[usize]) {
    let n = members.len();
    let mut a = vec![(pr + 1) as f32; 300_000];
    child.all_reduce_in_place(&mut a, ReduceOp::Sum).unwrap();
    let sum: usize = members.iter().map(|m| m + 1).sum();
    assert!(a.iter().all(|v| *v == sum as f32), "all-reduce on parent rank {pr}: {} != {sum}", a[0]);
    let mut g = vec![0i64; 3 * n];
    child.all_gather(&[pr as i64; 3], &mut g).unwrap();
    let want: Vec<i64> = members.iter().flat_map(|m| [*m as i64; 3]).collect();
    assert_eq!(g, want, "all-gather on parent rank {pr}");
    let mut b = vec![pr as i32; 50_000];
    child.broadcast(&mut b, n - 1).unwrap();
    assert!(b.iter().all(|v| *v == members[n - 1] as i32), "broadcast on parent rank {pr}");
}

/// Split 4 ranks by parity; both halves run collectives at once, while the parent
/// runs an all-reduce of its own; the parent works afterwards too.
fn halves(net: Net) {
    let out = on_ranks(comms(net, 4, T), |c| {
        let r = c.rank();
        let child = c.split(Some((r % 2) as u32), r as u32).unwrap().expect("every rank has a color");
        assert_eq!((child.rank(), child.world_size()), (r / 2, 2));
        assert_ne!(child.id(), c.id());
        let parent_work = c.all_reduce_async(vec![(r + 1) as i64; 200_000], ReduceOp::Sum);
        let members = if r % 2 == 0 { [0, 2] } else { [1, 3] };
        for _ in 0..3 {
            run_half(&child, r, &members);
        }
        let p = parent_work.wait().unwrap();
        assert!(p.iter().all(|v| *v == 10), "parent all-reduce during the split: {}", p[0]);
        let mut g = vec![0i32; 4];
        c.all_gather(&[r as i32], &mut g).unwrap();
        assert_eq!(g, vec![0, 1, 2, 3]);
        (child.id(), c.id())
    });
    // Both halves agree on their id, the halves' ids differ from each other and from the parent's.
    assert_eq!(out[0].0, out[2].0);
    assert_eq!(out[1].0, out[3].0);
    assert_ne!(out[0].0, out[1].0);
    assert!(out.iter().all(|o| o.1 == out[0].1 && o.0 != o.1));
}

#[test]
fn split_into_halves_runs_both_and_the_parent_at_once_inproc() {
    halves(Net::InProc);
}

#[test]
fn split_into_halves_runs_both_and_the_parent_at_once_tcp() {
    halves(Net::Tcp);
}

#[test]
fn split_into_halves_runs_both_and_the_parent_at_once_shm() {
    halves(Net::Shm);
}

/// Keys order the new ranks, `None` joins no group, and a child splits again.
fn keys_and_undefined(net: Net) {
    let out = on_ranks(comms(net, 4, T), |c| {
        let r = c.rank();
        let color = if r == 3 { None } else { Some(7) };
        let Some(child) = c.split(color, (10 - r) as u32).unwrap() else {
            assert_eq!(r, 3);
            return Vec::new();
        };
        // Keys 10, 9, 8 reverse parent ranks 0, 1, 2.
        assert_eq!((child.rank(), child.world_size()), (2 - r, 3));
        let mut g = vec![0u8; 3];
        child.all_gather(&[r as u8], &mut g).unwrap();
        // Ties in key fall back to the parent rank: all keys 0 keeps child order.
        let grand = child.split(Some(0), 0).unwrap().unwrap();
        assert_eq!(grand.rank(), child.rank());
        let mut s = vec![r as i64 + 1; 10];
        grand.all_reduce_in_place(&mut s, ReduceOp::Max).unwrap();
        assert_eq!(s, vec![3; 10]);
        g
    });
    assert_eq!(out[..3], [vec![2, 1, 0], vec![2, 1, 0], vec![2, 1, 0]]);
    assert!(out[3].is_empty());
}

#[test]
fn split_orders_by_key_and_leaves_out_undefined_colors_inproc() {
    keys_and_undefined(Net::InProc);
}

#[test]
fn split_orders_by_key_and_leaves_out_undefined_colors_tcp() {
    keys_and_undefined(Net::Tcp);
}

/// Two communicators built on one store by every rank, used at the same time
/// (one from a second thread of each rank), then a third built after both are gone.
fn two_on_one_store(kind: TransportKind) {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let out = threads(3, move |r| {
        let a = builder(r, 3, &store, kind).build().unwrap();
        let b = builder(r, 3, &store, kind).build().unwrap();
        assert_ne!(a.id(), b.id());
        let ids = (a.id(), b.id());
        std::thread::scope(|s| {
            let a = &a;
            let h = s.spawn(move || {
                for k in 0..5i64 {
                    let mut v = vec![r as i64 + k; 100_000];
                    a.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    assert!(v.iter().all(|x| *x == 3 + 3 * k), "communicator a, round {k}");
                }
            });
            for k in 0..5i32 {
                let mut v = vec![0i32; 3 * 1000];
                b.all_gather(&vec![r as i32 * 10 + k; 1000], &mut v).unwrap();
                let want: Vec<i32> = (0..3).flat_map(|p| vec![p * 10 + k; 1000]).collect();
                assert_eq!(v, want, "communicator b, round {k}");
            }
            h.join().unwrap();
        });
        drop((a, b));
        let c = builder(r, 3, &store, kind).build().unwrap();
        let mut v = vec![r as f64; 17];
        c.broadcast(&mut v, 2).unwrap();
        assert_eq!(v, vec![2.0; 17]);
        (ids, c.id())
    });
    for o in &out {
        assert_eq!(o, &out[0], "every rank agrees on every id");
        assert!(o.1 != o.0 .0 && o.1 != o.0 .1);
    }
}

#[test]
fn two_communicators_on_one_store_at_once_and_after_tcp() {
    two_on_one_store(TransportKind::Tcp);
}

#[test]
fn two_communicators_on_one_store_at_once_and_after_shm() {
    two_on_one_store(TransportKind::Shm);
}

/// A second handle on the same keys, as a second job's processes would have.
struct SameData(Arc<MemStore>);

impl Store for SameData {
    fn set(&self, key: &str, value: &[u8]) -> braid::Result<()> {
        self.0.set(key, value)
    }
    fn get(&self, key: &str) -> braid::Result<Option<Vec<u8>>> {
        self.0.get(key)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> braid::Result<()> {
        self.0.wait(keys, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> braid::Result<i64> {
        self.0.add(key, delta)
    }
    fn delete(&self, key: &str) -> braid::Result<bool> {
        self.0.delete(key)
    }
}

#[test]
fn a_second_job_on_the_same_store_fails_fast_naming_the_rank_and_the_store() {
    let mem = Arc::new(MemStore::new());
    let first: Arc<dyn Store> = Arc::new(SameData(mem.clone()));
    let job_a = threads(2, move |r| builder(r, 2, &first, TransportKind::Tcp).build().unwrap());
    let second: Arc<dyn Store> = Arc::new(SameData(mem));
    let t0 = Instant::now();
    let errs = threads(2, move |r| builder(r, 2, &second, TransportKind::Tcp).build().err().map(|e| e.to_string()));
    // Well before the 30 s deadline: no rank of the second job waits for anything.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    for (r, e) in errs.iter().enumerate() {
        let e = e.as_deref().expect("the second job must not link");
        assert!(e.contains(&format!("rank {r} of communicator braid/comm0 was already claimed")), "{e}");
        assert!(e.contains("is another job using store"), "{e}");
    }
    // The first job is untouched.
    let sums = on_ranks(job_a, |c| {
        let mut v = vec![c.rank() as i32 + 1; 5];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        v
    });
    assert_eq!(sums, vec![vec![3; 5], vec![3; 5]]);
}

#[test]
fn named_communicators_share_a_store_and_a_duplicate_name_is_refused() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let out = threads(2, move |r| {
        let x = builder(r, 2, &store, TransportKind::Tcp).name("x").build().unwrap();
        let y = builder(r, 2, &store, TransportKind::Tcp).name("y").build().unwrap();
        let dup = builder(r, 2, &store, TransportKind::Tcp).name("x").build().err().map(|e| e.to_string());
        let mut v = [r as u8 + 1; 4];
        x.all_reduce_in_place(&mut v, ReduceOp::Prod).unwrap();
        let mut w = [r as u8 + 1; 4];
        y.all_reduce_in_place(&mut w, ReduceOp::Sum).unwrap();
        (v, w, dup)
    });
    for (v, w, dup) in out {
        assert_eq!((v, w), ([2; 4], [3; 4]));
        assert!(dup.unwrap().contains("communicator braid/x was already claimed"));
    }
}

#[test]
fn a_job_rerun_against_a_fresh_tcp_store_hosted_by_rank_zero_works() {
    for run in 0..2 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("tcp://127.0.0.1:{port}");
        let out = threads(2, move |r| {
            let c = Communicator::builder(r, 2)
                .store_url(url.clone())
                .socket_ifname("lo")
                .transports(vec![TransportKind::Tcp])
                .timeout(T)
                .build()
                .unwrap();
            let mut v = vec![r as i64 + run; 9];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            c.barrier().unwrap();
            v
        });
        assert_eq!(out, vec![vec![1 + 2 * run; 9]; 2], "run {run}");
    }
}
