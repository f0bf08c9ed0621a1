//! x86-64 kernels: the generic loops of `kernels.rs` compiled with AVX2 enabled, and
//! fused kernels for f16 (F16C) and bf16 (AVX2 integer ops) that widen 8 lanes,
//! combine them in f32 and round once.
//!
//! The fused kernels use explicit vector operators ([`V8`]) because LLVM does not
//! vectorise the select-based scalar min/max across the conversions. They implement
//! exactly the scalar definitions in `kernels.rs` (canonical NaN, -0 < +0); the
//! tests check every path against the portable one bit for bit.
//!
//! Every function here is `unsafe` and `#[target_feature]`: it may only run on a CPU
//! with the feature. [`table`] hands them out only after detecting it.

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::kernels::{map2, map3, ElemOp, Max, Min, Prod, Sum};
use super::table::{generic_ops, Ops, Table};

/// The AVX2 table, or `None` when the CPU lacks AVX2 or F16C. (Every AVX2 CPU
/// shipped has F16C; requiring both keeps one table and one name.)
pub(super) fn table() -> Option<Table> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
        return None;
    }
    let mut t = Table::portable();
    t.name = "avx2+f16c";
    t.f32 = generic_ops!(avx2_2, avx2_3, f32);
    t.f64 = generic_ops!(avx2_2, avx2_3, f64);
    t.bf16 = Ops::new(
        [half2::<Bf16, Sum>, half2::<Bf16, Prod>, half2::<Bf16, Min>, half2::<Bf16, Max>],
        [half3::<Bf16, Sum>, half3::<Bf16, Prod>, half3::<Bf16, Min>, half3::<Bf16, Max>],
    );
    t.i8 = generic_ops!(avx2_2, avx2_3, i8);
    t.u8 = generic_ops!(avx2_2, avx2_3, u8);
    t.i32 = generic_ops!(avx2_2, avx2_3, i32);
    t.i64 = generic_ops!(avx2_2, avx2_3, i64);
    t.f16 = Ops::new(
        [half2::<F16, Sum>, half2::<F16, Prod>, half2::<F16, Min>, half2::<F16, Max>],
        [half3::<F16, Sum>, half3::<F16, Prod>, half3::<F16, Min>, half3::<F16, Max>],
    );
    Some(t)
}

/// [`map2`] compiled for AVX2 (LLVM widens the same loop to 256-bit vectors).
#[target_feature(enable = "avx2")]
unsafe fn avx2_2<T: Copy, O: ElemOp<T>>(acc: &mut [T], inc: &[T]) {
    map2::<T, O>(acc, inc)
}

/// [`map3`] compiled for AVX2.
#[target_feature(enable = "avx2")]
unsafe fn avx2_3<T: Copy, O: ElemOp<T>>(out: &mut [T], a: &[T], b: &[T]) {
    map3::<T, O>(out, a, b)
}

/// An element type stored as 16 bits and computed in f32, 16 lanes at a time.
///
/// The two f32 vectors may hold the lanes in any fixed order, as long as `store16`
/// undoes what `load16` did: the operators are lane-wise.
trait Half16 {
    /// The element type.
    type Elem;
    /// Widen 16 elements at `p` (unaligned) to f32.
    unsafe fn load16(p: *const u16) -> [__m256; 2];
    /// Round 16 f32 to nearest-even and store them at `p` (unaligned). Every NaN
    /// lane is the canonical NaN (each [`V8`] operator ensures that).
    unsafe fn store16(p: *mut u16, v: [__m256; 2]);
}

/// f16 through F16C.
struct F16;
/// bf16 through AVX2 integer ops.
struct Bf16;

impl Half16 for F16 {
    type Elem = f16;
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> [__m256; 2] {
        // SAFETY: caller guarantees 16 readable u16 and the avx2+f16c features.
        unsafe { [_mm256_cvtph_ps(_mm_loadu_si128(p.cast())), _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast()))] }
    }
    #[inline(always)]
    unsafe fn store16(p: *mut u16, v: [__m256; 2]) {
        // SAFETY: caller guarantees 16 writable u16 and the avx2+f16c features.
        unsafe {
            _mm_storeu_si128(p.cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v[0]));
            _mm_storeu_si128(p.add(8).cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v[1]));
        }
    }
}

/// Round the f32 lanes of `v` to bf16 (nearest, ties to even) in the low 16 bits of
/// each 32-bit lane, like `kernels::narrow_bf16` for every non-NaN input. The
/// canonical NaN 0x7FC0_0000 rounds to 0x7FC0, the canonical bf16 NaN, so no NaN
/// case is needed here.
#[inline(always)]
unsafe fn round_bf16(v: __m256) -> __m256i {
    // SAFETY: the callers run with avx2 enabled.
    unsafe {
        let b = _mm256_castps_si256(v);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
        let biased = _mm256_add_epi32(_mm256_add_epi32(b, lsb), _mm256_set1_epi32(0x7FFF));
        _mm256_srli_epi32::<16>(biased)
    }
}

impl Half16 for Bf16 {
    type Elem = bf16;
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> [__m256; 2] {
        // Interleaving with zeros puts each bf16 in the top half of a 32-bit lane,
        // which is its exact f32 value. The unpacks work within 128-bit halves, so
        // the first vector holds elements 0-3 and 8-11, the second 4-7 and 12-15.
        // SAFETY: caller guarantees 16 readable u16 and the avx2 feature.
        unsafe {
            let x = _mm256_loadu_si256(p.cast());
            let z = _mm256_setzero_si256();
            [_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x))]
        }
    }
    #[inline(always)]
    unsafe fn store16(p: *mut u16, v: [__m256; 2]) {
        // `packus` also works within 128-bit halves, so it restores the order the
        // unpacks produced; the rounded values are < 2^16 and pack unchanged.
        // SAFETY: caller guarantees 16 writable u16 and the avx2 feature.
        unsafe { _mm256_storeu_si256(p.cast(), _mm256_packus_epi32(round_bf16(v[0]), round_bf16(v[1]))) }
    }
}

/// A reduction operator on 8 f32 lanes, matching the scalar [`ElemOp`] exactly.
trait V8 {
    /// `a ⊕ b` lane by lane.
    unsafe fn v8(a: __m256, b: __m256) -> __m256;
}

/// Replace NaN lanes by the canonical quiet NaN.
#[inline(always)]
unsafe fn canon(r: __m256) -> __m256 {
    // SAFETY: the callers run with avx2 enabled.
    unsafe { _mm256_blendv_ps(r, _mm256_set1_ps(f32::NAN), _mm256_cmp_ps::<_CMP_UNORD_Q>(r, r)) }
}

impl V8 for Sum {
    #[inline(always)]
    unsafe fn v8(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the callers run with avx2 enabled.
        unsafe { canon(_mm256_add_ps(a, b)) }
    }
}

impl V8 for Prod {
    #[inline(always)]
    unsafe fn v8(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the callers run with avx2 enabled.
        unsafe { canon(_mm256_mul_ps(a, b)) }
    }
}

impl V8 for Min {
    #[inline(always)]
    unsafe fn v8(a: __m256, b: __m256) -> __m256 {
        // `min_ps` is "a < b ? a : b"; equal lanes take a|b (-0 wins); NaN lanes
        // become canonical.
        // SAFETY: the callers run with avx2 enabled.
        unsafe {
            let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b);
            let m = _mm256_blendv_ps(_mm256_min_ps(a, b), _mm256_or_ps(a, b), eq);
            _mm256_blendv_ps(m, _mm256_set1_ps(f32::NAN), _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b))
        }
    }
}

impl V8 for Max {
    #[inline(always)]
    unsafe fn v8(a: __m256, b: __m256) -> __m256 {
        // `max_ps` is "a > b ? a : b"; equal lanes take a&b (+0 wins).
        // SAFETY: the callers run with avx2 enabled.
        unsafe {
            let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b);
            let m = _mm256_blendv_ps(_mm256_max_ps(a, b), _mm256_and_ps(a, b), eq);
            _mm256_blendv_ps(m, _mm256_set1_ps(f32::NAN), _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b))
        }
    }
}

/// `acc = acc ⊕ inc` on a 16-bit float type.
#[target_feature(enable = "avx2,f16c")]
unsafe fn half2<H: Half16, O: V8>(acc: &mut [H::Elem], inc: &[H::Elem]) {
    debug_assert_eq!(acc.len(), inc.len());
    let out = acc.as_mut_ptr().cast::<u16>();
    // SAFETY: lengths are equal; `out` is read and written through the same pointer,
    // both derived from the one `&mut`, each lane group read before it is written.
    unsafe { half_core::<H, O>(out, out, inc.as_ptr().cast(), acc.len()) }
}

/// `out = a ⊕ b` on a 16-bit float type.
#[target_feature(enable = "avx2,f16c")]
unsafe fn half3<H: Half16, O: V8>(out: &mut [H::Elem], a: &[H::Elem], b: &[H::Elem]) {
    debug_assert!(out.len() == a.len() && a.len() == b.len());
    // SAFETY: lengths are equal and `out` cannot overlap `a` or `b` (borrow rules).
    unsafe { half_core::<H, O>(out.as_mut_ptr().cast(), a.as_ptr().cast(), b.as_ptr().cast(), out.len()) }
}

/// `out[i] = a[i] ⊕ b[i]` for `n` 16-bit values; `out` may equal `a` (but not
/// overlap otherwise). The tail goes through padded stack arrays so it uses the same
/// vector code as the body.
#[inline(always)]
unsafe fn half_core<H: Half16, O: V8>(out: *mut u16, a: *const u16, b: *const u16, n: usize) {
    #[inline(always)]
    unsafe fn step<H: Half16, O: V8>(out: *mut u16, a: *const u16, b: *const u16) {
        // SAFETY: forwarded from `half_core`.
        unsafe {
            let (x, y) = (H::load16(a), H::load16(b));
            H::store16(out, [O::v8(x[0], y[0]), O::v8(x[1], y[1])]);
        }
    }
    let mut i = 0;
    // SAFETY: every access is within `0..n` of each pointer (caller's contract);
    // the callers enable avx2 and f16c.
    unsafe {
        while i + 16 <= n {
            step::<H, O>(out.add(i), a.add(i), b.add(i));
            i += 16;
        }
        if i < n {
            let k = n - i;
            let mut x = [0u16; 16];
            let mut y = [0u16; 16];
            std::ptr::copy_nonoverlapping(a.add(i), x.as_mut_ptr(), k);
            std::ptr::copy_nonoverlapping(b.add(i), y.as_mut_ptr(), k);
            let mut r = [0u16; 16];
            step::<H, O>(r.as_mut_ptr(), x.as_ptr(), y.as_ptr());
            std::ptr::copy_nonoverlapping(r.as_ptr(), out.add(i), k);
        }
    }
}
