//! Half-precision compression of f32 buckets with error feedback: a bucket of f32
//! sums or averages travels as f16 or bf16 (half the bytes on the wire), and what
//! rounding dropped from each element is added back into that element the next
//! time the same bucket is reduced, so the error does not accumulate over steps
//! (1-bit SGD's and Horovod's error feedback).
//!
//! A request carries no name, so a bucket is known again by the fingerprint of its
//! batch's layout and its place in the batch: a training step that submits the same
//! tensors in the same order and flushes at its end gets the same batches every
//! step. A bucket that was cut differently starts from no residual.

use std::collections::HashMap;
use std::str::FromStr;

use half::{bf16, f16};

use crate::types::{DType, ReduceOp};

/// How a fuser sends f32 buckets of sums and averages (`BRAID_FUSION_COMPRESSION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    /// As they are (default).
    #[default]
    None,
    /// As f16 (11-bit mantissa, range up to 65504: for values known to be small).
    F16,
    /// As bf16 (8-bit mantissa, the range of f32).
    Bf16,
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "none" | "off" | "0" => Ok(Compression::None),
            "fp16" | "f16" => Ok(Compression::F16),
            "bf16" => Ok(Compression::Bf16),
            other => Err(format!("unknown compression `{other}` (expected none, fp16 or bf16)")),
        }
    }
}

impl Compression {
    /// The dtype a bucket of `dtype` and `op` travels as, when compressed.
    pub(super) fn wire(self, dtype: DType, op: ReduceOp) -> Option<DType> {
        if dtype != DType::F32 || !matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
            return None;
        }
        match self {
            Compression::None => None,
            Compression::F16 => Some(DType::F16),
            Compression::Bf16 => Some(DType::BF16),
        }
    }
}

fn to_half(wire: DType, v: f32) -> [u8; 2] {
    if wire == DType::F16 {
        f16::from_f32(v).to_le_bytes()
    } else {
        bf16::from_f32(v).to_le_bytes()
    }
}

fn from_half(wire: DType, b: [u8; 2]) -> f32 {
    if wire == DType::F16 {
        f16::from_le_bytes(b).to_f32()
    } else {
        bf16::from_le_bytes(b).to_f32()
    }
}

/// The largest finite `wire` value.
fn half_max(wire: DType) -> f32 {
    if wire == DType::F16 {
        f16::MAX.to_f32()
    } else {
        bf16::MAX.to_f32()
    }
}

/// Append `f32s` (little-endian f32 bytes) plus `residual` to `out` as `wire`
/// halves, leaving in `residual` what rounding dropped.
///
/// A finite value past the half range travels as the largest half of its sign and
/// the rest waits in the residual: rounded, it would become an infinity, and the
/// residual `v - inf` a NaN that no later step could leave. An infinity or NaN (a
/// loss-scaling step that overflowed) travels as itself, as it would uncompressed,
/// and leaves the residual as it was, so the next steps are finite again.
pub(super) fn compress(wire: DType, f32s: &[u8], residual: &mut [f32], out: &mut Vec<u8>) {
    let max = half_max(wire);
    for (x, r) in f32s.chunks_exact(4).zip(residual.iter_mut()) {
        let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        if !x.is_finite() {
            out.extend_from_slice(&to_half(wire, x));
            continue;
        }
        // Finite values summing past the f32 range stay finite (only there is anything lost).
        let v = (x + *r).clamp(-f32::MAX, f32::MAX);
        let h = to_half(wire, v.clamp(-max, max));
        // `h` is `v` rounded, or the largest half of its sign: the difference is finite.
        *r = v - from_half(wire, h);
        out.extend_from_slice(&h);
    }
}

/// Widen `halves` (`wire` values) into `f32s` (little-endian f32 bytes).
pub(super) fn decompress(wire: DType, halves: &[u8], f32s: &mut [u8]) {
    for (h, x) in halves.chunks_exact(2).zip(f32s.chunks_exact_mut(4)) {
        x.copy_from_slice(&from_half(wire, [h[0], h[1]]).to_le_bytes());
    }
}

/// Residuals of the buckets seen lately, by (batch fingerprint, bucket index),
/// bounded in total size.
#[derive(Default)]
pub(super) struct Residuals {
    map: HashMap<(i64, usize), Vec<f32>>,
    elems: usize,
}

/// At most this many residual elements are kept (256 MiB); past it they are dropped.
const MAX_RESIDUAL_ELEMS: usize = 64 << 20;

impl Residuals {
    /// The residual of a bucket of `len` elements (zeros if unknown or of another size).
    pub(super) fn take(&mut self, key: (i64, usize), len: usize) -> Vec<f32> {
        match self.map.remove(&key) {
            Some(v) if v.len() == len => {
                self.elems -= v.len();
                v
            }
            Some(v) => {
                self.elems -= v.len();
                vec![0.0; len]
            }
            None => vec![0.0; len],
        }
    }

    /// Keep `v` as the residual of `key`.
    pub(super) fn put(&mut self, key: (i64, usize), v: Vec<f32>) {
        if self.elems + v.len() > MAX_RESIDUAL_ELEMS {
            self.map.clear();
            self.elems = 0;
        }
        self.elems += v.len();
        self.map.insert(key, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn parse_and_which_buckets_compress() {
        assert_eq!("bf16".parse::<Compression>().unwrap(), Compression::Bf16);
        assert_eq!("FP16".parse::<Compression>().unwrap(), Compression::F16);
        assert_eq!("none".parse::<Compression>().unwrap(), Compression::None);
        assert!("fp8".parse::<Compression>().is_err());
        assert_eq!(Compression::F16.wire(DType::F32, ReduceOp::Sum), Some(DType::F16));
        assert_eq!(Compression::Bf16.wire(DType::F32, ReduceOp::Avg), Some(DType::BF16));
        assert_eq!(Compression::F16.wire(DType::F32, ReduceOp::Max), None);
        assert_eq!(Compression::F16.wire(DType::F64, ReduceOp::Sum), None);
        assert_eq!(Compression::None.wire(DType::F32, ReduceOp::Sum), None);
    }

    #[test]
    fn error_feedback_keeps_the_running_sum_exact_to_rounding() {
        // 0.1 + 1e-4 is not a bf16 value; without feedback each step loses the same
        // part and the running sum drifts by it times the steps.
        for wire in [DType::F16, DType::BF16] {
            let x = [0.1001f32, -3.3333, 1e-3];
            let mut residual = vec![0.0; 3];
            let (mut with, mut without) = ([0.0f64; 3], [0.0f64; 3]);
            for _ in 0..1000 {
                let mut out = Vec::new();
                compress(wire, &bytes(&x), &mut residual, &mut out);
                let mut back = vec![0u8; 12];
                decompress(wire, &out, &mut back);
                let mut plain = Vec::new();
                compress(wire, &bytes(&x), &mut [0.0; 3], &mut plain);
                let mut plain_back = vec![0u8; 12];
                decompress(wire, &plain, &mut plain_back);
                for i in 0..3 {
                    with[i] += f64::from(f32::from_le_bytes(back[4 * i..4 * i + 4].try_into().unwrap()));
                    without[i] += f64::from(f32::from_le_bytes(plain_back[4 * i..4 * i + 4].try_into().unwrap()));
                }
            }
            for i in 0..3 {
                let exact = 1000.0 * f64::from(x[i]);
                // With feedback: off by at most one rounding of one value.
                assert!((with[i] - exact).abs() <= 0.02 * f64::from(x[i]).abs().max(1e-3), "{wire:?} {i}: {}", with[i]);
                // Without it, bf16 drifts far more on these (the test would not show
                // feedback working if it did not).
                if wire == DType::BF16 {
                    assert!((without[i] - exact).abs() > 10.0 * (with[i] - exact).abs(), "{i}");
                }
            }
        }
    }

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(|x| f32::from_le_bytes(x.try_into().unwrap())).collect()
    }

    /// One step: what travels for `x` (widened back) and the residual after it.
    fn step(wire: DType, x: &[f32], residual: &mut [f32]) -> Vec<f32> {
        let mut out = Vec::new();
        compress(wire, &bytes(x), residual, &mut out);
        let mut back = vec![0u8; 4 * x.len()];
        decompress(wire, &out, &mut back);
        floats(&back)
    }

    #[test]
    fn overflow_saturates_and_infinities_and_nans_pass_without_entering_the_residual() {
        for wire in [DType::F16, DType::BF16] {
            let max = half_max(wire);
            // Past the half range (f16), and an f32 value past bf16's largest.
            let big = if wire == DType::F16 { 70_000.0 } else { f32::MAX };
            let mut residual = vec![0.0f32; 5];
            // A loss-scaling step that overflowed: one finite overflow, both
            // infinities and a NaN.
            let sent = step(wire, &[big, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0], &mut residual);
            assert_eq!(sent[0], max, "{wire:?}: a finite overflow saturates");
            assert_eq!(sent[1], f32::INFINITY, "{wire:?}");
            assert_eq!(sent[2], f32::NEG_INFINITY, "{wire:?}");
            assert!(sent[3].is_nan(), "{wire:?}");
            assert_eq!(sent[4], 1.0, "{wire:?}");
            assert!(residual.iter().all(|r| r.is_finite()), "{wire:?}: {residual:?}");
            assert_eq!(residual[0], big - max, "{wire:?}: the rest of the overflow is carried");
            assert_eq!(&residual[1..], &[0.0; 4], "{wire:?}: non-finite values leave the residual alone");
            // The next steps are finite and correct: the carried remainder comes out
            // with small gradients, and the sum over the steps is the sum sent in.
            let mut total = f64::from(sent[0]);
            for s in 0..3 {
                let sent = step(wire, &[1.0, 2.0, -2.0, 0.5, 1.0], &mut residual);
                assert!(sent.iter().all(|v| v.is_finite()), "{wire:?} step {s}: {sent:?}");
                assert_eq!(&sent[1..], &[2.0, -2.0, 0.5, 1.0], "{wire:?} step {s}");
                assert!(residual.iter().all(|r| r.is_finite()), "{wire:?} step {s}: {residual:?}");
                total += f64::from(sent[0]);
            }
            let want = f64::from(big) + 3.0;
            let rel = (total + f64::from(residual[0]) - want).abs() / want;
            assert!(rel < 1e-6, "{wire:?}: sent {total} + residual {} for {want}", residual[0]);
            if wire == DType::F16 {
                // 65504, then 4496 + 1 rounded to 4496, then the 1 left over with 1:
                // 70003 in all, nothing left behind.
                assert_eq!((total, residual[0]), (70_003.0, 0.0));
            }
        }
    }

    #[test]
    fn residuals_are_found_again_by_key_and_size() {
        let mut r = Residuals::default();
        assert_eq!(r.take((1, 0), 3), vec![0.0; 3]);
        r.put((1, 0), vec![1.0, 2.0, 3.0]);
        assert_eq!(r.take((1, 0), 3), vec![1.0, 2.0, 3.0]);
        r.put((1, 0), vec![1.0; 3]);
        assert_eq!(r.take((1, 0), 4), vec![0.0; 4], "another size starts over");
        assert_eq!(r.elems, 0);
    }
}
