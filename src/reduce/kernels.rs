//! Portable element operations and the loop shapes every kernel is built from.
//!
//! Each operator is a zero-sized type implementing [`ElemOp`] for every element
//! type. The loops ([`map2`], [`map3`]) are `#[inline(always)]` so that the same
//! source is compiled twice: once at the baseline (SSE2 on x86-64) and once inside
//! an `avx2` function in `x86.rs`. Both copies compute every element with the same
//! scalar definition, which is what keeps the two paths bit-for-bit identical.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Elements per unrolled step: 32 lanes fill at least one AVX2 register for every
/// type (i8: one register, f64: eight), giving LLVM a fixed trip count to vectorise.
const W: usize = 32;

/// Elementwise sum (integers wrap; floats: any NaN result is the canonical NaN;
/// bf16 through f32, rounded once).
pub(super) struct Sum;
/// Elementwise product (integers wrap; floats as for [`Sum`]).
pub(super) struct Prod;
/// Elementwise minimum (floats: NaN wins, -0 < +0).
pub(super) struct Min;
/// Elementwise maximum (floats: NaN wins, -0 < +0).
pub(super) struct Max;

/// One reduction operator on one element type: `apply(a, b)` is `a ⊕ b`.
///
/// Every implementation is commutative bit for bit (including NaN and signed-zero
/// cases), so ranks that combine the same two values in either order agree.
pub(super) trait ElemOp<T> {
    /// `a ⊕ b`.
    fn apply(a: T, b: T) -> T;
}

macro_rules! int_ops {
    ($($t:ty),*) => {$(
        impl ElemOp<$t> for Sum {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.wrapping_add(b) }
        }
        impl ElemOp<$t> for Prod {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.wrapping_mul(b) }
        }
        impl ElemOp<$t> for Min {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { if a < b { a } else { b } }
        }
        impl ElemOp<$t> for Max {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { if a > b { a } else { b } }
        }
    )*};
}
int_ops!(i8, u8, i32, i64);

// Sum and product turn any NaN result into the canonical quiet NaN: LLVM treats
// `fadd`/`fmul` as commutative and may order operands differently in each compiled
// loop, and x86 returns the payload of the first NaN operand, so otherwise the
// payload of `NaN + NaN` would depend on the code path (in-place vs into, AVX2 vs
// baseline) and ranks could disagree bitwise.
//
// Float min/max are written as selects (no branches on data) so they vectorise:
// `min_ps`-style "pick b unless a < b", then fix the two cases where that depends
// on operand order: equal values (only ±0 differ in bits; OR of the bits gives -0
// for min, AND gives +0 for max) and NaN (replaced by the canonical quiet NaN,
// whatever the payloads were).
macro_rules! float_ops {
    ($($t:ty),*) => {$(
        impl ElemOp<$t> for Sum {
            #[inline(always)]
            #[allow(clippy::eq_op)] // x != x is the branch-free NaN test
            fn apply(a: $t, b: $t) -> $t { let r = a + b; if r != r { <$t>::NAN } else { r } }
        }
        impl ElemOp<$t> for Prod {
            #[inline(always)]
            #[allow(clippy::eq_op)]
            fn apply(a: $t, b: $t) -> $t { let r = a * b; if r != r { <$t>::NAN } else { r } }
        }
        impl ElemOp<$t> for Min {
            #[inline(always)]
            #[allow(clippy::eq_op)]
            fn apply(a: $t, b: $t) -> $t {
                let m = if a < b { a } else { b };
                let m = if a == b { <$t>::from_bits(a.to_bits() | b.to_bits()) } else { m };
                if a != a || b != b { <$t>::NAN } else { m }
            }
        }
        impl ElemOp<$t> for Max {
            #[inline(always)]
            #[allow(clippy::eq_op)]
            fn apply(a: $t, b: $t) -> $t {
                let m = if a > b { a } else { b };
                let m = if a == b { <$t>::from_bits(a.to_bits() & b.to_bits()) } else { m };
                if a != a || b != b { <$t>::NAN } else { m }
            }
        }
    )*};
}
float_ops!(f32, f64);

/// bf16 → f32 is exact: the bf16 bits are the top half of the f32.
#[inline(always)]
pub(super) fn widen_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 → bf16 with round-to-nearest-even, as integer ops so it vectorises. NaNs keep
/// their top payload bits and are made quiet, exactly like `half::bf16::from_f32`.
#[inline(always)]
#[allow(clippy::eq_op)]
pub(super) fn narrow_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    // Adding 0x7FFF plus the kept LSB rounds ties to even; a carry into the
    // exponent is the correct rounding up (to the next binade or to infinity).
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x0040;
    (if x != x { nan } else { rounded }) as u16
}

/// bf16 operators: widen both operands, apply the f32 operator, round once.
impl<O: ElemOp<f32>> ElemOp<bf16> for O {
    #[inline(always)]
    fn apply(a: bf16, b: bf16) -> bf16 {
        bf16::from_bits(narrow_bf16(O::apply(widen_bf16(a.to_bits()), widen_bf16(b.to_bits()))))
    }
}

/// `acc[i] = acc[i] ⊕ inc[i]`. Fixed-width chunks, then the remainder.
#[inline(always)]
pub(super) fn map2<T: Copy, O: ElemOp<T>>(acc: &mut [T], inc: &[T]) {
    debug_assert_eq!(acc.len(), inc.len());
    let mut ca = acc.chunks_exact_mut(W);
    let mut ci = inc.chunks_exact(W);
    for (x, y) in (&mut ca).zip(&mut ci) {
        for (x, y) in x.iter_mut().zip(y) {
            *x = O::apply(*x, *y);
        }
    }
    for (x, y) in ca.into_remainder().iter_mut().zip(ci.remainder()) {
        *x = O::apply(*x, *y);
    }
}

/// `out[i] = a[i] ⊕ b[i]`. Same shape as [`map2`], so results match it bit for bit.
#[inline(always)]
pub(super) fn map3<T: Copy, O: ElemOp<T>>(out: &mut [T], a: &[T], b: &[T]) {
    debug_assert!(out.len() == a.len() && a.len() == b.len());
    let mut co = out.chunks_exact_mut(W);
    let mut ca = a.chunks_exact(W);
    let mut cb = b.chunks_exact(W);
    for ((o, x), y) in (&mut co).zip(&mut ca).zip(&mut cb) {
        for ((o, x), y) in o.iter_mut().zip(x).zip(y) {
            *o = O::apply(*x, *y);
        }
    }
    for ((o, x), y) in co.into_remainder().iter_mut().zip(ca.remainder()).zip(cb.remainder()) {
        *o = O::apply(*x, *y);
    }
}

/// Baseline-ISA instantiation of [`map2`].
pub(super) fn portable2<T: Copy, O: ElemOp<T>>(acc: &mut [T], inc: &[T]) {
    map2::<T, O>(acc, inc)
}

/// Baseline-ISA instantiation of [`map3`].
pub(super) fn portable3<T: Copy, O: ElemOp<T>>(out: &mut [T], a: &[T], b: &[T]) {
    map3::<T, O>(out, a, b)
}

/// f16 block size for the portable path: two f32 staging arrays of 1 KiB each.
const F16_BLOCK: usize = 256;

/// Portable f16: widen a block through `half`'s slice conversions (which use F16C
/// when the running CPU has it, and a software path otherwise), reduce in f32, round
/// once on the way back. Per-element `half` conversions would detect the CPU feature
/// per element, which is several times slower.
pub(super) fn f16_portable2<O: ElemOp<f32>>(acc: &mut [f16], inc: &[f16]) {
    let mut x = [0f32; F16_BLOCK];
    let mut y = [0f32; F16_BLOCK];
    for (ca, ci) in acc.chunks_mut(F16_BLOCK).zip(inc.chunks(F16_BLOCK)) {
        let n = ca.len();
        ca.convert_to_f32_slice(&mut x[..n]);
        ci.convert_to_f32_slice(&mut y[..n]);
        map2::<f32, O>(&mut x[..n], &y[..n]);
        ca.convert_from_f32_slice(&x[..n]);
    }
}

/// Three-operand form of [`f16_portable2`].
pub(super) fn f16_portable3<O: ElemOp<f32>>(out: &mut [f16], a: &[f16], b: &[f16]) {
    let mut x = [0f32; F16_BLOCK];
    let mut y = [0f32; F16_BLOCK];
    for ((co, ca), cb) in out.chunks_mut(F16_BLOCK).zip(a.chunks(F16_BLOCK)).zip(b.chunks(F16_BLOCK)) {
        let n = co.len();
        ca.convert_to_f32_slice(&mut x[..n]);
        cb.convert_to_f32_slice(&mut y[..n]);
        map2::<f32, O>(&mut x[..n], &y[..n]);
        co.convert_from_f32_slice(&x[..n]);
    }
}
