//! All-reduce throughput by size for the in-process, shared-memory and TCP transports
//! (`cargo bench`; `cargo bench -- --quick` for a short run). Ranks are threads of
//! this process; for process ranks and peer comparisons use `braid perf`.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid::bootstrap::{MemStore, Store};
use braid::transport::TransportKind;
use braid::{Communicator, ReduceOp};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const WORLD: usize = 2;

/// Rank threads that run `iters` all-reduces of `elems` f32 on command; rank 0's
/// thread is the caller, the others follow over a channel.
/// A command to follower ranks: all-reduce this many elements this many times (None: stop).
type Order = Option<(usize, u64)>;

struct Group {
    rank0: Communicator,
    followers: Vec<(mpsc::Sender<Order>, JoinHandle<()>)>,
}

impl Group {
    fn new(mut comms: Vec<Communicator>) -> Group {
        let rank0 = comms.remove(0);
        let followers = comms
            .into_iter()
            .map(|c| {
                let (tx, rx) = mpsc::channel::<Order>();
                let h = std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    while let Ok(Some((elems, iters))) = rx.recv() {
                        buf.resize(elems, 1.0f32);
                        for _ in 0..iters {
                            c.all_reduce_in_place(&mut buf, ReduceOp::Sum).expect("all-reduce");
                        }
                    }
                });
                (tx, h)
            })
            .collect();
        Group { rank0, followers }
    }

    fn run(&self, buf: &mut [f32], iters: u64) -> Duration {
        for (tx, _) in &self.followers {
            tx.send(Some((buf.len(), iters))).expect("follower alive");
        }
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
            let _ = tx.send(None);
            let _ = h.join();
        }
    }
}

fn process_comms(world: usize, kind: TransportKind) -> Vec<Communicator> {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let s = store.clone();
            std::thread::spawn(move || {
                Communicator::builder(r, world)
                    .store(s)
                    .socket_ifname("lo")
                    .transports(vec![kind])
                    .build()
                    .expect("links")
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("builder")).collect()
}

fn bench(c: &mut Criterion) {
    let groups = [
        ("inproc", Communicator::in_process(WORLD).expect("inproc")),
        ("shm", process_comms(WORLD, TransportKind::Shm)),
        ("tcp", process_comms(WORLD, TransportKind::Tcp)),
    ];
    for (name, comms) in groups {
        let group = Group::new(comms);
        let mut g = c.benchmark_group(format!("all_reduce_f32_{name}_{WORLD}ranks"));
        g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
        for bytes in [4usize << 10, 64 << 10, 1 << 20, 16 << 20] {
            g.throughput(Throughput::Bytes(bytes as u64));
            let mut buf = vec![1.0f32; bytes / 4];
            g.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, _| {
                b.iter_custom(|iters| group.run(&mut buf, iters))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
