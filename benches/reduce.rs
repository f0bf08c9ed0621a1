//! Reduction kernel throughput (`cargo bench --bench reduce`): bytes of one operand
//! per second, in place (`acc ⊕= inc`) and into a third buffer, at a cache-resident
//! and a memory-bound size. `braid::reduce::kernel_name()` says which kernel runs.

use braid::{reduce, DType, ReduceOp};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group(format!("reduce_{}", reduce::kernel_name()));
    g.sample_size(10).warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_millis(800));
    for (dtype, op) in [
        (DType::F32, ReduceOp::Sum),
        (DType::BF16, ReduceOp::Sum),
        (DType::F16, ReduceOp::Sum),
        (DType::F32, ReduceOp::Max),
    ] {
        for bytes in [64usize << 10, 16 << 20] {
            // Small integers: valid in every float type, no NaN or overflow.
            let inc: Vec<u8> = match dtype {
                DType::F32 => (0..bytes / 4).flat_map(|i| ((i % 7) as f32).to_le_bytes()).collect(),
                DType::BF16 => {
                    (0..bytes / 2).flat_map(|i| half::bf16::from_f32((i % 7) as f32).to_le_bytes()).collect()
                }
                _ => (0..bytes / 2).flat_map(|i| half::f16::from_f32((i % 7) as f32).to_le_bytes()).collect(),
            };
            let mut acc = vec![0u8; bytes];
            let mut out = vec![0u8; bytes];
            g.throughput(Throughput::Bytes(bytes as u64));
            let id = format!("{}_{}_{}", dtype.name(), op.name(), bytes);
            g.bench_with_input(BenchmarkId::new("in_place", &id), &bytes, |b, _| {
                b.iter(|| reduce::reduce_inplace(dtype, op, &mut acc, &inc).expect("equal lengths"))
            });
            g.bench_with_input(BenchmarkId::new("into", &id), &bytes, |b, _| {
                b.iter(|| reduce::reduce_into(dtype, op, &mut out, &acc, &inc).expect("equal lengths"))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
