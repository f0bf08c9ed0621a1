//! Kernel tests: every dtype × op against a scalar reference, on every kernel path
//! this CPU has, aligned and unaligned; plus the edge cases the contract names.

use half::{bf16, f16};

use super::*;
use crate::types::{DType, ReduceOp};

/// splitmix64: a seeded PRNG so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// One random element as bytes. Floats mix small values (sums, ties, ±0 and exact
/// products are common), specials (NaN with payloads, ±inf, ±0) and raw bit patterns.
fn random_elem(rng: &mut Rng, dtype: DType) -> Vec<u8> {
    let r = rng.next();
    let pick = r % 16;
    let small = ((r >> 8) % 65) as f64 / 4.0 - 8.0;
    let special = [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0][((r >> 16) % 6) as usize];
    let bits = r >> 20;
    let f = |v: f64| if pick < 8 { v } else { small };
    match dtype {
        DType::F32 => match pick {
            0..=1 => (special as f32).to_ne_bytes().to_vec(),
            2..=7 => (bits as u32).to_ne_bytes().to_vec(),
            _ => (f(0.0) as f32).to_ne_bytes().to_vec(),
        },
        DType::F64 => match pick {
            0..=1 => special.to_ne_bytes().to_vec(),
            2..=7 => bits.wrapping_mul(0x1_0000_1001).to_ne_bytes().to_vec(),
            _ => f(0.0).to_ne_bytes().to_vec(),
        },
        DType::F16 => match pick {
            0..=1 => f16::from_f64(special).to_ne_bytes().to_vec(),
            2..=7 => (bits as u16).to_ne_bytes().to_vec(),
            _ => f16::from_f64(small).to_ne_bytes().to_vec(),
        },
        DType::BF16 => match pick {
            0..=1 => bf16::from_f64(special).to_ne_bytes().to_vec(),
            2..=7 => (bits as u16).to_ne_bytes().to_vec(),
            _ => bf16::from_f64(small).to_ne_bytes().to_vec(),
        },
        _ => {
            // Integers: raw bits, with small values often so min/max ties occur.
            let v = if pick < 4 { (r >> 8) % 5 } else { bits };
            v.to_ne_bytes()[..dtype.size()].to_vec()
        }
    }
}

fn random_buf(rng: &mut Rng, dtype: DType, n: usize) -> Vec<u8> {
    (0..n).flat_map(|_| random_elem(rng, dtype)).collect()
}

/// IEEE-754-2019 style min/max written the obvious way, for the reference.
fn ref_minmax(a: f64, b: f64, max: bool) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == 0.0 && b == 0.0 {
        let neg = if max {
            a.is_sign_negative() && b.is_sign_negative()
        } else {
            a.is_sign_negative() || b.is_sign_negative()
        };
        if neg {
            -0.0
        } else {
            0.0
        }
    } else if max {
        a.max(b)
    } else {
        a.min(b)
    }
}

macro_rules! ref_float {
    ($t:ty, $op:expr, $a:expr, $b:expr) => {{
        let (a, b): ($t, $t) = ($a, $b);
        let r = match $op {
            ReduceOp::Sum | ReduceOp::Avg => a + b,
            ReduceOp::Prod => a * b,
            // The exact (representable) min/max.
            ReduceOp::Min | ReduceOp::Max => ref_minmax(a as f64, b as f64, $op == ReduceOp::Max) as $t,
        };
        // Every NaN result is the type's canonical quiet NaN.
        if r.is_nan() {
            <$t>::NAN
        } else {
            r
        }
    }};
}

macro_rules! ref_int {
    ($t:ty, $op:expr, $a:expr, $b:expr) => {{
        let (a, b): ($t, $t) = ($a, $b);
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
            ReduceOp::Prod => a.wrapping_mul(b),
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
        }
    }};
}

/// Scalar reference for one element; `a`, `b` are its bytes.
fn ref_elem(dtype: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
    use bytemuck::pod_read_unaligned as rd;
    match dtype {
        DType::F32 => ref_float!(f32, op, rd(a), rd(b)).to_ne_bytes().to_vec(),
        DType::F64 => ref_float!(f64, op, rd(a), rd(b)).to_ne_bytes().to_vec(),
        DType::F16 => {
            let r = ref_float!(f32, op, rd::<f16>(a).to_f32(), rd::<f16>(b).to_f32());
            let h = if r.is_nan() { f16::NAN } else { f16::from_f32(r) };
            h.to_ne_bytes().to_vec()
        }
        DType::BF16 => {
            let r = ref_float!(f32, op, rd::<bf16>(a).to_f32(), rd::<bf16>(b).to_f32());
            let h = if r.is_nan() { bf16::NAN } else { bf16::from_f32(r) };
            h.to_ne_bytes().to_vec()
        }
        DType::I8 => ref_int!(i8, op, rd(a), rd(b)).to_ne_bytes().to_vec(),
        DType::U8 => ref_int!(u8, op, rd(a), rd(b)).to_ne_bytes().to_vec(),
        DType::I32 => ref_int!(i32, op, rd(a), rd(b)).to_ne_bytes().to_vec(),
        DType::I64 => ref_int!(i64, op, rd(a), rd(b)).to_ne_bytes().to_vec(),
    }
}

fn reference(dtype: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
    let s = dtype.size();
    a.chunks_exact(s).zip(b.chunks_exact(s)).flat_map(|(x, y)| ref_elem(dtype, op, x, y)).collect()
}

/// The kernel tables this CPU can run (portable always; the detected one if different).
fn tables() -> Vec<Table> {
    let mut v = vec![Table::portable()];
    let d = Table::detect();
    if d.name != "portable" {
        v.push(d);
    }
    v
}

/// A copy of `data` placed at byte `off` of a fresh buffer, so that for `off` odd
/// the slice is unaligned for every multi-byte type.
fn at_offset(data: &[u8], off: usize) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; data.len() + off + 8];
    // Vec<u8> from the global allocator is at least 8-aligned in practice; shift to
    // an 8-aligned base first so `off` really decides the alignment.
    let base = (8 - v.as_ptr() as usize % 8) % 8;
    v[base + off..base + off + data.len()].copy_from_slice(data);
    (v, base + off)
}

#[test]
fn matches_reference_every_dtype_op_path_and_alignment() {
    let mut rng = Rng(0x5EED);
    let tabs = tables();
    for dtype in DType::ALL {
        for op in ReduceOp::ALL {
            for n in [0usize, 1, 2, 7, 15, 16, 17, 31, 33, 64, 1000, 2500] {
                let a = random_buf(&mut rng, dtype, n);
                let b = random_buf(&mut rng, dtype, n);
                let want = reference(dtype, op, &a, &b);
                let mut per_path = Vec::new();
                for t in &tabs {
                    for (oa, ob, oo) in [(0, 0, 0), (1, 1, 1), (1, 0, 3), (0, 3, 0)] {
                        let ctx = format!("{dtype} {op} n={n} path={} offsets=({oa},{ob},{oo})", t.name);
                        let (mut acc, ia) = at_offset(&a, oa);
                        let (inc, ib) = at_offset(&b, ob);
                        let len = a.len();
                        inplace_with(t, dtype, op, &mut acc[ia..ia + len], &inc[ib..ib + len]);
                        let (mut out, io) = at_offset(&vec![0xAB; len], oo);
                        let (src, is) = at_offset(&a, oa);
                        into_with(t, dtype, op, &mut out[io..io + len], &src[is..is + len], &inc[ib..ib + len]);
                        let got_in = &acc[ia..ia + len];
                        let got_into = &out[io..io + len];
                        assert_eq!(got_in, got_into, "inplace != into: {ctx}");
                        assert_eq!(got_in, &want[..], "mismatch vs reference: {ctx}");
                        per_path.push(got_in.to_vec());
                    }
                }
                // All paths and alignments agree bit for bit, NaN payloads included.
                assert!(per_path.windows(2).all(|w| w[0] == w[1]), "paths disagree: {dtype} {op} n={n}");
            }
        }
    }
}

#[test]
fn public_functions_match_reference() {
    let mut rng = Rng(7);
    for dtype in DType::ALL {
        for op in ReduceOp::ALL {
            let a = random_buf(&mut rng, dtype, 100);
            let b = random_buf(&mut rng, dtype, 100);
            let want = reference(dtype, op, &a, &b);
            let mut acc = a.clone();
            reduce_inplace(dtype, op, &mut acc, &b).unwrap();
            let mut out = vec![0; a.len()];
            reduce_into(dtype, op, &mut out, &a, &b).unwrap();
            assert_eq!(acc, out, "{dtype} {op}");
            assert_eq!(acc, want, "{dtype} {op}");
        }
    }
}

#[test]
fn float_min_max_propagate_nan_in_either_position() {
    fn check(dtype: DType, nan: Vec<u8>, one: Vec<u8>, is_nan: fn(&[u8]) -> bool) {
        for op in [ReduceOp::Min, ReduceOp::Max] {
            for t in tables() {
                for (a, b) in [(&nan, &one), (&one, &nan), (&nan, &nan)] {
                    let mut acc = a.clone();
                    inplace_with(&t, dtype, op, &mut acc, b);
                    assert!(is_nan(&acc), "{dtype} {op} {}", t.name);
                    let mut out = vec![0; a.len()];
                    into_with(&t, dtype, op, &mut out, b, a);
                    assert_eq!(acc, out, "{dtype} {op}: order changed the result");
                }
            }
        }
    }
    use bytemuck::pod_read_unaligned as rd;
    // A NaN with a payload and the sign bit set, against 1.0.
    check(DType::F32, f32::from_bits(0xFFC0_1234).to_ne_bytes().to_vec(), 1f32.to_ne_bytes().to_vec(), |b| {
        rd::<f32>(b).is_nan()
    });
    check(DType::F64, f64::NAN.to_ne_bytes().to_vec(), (-1f64).to_ne_bytes().to_vec(), |b| rd::<f64>(b).is_nan());
    check(DType::F16, f16::from_bits(0x7D01).to_ne_bytes().to_vec(), f16::ONE.to_ne_bytes().to_vec(), |b| {
        rd::<f16>(b).is_nan()
    });
    check(DType::BF16, bf16::from_bits(0xFF81).to_ne_bytes().to_vec(), bf16::ONE.to_ne_bytes().to_vec(), |b| {
        rd::<bf16>(b).is_nan()
    });
}

#[test]
fn signed_zeros_do_not_depend_on_order() {
    for t in tables() {
        for (a, b) in [(0.0f32, -0.0f32), (-0.0, 0.0)] {
            let mut acc = a.to_ne_bytes();
            inplace_with(&t, DType::F32, ReduceOp::Min, &mut acc, &b.to_ne_bytes());
            assert_eq!(f32::from_ne_bytes(acc).to_bits(), (-0.0f32).to_bits());
            let mut acc = a.to_ne_bytes();
            inplace_with(&t, DType::F32, ReduceOp::Max, &mut acc, &b.to_ne_bytes());
            assert_eq!(f32::from_ne_bytes(acc).to_bits(), 0.0f32.to_bits());
        }
    }
}

#[test]
fn integer_sum_and_prod_wrap() {
    let cases: [(DType, ReduceOp, u8, u8, u8); 6] = [
        (DType::I8, ReduceOp::Sum, 127, 1, 0x80),      // 127 + 1 = -128
        (DType::I8, ReduceOp::Prod, 0x80, 0xFF, 0x80), // -128 * -1 = -128
        (DType::I8, ReduceOp::Avg, 0x80, 0x80, 0),     // -128 + -128 = 0 (avg combines as sum)
        (DType::U8, ReduceOp::Sum, 255, 1, 0),         // 255 + 1 = 0
        (DType::U8, ReduceOp::Prod, 16, 16, 0),        // 256 = 0
        (DType::U8, ReduceOp::Prod, 255, 255, 1),      // 65025 mod 256 = 1
    ];
    for t in tables() {
        for (dtype, op, a, b, want) in cases {
            // 40 copies so both the vector body and the tail are exercised.
            let mut acc = vec![a; 40];
            inplace_with(&t, dtype, op, &mut acc, &[b; 40]);
            assert_eq!(acc, vec![want; 40], "{dtype} {op} {a} {b} ({})", t.name);
        }
    }
    let mut acc = i32::MAX.to_ne_bytes();
    reduce_inplace(DType::I32, ReduceOp::Sum, &mut acc, &1i32.to_ne_bytes()).unwrap();
    assert_eq!(i32::from_ne_bytes(acc), i32::MIN);
}

#[test]
fn finalize_avg_divides_each_dtype() {
    fn avg<T: bytemuck::Pod>(dtype: DType, vals: &[T], world: usize, off: usize) -> Vec<T> {
        let bytes: &[u8] = bytemuck::cast_slice(vals);
        let (mut buf, i) = at_offset(bytes, off);
        finalize(dtype, ReduceOp::Avg, &mut buf[i..i + bytes.len()], world).unwrap();
        buf[i..i + bytes.len()].chunks_exact(dtype.size()).map(bytemuck::pod_read_unaligned).collect()
    }
    for off in [0, 1] {
        assert_eq!(avg(DType::I32, &[7i32, -7, 8, i32::MIN], 2, off), [3, -3, 4, i32::MIN / 2]);
        assert_eq!(avg(DType::I8, &[7i8, -7, -128], 2, off), [3, -3, -64]);
        assert_eq!(avg(DType::I8, &[100i8, -100], 1000, off), [0, 0]);
        assert_eq!(avg(DType::U8, &[255u8, 7], 2, off), [127, 3]);
        assert_eq!(avg(DType::I64, &[i64::MAX, -9], 4, off), [i64::MAX / 4, -2]);
        assert_eq!(avg(DType::F32, &[3.0f32, -1.0, 1.0], 2, off), [1.5, -0.5, 0.5]);
        assert_eq!(avg(DType::F32, &[1.0f32], 3, off), [1.0f32 / 3.0]);
        assert_eq!(avg(DType::F64, &[1.0f64, 7.0], 3, off), [1.0 / 3.0, 7.0 / 3.0]);
        // f16: 1/3 rounded once from f32; 65504 / 2 exact; 3 / 4 exact.
        let h = avg(DType::F16, &[f16::ONE, f16::MAX, f16::from_f32(3.0)], 3, off);
        assert_eq!(h[0], f16::from_f32(1.0 / 3.0));
        assert_eq!(
            avg(DType::F16, &[f16::MAX, f16::from_f32(3.0)], 4, off),
            [f16::from_f32(16376.0), f16::from_f32(0.75)]
        );
        assert_eq!(
            avg(DType::BF16, &[bf16::from_f32(3.0), bf16::ONE], 2, off),
            [bf16::from_f32(1.5), bf16::from_f32(0.5)]
        );
        assert_eq!(avg(DType::BF16, &[bf16::ONE], 3, off), [bf16::from_f32(1.0 / 3.0)]);
    }
    // Other ops leave the buffer alone.
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
        let mut b = 7i32.to_ne_bytes();
        finalize(DType::I32, op, &mut b, 2).unwrap();
        assert_eq!(i32::from_ne_bytes(b), 7);
    }
}

#[test]
fn bad_lengths_and_world_are_invalid_argument() {
    let is_invalid = |r: Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
    let mut acc = [0u8; 8];
    assert!(is_invalid(reduce_inplace(DType::F32, ReduceOp::Sum, &mut acc, &[0u8; 4])));
    assert!(is_invalid(reduce_inplace(DType::F32, ReduceOp::Sum, &mut acc[..6], &[0u8; 6])));
    assert!(is_invalid(reduce_into(DType::I64, ReduceOp::Max, &mut acc, &[0u8; 8], &[0u8; 16])));
    assert!(is_invalid(reduce_into(DType::F16, ReduceOp::Min, &mut acc[..3], &[0u8; 3], &[0u8; 3])));
    assert!(is_invalid(finalize(DType::F64, ReduceOp::Avg, &mut acc[..4], 2)));
    assert!(is_invalid(finalize(DType::F32, ReduceOp::Avg, &mut acc, 0)));
    // The message gives the lengths.
    let e = reduce_inplace(DType::F32, ReduceOp::Sum, &mut acc, &[0u8; 4]).unwrap_err().to_string();
    assert!(e.contains("[8, 4]"), "{e}");
    // Empty buffers are fine.
    reduce_inplace(DType::F32, ReduceOp::Sum, &mut [], &[]).unwrap();
    reduce_into(DType::I8, ReduceOp::Prod, &mut [], &[], &[]).unwrap();
}

#[test]
fn bf16_rounding_matches_half() {
    let mut rng = Rng(99);
    let edges = [
        0u32,
        0x8000_0000,
        0x3F80_8000,
        0x3F81_8000,
        0x3F80_8001,
        0x7F7F_FFFF,
        0xFF7F_8000,
        0x7F80_0000,
        0x7F80_0001,
        0xFFC0_0000,
        0x0000_8000,
        0x0001_8000,
    ];
    let randoms = (0..200_000).map(|_| rng.next() as u32);
    for b in edges.into_iter().chain(randoms) {
        let x = f32::from_bits(b);
        assert_eq!(kernels::narrow_bf16(x), bf16::from_f32(x).to_bits(), "{b:#010x}");
    }
}

proptest::proptest! {
    /// Arbitrary bytes (all NaN payloads, denormals, ...): in-place equals into, and
    /// every path agrees bit for bit.
    #[test]
    fn prop_inplace_equals_into_on_every_path(
        code in 0u8..8, opc in 0u8..5, off in 0usize..8,
        data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
    ) {
        let dtype = DType::from_code(code).unwrap();
        let op = ReduceOp::from_code(opc).unwrap();
        let half = data.len() / 2 / dtype.size() * dtype.size();
        let (a, b) = (&data[..half], &data[half..2 * half]);
        let mut results = Vec::new();
        for t in tables() {
            let (mut acc, i) = at_offset(a, off);
            inplace_with(&t, dtype, op, &mut acc[i..i + half], b);
            let mut out = vec![0; half];
            into_with(&t, dtype, op, &mut out, a, b);
            proptest::prop_assert_eq!(&acc[i..i + half], &out[..]);
            results.push(out);
        }
        proptest::prop_assert!(results.windows(2).all(|w| w[0] == w[1]));
    }
}
