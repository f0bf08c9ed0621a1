//! All-reduce throughput of every algorithm by size (`cargo bench --bench algorithms`;
//! add `-- --quick` for a short run, or a filter such as `allreduce/ring`). One
//! criterion group per algorithm of `algorithms_for(OpKind::AllReduce)`, named
//! `allreduce/<algo>`, each forced with the builder's `.algorithm(..)`, over f32
//! buffers of 4 KiB, 64 KiB, 1 MiB and 16 MiB per rank.
//!
//! Ranks are threads of this process linked by shared memory; `BRAID_BENCH_WORLD=N`
//! sets the number of ranks (default 2). Before a size is timed, one all-reduce of
//! integer-valued inputs is checked against its closed-form sum on every rank, and
//! the planned schedule must be the forced algorithm, so a broken or bypassed
//! algorithm cannot report a fast bogus number.

mod common;

use std::time::Duration;

use braid::algorithm::algorithms_for;
use braid::TransportKind;
use braid::{CallSig, DType, OpKind, ReduceOp};
use common::{comms, Group};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 16 << 20];

fn bench(c: &mut Criterion) {
    let world = std::env::var("BRAID_BENCH_WORLD")
        .ok()
        .map_or(2, |s| s.trim().parse().expect("BRAID_BENCH_WORLD: a number of ranks"));
    assert!(world >= 2, "BRAID_BENCH_WORLD: at least 2 ranks");
    for &alg in algorithms_for(OpKind::AllReduce) {
        let name = alg.name();
        let group = Group::new(comms(world, TransportKind::Shm, Some(alg)));
        let mut g = c.benchmark_group(format!("allreduce/{name}"));
        g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
        for bytes in SIZES {
            let elems = bytes / 4;
            let sig = CallSig::new(OpKind::AllReduce, DType::F32, elems as u64, 0, ReduceOp::Sum);
            let planned = group.rank0.plan(&sig).expect("plan").algorithm;
            assert_eq!(planned, alg, "allreduce/{name} planned {planned} at {bytes} bytes");
            group.check(elems, name);
            g.throughput(Throughput::Bytes(bytes as u64));
            let mut buf = vec![1.0f32; elems];
            g.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, _| {
                b.iter_custom(|iters| group.run(&mut buf, iters))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
