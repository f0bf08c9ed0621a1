//! The benches' rank harness: ranks are threads of the bench process, rank 0 the
//! caller and the others following orders over channels, so criterion times rank
//! 0's loop while every rank runs it.
#![allow(dead_code)]

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid::algorithm::Algorithm;
use braid::bootstrap::{MemStore, Store};
use braid::TransportKind;
use braid::{Communicator, ReduceOp};

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
pub struct Group {
    pub rank0: Communicator,
    followers: Vec<(mpsc::Sender<Order>, JoinHandle<()>)>,
    checked: mpsc::Receiver<bool>,
}

impl Group {
    pub fn new(mut comms: Vec<Communicator>) -> Group {
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
    pub fn check(&self, elems: usize, name: &str) {
        self.order(|| Order::Check(elems));
        let world = self.rank0.world_size();
        let mut buf: Vec<f32> = (0..elems).map(|i| input(0, i)).collect();
        self.rank0.all_reduce_in_place(&mut buf, ReduceOp::Sum).expect("all-reduce");
        let ok = exact(&buf, world) && self.followers.iter().all(|_| self.checked.recv().expect("follower"));
        assert!(ok, "allreduce/{name}: wrong sum of {elems} f32 over {world} ranks");
    }

    pub fn run(&self, buf: &mut [f32], iters: u64) -> Duration {
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

/// `world` communicators over `kind` (threads of this process), running `alg`
/// (None: the tuner picks).
pub fn comms(world: usize, kind: TransportKind, alg: Option<Algorithm>) -> Vec<Communicator> {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let s = store.clone();
            std::thread::spawn(move || {
                Communicator::builder(r, world)
                    .store(s)
                    .socket_ifname("lo")
                    .transports(vec![kind])
                    .algorithm(alg)
                    .build()
                    .expect("links")
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("builder")).collect()
}
