//! Tests of the kernel source: its shape, and its arithmetic run on the host.
//!
//! The source is plain C++ apart from a few CUDA spellings, so with those defined
//! for the host (one thread, one block: the grid-stride loops then walk the whole
//! range) the host C++ compiler builds the very same kernels into a shared library.
//! Running them against [`crate::reduce`] on adversarial bit patterns checks the
//! arithmetic this file promises (wrapping, canonical NaNs, signed zeros, f16/bf16
//! rounding) without a GPU. Skipped, with a message, when no `c++` is installed.

use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::process::Command;

use half::{bf16, f16};

use super::*;

#[test]
fn every_kernel_is_defined_once_with_its_signature() {
    let src = source();
    for dtype in DType::ALL {
        for op in ReduceOp::ALL {
            let name = reduce_kernel_name(dtype, op);
            let def = format!("extern \"C\" __global__ void {name}(");
            assert_eq!(src.matches(&def).count(), 1, "{name} ({dtype} {op})");
        }
        let name = finalize_kernel_name(dtype);
        let def = format!("extern \"C\" __global__ void {name}(");
        assert_eq!(src.matches(&def).count(), 1, "{name}");
    }
    assert_eq!(kernel_names().len(), DType::ALL.len() * 5);
    assert_eq!(src.matches("__global__").count(), kernel_names().len());
    assert_eq!(reduce_kernel_name(DType::BF16, ReduceOp::Avg), "braid_reduce_bf16_sum");
    assert_eq!(finalize_kernel_name(DType::I8), "braid_finalize_avg_i8");
}

#[test]
fn source_needs_no_headers() {
    assert!(!source().contains("#include"));
    assert!(!source().contains("cuda_fp16"));
}

/// CUDA spellings defined for a host build (test-only; NVRTC never sees this).
const HOST_SHIM: &str = r#"
#include <string.h>
#define __global__
#define __device__
#define __forceinline__ inline
struct braid_dim { unsigned int x; };
static const braid_dim threadIdx = {0}, blockIdx = {0}, blockDim = {1}, gridDim = {1};
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
static inline long long __double_as_longlong(double f) { long long u; memcpy(&u, &f, 8); return u; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
"#;

/// Exported wrappers of the conversions, to compare them with `half`.
const HOST_EXPORTS: &str = r#"
extern "C" unsigned int t_f16_to_f32(unsigned short h) { return __float_as_uint(braid_f16_to_f32(h)); }
extern "C" unsigned short t_f32_to_f16(unsigned int x) { return braid_f32_to_f16(__uint_as_float(x)); }
extern "C" unsigned int t_bf16_to_f32(unsigned short h) { return __float_as_uint(braid_bf16_to_f32(h)); }
extern "C" unsigned short t_f32_to_bf16(unsigned int x) { return braid_f32_to_bf16(__uint_as_float(x)); }
"#;

/// The kernels built for the host and loaded.
struct HostKernels {
    lib: *mut c_void,
}

type ReduceFn = unsafe extern "C" fn(*mut u8, *const u8, *const u8, u64);
type FinalizeFn = unsafe extern "C" fn(*mut u8, u64, i64);
type WidenFn = unsafe extern "C" fn(u16) -> u32;
type NarrowFn = unsafe extern "C" fn(u32) -> u16;

impl HostKernels {
    /// Build and load, or `None` (with a message) when there is no C++ compiler.
    fn build(tag: &str) -> Option<HostKernels> {
        let dir = std::env::temp_dir().join(format!("braid-cuda-kernels-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let cpp = dir.join("kernels.cpp");
        let so: PathBuf = dir.join("kernels.so");
        std::fs::write(&cpp, format!("{HOST_SHIM}\n{}\n{HOST_EXPORTS}", source())).expect("write source");
        let out = Command::new("c++")
            .args(["-std=c++11", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-o"])
            .arg(&so)
            .arg(&cpp)
            .output();
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                eprintln!("skipping the host run of the CUDA kernels: no c++ compiler ({e})");
                return None;
            }
        };
        assert!(
            out.status.success(),
            "host build of the kernel source failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = CString::new(so.to_str().expect("utf-8 temp path")).expect("no NUL");
        // SAFETY: dlopen of a library just built from our own source; its only
        // initialisers are the shim's constant structs.
        let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!lib.is_null(), "dlopen of the host-built kernels failed");
        let _ = std::fs::remove_dir_all(&dir);
        Some(HostKernels { lib })
    }

    fn symbol(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).expect("no NUL");
        // SAFETY: `lib` is a live handle from dlopen; `c` is NUL-terminated.
        let p = unsafe { libc::dlsym(self.lib, c.as_ptr()) };
        assert!(!p.is_null(), "{name} is not exported by the host-built kernels");
        p
    }

    fn reduce(&self, name: &str) -> ReduceFn {
        // SAFETY: the symbol is the extern "C" kernel of that name, whose signature
        // is (T*, const T*, const T*, unsigned long long) with T the element type:
        // the same ABI as byte pointers and a u64.
        unsafe { std::mem::transmute::<*mut c_void, ReduceFn>(self.symbol(name)) }
    }

    fn finalize(&self, name: &str) -> FinalizeFn {
        // SAFETY: as above, (T*, unsigned long long, long long).
        unsafe { std::mem::transmute::<*mut c_void, FinalizeFn>(self.symbol(name)) }
    }

    fn widen(&self, name: &str) -> WidenFn {
        // SAFETY: an exported wrapper in HOST_EXPORTS with exactly this signature.
        unsafe { std::mem::transmute::<*mut c_void, WidenFn>(self.symbol(name)) }
    }

    fn narrow(&self, name: &str) -> NarrowFn {
        // SAFETY: an exported wrapper in HOST_EXPORTS with exactly this signature.
        unsafe { std::mem::transmute::<*mut c_void, NarrowFn>(self.symbol(name)) }
    }
}

impl Drop for HostKernels {
    fn drop(&mut self) {
        // SAFETY: the handle from dlopen, closed once; no function pointer from it
        // outlives `self` (they are only used while the test holds it).
        unsafe { libc::dlclose(self.lib) };
    }
}

/// Deterministic test inputs (also used by the GPU tests).
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        // xorshift64*: deterministic and fast; quality is plenty for test inputs.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Bit patterns that stress each type: zeros of both signs, infinities, NaNs with
/// payloads (quiet and signalling, both signs), subnormals, extremes, small values.
fn specials(dtype: DType) -> Vec<u64> {
    match dtype {
        DType::F32 => vec![
            0,
            0x8000_0000,
            0x3f80_0000,
            0xbf80_0000,
            0x3f00_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0x7fc1_2345,
            0xffc0_0001,
            0x7f80_0001,
            0xff80_1000,
            1,
            0x8000_0001,
            0x007f_ffff,
            0x0080_0000,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x4b80_0000,
            0x3380_0000,
            0x4049_0fdb,
        ],
        DType::F64 => vec![
            0,
            1 << 63,
            0x3ff0_0000_0000_0000,
            0xbff0_0000_0000_0000,
            0x7ff0_0000_0000_0000,
            0xfff0_0000_0000_0000,
            0x7ff8_0000_0000_0000,
            0x7ff8_0000_0012_3456,
            0xfff8_0000_0000_0001,
            0x7ff0_0000_0000_0001,
            1,
            0x000f_ffff_ffff_ffff,
            0x0010_0000_0000_0000,
            0x7fef_ffff_ffff_ffff,
            0x4340_0000_0000_0000,
        ],
        DType::F16 => vec![
            0, 0x8000, 0x3c00, 0xbc00, 0x3800, 0x7c00, 0xfc00, 0x7e00, 0x7e55, 0xfe01, 0x7c01, 0x0001, 0x8001, 0x03ff,
            0x0400, 0x7bff, 0xfbff, 0x6800, 0x1400, 0x3c01,
        ],
        DType::BF16 => vec![
            0, 0x8000, 0x3f80, 0xbf80, 0x3f00, 0x7f80, 0xff80, 0x7fc0, 0x7fd5, 0xffc1, 0x7f81, 0x0001, 0x8001, 0x007f,
            0x0080, 0x7f7f, 0xff7f, 0x4b80, 0x3f81,
        ],
        DType::I8 | DType::U8 => vec![0, 1, 2, 0x7f, 0x80, 0x81, 0xff, 0xfe, 0x10, 0x55],
        DType::I32 => vec![0, 1, 2, 0x7fff_ffff, 0x8000_0000, 0x8000_0001, 0xffff_ffff, 0x1_0000, 0xffff, 0x5555_5555],
        DType::I64 => vec![0, 1, 2, i64::MAX as u64, 1 << 63, (1 << 63) + 1, u64::MAX, 1 << 32, 0x5555_5555_5555_5555],
    }
}

/// Operand vectors `(a, b)` for a dtype, as bytes: every pair of specials, every
/// 16-bit pattern against a rotating partner (f16/bf16), then random bits.
pub(crate) fn operands(dtype: DType, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let size = dtype.size();
    let sp = specials(dtype);
    let mut a = Vec::new();
    let mut b = Vec::new();
    let push = |v: &mut Vec<u8>, x: u64| v.extend_from_slice(&x.to_le_bytes()[..size]);
    for &x in &sp {
        for &y in &sp {
            push(&mut a, x);
            push(&mut b, y);
        }
    }
    if size == 2 {
        for x in 0..=u16::MAX as u64 {
            push(&mut a, x);
            push(&mut b, sp[(x as usize) % sp.len()] ^ (x & 0x7));
        }
    }
    for _ in 0..50_000 {
        let (x, y) = (rng.next(), rng.next());
        push(&mut a, x);
        push(&mut b, y);
    }
    // Small values whose sums and products are often exact (and tie in f16/bf16).
    for _ in 0..20_000 {
        let (x, y) = (rng.next() % 4096, rng.next() % 4096);
        let enc = |v: u64| match dtype {
            DType::F32 => u64::from((v as f32 / 16.0 - 100.0).to_bits()),
            DType::F64 => (v as f64 / 16.0 - 100.0).to_bits(),
            DType::F16 => u64::from(f16::from_f32(v as f32 / 16.0 - 100.0).to_bits()),
            DType::BF16 => u64::from(bf16::from_f32(v as f32 / 16.0 - 100.0).to_bits()),
            _ => v.wrapping_sub(2048),
        };
        push(&mut a, enc(x));
        push(&mut b, enc(y));
    }
    (a, b)
}

/// Copy bytes into 8-byte-aligned storage (the kernels read whole elements).
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
    v
}

fn first_difference(dtype: DType, got: &[u8], want: &[u8], a: &[u8], b: &[u8]) -> Option<String> {
    let s = dtype.size();
    (0..got.len() / s).find(|i| got[i * s..(i + 1) * s] != want[i * s..(i + 1) * s]).map(|i| {
        let hex = |v: &[u8]| v[i * s..(i + 1) * s].iter().rev().map(|x| format!("{x:02x}")).collect::<String>();
        format!("element {i}: a=0x{} b=0x{} device=0x{} host=0x{}", hex(a), hex(b), hex(got), hex(want))
    })
}

#[test]
fn host_build_of_every_reduce_kernel_matches_the_host_kernels_bit_for_bit() {
    let Some(k) = HostKernels::build("reduce") else { return };
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for dtype in DType::ALL {
        let (a, b) = operands(dtype, &mut rng);
        let n = (a.len() / dtype.size()) as u64;
        let (av, bv) = (aligned(&a), aligned(&b));
        for op in COMBINERS {
            let mut want = vec![0u8; a.len()];
            crate::reduce::reduce_into(dtype, op, &mut want, &a, &b).unwrap();
            let f = k.reduce(&reduce_kernel_name(dtype, op));
            let mut out = aligned(&vec![0u8; a.len()]);
            // SAFETY: the three buffers hold n elements of the kernel's type each
            // and are 8-byte aligned; the kernel runs synchronously on this thread.
            unsafe { f(out.as_mut_ptr() as *mut u8, av.as_ptr() as *const u8, bv.as_ptr() as *const u8, n) };
            let got = &bytemuck::cast_slice::<u64, u8>(&out)[..a.len()];
            if let Some(d) = first_difference(dtype, got, &want, &a, &b) {
                panic!("{dtype} {op}: {d}");
            }
            // In place (dst == a), as the executor accumulates.
            let mut acc = av.clone();
            let p = acc.as_mut_ptr() as *mut u8;
            // SAFETY: as above; dst aliasing a is allowed by the kernel contract
            // (each element is read before it is written, by the same thread).
            unsafe { f(p, p, bv.as_ptr() as *const u8, n) };
            let got = &bytemuck::cast_slice::<u64, u8>(&acc)[..a.len()];
            if let Some(d) = first_difference(dtype, got, &want, &a, &b) {
                panic!("{dtype} {op} in place: {d}");
            }
        }
    }
}

#[test]
fn host_build_of_every_finalize_kernel_matches_the_host_division() {
    let Some(k) = HostKernels::build("finalize") else { return };
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for dtype in DType::ALL {
        let (a, _) = operands(dtype, &mut rng);
        let n = (a.len() / dtype.size()) as u64;
        let f = k.finalize(&finalize_kernel_name(dtype));
        for world in [1usize, 2, 3, 7, 64, 1000, 1 << 20] {
            let mut want = a.clone();
            crate::reduce::finalize(dtype, ReduceOp::Avg, &mut want, world).unwrap();
            let mut buf = aligned(&a);
            // SAFETY: `buf` holds n aligned elements; the kernel runs synchronously.
            unsafe { f(buf.as_mut_ptr() as *mut u8, n, world as i64) };
            let got = &bytemuck::cast_slice::<u64, u8>(&buf)[..a.len()];
            if let Some(d) = first_difference(dtype, got, &want, &a, &a) {
                panic!("{dtype} avg over {world}: {d}");
            }
        }
    }
}

#[test]
fn source_conversions_match_the_half_crate() {
    let Some(k) = HostKernels::build("convert") else { return };
    let (f16_f32, f32_f16) = (k.widen("t_f16_to_f32"), k.narrow("t_f32_to_f16"));
    let (bf16_f32, f32_bf16) = (k.widen("t_bf16_to_f32"), k.narrow("t_f32_to_bf16"));
    for h in 0..=u16::MAX {
        // SAFETY: plain value conversions exported by the host-built source.
        let (w, bw) = unsafe { (f16_f32(h), bf16_f32(h)) };
        assert_eq!(w, f16::from_bits(h).to_f32().to_bits(), "f16 {h:#06x} to f32");
        assert_eq!(bw, bf16::from_bits(h).to_f32().to_bits(), "bf16 {h:#06x} to f32");
    }
    // Every f32 next to a rounding boundary of either type (the midpoints between
    // neighbours and one ulp either side), then a sweep over all exponents.
    let mut xs: Vec<u32> = Vec::new();
    for h in 0..=u16::MAX {
        let lo = f16::from_bits(h).to_f32();
        let hi = f16::from_bits(h.wrapping_add(1)).to_f32();
        if lo.is_finite() && hi.is_finite() {
            let mid = ((f64::from(lo) + f64::from(hi)) / 2.0) as f32;
            xs.extend([mid.to_bits().wrapping_sub(1), mid.to_bits(), mid.to_bits().wrapping_add(1)]);
        }
        let b = u32::from(h) << 16;
        xs.extend([b | 0x7fff, b | 0x8000, b | 0x8001, b | 0x0001, b | 0xffff]);
    }
    xs.extend((0..=u32::MAX).step_by(4093));
    for x in xs {
        let f = f32::from_bits(x);
        // SAFETY: plain value conversions exported by the host-built source.
        let (h, bh) = unsafe { (f32_f16(x), f32_bf16(x)) };
        assert_eq!(h, f16::from_f32(f).to_bits(), "f32 {x:#010x} ({f:e}) to f16");
        assert_eq!(bh, bf16::from_f32(f).to_bits(), "f32 {x:#010x} ({f:e}) to bf16");
    }
}
