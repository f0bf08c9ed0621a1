//! The handwritten-digits model shared by `examples/train_digits.rs` and
//! `tests/train_digits.rs`: the data set (8x8 images, 64 pixel counts 0..16, then
//! the digit), an 80/20 split fixed by seed, a 64-32-10 MLP (ReLU, softmax
//! cross-entropy) whose step returns gradient *sums* as the strategies expect, and
//! the training loop every strategy runs.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};

use braid::strategy::{Gradients, Replica, Strategy, Tensors};
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis};

pub const FEATURES: usize = 64;
pub const HIDDEN: usize = 32;
pub const CLASSES: usize = 10;

/// Examples: one row of scaled pixels each, and the digits.
pub struct Data {
    pub x: Array2<f32>,
    pub y: Vec<usize>,
}

impl Data {
    pub fn len(&self) -> usize {
        self.y.len()
    }
}

/// Where the data set sits in the repository.
pub fn default_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/digits.csv.gz")
}

/// Load the gzipped CSV: 64 pixel counts (0..16, scaled to 0..1) then the label.
pub fn load(path: &Path) -> Result<Data, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file).read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    let (mut pixels, mut y) = (Vec::new(), Vec::new());
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != FEATURES + 1 {
            return Err(format!("line {}: {} fields, expected {}", n + 1, fields.len(), FEATURES + 1));
        }
        for f in &fields[..FEATURES] {
            let v: f32 = f.trim().parse().map_err(|_| format!("line {}: `{f}` is not a number", n + 1))?;
            pixels.push(v / 16.0);
        }
        let label: usize = fields[FEATURES].trim().parse().map_err(|_| format!("line {}: bad label", n + 1))?;
        if label >= CLASSES {
            return Err(format!("line {}: label {label} is not a digit", n + 1));
        }
        y.push(label);
    }
    let x = Array2::from_shape_vec((y.len(), FEATURES), pixels).map_err(|e| e.to_string())?;
    Ok(Data { x, y })
}

/// SplitMix64: a seeded, version-stable stream for shuffles and initial weights.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next_u64() % (i as u64 + 1)) as usize);
        }
    }
}

fn rows(d: &Data, idx: &[usize]) -> Data {
    Data { x: d.x.select(Axis(0), idx), y: idx.iter().map(|&i| d.y[i]).collect() }
}

/// An 80/20 train/test split, shuffled by `seed`.
pub fn split(d: &Data, seed: u64) -> (Data, Data) {
    let mut order: Vec<usize> = (0..d.len()).collect();
    Rng::new(seed).shuffle(&mut order);
    let cut = d.len() * 4 / 5;
    (rows(d, &order[..cut]), rows(d, &order[cut..]))
}

/// Initial variables `[w1 (64x32), b1, w2 (32x10), b2]`: He-uniform weights, zero biases.
pub fn init(seed: u64) -> Tensors {
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut he = |fan_in: usize, n: usize| {
        let a = (6.0 / fan_in as f32).sqrt();
        (0..n).map(|_| (rng.unit() * 2.0 - 1.0) * a).collect::<Vec<f32>>()
    };
    vec![he(FEATURES, FEATURES * HIDDEN), vec![0.0; HIDDEN], he(HIDDEN, HIDDEN * CLASSES), vec![0.0; CLASSES]]
}

fn views(vars: &Tensors) -> (ArrayView2<'_, f32>, ArrayView1<'_, f32>, ArrayView2<'_, f32>, ArrayView1<'_, f32>) {
    (
        ArrayView2::from_shape((FEATURES, HIDDEN), &vars[0]).expect("w1 shape"),
        ArrayView1::from(&vars[1][..]),
        ArrayView2::from_shape((HIDDEN, CLASSES), &vars[2]).expect("w2 shape"),
        ArrayView1::from(&vars[3][..]),
    )
}

/// Hidden activations and class probabilities of the rows of `x`.
fn forward(vars: &Tensors, x: ArrayView2<'_, f32>) -> (Array2<f32>, Array2<f32>) {
    let (w1, b1, w2, b2) = views(vars);
    let h = (x.dot(&w1) + b1).mapv(|v| v.max(0.0));
    let mut p = h.dot(&w2) + b2;
    for mut row in p.rows_mut() {
        let m = row.fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        row.mapv_inplace(|v| (v - m).exp());
        let s = row.sum();
        row.mapv_inplace(|v| v / s);
    }
    (h, p)
}

/// Sums over the examples `idx` of `d` of the cross-entropy and its gradient.
pub fn gradients(vars: &Tensors, d: &Data, idx: &[usize]) -> Gradients {
    if idx.is_empty() {
        return Gradients { grads: vars.iter().map(|t| vec![0.0; t.len()]).collect(), loss: 0.0 };
    }
    let batch = rows(d, idx);
    let (h, p) = forward(vars, batch.x.view());
    let (_, _, w2, _) = views(vars);
    let mut loss = 0.0f64;
    let mut dlogits = p;
    for (mut row, &label) in dlogits.rows_mut().into_iter().zip(&batch.y) {
        loss -= f64::from(row[label].max(1e-12).ln());
        row[label] -= 1.0;
    }
    let dw2 = h.t().dot(&dlogits);
    let db2: Array1<f32> = dlogits.sum_axis(Axis(0));
    let mut dh = dlogits.dot(&w2.t());
    dh.zip_mut_with(&h, |g, &a| {
        if a <= 0.0 {
            *g = 0.0
        }
    });
    let dw1 = batch.x.t().dot(&dh);
    let db1 = dh.sum_axis(Axis(0));
    let flat = |a: Array2<f32>| a.as_standard_layout().iter().copied().collect::<Vec<f32>>();
    Gradients { grads: vec![flat(dw1), db1.to_vec(), flat(dw2), db2.to_vec()], loss }
}

/// Share of the test set classified right.
pub fn accuracy(vars: &Tensors, d: &Data) -> f64 {
    let (_, p) = forward(vars, d.x.view());
    let right = p
        .rows()
        .into_iter()
        .zip(&d.y)
        .filter(|(row, &label)| {
            row.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 == label
        })
        .count();
    right as f64 / d.len().max(1) as f64
}

/// Plain SGD with learning rate `lr`.
pub fn sgd(lr: f32) -> impl Fn(&mut Tensors, &Tensors) + Sync {
    move |vars: &mut Tensors, grads: &Tensors| {
        for (v, g) in vars.iter_mut().flatten().zip(grads.iter().flatten()) {
            *v -= lr * g;
        }
    }
}

/// What one epoch ended with.
#[derive(Clone, Copy, Debug)]
pub struct Epoch {
    pub epoch: u64,
    pub loss: f64,
    pub accuracy: f64,
}

/// How to train: epochs `from..epochs` (0-based) in global batches.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub from: u64,
    pub epochs: u64,
    pub global_batch: usize,
    pub seed: u64,
    pub lr: f32,
}

/// Train as `plan` says, the training set reshuffled each epoch by `(seed,
/// epoch)` so that a resumed run sees the batches an uninterrupted one would.
/// `after` runs after each epoch (checkpoints, printing); an error from it stops
/// training.
pub fn train(
    s: &mut dyn Strategy,
    data: (&Data, &Data),
    plan: Schedule,
    mut after: impl FnMut(&mut dyn Strategy, Epoch) -> Result<(), String>,
) -> Result<Epoch, String> {
    let (train, test) = data;
    let apply = sgd(plan.lr);
    let mut last = Epoch { epoch: plan.from, loss: f64::NAN, accuracy: accuracy(s.variables(), test) };
    for epoch in plan.from..plan.epochs {
        let mut order: Vec<usize> = (0..train.len()).collect();
        Rng::new(plan.seed.wrapping_mul(1_000_003).wrapping_add(epoch)).shuffle(&mut order);
        let (mut loss_sum, mut seen) = (0.0, 0usize);
        for batch in order.chunks(plan.global_batch.max(1)) {
            let step = |r: &Replica<'_>| gradients(r.vars, train, &batch[r.batch.clone()]);
            let loss = s.step(batch.len(), &step, &apply).map_err(|e| e.to_string())?;
            loss_sum += loss * batch.len() as f64;
            seen += batch.len();
        }
        s.sync().map_err(|e| e.to_string())?;
        last = Epoch { epoch: epoch + 1, loss: loss_sum / seen.max(1) as f64, accuracy: accuracy(s.variables(), test) };
        after(s, last)?;
    }
    Ok(last)
}
