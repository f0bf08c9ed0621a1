//! All-reduce throughput by size for the in-process, shared-memory and TCP transports
//! (`cargo bench`; `cargo bench -- --quick` for a short run). Ranks are threads of
//! this process; for process ranks and peer comparisons use `braid perf`.

mod common;

use std::time::Duration;

use braid::Communicator;
use braid::TransportKind;
use common::{comms, Group};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const WORLD: usize = 2;

fn bench(c: &mut Criterion) {
    let groups = [
        ("inproc", Communicator::in_process(WORLD).expect("inproc")),
        ("shm", comms(WORLD, TransportKind::Shm, None)),
        ("tcp", comms(WORLD, TransportKind::Tcp, None)),
    ];
    for (name, comms) in groups {
        let group = Group::new(comms);
        let mut g = c.benchmark_group(format!("all_reduce_f32_{name}_{WORLD}ranks"));
        g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
        for bytes in [4usize << 10, 64 << 10, 1 << 20, 16 << 20] {
            g.throughput(Throughput::Bytes(bytes as u64));
            let mut buf = vec![1.0f32; bytes / 4];
            g.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, _| {
                b.iter_custom(|iters| group.run(&mut buf, iters))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
