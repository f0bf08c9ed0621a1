//! What `braid perf` puts in its buffers and what it expects back: small integers, so
//! every result is exact whatever the reduction order and `--check` compares bit for
//! bit.

use braid::{Communicator, DType, OpKind, ReduceOp};
use half::{bf16, f16};

use crate::perf::{Case, PerfArgs, Place};

/// Test hook: `BRAID_PERF_TEST_CORRUPT=in-place` (or `out-of-place`) spoils one
/// element of rank 0's result in that mode before `--check` reads it, so a test can
/// see that each mode's wrong elements are counted in its own column.
fn corrupted_place() -> Option<Place> {
    match std::env::var("BRAID_PERF_TEST_CORRUPT").ok()?.as_str() {
        "in-place" => Some(Place::InPlace),
        "out-of-place" => Some(Place::OutOfPlace),
        _ => None,
    }
}

/// Bytes of one element of value `v` (integers wrap, floats are exact for small values).
fn encode(dt: DType, v: i64, out: &mut [u8]) {
    match dt {
        DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&(v as f64).to_le_bytes()),
        DType::F16 => out.copy_from_slice(&f16::from_f32(v as f32).to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&bf16::from_f32(v as f32).to_le_bytes()),
        DType::I8 => out[0] = v as i8 as u8,
        DType::U8 => out[0] = v as u8,
        DType::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => out.copy_from_slice(&v.to_le_bytes()),
    }
}

/// Bytes of `sum / n` as braid's `avg` computes it.
fn encode_avg(dt: DType, sum: i64, n: usize, out: &mut [u8]) {
    match dt {
        DType::F32 => out.copy_from_slice(&(sum as f32 / n as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&(sum as f64 / n as f64).to_le_bytes()),
        DType::F16 => out.copy_from_slice(&f16::from_f32(sum as f32 / n as f32).to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&bf16::from_f32(sum as f32 / n as f32).to_le_bytes()),
        DType::I8 => out[0] = (sum as i8).wrapping_div(n as i8) as u8,
        DType::U8 => out[0] = (sum as u8).wrapping_div(n as u8),
        DType::I32 => out.copy_from_slice(&((sum as i32) / n as i32).to_le_bytes()),
        DType::I64 => out.copy_from_slice(&(sum / n as i64).to_le_bytes()),
    }
}

/// Rank `r`'s input value at element `i`: 1..=3 (1..=2 for products, so 8 ranks stay exact).
fn value(rop: ReduceOp, r: usize, i: usize) -> i64 {
    match rop {
        ReduceOp::Prod => 1 + ((r + i) % 2) as i64,
        _ => 1 + ((r + i) % 3) as i64,
    }
}

/// The values repeat every 6 elements; this table holds the 6 expected reductions.
fn reduced_table(dt: DType, rop: ReduceOp, n: usize) -> Vec<Vec<u8>> {
    (0..6)
        .map(|i| {
            let vals = (0..n).map(|r| value(rop, r, i));
            let mut b = vec![0u8; dt.size()];
            match rop {
                ReduceOp::Sum => encode(dt, vals.sum(), &mut b),
                ReduceOp::Prod => encode(dt, vals.product(), &mut b),
                ReduceOp::Min => encode(dt, vals.min().unwrap_or(0), &mut b),
                ReduceOp::Max => encode(dt, vals.max().unwrap_or(0), &mut b),
                ReduceOp::Avg => encode_avg(dt, vals.sum(), n, &mut b),
            }
            b
        })
        .collect()
}

fn fill(dt: DType, buf: &mut [u8], f: impl Fn(usize) -> i64) {
    for (i, e) in buf.chunks_exact_mut(dt.size()).enumerate() {
        encode(dt, f(i), e);
    }
}

fn count_wrong(dt: DType, buf: &[u8], want: impl Fn(usize, &mut [u8])) -> u64 {
    let mut tmp = vec![0u8; dt.size()];
    let mut wrong = 0;
    for (i, e) in buf.chunks_exact(dt.size()).enumerate() {
        want(i, &mut tmp);
        wrong += (e != tmp.as_slice()) as u64;
    }
    wrong
}

/// This rank's input values for the case, written into `target`.
pub(crate) fn fill_inputs(comm: &Communicator, a: &PerfArgs, c: &Case, target: &mut [u8]) {
    let (r, dt, rop) = (comm.rank(), a.dtype, a.reduce_op);
    let count = c.sig.count as usize;
    match a.op {
        OpKind::AllToAll => fill(dt, target, |k| ((r * 3 + k / count.max(1) + k % count.max(1)) % 5 + 1) as i64),
        OpKind::Broadcast => fill(dt, target, |i| if r == a.root { value(rop, a.root, i) } else { 0 }),
        OpKind::AllGather if !c.out_of_place => {
            let esz = dt.size();
            fill(dt, target, |_| 0);
            fill(dt, &mut target[r * count * esz..(r + 1) * count * esz], |i| value(rop, r, i));
        }
        // The root's blocks, block `j` meant for rank `j`; in place, its own at block `root`.
        OpKind::Scatter if r == a.root => fill(dt, target, |k| value(rop, k / count.max(1), k % count.max(1))),
        // In place off the root, the buffer is only written: start it wrong.
        OpKind::Scatter if !c.out_of_place => fill(dt, target, |_| 0),
        OpKind::Gather if r == a.root && !c.out_of_place => {
            let esz = dt.size();
            fill(dt, target, |_| 0);
            fill(dt, &mut target[r * count * esz..(r + 1) * count * esz], |i| value(rop, r, i));
        }
        _ => fill(dt, target, |i| value(rop, r, i)),
    }
}

pub(crate) fn check(comm: &Communicator, a: &PerfArgs, c: &mut Case) -> braid::Result<u64> {
    if let Some(d) = &c.dev {
        d.output.read(&mut c.output)?;
    }
    let place = if c.out_of_place { Place::OutOfPlace } else { Place::InPlace };
    if comm.rank() == 0 && corrupted_place() == Some(place) {
        if let Some(b) = c.output.first_mut() {
            *b ^= 0xff;
        }
    }
    Ok(check_host(comm, a, c))
}

fn check_host(comm: &Communicator, a: &PerfArgs, c: &Case) -> u64 {
    let (n, r, dt, rop) = (comm.world_size(), comm.rank(), a.dtype, a.reduce_op);
    let count = c.sig.count as usize;
    let esz = dt.size();
    let table = reduced_table(dt, rop, n);
    match a.op {
        OpKind::AllReduce => count_wrong(dt, &c.output, |i, b| b.copy_from_slice(&table[i % 6])),
        OpKind::Reduce if r == a.root => count_wrong(dt, &c.output, |i, b| b.copy_from_slice(&table[i % 6])),
        OpKind::Reduce | OpKind::Barrier => 0,
        OpKind::ReduceScatter => {
            let out = if c.out_of_place { &c.output[..] } else { &c.output[r * count * esz..(r + 1) * count * esz] };
            count_wrong(dt, out, |i, b| b.copy_from_slice(&table[(r * count + i) % 6]))
        }
        OpKind::Broadcast => count_wrong(dt, &c.output, |i, b| encode(dt, value(rop, a.root, i), b)),
        OpKind::AllGather => {
            count_wrong(dt, &c.output, |k, b| encode(dt, value(rop, k / count.max(1), k % count.max(1)), b))
        }
        OpKind::Gather if r == a.root => {
            count_wrong(dt, &c.output, |k, b| encode(dt, value(rop, k / count.max(1), k % count.max(1)), b))
        }
        OpKind::Gather => 0,
        OpKind::Scatter => {
            let out = if c.out_of_place || r != a.root {
                &c.output[..]
            } else {
                &c.output[r * count * esz..(r + 1) * count * esz]
            };
            count_wrong(dt, out, |i, b| encode(dt, value(rop, r, i), b))
        }
        OpKind::AllToAll => count_wrong(dt, &c.output, |k, b| {
            let (j, i) = (k / count.max(1), k % count.max(1));
            encode(dt, ((j * 3 + r + i) % 5 + 1) as i64, b)
        }),
        OpKind::Send => count_wrong(dt, &c.output, |i, b| encode(dt, value(rop, (r + n - 1) % n, i), b)),
        // parse_op refuses them: the sweep has one count per rank.
        OpKind::Recv | OpKind::AllGatherV | OpKind::ReduceScatterV | OpKind::AllToAllV => 0,
    }
}
