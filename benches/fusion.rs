//! Tensor fusion against one collective per tensor (issue 20): every iteration
//! all-reduces the same 1,000 f32 tensors of 1 KiB to 64 KiB (sizes log-uniform,
//! fixed seed), on 2 ranks that are threads of this process, per transport.
//! `per_tensor` calls `all_reduce_in_place` once per tensor; `fused` submits all
//! of them to a [`braid::fusion::Fuser`] (default threshold and cycle), flushes,
//! and waits for every handle, with pipelined packing off; `fused_pipelined` does
//! the same in pieces of `PIPELINE_BYTES` (or as `BRAID_FUSION_PIPELINE` says).
//! `one_buffer` all-reduces one buffer holding as many
//! bytes as all the tensors together: no fusion can beat it (it packs nothing and
//! makes one call), so per_tensor / one_buffer bounds what fusion can gain here.
//! `bucket_views` all-reduces the same tensors laid out in a
//! [`braid::fusion::GradientBuffer`] (default 64 MiB buckets): in place, no copies.
//!
//! A synthetic backward pass (issue 39): the 1,000 tensors are 50 layers of 20,
//! whose gradients are written last layer first, each layer after a compute of
//! calibrated length (a step's compute is about the one-buffer all-reduce time,
//! measured first): busy on the rank's thread (`_cpu`), or on a device that runs
//! the layers back to back while the thread sleeps until each bucket's last layer
//! is done (`_device`). `backward_compute` is the compute alone, `backward_comm` the
//! all-reduce of the written gradients alone (buckets of `BACKWARD_BUCKET`, the
//! first one smaller),
//! `backward_overlap` both, each bucket's all-reduce starting as its last
//! gradient is written ([`braid::fusion::GradientBuffer::all_reduce_as_ready`]).

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use braid::fusion::{FusedWork, Fuser, FusionConfig, GradientBuffer, Overlap, Pipeline};
use braid::TransportKind;
use braid::{Communicator, ReduceOp};
use common::comms;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const WORLD: usize = 2;
const TENSORS: usize = 1000;
/// Layers of the synthetic backward pass (tensors per layer: TENSORS / LAYERS).
const LAYERS: usize = 50;
/// Bucket size of the backward pass: small enough that buckets leave while later
/// layers compute (15.1 MB in about 8 buckets).
const BACKWARD_BUCKET: usize = 2 << 20;
/// The backward pass's first bucket: communication starts once it is written,
/// and with compute as long as communication that wait is added to the step (a
/// 2 MiB first bucket: 1/8 of a step), hence a small one, as PyTorch DDP's.
/// `FUSION_BENCH_FIRST_BUCKET_KIB` overrides it.
fn backward_first_bucket() -> usize {
    std::env::var("FUSION_BENCH_FIRST_BUCKET_KIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(512 << 10, |k| k << 10)
}
/// Piece size of `fused_pipelined` (`BRAID_FUSION_PIPELINE` overrides it).
const PIPELINE_BYTES: usize = 256 << 10;

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
    /// Through a fuser with this pipelining.
    Fused(Pipeline),
    OneBuffer,
    BucketViews,
    /// The backward pass: compute alone, all-reduce alone, or both overlapped;
    /// the compute of one layer.
    BackwardCompute(Layer),
    BackwardComm,
    BackwardOverlap(Layer),
}

/// A layer's compute: its length, and whether it keeps this thread's core busy
/// (training on the CPU) or leaves it free (an accelerator computes, the thread
/// sleeps until it is done).
#[derive(Clone, Copy)]
struct Layer {
    time: Duration,
    on_cpu: bool,
}

/// Sleeps of this thread end when asked, not up to 50 µs later (the default timer
/// slack is as long as a layer's compute here).
fn fine_sleeps() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
}

/// One layer's compute on the CPU: busy for the layer's time.
fn compute_on_cpu(layer: Layer) {
    let t = Instant::now();
    while t.elapsed() < layer.time {
        std::hint::spin_loop();
    }
}

/// Sleeps until a device that began the step at `step` is done with layer
/// `index` (counted from the step's first). The device runs its layers back to back, whatever the thread is
/// doing, so layer k is done at `step + (k + 1) x time`: a wake-up that comes
/// late shortens the next sleep instead of delaying every later layer (sleeping
/// for each layer's time in turn made a step's compute twice the calibrated
/// time, 4.3 ms for 2.1 ms in process, as the overshoots added up).
fn wait_for_device(layer: Layer, index: usize, step: Instant) {
    let done = step + layer.time * (index as u32 + 1);
    if let Some(left) = done.checked_duration_since(Instant::now()) {
        std::thread::sleep(left);
    }
}

/// Writes the gradient of tensor `i` (last layer first: tensor 0 is in the last
/// layer). On the CPU the thread computes each layer before its first tensor and
/// writes the gradient. A device writes the gradients into the bucket itself,
/// through its own memory; the thread waits only where a bucket ends
/// (`bucket_end`), until the layer of the bucket's last tensor is done, as one
/// event per bucket would tell it. Layers finish in order, so the whole bucket is
/// written then. (Waking for every layer, every 36-45 µs here, took a core from
/// the workers each time; a 2-rank all-reduce over memory stalls whenever either
/// worker is off its core: results/fusion-2026-11-28.md.)
fn backward_step(i: usize, t: &mut [f32], layer: Layer, step: Instant, bucket_end: bool) {
    let per = TENSORS / LAYERS;
    if layer.on_cpu {
        if i.is_multiple_of(per) {
            compute_on_cpu(layer);
        }
        t.fill(0.0);
    } else if bucket_end {
        wait_for_device(layer, i / per, step);
    }
}

/// CPU time of this process so far (user and system, every thread).
fn cpu_time() -> Duration {
    // SAFETY: rusage is plain integers (all-zero is valid), and getrusage writes
    // one, which lives on this stack.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Whether tensor i is the last of its bucket.
fn bucket_ends(grads: &GradientBuffer<f32>) -> Vec<bool> {
    let n = grads.len();
    (0..n).map(|i| i + 1 == n || grads.bucket_of(i + 1) != grads.bucket_of(i)).collect()
}

/// One rank: its communicator (inside a fuser for `Fused`) and its tensors.
struct Rank {
    mode: Mode,
    comm: Option<Communicator>,
    fuser: Option<Fuser>,
    tensors: Vec<Vec<f32>>,
    grads: Option<GradientBuffer<f32>>,
}

impl Rank {
    fn new(comm: Communicator, mode: Mode) -> Rank {
        // Zeros: sums stay zero however many iterations run (exactness is tests' work).
        let tensors: Vec<Vec<f32>> = sizes().into_iter().map(|n| vec![0.0f32; n]).collect();
        let lens: Vec<usize> = tensors.iter().map(Vec::len).collect();
        let views = |bytes| Some(GradientBuffer::new(&lens, bytes));
        let (comm, fuser, tensors, grads) = match mode {
            Mode::PerTensor => (Some(comm), None, tensors, None),
            Mode::OneBuffer => {
                let total = tensors.iter().map(Vec::len).sum();
                (Some(comm), None, vec![vec![0.0f32; total]], None)
            }
            Mode::Fused(pipeline) => {
                let cfg = FusionConfig { pipeline, ..FusionConfig::default() };
                (None, Some(Fuser::new(comm, cfg)), tensors, None)
            }
            Mode::BucketViews => (Some(comm), None, Vec::new(), views(FusionConfig::default().threshold_bytes)),
            Mode::BackwardCompute(_) | Mode::BackwardComm | Mode::BackwardOverlap(_) => {
                let layout = GradientBuffer::with_first_bucket(&lens, backward_first_bucket(), BACKWARD_BUCKET);
                (Some(comm), None, Vec::new(), Some(layout))
            }
        };
        Rank { mode, comm, fuser, tensors, grads }
    }

    fn iterate(&mut self, iters: u64) {
        for _ in 0..iters {
            if let (Some(grads), Some(comm)) = (&mut self.grads, &self.comm) {
                match self.mode {
                    Mode::BackwardCompute(d) => {
                        let ends = bucket_ends(grads);
                        let step = Instant::now();
                        for (i, t) in grads.tensors_mut().into_iter().enumerate() {
                            backward_step(i, t, d, step, ends[i]);
                        }
                    }
                    Mode::BackwardOverlap(d) => {
                        // Auto on the CPU (inline on this 2-core machine); the worker when
                        // a device computes and the core is free.
                        grads.set_overlap(if d.on_cpu { Overlap::Auto } else { Overlap::Worker });
                        let ends = bucket_ends(grads);
                        let step = Instant::now();
                        grads
                            .all_reduce_as_ready(comm, ReduceOp::Sum, |i, t| backward_step(i, t, d, step, ends[i]))
                            .expect("overlap")
                    }
                    _ => grads.all_reduce(comm, ReduceOp::Sum).expect("bucket views"),
                }
            } else if let Some(comm) = &self.comm {
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
        fine_sleeps();
        let (tx, rx) = mpsc::channel::<u64>();
        let (done_tx, done) = mpsc::channel();
        let c1 = comms.pop().expect("rank 1");
        std::thread::spawn(move || {
            fine_sleeps();
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
    let pipeline = match std::env::var_os("BRAID_FUSION_PIPELINE") {
        Some(_) => FusionConfig::from_env().expect("BRAID_FUSION_PIPELINE").pipeline,
        None => Pipeline::Pieces(PIPELINE_BYTES),
    };
    for (name, kind) in [("inproc", None), ("shm", Some(TransportKind::Shm)), ("tcp", Some(TransportKind::Tcp))] {
        let group = || match kind {
            None => Communicator::in_process(WORLD).expect("inproc"),
            Some(k) => comms(WORLD, k, None),
        };
        // The backward pass's compute per step: the one-buffer all-reduce's time
        // (median of 9 after a warm-up), spread over the layers.
        let (per_layer, cores_busy) = {
            let mut pair = Pair::new(group(), Mode::OneBuffer);
            pair.time(3);
            let (cpu0, wall) = (cpu_time(), Instant::now());
            let mut t: Vec<Duration> = (0..9).map(|_| pair.time(1)).collect();
            let cores_busy = (cpu_time() - cpu0).as_secs_f64() / wall.elapsed().as_secs_f64();
            t.sort_unstable();
            (t[4] / LAYERS as u32, cores_busy)
        };
        // How many cores the all-reduce alone keeps busy: near the machine's core
        // count, compute on those cores cannot overlap it, and a step with compute
        // on the CPU takes at least compute + communication.
        eprintln!(
            "fusion bench: {name}: backward compute {per_layer:?} per layer, {:?} per step; \
             the one-buffer all-reduce kept {cores_busy:.2} cores busy",
            per_layer * LAYERS as u32
        );
        let mut g = c.benchmark_group(format!("fusion_1000_tensors_{name}_{WORLD}ranks"));
        g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
        g.throughput(Throughput::Bytes(bytes as u64));
        let (cpu, device) = (Layer { time: per_layer, on_cpu: true }, Layer { time: per_layer, on_cpu: false });
        let modes = [
            ("per_tensor", Mode::PerTensor),
            ("fused", Mode::Fused(Pipeline::Off)),
            ("fused_pipelined", Mode::Fused(pipeline)),
            ("one_buffer", Mode::OneBuffer),
            ("bucket_views", Mode::BucketViews),
            ("backward_comm", Mode::BackwardComm),
            ("backward_compute_cpu", Mode::BackwardCompute(cpu)),
            ("backward_overlap_cpu", Mode::BackwardOverlap(cpu)),
            ("backward_compute_device", Mode::BackwardCompute(device)),
            ("backward_overlap_device", Mode::BackwardOverlap(device)),
        ];
        for (label, mode) in modes {
            let mut pair = Pair::new(group(), mode);
            g.bench_function(label, |b| b.iter_custom(|iters| pair.time(iters)));
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
