use std::path::PathBuf;

use super::checkpoint::{decode, encode, read_capped};
use super::*;
use crate::comm::Communicator;

/// A least-squares linear model over a fixed synthetic set: 3 weights and a bias.
const FEATURES: usize = 3;
pub(super) const EXAMPLES: usize = 24;

fn example(i: usize) -> ([f32; FEATURES], f32) {
    let x = [(i % 5) as f32 * 0.5, (i % 3) as f32 - 1.0, ((i * 7) % 11) as f32 * 0.1];
    (x, 2.0 * x[0] - x[1] + 0.5 * x[2] + 0.25)
}

pub(super) fn init() -> Tensors {
    vec![vec![0.1, -0.2, 0.3], vec![0.0]]
}

/// Gradient sums of squared error over the replica's share of batch `b`.
fn grads_of(batch_start: usize) -> impl Fn(&Replica<'_>) -> Gradients + Sync {
    move |r: &Replica<'_>| {
        let (w, b) = (&r.vars[0], r.vars[1][0]);
        let mut g = Gradients { grads: vec![vec![0.0; FEATURES], vec![0.0]], loss: 0.0 };
        for i in r.batch.clone() {
            let (x, y) = example(batch_start + i);
            let err = w.iter().zip(&x).map(|(w, x)| w * x).sum::<f32>() + b - y;
            for (gk, xk) in g.grads[0].iter_mut().zip(&x) {
                *gk += 2.0 * err * xk;
            }
            g.grads[1][0] += 2.0 * err;
            g.loss += f64::from(err * err);
        }
        g
    }
}

fn sgd(vars: &mut Tensors, grads: &Tensors) {
    for (v, g) in vars.iter_mut().flatten().zip(grads.iter().flatten()) {
        *v -= 0.05 * g;
    }
}

/// Train `epochs` over the set in global batches of `batch` (the last one short).
fn train(s: &mut dyn Strategy, epochs: usize, batch: usize) -> Vec<f64> {
    let mut losses = Vec::new();
    for _ in 0..epochs {
        for start in (0..EXAMPLES).step_by(batch) {
            let n = batch.min(EXAMPLES - start);
            losses.push(s.step(n, &grads_of(start), &sgd).expect("step"));
        }
    }
    losses
}

/// For other strategies' tests: the gradients of the batch starting at `start`,
/// the update, and the one-device run they are compared with.
pub(super) fn example_grads(start: usize) -> impl Fn(&Replica<'_>) -> Gradients + Sync {
    grads_of(start)
}
pub(super) fn sgd_step(vars: &mut Tensors, grads: &Tensors) {
    sgd(vars, grads)
}
pub(super) fn one_device_run(epochs: usize, batch: usize) -> (Tensors, Vec<f64>) {
    reference(epochs, batch)
}

fn max_diff(a: &Tensors, b: &Tensors) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn reference(epochs: usize, batch: usize) -> (Tensors, Vec<f64>) {
    let mut one = OneDevice::new(init());
    let losses = train(&mut one, epochs, batch);
    (one.variables().clone(), losses)
}

#[test]
fn split_batch_is_contiguous_and_even() {
    assert_eq!(split_batch(10, 4), vec![0..3, 3..6, 6..8, 8..10]);
    assert_eq!(split_batch(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
    assert_eq!(split_batch(5, 0), vec![0..5]);
}

#[test]
fn synchronous_strategies_match_one_device() {
    // A batch of 7 does not divide by 2 or 4: uneven shares must still give the
    // one-device update (sums, then one division by the global batch).
    let (want, want_losses) = reference(5, 7);
    let mut cases: Vec<Box<dyn Strategy>> = Vec::new();
    for n in [1, 2, 3, 4] {
        cases.push(Box::new(Mirrored::new(n, init(), CrossReplica::AllReduce).unwrap()));
        cases.push(Box::new(CentralStorage::new(n, init()).unwrap()));
    }
    cases.push(Box::new(Mirrored::new(4, init(), CrossReplica::Hierarchical).unwrap()));
    cases.push(Box::new(Mirrored::new(3, init(), CrossReplica::ReduceBroadcast).unwrap()));
    for mut s in cases {
        let losses = train(s.as_mut(), 5, 7);
        let d = max_diff(s.variables(), &want);
        assert!(d <= 1e-5, "{} with {} replicas: weights differ by {d}", s.name(), s.num_replicas_in_sync());
        for (a, b) in losses.iter().zip(&want_losses) {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{}: loss {a} against {b}", s.name());
        }
    }
}

#[test]
fn multi_worker_replicas_match_one_device() {
    let (want, _) = reference(5, 8);
    for n in [1, 2, 4] {
        let comms = Communicator::in_process(n).unwrap();
        let threads: Vec<_> = comms
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    let mut s = MultiWorkerMirrored::new(c, init()).unwrap();
                    assert_eq!(s.num_replicas_in_sync(), n);
                    train(&mut s, 5, 8);
                    let mean = s.reduce(Reduction::Mean, &[s.local_replicas().start as f64]).unwrap();
                    (s.variables().clone(), mean)
                })
            })
            .collect();
        for t in threads {
            let (vars, mean) = t.join().unwrap();
            assert!(max_diff(&vars, &want) <= 1e-5, "{n} workers");
            assert_eq!(mean, (n - 1) as f64 / 2.0);
        }
    }
}

#[test]
fn replicas_start_from_replica_zero_and_reduce_values() {
    let mut m = Mirrored::new(3, init(), CrossReplica::AllReduce).unwrap();
    assert_eq!(m.reduce(Reduction::Sum, &[1.0, 2.0, 4.0]).unwrap(), 7.0);
    assert_eq!(m.reduce(Reduction::Mean, &[1.0, 2.0, 6.0]).unwrap(), 3.0);
    assert!(m.reduce(Reduction::Sum, &[1.0]).is_err());
    let new = vec![vec![1.0, 2.0, 3.0], vec![4.0]];
    m.set_variables(new.clone()).unwrap();
    assert_eq!(m.variables(), &new);
    assert!(m.set_variables(vec![vec![1.0]]).is_err());
}

#[test]
fn a_step_with_misshaped_gradients_fails_on_every_replica() {
    let mut m = Mirrored::new(2, init(), CrossReplica::AllReduce).unwrap();
    let bad = |r: &Replica<'_>| Gradients {
        grads: if r.id == 0 { vec![vec![0.0; 2]] } else { vec![vec![0.0; 3], vec![0.0]] },
        loss: 0.0,
    };
    assert!(m.step(4, &bad, &sgd).is_err());
    let mut c = CentralStorage::new(2, init()).unwrap();
    assert!(c.step(4, &bad, &sgd).is_err());
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("braid-ckpt-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("model.ckpt")
}

#[test]
fn checkpoints_round_trip_and_resume() {
    let path = temp("resume");
    let (want, _) = reference(4, 6);
    // Two epochs, save, then a fresh strategy restores and trains two more.
    let mut a = Mirrored::new(2, init(), CrossReplica::AllReduce).unwrap();
    train(&mut a, 2, 6);
    a.save(&path, 2).unwrap();
    let mut b = Mirrored::new(2, init(), CrossReplica::AllReduce).unwrap();
    assert_eq!(b.restore(&path).unwrap(), 2);
    train(&mut b, 2, 6);
    assert!(max_diff(b.variables(), &want) <= 1e-5);
    // A model of other shapes refuses it.
    let mut other = OneDevice::new(vec![vec![0.0; 2]]);
    assert!(other.restore(&path).unwrap_err().to_string().contains("lengths"));
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn damaged_checkpoints_are_refused() {
    let good = encode(&Checkpoint { epoch: 3, vars: vec![vec![1.0, 2.0], vec![], vec![3.5]] });
    assert_eq!(decode(&good, "t").unwrap().vars, vec![vec![1.0, 2.0], vec![], vec![3.5]]);
    assert!(decode(b"hello", "t").is_err());
    for cut in 0..good.len() {
        assert!(decode(&good[..cut], "t").is_err(), "truncated at {cut}");
    }
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x40;
        assert!(decode(&bad, "t").is_err(), "flipped byte {i}");
    }
    // A huge tensor count or length with a matching checksum: refused before allocating.
    for (at, value) in [(19 + 8, u64::MAX), (19 + 16, u64::MAX / 2)] {
        let mut lie = good[..good.len() - 8].to_vec();
        lie[at..at + 8].copy_from_slice(&value.to_le_bytes());
        let sum = lie.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        lie.extend_from_slice(&sum.to_le_bytes());
        let e = decode(&lie, "t").unwrap_err().to_string();
        assert!(e.contains("tensors") || e.contains("lengths"), "{e}");
    }
}

#[test]
fn saving_never_follows_a_symlink_planted_at_a_temporary_name() {
    let path = temp("symlink");
    let dir = path.parent().unwrap().to_path_buf();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    // The name saves used to write through first, predictable from the pid.
    std::os::unix::fs::symlink(&victim, path.with_extension(format!("tmp{}", std::process::id()))).unwrap();
    let c = Checkpoint { epoch: 1, vars: vec![vec![1.0, 2.0]] };
    write_checkpoint(&path, &c).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "the symlink's target was written");
    assert!(std::fs::symlink_metadata(&path).unwrap().is_file(), "the checkpoint is a file of its own");
    assert_eq!(read_checkpoint(&path, None).unwrap(), c);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn threads_saving_paths_that_differ_by_extension_each_keep_their_own() {
    let dir = temp("extensions").parent().unwrap().to_path_buf();
    // `a.ckpt` and `a.bin` used to share the temporary `a.tmpPID`, which is also
    // the third path.
    let paths = ["a.ckpt".to_string(), "a.bin".to_string(), format!("a.tmp{}", std::process::id())];
    let barrier = std::sync::Barrier::new(paths.len());
    // Failures are collected, not raised: a thread that stopped would leave the
    // others waiting at the barrier.
    let failures: Vec<String> = std::thread::scope(|s| {
        let threads: Vec<_> = (paths.iter().enumerate())
            .map(|(t, name)| {
                let (path, barrier) = (dir.join(name), &barrier);
                s.spawn(move || {
                    let mut failures = Vec::new();
                    for epoch in 0..60u64 {
                        let c = Checkpoint { epoch, vars: vec![vec![t as f32; 1 + t], vec![epoch as f32]] };
                        barrier.wait();
                        let saved = write_checkpoint(&path, &c);
                        barrier.wait();
                        match saved.and_then(|()| read_checkpoint(&path, None)) {
                            Ok(back) if back == c => {}
                            Ok(back) => failures.push(format!("{name}, epoch {epoch}: read back {back:?}")),
                            Err(e) => failures.push(format!("{name}, epoch {epoch}: {e}")),
                        }
                    }
                    failures
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "{} of 180 saves failed, first: {}", failures.len(), failures[0]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn reading_refuses_fifos_devices_and_files_past_the_cap() {
    let path = temp("sources");
    let dir = path.parent().unwrap().to_path_buf();
    // A FIFO with no writer: opening it to read used to block for good.
    let fifo = dir.join("fifo.ckpt");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reading = fifo.clone();
    std::thread::spawn(move || tx.send(read_checkpoint(&reading, None).map(|_| ())));
    let e = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("reading a FIFO hung").unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    // Longer than the model's tensors make: refused from its size, before reading
    // (a sparse file: nothing is written to disk).
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(64 << 20).unwrap();
    let like = vec![vec![0.0f32; 2]];
    let e = read_checkpoint(&path, Some(&like)).unwrap_err().to_string();
    assert!(e.contains("67108864 bytes, more than 59 bytes") && e.contains("lengths [2]"), "{e}");
    let e = read_capped(&path, 1024, &|| "a test's cap".into()).unwrap_err().to_string();
    assert!(e.contains("more than 1024 bytes (a test's cap)"), "{e}");
    // A device that never ends.
    let e = read_capped(std::path::Path::new("/dev/zero"), 1024, &|| "a test's cap".into()).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    // A file within the cap reads whole.
    std::fs::write(&path, [7u8; 1024]).unwrap();
    assert_eq!(read_capped(&path, 1024, &|| "a test's cap".into()).unwrap(), vec![7u8; 1024]);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Run a parameter-server job of `servers + workers` rank threads: servers serve,
/// workers train `epochs`; each worker's final pulled variables, and each
/// server's report. `quit_after` makes worker 1 go silent after that many steps.
fn ps_job(
    servers: usize,
    workers: usize,
    epochs: usize,
    staleness: Option<u64>,
    quit_after: Option<usize>,
) -> (Vec<Tensors>, Vec<ServeReport>) {
    let mut cfg = crate::Config::new(0, servers + workers);
    cfg.timeout = std::time::Duration::from_secs(2);
    let comms = Communicator::in_process_with(cfg).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let mut p = ParameterServer::new(c, servers, init(), staleness).unwrap();
                if p.is_server() {
                    return (None, Some(p.serve(&sgd).unwrap()));
                }
                let w = p.local_replicas().start;
                let mut steps = 0;
                for _ in 0..epochs {
                    for start in (0..EXAMPLES).step_by(8) {
                        if w == 1 && quit_after == Some(steps) {
                            // Silent from here on, links left open: only the
                            // servers' deadline notices.
                            std::mem::forget(p);
                            return (None, None);
                        }
                        p.step(8, &grads_of(start), &sgd).unwrap();
                        steps += 1;
                    }
                }
                p.sync().unwrap();
                (Some(p.variables().clone()), None)
            })
        })
        .collect();
    let (mut vars, mut reports) = (Vec::new(), Vec::new());
    for t in threads {
        let (v, r) = t.join().unwrap();
        vars.extend(v);
        reports.extend(r);
    }
    (vars, reports)
}

fn loss_of(vars: &Tensors) -> f64 {
    let all = Replica { id: 0, replicas: 1, batch: 0..EXAMPLES, vars };
    grads_of(0)(&all).loss / EXAMPLES as f64
}

#[test]
fn parameter_servers_train_asynchronous_workers() {
    let start = loss_of(&init());
    for (servers, workers, staleness) in [(1, 1, None), (1, 3, None), (2, 3, Some(1))] {
        let (vars, reports) = ps_job(servers, workers, 30, staleness, None);
        assert_eq!(vars.len(), workers);
        for r in &reports {
            assert_eq!(r.finished, (0..workers).collect::<Vec<_>>());
            assert!(r.lost.is_empty());
        }
        // Each worker's last pull (others may still have been pushing) learned.
        for v in &vars {
            let end = loss_of(v);
            assert!(end < start / 5.0, "{servers} servers, {workers} workers: loss {start} -> {end}");
        }
    }
}

#[test]
fn a_silent_worker_is_dropped_and_the_others_finish() {
    let start = loss_of(&init());
    // Worker 1 stops after 2 steps; with a staleness bound of 1 the others would
    // wait for it forever, until the servers' deadline drops it.
    let (vars, reports) = ps_job(1, 3, 10, Some(1), Some(2));
    assert_eq!(vars.len(), 2);
    assert_eq!(reports[0].lost, vec![1]);
    assert_eq!(reports[0].finished, vec![0, 2]);
    assert!(loss_of(&vars[0]) < start / 10.0);
}

#[test]
fn parameter_server_roles_refuse_the_other_roles_calls() {
    let comms = Communicator::in_process(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let mut p = ParameterServer::new(c, 1, init(), None).unwrap();
                if p.is_server() {
                    assert!(p.step(4, &grads_of(0), &sgd).is_err());
                    assert!(p.set_variables(vec![vec![0.0]]).is_err());
                    p.serve(&sgd).unwrap()
                } else {
                    assert!(p.serve(&sgd).is_err());
                    assert!(p.set_variables(init()).is_err());
                    assert!(p.reduce(Reduction::Sum, &[1.0]).is_err());
                    p.finish().unwrap();
                    ServeReport { finished: vec![], lost: vec![] }
                }
            })
        })
        .collect();
    let reports: Vec<ServeReport> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(reports[0].finished, vec![0]);
    assert!(ParameterServer::new(Communicator::in_process(1).unwrap().remove(0), 1, init(), None).is_err());
}

#[test]
fn the_staleness_bound_gives_way_after_half_the_deadline() {
    // A worker that says it is at step 1,000,000 under a staleness bound of 1 waits
    // for a slowest worker (itself, at 0 pushes) that never catches up: the bound
    // holds it for half the link's deadline, then lets it go, so neither it nor the
    // server waits forever.
    let mut cfg = crate::Config::new(0, 2);
    cfg.timeout = std::time::Duration::from_millis(400);
    let comms = Communicator::in_process_with(cfg).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let mut p = ParameterServer::new(c, 1, init(), Some(1)).unwrap();
                if p.is_server() {
                    return (Some(p.serve(&sgd).unwrap()), None);
                }
                p.steps = 1_000_000;
                let t = std::time::Instant::now();
                p.step(8, &grads_of(0), &sgd).unwrap();
                (None, Some(t.elapsed()))
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let report = results.iter().find_map(|r| r.0.clone()).unwrap();
    assert_eq!(report, ServeReport { finished: vec![0], lost: vec![] });
    let held = results.iter().find_map(|r| r.1).unwrap();
    assert!(held >= std::time::Duration::from_millis(200), "held only {held:?}");
}
