//! Tensor fusion against one collective per tensor (issue 20): every iteration
//! all-reduces the same 1,000 f32 tensors of 1 KiB to 64 KiB (sizes log-uniform,
//! fixed seed), on 2 ranks that are threads of this process, per transport.
//! `per_tensor` calls `all_reduce_in_place` once per tensor; `fused` submits all
//! of them to a [`braid::fusion::Fuser`] (default threshold and cycle), flushes,
//! and waits for every handle. `one_buffer` all-reduces one buffer holding as many
//! bytes as all the tensors together: no fusion can beat it (it packs nothing and
//! makes one call), so per_tensor / one_buffer bounds what fusion can gain here.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use braid::fusion::{FusedWork, Fuser, FusionConfig};
use braid::TransportKind;
use braid::{Communicator, ReduceOp};
use common::comms;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const WORLD: usize = 2;
const TENSORS: usize = 1000;

/// Element counts of the tensors: 1 KiB to 64 KiB, log-uniform, the same on every rank.
fn sizes() -> Vec<usize> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..TENSORS)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            let bytes = 1024.0 * 64f64.powf(u);
            (bytes as usize / 4).max(1)
        })
        .collect()
}

/// How one rank runs an iteration.
#[derive(Clone, Copy)]
enum Mode {
    PerTensor,
    Fused,
    OneBuffer,
}

/// One rank: its communicator (inside a fuser for `Fused`) and its tensors.
struct Rank {
    comm: Option<Communicator>,
    fuser: Option<Fuser>,
    tensors: Vec<Vec<f32>>,
}

impl Rank {
    fn new(comm: Communicator, mode: Mode) -> Rank {
        // Zeros: sums stay zero however many iterations run (exactness is tests' work).
        let tensors = sizes().into_iter().map(|n| vec![0.0f32; n]).collect();
        match mode {
            Mode::PerTensor => Rank { comm: Some(comm), fuser: None, tensors },
            Mode::OneBuffer => {
                let total = tensors.iter().map(Vec::len).sum();
                Rank { comm: Some(comm), fuser: None, tensors: vec![vec![0.0f32; total]] }
            }
            Mode::Fused => Rank { comm: None, fuser: Some(Fuser::new(comm, FusionConfig::default())), tensors },
        }
    }

    fn iterate(&mut self, iters: u64) {
        for _ in 0..iters {
            if let Some(comm) = &self.comm {
                for t in &mut self.tensors {
                    comm.all_reduce_in_place(t, ReduceOp::Sum).expect("all-reduce");
                }
            } else if let Some(f) = &self.fuser {
                let works: Vec<FusedWork<f32>> =
                    self.tensors.drain(..).map(|t| f.all_reduce(t, ReduceOp::Sum)).collect();
                f.flush();
                self.tensors = works.into_iter().map(|w| w.wait().expect("fused all-reduce")).collect();
            }
        }
    }
}

/// Rank 0 runs in criterion's loop; the other ranks follow over channels.
struct Pair {
    rank0: Rank,
    follower: mpsc::Sender<u64>,
    done: mpsc::Receiver<()>,
}

impl Pair {
    fn new(mut comms: Vec<Communicator>, mode: Mode) -> Pair {
        let (tx, rx) = mpsc::channel::<u64>();
        let (done_tx, done) = mpsc::channel();
        let c1 = comms.pop().expect("rank 1");
        std::thread::spawn(move || {
            let mut me = Rank::new(c1, mode);
            for iters in rx {
                me.iterate(iters);
                let _ = done_tx.send(());
            }
        });
        Pair { rank0: Rank::new(comms.pop().expect("rank 0"), mode), follower: tx, done }
    }

    fn time(&mut self, iters: u64) -> Duration {
        let t = Instant::now();
        self.follower.send(iters).expect("follower");
        self.rank0.iterate(iters);
        self.done.recv().expect("follower done");
        t.elapsed()
    }
}

fn bench(c: &mut Criterion) {
    let bytes: usize = sizes().iter().map(|n| n * 4).sum();
    for (name, kind) in [("inproc", None), ("shm", Some(TransportKind::Shm)), ("tcp", Some(TransportKind::Tcp))] {
        let mut g = c.benchmark_group(format!("fusion_1000_tensors_{name}_{WORLD}ranks"));
        g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
        g.throughput(Throughput::Bytes(bytes as u64));
        for (label, mode) in [("per_tensor", Mode::PerTensor), ("fused", Mode::Fused), ("one_buffer", Mode::OneBuffer)]
        {
            let comms = match kind {
                None => Communicator::in_process(WORLD).expect("inproc"),
                Some(k) => comms(WORLD, k, None),
            };
            let mut pair = Pair::new(comms, mode);
            g.bench_function(label, |b| b.iter_custom(|iters| pair.time(iters)));
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
