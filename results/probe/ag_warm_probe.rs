//! Probe for results/vs-mpi-2026-11-25-rewind.md: is a fresh communicator's slow start
//! time, call count or the ring's first lap? Build: copy to examples/, then
//! `cargo build --release --example ag_warm_probe` and
//! `braid run -n 2 -- target/release/examples/ag_warm_probe none|spin|tiny|barrier|full`.
use braid::Communicator;
use std::time::Instant;

fn timed(comm: &Communicator, input: &[f32], out: &mut [f32], n: usize) -> f64 {
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        comm.barrier().unwrap();
        let t0 = Instant::now();
        comm.all_gather(input, out).unwrap();
        t.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    comm.all_reduce_in_place(&mut t, braid::ReduceOp::Max).unwrap();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[n / 2]
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let comm = Communicator::from_env().unwrap();
    let n = comm.world_size();
    let input = vec![1.0f32; 512];
    let mut out = vec![0.0f32; 512 * n];
    match mode.as_str() {
        "spin" => {
            let t0 = Instant::now();
            while t0.elapsed().as_millis() < 20 {
                std::hint::spin_loop();
            }
        }
        "tiny" => {
            let i = [1.0f32];
            let mut o = vec![0.0f32; n];
            for _ in 0..2000 {
                comm.all_gather(&i, &mut o).unwrap();
            }
        }
        "barrier" => {
            for _ in 0..2000 {
                comm.barrier().unwrap();
            }
        }
        "full" => {
            for _ in 0..1000 {
                comm.all_gather(&input, &mut out).unwrap();
            }
        }
        _ => {}
    }
    for _ in 0..10 {
        comm.all_gather(&input, &mut out).unwrap();
    }
    let a = timed(&comm, &input, &mut out, 100);
    let b = timed(&comm, &input, &mut out, 100);
    let mut c = 0.0;
    for _ in 0..8 {
        c = timed(&comm, &input, &mut out, 100);
    }
    if comm.rank() == 0 {
        println!("{mode:8} first100 {a:.3} next100 {b:.3} after1000 {c:.3}");
    }
}
