//! All-reduce throughput of every algorithm by size (`cargo bench --bench algorithms`;
//! add `-- --quick` for a short run, or a filter such as `allreduce/ring`). One
//! criterion group per algorithm of `algorithms_for(OpKind::AllReduce)`, named
//! `allreduce/<algo>`, each forced with the builder's `.algorithm(..)`, over f32
//! buffers of 4 KiB, 64 KiB, 1 MiB and 16 MiB per rank.
//!
//! Ranks are threads of this process linked by shared memory; `BRAID_BENCH_WORLD=N`
//! sets the number of ranks (default 2). Before a size is timed, one all-reduce of
//! integer-valued inputs is checked against its closed-form sum on every rank, and
//! the planned schedule must be the forced algorithm, so a broken or bypassed
//! algorithm cannot report a fast bogus number.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid::algorithm::{algorithms_for, Algorithm};
use braid::bootstrap::{MemStore, Store};
use braid::transport::TransportKind;
use braid::{CallSig, Communicator, DType, OpKind, ReduceOp};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 16 << 20];

/// Input of `rank` at `i`: small integers, so every sum is exact in f32.
fn input(rank: usize, i: usize) -> f32 {
    ((i % 251) + rank) as f32
}

/// The all-reduced (summed) value at `i` over `world` ranks.
fn expected(world: usize, i: usize) -> f32 {
    (world * (i % 251) + world * (world - 1) / 2) as f32
}

/// Whether `buf` holds the all-reduce of [`input`] over `world` ranks.
fn exact(buf: &[f32], world: usize) -> bool {
    buf.iter().enumerate().all(|(i, &x)| x == expected(world, i))
}

/// A command to follower ranks.
enum Order {
    /// One all-reduce of [`input`] of this many elements; reply whether it was exact.
    Check(usize),
    /// This many all-reduces of this many elements.
    Run(usize, u64),
}

/// Rank threads: rank 0 is the caller, the others follow orders over a channel.
struct Group {
    rank0: Communicator,
    followers: Vec<(mpsc::Sender<Order>, JoinHandle<()>)>,
    checked: mpsc::Receiver<bool>,
}

impl Group {
    fn new(mut comms: Vec<Communicator>) -> Group {
        let rank0 = comms.remove(0);
        let (ok_tx, checked) = mpsc::channel();
        let followers = comms
            .into_iter()
            .map(|c| {
                let (tx, rx) = mpsc::channel::<Order>();
                let ok_tx = ok_tx.clone();
                let h = std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    for order in rx {
                        match order {
                            Order::Check(elems) => {
                                buf = (0..elems).map(|i| input(c.rank(), i)).collect();
                                c.all_reduce_in_place(&mut buf, ReduceOp::Sum).expect("all-reduce");
                                let _ = ok_tx.send(exact(&buf, c.world_size()));
                            }
                            Order::Run(elems, iters) => {
                                buf.resize(elems, 1.0);
                                for _ in 0..iters {
                                    c.all_reduce_in_place(&mut buf, ReduceOp::Sum).expect("all-reduce");
                                }
                            }
                        }
                    }
                });
                (tx, h)
            })
            .collect();
        Group { rank0, followers, checked }
    }

    fn order(&self, order: impl Fn() -> Order) {
        for (tx, _) in &self.followers {
            tx.send(order()).expect("follower alive");
        }
    }

    /// Panics unless one all-reduce of `elems` elements is exact on every rank.
    fn check(&self, elems: usize, name: &str) {
        self.order(|| Order::Check(elems));
        let world = self.rank0.world_size();
        let mut buf: Vec<f32> = (0..elems).map(|i| input(0, i)).collect();
        self.rank0.all_reduce_in_place(&mut buf, ReduceOp::Sum).expect("all-reduce");
        let ok = exact(&buf, world) && self.followers.iter().all(|_| self.checked.recv().expect("follower"));
        assert!(ok, "allreduce/{name}: wrong sum of {elems} f32 over {world} ranks");
    }

    fn run(&self, buf: &mut [f32], iters: u64) -> Duration {
        self.order(|| Order::Run(buf.len(), iters));
        let t0 = Instant::now();
        for _ in 0..iters {
            self.rank0.all_reduce_in_place(buf, ReduceOp::Sum).expect("all-reduce");
        }
        t0.elapsed()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for (tx, h) in self.followers.drain(..) {
            drop(tx);
            let _ = h.join();
        }
    }
}

/// `world` shared-memory communicators that all run `alg`.
fn shm_comms(world: usize, alg: Algorithm) -> Vec<Communicator> {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let s = store.clone();
            std::thread::spawn(move || {
                Communicator::builder(r, world)
                    .store(s)
                    .socket_ifname("lo")
                    .transports(vec![TransportKind::Shm])
                    .algorithm(Some(alg))
                    .build()
                    .expect("links")
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("builder")).collect()
}

fn bench(c: &mut Criterion) {
    let world = std::env::var("BRAID_BENCH_WORLD")
        .ok()
        .map_or(2, |s| s.trim().parse().expect("BRAID_BENCH_WORLD: a number of ranks"));
    assert!(world >= 2, "BRAID_BENCH_WORLD: at least 2 ranks");
    for &alg in algorithms_for(OpKind::AllReduce) {
        let name = alg.name();
        let group = Group::new(shm_comms(world, alg));
        let mut g = c.benchmark_group(format!("allreduce/{name}"));
        g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
        for bytes in SIZES {
            let elems = bytes / 4;
            let sig = CallSig::new(OpKind::AllReduce, DType::F32, elems as u64, 0, ReduceOp::Sum);
            let planned = group.rank0.plan(&sig).expect("plan").algorithm;
            assert_eq!(planned, alg, "allreduce/{name} planned {planned} at {bytes} bytes");
            group.check(elems, name);
            g.throughput(Throughput::Bytes(bytes as u64));
            let mut buf = vec![1.0f32; elems];
            g.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, _| {
                b.iter_custom(|iters| group.run(&mut buf, iters))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
