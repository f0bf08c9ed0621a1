use std::time::Duration;

use super::*;
use crate::types::DType;
use half::f16;

/// Run `body(rank, fuser)` on every rank of an in-process world, in threads.
fn on_ranks<R: Send + 'static>(
    world: usize,
    cfg: FusionConfig,
    body: impl Fn(usize, &Fuser) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let body = Arc::new(body);
    let comms = Communicator::in_process(world).expect("in-process world");
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let body = body.clone();
            std::thread::spawn(move || {
                let rank = c.rank();
                let fuser = Fuser::new(c, cfg);
                body(rank, &fuser)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("rank thread")).collect()
}

/// Element `i` of tensor `t` on `rank`: small integers, exact in every dtype.
fn value(rank: usize, t: usize, i: usize) -> i64 {
    ((i * 7 + t * 3) % 23 + rank) as i64
}

/// The sum of [`value`] over `world` ranks.
fn summed(world: usize, t: usize, i: usize) -> i64 {
    (0..world).map(|r| value(r, t, i)).sum()
}

/// Sizes of a mixed list: tensor `t` has this many elements (0 and 1 included).
fn len(t: usize) -> usize {
    [0, 1, 3, 17, 256, 1000, 4099][t % 7] + t
}

/// Submit a mixed list (f32, i32, f16, f64 interleaved, in runs), wait, check every
/// element exactly. Returns how many tensors were checked.
fn mixed_round_trip(rank: usize, world: usize, fuser: &Fuser, tensors: usize, stagger: bool) -> usize {
    enum H {
        F32(FusedWork<f32>, usize),
        I32(FusedWork<i32>, usize),
        F16(FusedWork<f16>, usize),
        F64(FusedWork<f64>, usize),
    }
    let mut handles = Vec::new();
    for t in 0..tensors {
        if stagger && (t + rank).is_multiple_of(5) {
            std::thread::sleep(Duration::from_micros(300 * (rank as u64 + 1)));
        }
        let n = len(t);
        let h = match (t / 3) % 4 {
            0 => H::F32(fuser.all_reduce((0..n).map(|i| value(rank, t, i) as f32).collect(), ReduceOp::Sum), t),
            1 => H::I32(fuser.all_reduce((0..n).map(|i| value(rank, t, i) as i32).collect(), ReduceOp::Sum), t),
            2 => H::F16(
                fuser.all_reduce((0..n).map(|i| f16::from_f32(value(rank, t, i) as f32)).collect(), ReduceOp::Sum),
                t,
            ),
            _ => H::F64(fuser.all_reduce((0..n).map(|i| value(rank, t, i) as f64).collect(), ReduceOp::Sum), t),
        };
        handles.push(h);
    }
    fuser.flush();
    let mut checked = 0;
    for h in handles {
        let (got, t): (Vec<i64>, usize) = match h {
            H::F32(w, t) => (w.wait().unwrap().iter().map(|&x| x as i64).collect(), t),
            H::I32(w, t) => (w.wait().unwrap().iter().map(|&x| x as i64).collect(), t),
            H::F16(w, t) => (w.wait().unwrap().iter().map(|x| x.to_f32() as i64).collect(), t),
            H::F64(w, t) => (w.wait().unwrap().iter().map(|&x| x as i64).collect(), t),
        };
        let want: Vec<i64> = (0..len(t)).map(|i| summed(world, t, i)).collect();
        assert_eq!(got, want, "rank {rank}: tensor {t}");
        checked += 1;
    }
    checked
}

#[test]
fn mixed_tensors_reduce_exactly_for_every_world_and_threshold() {
    for world in [1, 2, 3, 4] {
        for (threshold, cycle) in [(0, 0), (1 << 10, 0), (16 << 10, 1), (64 << 20, 1), (64 << 20, 50)] {
            let cfg = FusionConfig {
                threshold_bytes: threshold,
                cycle: Duration::from_millis(cycle),
                ..FusionConfig::default()
            };
            let counts = on_ranks(world, cfg, move |rank, f| mixed_round_trip(rank, world, f, 40, false));
            assert_eq!(counts, vec![40; world], "world {world} threshold {threshold}");
        }
    }
}

#[test]
fn ranks_that_submit_at_different_times_still_agree() {
    for world in [2, 3] {
        let cfg =
            FusionConfig { threshold_bytes: 8 << 10, cycle: Duration::from_micros(200), ..FusionConfig::default() };
        let counts = on_ranks(world, cfg, move |rank, f| mixed_round_trip(rank, world, f, 60, true));
        assert_eq!(counts, vec![60; world]);
    }
}

#[test]
fn avg_and_max_buckets_apart_from_sums() {
    let world = 3;
    let out = on_ranks(world, FusionConfig::default(), move |rank, f| {
        let r = rank as f32;
        let a = f.all_reduce(vec![r * 3.0; 5], ReduceOp::Avg);
        let m = f.all_reduce(vec![r, 10.0 - r], ReduceOp::Max);
        let s = f.all_reduce(vec![1i64; 7], ReduceOp::Sum);
        f.flush();
        (a.wait().unwrap(), m.wait().unwrap(), s.wait().unwrap())
    });
    for (a, m, s) in out {
        assert_eq!(a, vec![3.0; 5]);
        assert_eq!(m, vec![2.0, 10.0]);
        assert_eq!(s, vec![3i64; 7]);
    }
}

#[test]
fn requests_left_at_drop_complete_and_the_communicator_comes_back() {
    let out = on_ranks(
        2,
        FusionConfig { threshold_bytes: 64 << 20, cycle: Duration::from_secs(3600), ..FusionConfig::default() },
        |rank, f| {
            // No flush and an hour's cycle: only stopping the fuser negotiates these.
            let w = f.all_reduce(vec![rank as i32 + 1; 9], ReduceOp::Sum);
            (w, rank)
        },
    );
    // The fusers were dropped at the end of each rank's body, finishing the request.
    for (w, _) in out {
        assert_eq!(w.wait().unwrap(), vec![3; 9]);
    }
    let sums = on_ranks(2, FusionConfig::default(), |rank, f| {
        let w = f.all_reduce(vec![rank as u8; 4], ReduceOp::Sum);
        f.flush();
        let got = w.wait().unwrap();
        // Safe to use the communicator directly once every handle is waited on.
        let mut more = vec![rank as i32; 3];
        f.communicator().all_reduce_in_place(&mut more, ReduceOp::Sum).unwrap();
        (got, more)
    });
    for (got, more) in sums {
        assert_eq!(got, vec![1u8; 4]);
        assert_eq!(more, vec![1; 3]);
    }
}

#[test]
fn a_full_bucket_runs_without_a_flush_or_the_cycle() {
    // An hour's cycle and no flush: only filling the bucket makes a batch due.
    // The fuser's thread sleeps between requests and is woken by the submission
    // that fills the bucket, whether it came first, in the middle or last.
    let cfg = FusionConfig { threshold_bytes: 8 << 10, cycle: Duration::from_secs(3600), ..FusionConfig::default() };
    let out = on_ranks(2, cfg, |rank, f| {
        let mut results = Vec::new();
        // Element counts of i32 tensors per batch: 9 KiB at once; then 4, 2 and
        // 3 KiB; then many small ones up to the bucket.
        for batch in [vec![2304], vec![1024, 512, 768], vec![64; 32]] {
            let works: Vec<FusedWork<i32>> = batch
                .iter()
                .map(|&n| {
                    // Time for the fuser's thread to take the request and sleep again.
                    std::thread::sleep(Duration::from_millis(5));
                    f.all_reduce(vec![rank as i32 + 1; n], ReduceOp::Sum)
                })
                .collect();
            for mut w in works {
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while !w.test() {
                    assert!(std::time::Instant::now() < deadline, "rank {rank}: a full bucket did not run");
                    std::thread::sleep(Duration::from_millis(1));
                }
                results.push(w.wait().unwrap());
            }
        }
        results
    });
    for results in out {
        let lens: Vec<usize> = results.iter().map(Vec::len).collect();
        assert_eq!(lens, [vec![2304], vec![1024, 512, 768], vec![64; 32]].concat());
        assert!(results.iter().all(|r| r.iter().all(|&x| x == 3)));
    }
}

#[test]
fn into_communicator_finishes_requests_first() {
    let comms = Communicator::in_process(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rank = c.rank() as i64;
                let f = Fuser::new(
                    c,
                    FusionConfig {
                        threshold_bytes: 1 << 20,
                        cycle: Duration::from_secs(3600),
                        ..FusionConfig::default()
                    },
                );
                let w = f.all_reduce(vec![rank; 2], ReduceOp::Sum);
                let comm = f.into_communicator();
                let mut v = [rank * 10];
                comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                (w.wait().unwrap(), v[0])
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), (vec![1i64; 2], 10));
    }
}

#[test]
fn different_layouts_of_one_size_fail_on_every_rank_without_hanging() {
    // Same dtype and total bytes, other split: one bucket of 12 floats on both
    // ranks, which without the layout check would reduce tensor halves into each
    // other silently.
    let out = on_ranks(
        2,
        FusionConfig { threshold_bytes: 1 << 20, cycle: Duration::from_secs(3600), ..FusionConfig::default() },
        |rank, f| {
            let sizes = if rank == 0 { [4, 8] } else { [8, 4] };
            let ws: Vec<_> = sizes.iter().map(|&n| f.all_reduce(vec![1.0f32; n], ReduceOp::Sum)).collect();
            f.flush();
            let results: Vec<Result<Vec<f32>>> = ws.into_iter().map(FusedWork::wait).collect();
            // Later requests fail at once with the same cause.
            let later = f.all_reduce(vec![1.0f32; 1], ReduceOp::Sum).wait();
            (results, later)
        },
    );
    for (results, later) in out {
        for r in results {
            let e = r.expect_err("mismatched layouts must fail");
            assert!(e.to_string().contains("layout"), "{e}");
        }
        assert!(later.is_err());
    }
}

#[test]
fn config_reads_the_environment_forms() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    assert_eq!(FusionConfig::from_vars(vars(&[])).unwrap(), FusionConfig::default());
    let off = FusionConfig::from_vars(vars(&[("BRAID_FUSION_BYTES", "0"), ("BRAID_FUSION_CYCLE", "0")])).unwrap();
    assert_eq!(off, FusionConfig { threshold_bytes: 0, cycle: Duration::ZERO, ..FusionConfig::default() });
    let set = FusionConfig::from_vars(vars(&[("BRAID_FUSION_BYTES", "4M"), ("BRAID_FUSION_CYCLE", "5ms")])).unwrap();
    assert_eq!(
        set,
        FusionConfig { threshold_bytes: 4 << 20, cycle: Duration::from_millis(5), ..FusionConfig::default() }
    );
    let bad = FusionConfig::from_vars(vars(&[("BRAID_FUSION_BYTES", "lots")])).unwrap_err();
    assert!(bad.to_string().contains("BRAID_FUSION_BYTES"), "{bad}");
    let half = FusionConfig::from_vars(vars(&[("BRAID_FUSION_COMPRESSION", "bf16")])).unwrap();
    assert_eq!(half.compression, Compression::Bf16);
    assert!(FusionConfig::from_vars(vars(&[("BRAID_FUSION_COMPRESSION", "zip")])).is_err());
    let bad = FusionConfig::from_vars(vars(&[("BRAID_FUSION_CYCLE", "soon")])).unwrap_err();
    assert!(bad.to_string().contains("BRAID_FUSION_CYCLE"), "{bad}");
}

#[test]
fn byte_level_async_calls_run_in_issue_order_with_any_dtype() {
    // The form fusion's callers of mixed dtypes build on: two async byte calls of
    // different dtypes, issued back to back, then a typed sync call.
    let comms = Communicator::in_process(3).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let r = c.rank() as i64;
                let ints: Vec<u8> = bytemuck::cast_slice(&[r, 2 * r, -r]).to_vec();
                let halves: Vec<u8> = bytemuck::cast_slice(&[f16::from_f32(r as f32); 5]).to_vec();
                let a =
                    c.collective_bytes_async(CallSig::new(OpKind::AllReduce, DType::I64, 3, 0, ReduceOp::Sum), ints);
                let b =
                    c.collective_bytes_async(CallSig::new(OpKind::AllReduce, DType::F16, 5, 0, ReduceOp::Max), halves);
                let mut last = [r as i32];
                c.all_reduce_in_place(&mut last, ReduceOp::Sum).unwrap();
                let a: Vec<i64> =
                    a.wait().unwrap().chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
                let b: Vec<f16> = b.wait().unwrap().chunks(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect();
                (a, b, last[0])
            })
        })
        .collect();
    for t in threads {
        let (a, b, last) = t.join().unwrap();
        assert_eq!(a, vec![3, 6, -3]);
        assert_eq!(b, vec![f16::from_f32(2.0); 5]);
        assert_eq!(last, 3);
    }
}

#[test]
fn compressed_buckets_carry_halves_and_leave_other_buckets_alone() {
    for compression in [Compression::F16, Compression::Bf16] {
        let cfg = FusionConfig { compression, ..FusionConfig::default() };
        let out = on_ranks(3, cfg, |rank, f| {
            // Small integers and halves: exact in f16 and bf16, sums too.
            let sums = f.all_reduce((0..300).map(|i| ((i % 7) as f32) * 0.5 + rank as f32).collect(), ReduceOp::Sum);
            let avg = f.all_reduce(vec![rank as f32 * 3.0; 5], ReduceOp::Avg);
            let max = f.all_reduce(vec![1.0e-3 + rank as f32; 2], ReduceOp::Max);
            let wide = f.all_reduce(vec![1.0e-3 + rank as f64; 2], ReduceOp::Sum);
            f.flush();
            let got = (sums.wait().unwrap(), avg.wait().unwrap(), max.wait().unwrap(), wide.wait().unwrap());
            // Not a half value: it comes back rounded, so the halves did travel.
            let lossy = f.all_reduce(vec![0.1001f32; 4], ReduceOp::Sum);
            f.flush();
            (got, lossy.wait().unwrap())
        });
        for ((sums, avg, max, wide), lossy) in out {
            for x in lossy {
                assert!(x != 0.3003 && (x - 0.3003).abs() < 0.3003 * 0.01, "{compression:?}: {x}");
            }
            let want: Vec<f32> = (0..300).map(|i| ((i % 7) as f32) * 1.5 + 3.0).collect();
            assert_eq!(sums, want, "{compression:?}");
            assert_eq!(avg, vec![3.0; 5]);
            // Max and f64 buckets are not compressed: 1e-3 survives exactly.
            assert_eq!(max, vec![2.001; 2]);
            let exact: f64 = (0..3).map(|r| 1.0e-3 + r as f64).sum();
            assert_eq!(wide, vec![exact; 2]);
        }
    }
}

#[test]
fn ranks_that_disagree_on_compression_fail_instead_of_mixing() {
    let comms = Communicator::in_process(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let compression = if c.rank() == 0 { Compression::F16 } else { Compression::None };
                let f = Fuser::new(c, FusionConfig { compression, ..FusionConfig::default() });
                let w = f.all_reduce(vec![1.0f32; 64], ReduceOp::Sum);
                f.flush();
                w.wait()
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap().is_err());
    }
}

/// Pipelined packing's configurations: pieces far smaller than a bucket, about one
/// tensor, larger than every bucket (the unpipelined path), and the two named ones
/// (in process, `Auto` is off).
const PIPELINES: [(usize, Pipeline); 6] = [
    (64 << 10, Pipeline::Pieces(1)),
    (64 << 10, Pipeline::Pieces(4 << 10)),
    (1 << 20, Pipeline::Pieces(16 << 10)),
    (8 << 10, Pipeline::Pieces(1 << 20)),
    (1 << 20, Pipeline::Auto),
    (1 << 20, Pipeline::Off),
];

#[test]
fn pipelined_pieces_reduce_exactly_for_every_world() {
    for world in [1, 2, 3, 4] {
        for (threshold, pipeline) in PIPELINES {
            let cfg = FusionConfig { threshold_bytes: threshold, pipeline, ..FusionConfig::default() };
            let counts = on_ranks(world, cfg, move |rank, f| {
                // Twice: the piece buffers are reused across batches.
                mixed_round_trip(rank, world, f, 70, false) + mixed_round_trip(rank, world, f, 35, true)
            });
            assert_eq!(counts, vec![105; world], "world {world} threshold {threshold} {pipeline:?}");
        }
    }
}

/// Two ranks whose fusers differ in (bucket bytes, pipelining) submit the same
/// 40 tensors; the results of each rank.
fn with_settings(a: (usize, Pipeline), b: (usize, Pipeline)) -> Vec<Vec<Result<Vec<i32>>>> {
    let comms = Communicator::in_process(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let (threshold_bytes, pipeline) = if c.rank() == 0 { a } else { b };
            std::thread::spawn(move || {
                let f = Fuser::new(c, FusionConfig { threshold_bytes, pipeline, ..FusionConfig::default() });
                let ws: Vec<_> = (0..40).map(|t| f.all_reduce(vec![1i32; 1000 + t], ReduceOp::Sum)).collect();
                f.flush();
                ws.into_iter().map(FusedWork::wait).collect::<Vec<_>>()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn ranks_that_ask_for_different_pieces_agree_on_the_largest() {
    let big = 1 << 20;
    for (a, b) in [(Pipeline::Pieces(4 << 10), Pipeline::Off), (Pipeline::Auto, Pipeline::Pieces(20 << 10))] {
        for results in with_settings((big, a), (big, b)) {
            for (t, r) in results.into_iter().enumerate() {
                assert_eq!(r.unwrap(), vec![2; 1000 + t], "{a:?} against {b:?}");
            }
        }
    }
}

#[test]
fn ranks_with_different_bucket_sizes_fail_on_every_rank_without_hanging() {
    // Same tensors, other cuts: without the bucket size in the fingerprint, the
    // ranks' calls would differ in size (a mismatch, but not named as the layout).
    for results in with_settings((1 << 20, Pipeline::Off), (16 << 10, Pipeline::Off)) {
        for r in results {
            let e = r.expect_err("different cuts must fail");
            assert!(e.to_string().contains("layout") && e.to_string().contains("BRAID_FUSION_BYTES"), "{e}");
        }
    }
}

#[test]
fn a_peer_that_leaves_mid_pipeline_fails_every_request_without_hanging() {
    // Rank 1 plays the fuser's part by hand up to the first piece, then aborts:
    // rank 0 has later pieces in flight on its worker and must answer them all.
    let (threshold, piece) = (1 << 20, 8 << 10);
    // An hour's cycle: only the flush negotiates, so the batch holds all 24 requests
    // however slowly they are submitted (with the default 1 ms a loaded machine cut
    // it after 20, and the leaver's hand-made layout no longer matched).
    let cfg = FusionConfig {
        threshold_bytes: threshold,
        cycle: Duration::from_secs(3600),
        pipeline: Pipeline::Pieces(piece),
        ..FusionConfig::default()
    };
    let sizes: Vec<usize> = (0..24).map(|t| 1000 + t).collect();
    let entries: Vec<Entry> =
        sizes.iter().map(|&n| Entry { dtype: DType::I32, op: ReduceOp::Sum, bytes: n * 4 }).collect();
    let entries0 = entries.clone();
    let mut comms = Communicator::in_process(2).unwrap();
    let c1 = comms.pop().unwrap();
    let c0 = comms.pop().unwrap();
    let leaver = std::thread::spawn(move || {
        let mut agreed = [entries.len() as i64, -(piece as i64)];
        c1.all_reduce_in_place(&mut agreed, ReduceOp::Min).unwrap();
        assert_eq!(agreed, [entries.len() as i64, -(piece as i64)]);
        let fp = plan::fingerprint_with(&entries, &[threshold as u64]);
        let mut seen = [fp, -fp];
        c1.all_reduce_in_place(&mut seen, ReduceOp::Min).unwrap();
        assert_eq!(seen, [fp, -fp], "the hand-made layout matches the fuser's");
        let first = plan::buckets(&entries, piece)[0].clone();
        let mut part = vec![1i32; entries[first].iter().map(|e| e.bytes / 4).sum()];
        c1.all_reduce_in_place(&mut part, ReduceOp::Sum).unwrap();
        c1.abort();
    });
    let f = Fuser::new(c0, cfg);
    let ws: Vec<_> = sizes.iter().map(|&n| f.all_reduce(vec![1i32; n], ReduceOp::Sum)).collect();
    f.flush();
    let results: Vec<Result<Vec<i32>>> = ws.into_iter().map(FusedWork::wait).collect();
    leaver.join().unwrap();
    // The first piece may have finished before the abort (exactly); every later
    // one failed, and nothing came back wrong.
    let first = plan::buckets(&entries0, piece)[0].len();
    assert!(first < results.len(), "the test needs more than one piece");
    for (t, r) in results.iter().enumerate() {
        match r {
            Ok(v) => assert!(t < first && v.iter().all(|&x| x == 2), "tensor {t}: {:?}", &v[..3]),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    assert!(results[first..].iter().all(Result::is_err));
    assert!(f.all_reduce(vec![1i32; 3], ReduceOp::Sum).wait().is_err(), "later requests fail too");
}

#[test]
fn pipeline_setting_reads_its_forms() {
    for (v, want) in [
        ("auto", Pipeline::Auto),
        ("0", Pipeline::Off),
        ("off", Pipeline::Off),
        ("1M", Pipeline::Pieces(1 << 20)),
        ("4096", Pipeline::Pieces(4096)),
    ] {
        let cfg = FusionConfig::from_vars(|k| (k == "BRAID_FUSION_PIPELINE").then(|| v.to_string())).unwrap();
        assert_eq!(cfg.pipeline, want, "{v}");
    }
    let bad = FusionConfig::from_vars(|k| (k == "BRAID_FUSION_PIPELINE").then(|| "soon".to_string())).unwrap_err();
    assert!(bad.to_string().contains("BRAID_FUSION_PIPELINE"), "{bad}");
    assert_eq!(FusionConfig::default().pipeline, Pipeline::Auto);
}
