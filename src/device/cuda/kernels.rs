//! The CUDA C source of braid's device reductions, compiled by NVRTC ahead of time
//! into the committed `kernels.ptx` (`scripts/gen-ptx.sh`), or at run time.
//!
//! One source holds a kernel per (dtype, combining op) and an `Avg` division per
//! dtype. It has no `#include`, so NVRTC needs no CUDA headers: the f16/bf16
//! conversions are written out on the raw `unsigned short` bits instead of taken
//! from `cuda_fp16.h`, which also pins their rounding to exactly what the host
//! kernels in [`crate::reduce`] do (the `half` crate's conversions). Every element
//! is computed bit for bit as on the host:
//!
//! - integer `Sum`/`Prod` wrap (computed in the unsigned type of the same width, as
//!   signed overflow is undefined in C++);
//! - a float `Sum`/`Prod`/`Min`/`Max` that yields NaN yields the canonical quiet NaN
//!   (the GPU's own NaN is `0x7FFFFFFF`, not the host's `0x7FC00000`);
//! - float `Min`/`Max` treat -0 as smaller than +0 and return NaN if either operand is;
//! - f16/bf16 are widened to f32, combined, and rounded once to nearest-even;
//! - `Avg`'s final division keeps a NaN's payload, quieted (as x86 division does),
//!   and uses `__fdiv_rn`/`__ddiv_rn`, which stay IEEE whatever the compile flags.
//!
//! Every kernel takes its element count as `unsigned long long` and walks it with
//! a grid-stride loop, so any launch shape covers any length.

use std::fmt::Write;
use std::sync::OnceLock;

use crate::types::{DType, ReduceOp};

/// The combining ops that have kernels (`Avg` reduces as `Sum`).
pub const COMBINERS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

/// The kernel computing `dst = a ⊕ b` for `dtype` and `op` (`op.combiner()` is used,
/// so `Avg` names the `Sum` kernel). Signature:
/// `(T* dst, const T* a, const T* b, unsigned long long n)`.
pub fn reduce_kernel_name(dtype: DType, op: ReduceOp) -> String {
    format!("braid_reduce_{}_{}", dtype.name(), op.combiner().name())
}

/// The kernel dividing every element by the world size for `Avg`. Signature:
/// `(T* buf, unsigned long long n, long long world)`.
pub fn finalize_kernel_name(dtype: DType) -> String {
    format!("braid_finalize_avg_{}", dtype.name())
}

/// Every kernel name in [`source`].
#[cfg(test)]
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for dtype in DType::ALL {
        for op in COMBINERS {
            names.push(reduce_kernel_name(dtype, op));
        }
        names.push(finalize_kernel_name(dtype));
    }
    names
}

/// The CUDA C source of every kernel (generated once per process).
pub fn source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(generate)
}

/// The C type a dtype's elements are stored as, and the unsigned type of the same
/// width that integer arithmetic wraps in.
fn c_types(dtype: DType) -> (&'static str, &'static str) {
    match dtype {
        DType::F32 => ("float", ""),
        DType::F64 => ("double", ""),
        DType::F16 | DType::BF16 => ("unsigned short", ""),
        DType::I8 => ("signed char", "unsigned char"),
        DType::U8 => ("unsigned char", "unsigned char"),
        DType::I32 => ("int", "unsigned int"),
        DType::I64 => ("long long", "unsigned long long"),
    }
}

/// Helpers shared by every kernel: bit casts, canonical NaNs, the float operators
/// (one definition each, as in `reduce/kernels.rs`) and the f16/bf16 conversions
/// (transliterated from the `half` crate's software paths, which its hardware
/// paths match).
const PRELUDE: &str = r#"
#define BRAID_DEV static __device__ __forceinline__

BRAID_DEV float braid_nan_f32() { return __uint_as_float(0x7fc00000u); }
BRAID_DEV double braid_nan_f64() { return __longlong_as_double(0x7ff8000000000000ll); }

BRAID_DEV float braid_sum_f32(float a, float b) { float r = __fadd_rn(a, b); return r != r ? braid_nan_f32() : r; }
BRAID_DEV float braid_prod_f32(float a, float b) { float r = __fmul_rn(a, b); return r != r ? braid_nan_f32() : r; }
BRAID_DEV float braid_min_f32(float a, float b) {
    float m = a < b ? a : b;
    if (a == b) m = __uint_as_float(__float_as_uint(a) | __float_as_uint(b));
    return (a != a || b != b) ? braid_nan_f32() : m;
}
BRAID_DEV float braid_max_f32(float a, float b) {
    float m = a > b ? a : b;
    if (a == b) m = __uint_as_float(__float_as_uint(a) & __float_as_uint(b));
    return (a != a || b != b) ? braid_nan_f32() : m;
}

BRAID_DEV double braid_sum_f64(double a, double b) { double r = __dadd_rn(a, b); return r != r ? braid_nan_f64() : r; }
BRAID_DEV double braid_prod_f64(double a, double b) { double r = __dmul_rn(a, b); return r != r ? braid_nan_f64() : r; }
BRAID_DEV double braid_min_f64(double a, double b) {
    double m = a < b ? a : b;
    if (a == b) m = __longlong_as_double(__double_as_longlong(a) | __double_as_longlong(b));
    return (a != a || b != b) ? braid_nan_f64() : m;
}
BRAID_DEV double braid_max_f64(double a, double b) {
    double m = a > b ? a : b;
    if (a == b) m = __longlong_as_double(__double_as_longlong(a) & __double_as_longlong(b));
    return (a != a || b != b) ? braid_nan_f64() : m;
}

/* f16 -> f32, exact. NaNs are quieted and keep their payload. */
BRAID_DEV float braid_f16_to_f32(unsigned short h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int exp = ((unsigned int)h >> 10) & 0x1fu;
    unsigned int man = (unsigned int)h & 0x3ffu;
    unsigned int bits;
    if (exp == 0x1fu) {
        bits = man == 0u ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (man << 13));
    } else if (exp != 0u) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0u) {
        bits = sign;
    } else {
        /* Subnormal: shift the leading one up to the implicit bit; 113 is the
           biased f32 exponent of 2^-14, the f16 subnormal scale. */
        unsigned int e = 113u;
        while ((man & 0x400u) == 0u) { man <<= 1; e -= 1u; }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    return __uint_as_float(bits);
}

/* f32 -> f16, round to nearest, ties to even. NaNs are quieted and keep the top
   payload bits; overflow gives infinity; underflow gives subnormals or zero. */
BRAID_DEV unsigned short braid_f32_to_f16(float f) {
    unsigned int x = __float_as_uint(f);
    unsigned int sign = x & 0x80000000u;
    unsigned int exp = x & 0x7f800000u;
    unsigned int man = x & 0x007fffffu;
    if (exp == 0x7f800000u) {
        return (unsigned short)((sign >> 16) | 0x7c00u | (man != 0u ? 0x0200u : 0u) | (man >> 13));
    }
    unsigned int half_sign = sign >> 16;
    int half_exp = (int)(exp >> 23) - 127 + 15;
    if (half_exp >= 0x1f) return (unsigned short)(half_sign | 0x7c00u);
    if (half_exp <= 0) {
        if (14 - half_exp > 24) return (unsigned short)half_sign;
        unsigned int m = man | 0x00800000u;
        unsigned int half_man = m >> (14 - half_exp);
        unsigned int round_bit = 1u << (13 - half_exp);
        if ((m & round_bit) != 0u && (m & (3u * round_bit - 1u)) != 0u) half_man += 1u;
        return (unsigned short)(half_sign | half_man);
    }
    unsigned int r = half_sign | ((unsigned int)half_exp << 10) | (man >> 13);
    /* A carry out of the mantissa is the correct rounding up into the next binade
       (or to infinity). */
    if ((man & 0x1000u) != 0u && (man & 0x2fffu) != 0u) r += 1u;
    return (unsigned short)r;
}

/* bf16 -> f32, exact (bf16 is the top half of an f32). NaNs are quieted. */
BRAID_DEV float braid_bf16_to_f32(unsigned short h) {
    unsigned int b = (unsigned int)h;
    if ((b & 0x7fffu) > 0x7f80u) b |= 0x0040u;
    return __uint_as_float(b << 16);
}

/* f32 -> bf16, round to nearest, ties to even. NaNs are quieted and keep the top
   payload bits. */
BRAID_DEV unsigned short braid_f32_to_bf16(float f) {
    unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x0040u);
    unsigned int r = x >> 16;
    if ((x & 0x8000u) != 0u && (x & 0x17fffu) != 0u) r += 1u;
    return (unsigned short)r;
}
"#;

/// The body of the element operator `braid_{op}_{dtype}(a, b)` for dtypes whose
/// operators are not in the prelude.
fn element_op(dtype: DType, op: ReduceOp) -> String {
    let (t, u) = c_types(dtype);
    let opn = op.name();
    match dtype {
        DType::F16 | DType::BF16 => {
            let d = dtype.name();
            format!("return braid_f32_to_{d}(braid_{opn}_f32(braid_{d}_to_f32(a), braid_{d}_to_f32(b)));")
        }
        _ => match op {
            // Through the unsigned type: wraps instead of overflowing. 8-bit operands
            // promote to int, whose range holds every 8-bit sum and product.
            ReduceOp::Sum => format!("return ({t})({u})(({u})a + ({u})b);"),
            ReduceOp::Prod => format!("return ({t})({u})(({u})a * ({u})b);"),
            ReduceOp::Min => "return a < b ? a : b;".to_string(),
            ReduceOp::Max => "return a > b ? a : b;".to_string(),
            ReduceOp::Avg => unreachable!("Avg combines as Sum"),
        },
    }
}

/// The body of `Avg`'s division of one element `x` by `world` (a `long long`).
fn finalize_body(dtype: DType) -> &'static str {
    match dtype {
        // x86 division returns a NaN dividend quieted, payload kept; the GPU would
        // return its canonical NaN instead, so NaNs are passed through by hand.
        DType::F32 => {
            "return x != x ? __uint_as_float(__float_as_uint(x) | 0x00400000u) : __fdiv_rn(x, (float)world);"
        }
        DType::F64 => {
            "return x != x ? __longlong_as_double(__double_as_longlong(x) | 0x0008000000000000ll) : __ddiv_rn(x, (double)world);"
        }
        // Widening quiets a NaN; narrowing keeps it, as `half` does on the host.
        DType::F16 => "float f = braid_f16_to_f32(x); return braid_f32_to_f16(f != f ? f : __fdiv_rn(f, (float)world));",
        DType::BF16 => {
            "float f = braid_bf16_to_f32(x); return braid_f32_to_bf16(f != f ? f : __fdiv_rn(f, (float)world));"
        }
        // Truncating division in 64 bits, as the host does.
        DType::I8 => "return (signed char)((long long)x / world);",
        DType::U8 => "return (unsigned char)((long long)x / world);",
        DType::I32 => "return (int)((long long)x / world);",
        DType::I64 => "return x / world;",
    }
}

fn generate() -> String {
    let mut s = String::from("/* braid device reductions: generated by src/device/cuda/kernels.rs */\n");
    s.push_str(PRELUDE);
    for dtype in DType::ALL {
        let (t, _) = c_types(dtype);
        let d = dtype.name();
        s.push('\n');
        for op in COMBINERS {
            let opn = op.name();
            if !matches!(dtype, DType::F32 | DType::F64) {
                let body = element_op(dtype, op);
                let _ = writeln!(s, "BRAID_DEV {t} braid_{opn}_{d}({t} a, {t} b) {{ {body} }}");
            }
            let name = reduce_kernel_name(dtype, op);
            let _ = writeln!(
                s,
                "extern \"C\" __global__ void {name}({t}* dst, const {t}* a, const {t}* b, unsigned long long n) {{\n    \
                 unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n    \
                 for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)\n        \
                 dst[i] = braid_{opn}_{d}(a[i], b[i]);\n}}"
            );
        }
        let body = finalize_body(dtype);
        let name = finalize_kernel_name(dtype);
        let _ = writeln!(
            s,
            "BRAID_DEV {t} braid_avg_{d}({t} x, long long world) {{ {body} }}\n\
             extern \"C\" __global__ void {name}({t}* buf, unsigned long long n, long long world) {{\n    \
             unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n    \
             for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)\n        \
             buf[i] = braid_avg_{d}(buf[i], world);\n}}"
        );
    }
    s
}

#[cfg(test)]
#[path = "kernels_tests.rs"]
pub(super) mod tests;
