//! Reduction kernels: `acc ⊕= inc`, `out = a ⊕ b` and the final division of `Avg`,
//! on raw byte buffers of any [`DType`].
//!
//! Buffers come from users (often through the C ABI) and may be unaligned for their
//! element type. Aligned buffers are reinterpreted in place; unaligned ones are
//! reduced through small aligned stack blocks, so no path ever forms a misaligned
//! reference.
//!
//! The kernels are chosen once per process: AVX2 builds of the same loops (and fused
//! f16/bf16 kernels) when the CPU has AVX2 and F16C, the baseline build otherwise. Every
//! path computes each element with the same scalar definition (see `kernels.rs`), so
//! results are bitwise identical across paths, between [`reduce_inplace`] and
//! [`reduce_into`], and across ranks:
//!
//! - integer `Sum`/`Prod` wrap;
//! - a float result that is NaN is always the canonical quiet NaN of its type (NaN
//!   payloads are not propagated: which payload survives would depend on codegen);
//! - float `Min`/`Max` return NaN if either operand is NaN and treat -0 as smaller
//!   than +0, so they never depend on operand order;
//! - f16/bf16 are widened to f32, combined, and rounded once (to nearest, ties to even).

use std::sync::OnceLock;

use bytemuck::Pod;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};

mod kernels;
mod table;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use table::{Table, K2, K3};

/// `acc = acc ⊕ inc`, elementwise, with `op.combiner()` semantics (`Avg` reduces as
/// `Sum`; call [`finalize`] once at the end).
///
/// `acc` and `inc` must have equal lengths, a multiple of `dtype.size()`; otherwise
/// [`Error::InvalidArgument`]. Either may be unaligned.
pub fn reduce_inplace(dtype: DType, op: ReduceOp, acc: &mut [u8], inc: &[u8]) -> Result<()> {
    check_lengths(dtype, &[acc.len(), inc.len()])?;
    inplace_with(table(), dtype, op, acc, inc);
    Ok(())
}

/// `out = a ⊕ b`, elementwise, with `op.combiner()` semantics. Bitwise identical to
/// copying `a` into `out` and calling [`reduce_inplace`]`(out, b)`.
///
/// All three lengths must be equal and a multiple of `dtype.size()`; otherwise
/// [`Error::InvalidArgument`]. Any of them may be unaligned.
pub fn reduce_into(dtype: DType, op: ReduceOp, out: &mut [u8], a: &[u8], b: &[u8]) -> Result<()> {
    check_lengths(dtype, &[out.len(), a.len(), b.len()])?;
    into_with(table(), dtype, op, out, a, b);
    Ok(())
}

/// Finish a reduction. For `Avg` divide every element by `world`: floats compute
/// `x / world` in the type's precision (f16/bf16 through f32, rounded once), integers
/// use truncating division. Every other op leaves `buf` untouched.
///
/// `buf.len()` must be a multiple of `dtype.size()` and `world` at least 1 (for
/// `Avg`); otherwise [`Error::InvalidArgument`].
pub fn finalize(dtype: DType, op: ReduceOp, buf: &mut [u8], world: usize) -> Result<()> {
    check_lengths(dtype, &[buf.len()])?;
    if op != ReduceOp::Avg {
        return Ok(());
    }
    if world == 0 {
        return Err(Error::InvalidArgument("cannot average over a world of size 0".into()));
    }
    let wi = i64::try_from(world)
        .map_err(|_| Error::InvalidArgument(format!("world size {world} is too large to average over")))?;
    // World sizes are far below 2^24, so the conversions to float are exact.
    let wf = world as f32;
    match dtype {
        DType::F32 => map1(buf, |x: f32| x / wf),
        DType::F64 => map1(buf, |x: f64| x / world as f64),
        DType::F16 => map1(buf, |x: f16| f16::from_f32(x.to_f32() / wf)),
        DType::BF16 => map1(buf, |x: bf16| bf16::from_f32(x.to_f32() / wf)),
        // Division in i64 so that a world larger than the type's range gives 0
        // (or the right small quotient) instead of overflowing the divisor.
        DType::I8 => map1(buf, |x: i8| (i64::from(x) / wi) as i8),
        DType::U8 => map1(buf, |x: u8| (i64::from(x) / wi) as u8),
        DType::I32 => map1(buf, |x: i32| (i64::from(x) / wi) as i32),
        DType::I64 => map1(buf, |x: i64| x / wi),
    }
    Ok(())
}

/// Which kernel family this process uses (`"avx2+f16c"` or `"portable"`), for logs
/// and benchmark reports.
pub fn kernel_name() -> &'static str {
    table().name
}

fn check_lengths(dtype: DType, lens: &[usize]) -> Result<()> {
    let size = dtype.size();
    if lens.iter().any(|&l| l != lens[0] || l % size != 0) {
        return Err(Error::InvalidArgument(format!(
            "reduction buffers must have equal lengths that are a multiple of the {dtype} element size {size}; got lengths {lens:?} bytes"
        )));
    }
    Ok(())
}

impl Table {
    /// The fastest kernels this CPU supports.
    fn detect() -> Table {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = x86::table() {
            return t;
        }
        Table::portable()
    }
}

/// The process-wide kernel table, detected on first use.
fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(Table::detect)
}

fn op_index(op: ReduceOp) -> usize {
    match op.combiner() {
        ReduceOp::Sum | ReduceOp::Avg => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Min => 2,
        ReduceOp::Max => 3,
    }
}

/// [`reduce_inplace`] with an explicit table; lengths already checked.
fn inplace_with(t: &Table, dtype: DType, op: ReduceOp, acc: &mut [u8], inc: &[u8]) {
    let i = op_index(op);
    match dtype {
        DType::F32 => run2(t.f32.two[i], acc, inc),
        DType::F64 => run2(t.f64.two[i], acc, inc),
        DType::F16 => run2(t.f16.two[i], acc, inc),
        DType::BF16 => run2(t.bf16.two[i], acc, inc),
        DType::I8 => run2(t.i8.two[i], acc, inc),
        DType::U8 => run2(t.u8.two[i], acc, inc),
        DType::I32 => run2(t.i32.two[i], acc, inc),
        DType::I64 => run2(t.i64.two[i], acc, inc),
    }
}

/// [`reduce_into`] with an explicit table; lengths already checked.
fn into_with(t: &Table, dtype: DType, op: ReduceOp, out: &mut [u8], a: &[u8], b: &[u8]) {
    let i = op_index(op);
    match dtype {
        DType::F32 => run3(t.f32.three[i], out, a, b),
        DType::F64 => run3(t.f64.three[i], out, a, b),
        DType::F16 => run3(t.f16.three[i], out, a, b),
        DType::BF16 => run3(t.bf16.three[i], out, a, b),
        DType::I8 => run3(t.i8.three[i], out, a, b),
        DType::U8 => run3(t.u8.three[i], out, a, b),
        DType::I32 => run3(t.i32.three[i], out, a, b),
        DType::I64 => run3(t.i64.three[i], out, a, b),
    }
}

/// Bytes per staging block for unaligned operands: small enough that three blocks
/// stay in L1, large enough that the per-block call and copies are amortised. A
/// multiple of every element size.
const BLOCK: usize = 4096;

/// A staging block aligned for every element type.
#[repr(C, align(64))]
struct Block([u8; BLOCK]);

fn aligned<T>(s: &[u8]) -> bool {
    (s.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
}

fn run2<T: Pod>(k: K2<T>, acc: &mut [u8], inc: &[u8]) {
    if aligned::<T>(acc) && aligned::<T>(inc) {
        // SAFETY: `k` comes from a `Table` built for this CPU; the casts cannot fail
        // (alignment checked above, lengths checked by the caller).
        unsafe { k(bytemuck::cast_slice_mut(acc), bytemuck::cast_slice(inc)) };
        return;
    }
    let mut x = Block([0; BLOCK]);
    let mut y = Block([0; BLOCK]);
    for (ca, ci) in acc.chunks_mut(BLOCK).zip(inc.chunks(BLOCK)) {
        let n = ca.len();
        x.0[..n].copy_from_slice(ca);
        y.0[..n].copy_from_slice(ci);
        // SAFETY: as above; the blocks are 64-byte aligned and `n` is a multiple of
        // the element size because BLOCK and the total length are.
        unsafe { k(bytemuck::cast_slice_mut(&mut x.0[..n]), bytemuck::cast_slice(&y.0[..n])) };
        ca.copy_from_slice(&x.0[..n]);
    }
}

fn run3<T: Pod>(k: K3<T>, out: &mut [u8], a: &[u8], b: &[u8]) {
    if aligned::<T>(out) && aligned::<T>(a) && aligned::<T>(b) {
        // SAFETY: see `run2`.
        unsafe { k(bytemuck::cast_slice_mut(out), bytemuck::cast_slice(a), bytemuck::cast_slice(b)) };
        return;
    }
    let mut o = Block([0; BLOCK]);
    let mut x = Block([0; BLOCK]);
    let mut y = Block([0; BLOCK]);
    for ((co, ca), cb) in out.chunks_mut(BLOCK).zip(a.chunks(BLOCK)).zip(b.chunks(BLOCK)) {
        let n = co.len();
        x.0[..n].copy_from_slice(ca);
        y.0[..n].copy_from_slice(cb);
        // SAFETY: see `run2`.
        unsafe {
            k(bytemuck::cast_slice_mut(&mut o.0[..n]), bytemuck::cast_slice(&x.0[..n]), bytemuck::cast_slice(&y.0[..n]))
        };
        co.copy_from_slice(&o.0[..n]);
    }
}

/// Apply `f` to every element of `buf`, aligned or not.
fn map1<T: Pod>(buf: &mut [u8], f: impl Fn(T) -> T) {
    if aligned::<T>(buf) {
        for x in bytemuck::cast_slice_mut::<u8, T>(buf) {
            *x = f(*x);
        }
    } else {
        for c in buf.chunks_exact_mut(std::mem::size_of::<T>()) {
            let v = f(bytemuck::pod_read_unaligned(c));
            c.copy_from_slice(bytemuck::bytes_of(&v));
        }
    }
}

/// Copies at least this long bypass the cache ([`copy_streaming`]).
pub(crate) const STREAM_MIN_BYTES: usize = 1 << 20;

/// Copy `src` into `dst` (same length). Long copies use non-temporal stores on
/// x86-64: a destination far larger than the cache is then written without first
/// being read into it, which saves a third of the memory traffic. Short copies,
/// whose result is likely read again soon, stay ordinary.
pub(crate) fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming needs equal lengths");
    if dst.len() >= STREAM_MIN_BYTES {
        copy_nontemporal(dst, src);
    } else {
        dst.copy_from_slice(src);
    }
}

/// Copy with non-temporal stores whatever the length (x86-64; a plain copy
/// elsewhere): for pieces of a destination that as a whole is far larger than the cache.
pub(crate) fn copy_nontemporal(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_nontemporal needs equal lengths");
    // SAFETY: two distinct live slices of equal length (one is `&mut`).
    unsafe { copy_nontemporal_raw(dst.as_mut_ptr(), src.as_ptr(), dst.len()) }
}

/// [`copy_nontemporal`] on raw pointers, for memory no Rust reference may cover
/// (a shared-memory ring another process maps). Ends with a store fence, so the
/// copied bytes are ordered before any later store that publishes them.
///
/// # Safety
/// `src` is valid for `len` bytes of reads and `dst` for `len` bytes of writes,
/// and the two ranges do not overlap.
pub(crate) unsafe fn copy_nontemporal_raw(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of the x86-64 baseline; the ranges are the caller's.
    unsafe {
        stream_copy_sse2(dst, src, len)
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
unsafe fn stream_copy_sse2(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Streaming stores need 16-byte aligned destinations: copy the head normally.
    let head = dst.align_offset(16).min(n);
    // SAFETY: head <= n, inside both ranges (the caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let body = (n - head) / 64 * 64;
    // SAFETY: head <= n: the offsets stay inside both ranges.
    let (d, s) = unsafe { (dst.add(head), src.add(head)) };
    let mut i = 0;
    while i < body {
        // SAFETY: i + 64 <= body <= n - head, inside both ranges; d + i is 16-byte
        // aligned (d is, and i is a multiple of 64); the loads are unaligned.
        unsafe {
            let a = _mm_loadu_si128(s.add(i) as *const __m128i);
            let b = _mm_loadu_si128(s.add(i + 16) as *const __m128i);
            let c = _mm_loadu_si128(s.add(i + 32) as *const __m128i);
            let e = _mm_loadu_si128(s.add(i + 48) as *const __m128i);
            _mm_stream_si128(d.add(i) as *mut __m128i, a);
            _mm_stream_si128(d.add(i + 16) as *mut __m128i, b);
            _mm_stream_si128(d.add(i + 32) as *mut __m128i, c);
            _mm_stream_si128(d.add(i + 48) as *mut __m128i, e);
        }
        i += 64;
    }
    // Order the streaming stores before anything that publishes the data.
    _mm_sfence();
    // SAFETY: the last n - head - body bytes of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(s.add(body), d.add(body), n - head - body) };
}

#[cfg(test)]
mod copy_tests {
    use super::*;

    #[test]
    fn streaming_copy_is_exact_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..(STREAM_MIN_BYTES + 300)).map(|i| (i * 31 % 251) as u8).collect();
        for (off, len) in [(0, STREAM_MIN_BYTES), (1, STREAM_MIN_BYTES + 7), (13, STREAM_MIN_BYTES + 200), (3, 100)] {
            let mut dst = vec![0u8; len + off];
            copy_streaming(&mut dst[off..off + len], &src[5..5 + len]);
            assert_eq!(&dst[off..], &src[5..5 + len], "offset {off}, length {len}");
            assert!(dst[..off].iter().all(|b| *b == 0));
        }
    }
}
