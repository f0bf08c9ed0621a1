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
//! all-reduce of the written gradients alone (buckets of `backward_bucket()`, the
//! first one smaller),
//! `backward_overlap` both, each bucket's all-reduce starting as its last
//! gradient is written ([`braid::fusion::GradientBuffer::all_reduce_as_ready`]).
//! After each transport's group (when the run is not filtered, or its filter
//! names `backward`), `backward_interleaved` times the device's compute, the
//! communication and both in turn, round after round, and prints the ratio
//! overlapped / max(compute, comm): criterion's separate minutes let the
//! machine's drift into that ratio. `--noplot backward_interleaved` runs only it.

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
/// layers compute (15.1 MB in 15 buckets) and the last bucket's all-reduce, which
/// no compute hides, is short. 1 MiB measured below 2 MiB's 1.16-1.24 on this
/// machine (results/fusion-2026-11-29.md). `FUSION_BENCH_BUCKET_KIB` overrides it.
fn backward_bucket() -> usize {
    kib_from_env("FUSION_BENCH_BUCKET_KIB").unwrap_or(1 << 20)
}
/// The backward pass's first bucket: communication starts once it is written,
/// and with compute as long as communication that wait is added to the step (a
/// 2 MiB first bucket: 1/8 of a step), hence a small one, as PyTorch DDP's.
/// `FUSION_BENCH_FIRST_BUCKET_KIB` overrides it.
fn backward_first_bucket() -> usize {
    kib_from_env("FUSION_BENCH_FIRST_BUCKET_KIB").unwrap_or(256 << 10)
}
/// A size in KiB from the environment, in bytes.
fn kib_from_env(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse::<usize>().ok()).map(|k| k << 10)
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
                let layout = GradientBuffer::with_first_bucket(&lens, backward_first_bucket(), backward_bucket());
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
    /// Iterations to run, and the mode to run them in (the same but for a
    /// layer's compute time, see [`backward_interleaved`]).
    follower: mpsc::Sender<(u64, Mode)>,
    done: mpsc::Receiver<()>,
}

impl Pair {
    fn new(mut comms: Vec<Communicator>, mode: Mode) -> Pair {
        fine_sleeps();
        let (tx, rx) = mpsc::channel::<(u64, Mode)>();
        let (done_tx, done) = mpsc::channel();
        let c1 = comms.pop().expect("rank 1");
        std::thread::spawn(move || {
            fine_sleeps();
            let mut me = Rank::new(c1, mode);
            for (iters, mode) in rx {
                me.mode = mode;
                me.iterate(iters);
                let _ = done_tx.send(());
            }
        });
        Pair { rank0: Rank::new(comms.pop().expect("rank 0"), mode), follower: tx, done }
    }

    fn time(&mut self, iters: u64) -> Duration {
        let t = Instant::now();
        self.follower.send((iters, self.rank0.mode)).expect("follower");
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
        if interleaved_wanted() {
            backward_interleaved(name, &group, device);
        }
    }
}

/// Rounds of [`backward_interleaved`].
const INTERLEAVED_ROUNDS: usize = 15;
/// Steps each mode runs per round.
const INTERLEAVED_STEPS: u64 = 20;

/// Whether this run asks for the backward pass (no filter, or one naming it).
fn interleaved_wanted() -> bool {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    filters.is_empty() || filters.iter().any(|f| f.contains("backward"))
}

/// Item 2's ratio measured so that the machine's drift cancels: criterion times
/// compute, communication and both in separate minutes, and on this shared
/// machine their ratio moved by 40% between them (results/fusion-2026-11-29.md).
/// Here each round times the three back to back (in a rotating order) over the
/// same steps, and the ratio overlapped / max(compute, comm) is taken per round.
/// The compute of a step is kept at the communication's time, the case the issue
/// sets and the hardest to hide: the median of the rounds' comm times so far
/// (first the calibration's `device` layer).
fn backward_interleaved(name: &str, group: &dyn Fn() -> Vec<Communicator>, device: Layer) {
    let mut pairs = [
        Pair::new(group(), Mode::BackwardCompute(device)),
        Pair::new(group(), Mode::BackwardComm),
        Pair::new(group(), Mode::BackwardOverlap(device)),
    ];
    for p in &mut pairs {
        p.time(2);
    }
    let per_step = |d: Duration| d.as_secs_f64() * 1e3 / INTERLEAVED_STEPS as f64;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut rounds: Vec<[f64; 3]> = Vec::with_capacity(INTERLEAVED_ROUNDS);
    for r in 0..INTERLEAVED_ROUNDS {
        if !rounds.is_empty() {
            let comm_ms = median(rounds.iter().map(|x| x[1]).collect());
            let layer = Layer { time: Duration::from_secs_f64(comm_ms / 1e3 / LAYERS as f64), on_cpu: false };
            pairs[0].rank0.mode = Mode::BackwardCompute(layer);
            pairs[2].rank0.mode = Mode::BackwardOverlap(layer);
        }
        let mut ms = [0.0; 3];
        for k in 0..3 {
            let m = (r + k) % 3;
            ms[m] = per_step(pairs[m].time(INTERLEAVED_STEPS));
        }
        rounds.push(ms);
    }
    let ratios: Vec<f64> = rounds.iter().map(|[c, k, o]| o / c.max(*k)).collect();
    let (lo, hi) = ratios.iter().fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
    eprintln!(
        "fusion bench: {name}: backward interleaved, {INTERLEAVED_ROUNDS} rounds of {INTERLEAVED_STEPS} steps: \
         compute {:.3} ms, comm {:.3} ms, overlapped {:.3} ms (medians); overlapped / max(compute, comm) \
         median {:.3} (per round {lo:.3}-{hi:.3})",
        median(rounds.iter().map(|r| r[0]).collect()),
        median(rounds.iter().map(|r| r[1]).collect()),
        median(rounds.iter().map(|r| r[2]).collect()),
        median(ratios),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
