//! Issue 20's acceptance on the real digits data: every synchronous strategy with
//! 1, 2 and 4 replicas ends 5 epochs with the one-device weights (max abs
//! difference 1e-5), 20 epochs reach 0.93 test accuracy (0.90 for parameter
//! servers), the example program trains across processes and resumes from its
//! checkpoint, and a parameter-server worker that crashes leaves the others
//! training to the end.

#[path = "../examples/digits/mlp.rs"]
mod mlp;

use std::path::PathBuf;
use std::process::Command;

use braid::strategy::{
    CentralStorage, CrossReplica, Mirrored, Momentum, MultiWorkerMirrored, OneDevice, Sharded, Strategy, Tensors,
};
use braid::Communicator;

const SEED: u64 = 7;
const BATCH: usize = 32;
const LR: f32 = 0.1;

fn data() -> (mlp::Data, mlp::Data) {
    let all = mlp::load(&mlp::default_path()).expect("digits data");
    assert_eq!((all.len(), all.x.ncols()), (1797, 64));
    mlp::split(&all, SEED)
}

fn fit(s: &mut dyn Strategy, d: &(mlp::Data, mlp::Data), epochs: u64) -> (Tensors, mlp::Epoch) {
    let plan = mlp::Schedule { from: 0, epochs, global_batch: BATCH, seed: SEED, lr: LR };
    let last = mlp::train(s, (&d.0, &d.1), plan, |_, _| Ok(())).expect("training");
    (s.variables().clone(), last)
}

fn max_diff(a: &Tensors, b: &Tensors) -> f32 {
    assert_eq!(a.iter().map(Vec::len).collect::<Vec<_>>(), b.iter().map(Vec::len).collect::<Vec<_>>());
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// One-process-per-replica strategies (made by `make`), as threads over one
/// in-process communicator each.
fn per_process<S: Strategy>(
    n: usize,
    d: &(mlp::Data, mlp::Data),
    epochs: u64,
    make: impl Fn(Communicator) -> S + Sync,
) -> Vec<(Tensors, mlp::Epoch)> {
    let comms = Communicator::in_process(n).expect("communicators");
    let make = &make;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || fit(&mut make(c), d, epochs))).collect();
        hs.into_iter().map(|h| h.join().expect("worker")).collect()
    })
}

fn multi_worker(n: usize, d: &(mlp::Data, mlp::Data), epochs: u64) -> Vec<(Tensors, mlp::Epoch)> {
    per_process(n, d, epochs, |c| MultiWorkerMirrored::new(c, mlp::init(SEED)).expect("multi-worker"))
}

fn sharded(n: usize, d: &(mlp::Data, mlp::Data), epochs: u64) -> Vec<(Tensors, mlp::Epoch)> {
    per_process(n, d, epochs, |c| Sharded::new(c, mlp::init(SEED)).expect("sharded"))
}

#[test]
fn synchronous_strategies_end_with_the_one_device_weights() {
    let d = data();
    let (want, _) = fit(&mut OneDevice::new(mlp::init(SEED)), &d, 5);
    for n in [1, 2, 4] {
        let mut m = Mirrored::new(n, mlp::init(SEED), CrossReplica::AllReduce).unwrap();
        let (got, _) = fit(&mut m, &d, 5);
        let diff = max_diff(&got, &want);
        assert!(diff <= 1e-5, "mirrored x{n}: {diff}");
        let mut c = CentralStorage::new(n, mlp::init(SEED)).unwrap();
        let (got, _) = fit(&mut c, &d, 5);
        let diff = max_diff(&got, &want);
        assert!(diff <= 1e-5, "central-storage x{n}: {diff}");
        for (rank, (got, _)) in multi_worker(n, &d, 5).into_iter().enumerate() {
            let diff = max_diff(&got, &want);
            assert!(diff <= 1e-5, "multi-worker x{n} rank {rank}: {diff}");
        }
        for (rank, (got, _)) in sharded(n, &d, 5).into_iter().enumerate() {
            let diff = max_diff(&got, &want);
            assert!(diff <= 1e-5, "sharded x{n} rank {rank}: {diff}");
        }
    }
}

#[test]
fn twenty_epochs_reach_093_test_accuracy() {
    let d = data();
    let (_, one) = fit(&mut OneDevice::new(mlp::init(SEED)), &d, 20);
    assert!(one.accuracy >= 0.93, "one-device: {one:?}");
    let (_, m) = fit(&mut Mirrored::new(2, mlp::init(SEED), CrossReplica::AllReduce).unwrap(), &d, 20);
    assert!(m.accuracy >= 0.93, "mirrored: {m:?}");
    let (_, c) = fit(&mut CentralStorage::new(2, mlp::init(SEED)).unwrap(), &d, 20);
    assert!(c.accuracy >= 0.93, "central-storage: {c:?}");
    for (_, w) in multi_worker(2, &d, 20) {
        assert!(w.accuracy >= 0.93, "multi-worker: {w:?}");
    }
    for (_, w) in sharded(4, &d, 20) {
        assert!(w.accuracy >= 0.93, "sharded: {w:?}");
    }
}

/// Sharded momentum: 2 and 4 replicas, each holding its shard of the state, end
/// with the weights of 1 replica holding all of it (one device's optimizer).
#[test]
fn sharded_momentum_ends_with_the_weights_of_one_replica_holding_all_the_state() {
    let d = data();
    let run = |n| {
        per_process(n, &d, 5, |c| {
            let s = Sharded::with_optimizer(c, mlp::init(SEED), Box::new(Momentum { lr: 0.05, momentum: 0.9 }));
            s.expect("sharded")
        })
    };
    let (want, one) = run(1).remove(0);
    assert!(one.accuracy >= 0.9, "{one:?}");
    for n in [2, 4] {
        for (rank, (got, _)) in run(n).into_iter().enumerate() {
            let diff = max_diff(&got, &want);
            assert!(diff <= 1e-5, "sharded momentum x{n} rank {rank}: {diff}");
        }
    }
}

/// The example binary, brought up to date first: `cargo test --test train_digits`
/// alone does not rebuild examples. Built with this test's profile (`test` puts it
/// in `target/debug`, as `cargo test` does), so nothing else recompiles.
fn example() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test path");
            let dir = exe.parent().and_then(|p| p.parent()).expect("target dir").to_path_buf();
            let profile = if dir.ends_with("release") { "release" } else { "test" };
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let ok = Command::new(cargo)
                .args(["build", "--example", "train_digits", "--profile", profile])
                .status()
                .expect("cargo build --example");
            assert!(ok.success(), "building the example failed");
            dir.join("examples").join("train_digits")
        })
        .clone()
}

/// The `final loss=.. accuracy=..` line of a run that must have succeeded.
fn final_line(out: &std::process::Output) -> String {
    assert!(out.status.success(), "example failed: {}\n{}", stdout(out), String::from_utf8_lossy(&out.stderr));
    last_final(out)
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn last_final(out: &std::process::Output) -> String {
    let text = stdout(out);
    text.lines().rfind(|l| l.starts_with("final ")).unwrap_or_else(|| panic!("no final line in:\n{text}")).to_string()
}

/// The accuracy of a `final` line.
fn accuracy_of(line: &str) -> f64 {
    line.rsplit("accuracy=").next().and_then(|a| a.trim().parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

/// Run the example with `args`, outside any launcher, with `env` set.
fn example_run(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(example());
    c.args(args);
    for k in
        ["BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_STORE", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "TF_CONFIG"]
    {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    c.output().expect("running the example")
}

#[test]
fn parameter_server_training_reaches_090_and_survives_a_dead_worker() {
    let args =
        ["--strategy", "parameter-server", "--replicas", "3", "--epochs", "20", "--global-batch", "32", "--seed", "5"];
    let whole = example_run(&args, &[]);
    let line = final_line(&whole);
    assert!(accuracy_of(&line) >= 0.90, "{line}");
    // Worker 1 aborts after epoch 3 (a crash, no goodbye): worker 0 trains to the
    // end, the server reports the loss, the launcher reports the dead rank.
    let crashed = example_run(&args, &[("TRAIN_DIGITS_CRASH", "1:3")]);
    let (out, err) = (stdout(&crashed), String::from_utf8_lossy(&crashed.stderr).to_string());
    assert!(out.contains("epoch 20 loss="), "{out}\n{err}");
    assert!(accuracy_of(&last_final(&crashed)) >= 0.90, "{out}");
    assert!(err.contains("[0, 2] finished, [1] lost"), "{err}");
    assert!(err.contains("rank 2: signal"), "{err}");
    assert!(!crashed.status.success());
}

#[test]
fn parameter_server_training_resumes_from_its_checkpoint() {
    let dir = std::env::temp_dir().join(format!("braid-digits-ps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let run = |epochs: &str| {
        example_run(
            &[
                "--strategy",
                "parameter-server",
                "--replicas",
                "2",
                "--epochs",
                epochs,
                "--global-batch",
                "32",
                "--checkpoint",
                d,
            ],
            &[],
        )
    };
    let first = run("3");
    let first_text = stdout(&first);
    assert!(first_text.contains("epoch 3 loss="), "{first_text}");
    final_line(&first);
    let resumed = run("6");
    let text = stdout(&resumed);
    assert!(text.contains("resumed from") && text.contains("at epoch 3"), "{text}");
    assert!(
        !text.contains("epoch 3 loss=") && text.contains("epoch 4 loss=") && text.contains("epoch 6 loss="),
        "{text}"
    );
    // Async training picks up where it stopped, not from scratch.
    assert!(accuracy_of(&final_line(&resumed)) >= 0.90, "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_example_trains_across_processes_and_resumes_from_its_checkpoint() {
    let dir = std::env::temp_dir().join(format!("braid-digits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap().to_string();
    // Not under a launcher: the example starts its own ranks.
    let run = |strategy: &str, epochs: &str, ckpt: bool| {
        let mut args =
            vec!["--strategy", strategy, "--replicas", "2", "--epochs", epochs, "--global-batch", "32", "--seed", "3"];
        if ckpt {
            args.extend(["--checkpoint", d.as_str()]);
        }
        example_run(&args, &[])
    };
    let reference = final_line(&run("one-device", "4", false));
    // Two epochs, stop; a second run resumes at epoch 2 and ends where 4 straight epochs do.
    final_line(&run("multi-worker", "2", true));
    let resumed = run("multi-worker", "4", true);
    let text = stdout(&resumed);
    assert!(text.contains("at epoch 2"), "{text}");
    assert!(!text.contains("epoch 1 loss"), "{text}");
    assert_eq!(final_line(&resumed), reference);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn multi_worker_joins_a_job_described_by_tf_config() {
    // Two workers started by hand, as a TensorFlow cluster manager would: each
    // gets TF_CONFIG with the cluster and its own task; the chief's address hosts
    // the store. They must end where one device does.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let args = ["--strategy", "multi-worker", "--epochs", "3", "--global-batch", "32", "--seed", "9"];
    let reference = final_line(&example_run(
        &["--strategy", "one-device", "--epochs", "3", "--global-batch", "32", "--seed", "9"],
        &[],
    ));
    let key = format!("tf-config-test-{}", std::process::id());
    let children: Vec<_> = [("chief", 0), ("worker", 0)]
        .into_iter()
        .map(|(kind, i)| {
            let spec = format!(
                r#"{{"cluster": {{"chief": ["127.0.0.1:{port}"], "worker": ["127.0.0.1:{}"]}}, "task": {{"type": "{kind}", "index": {i}}}}}"#,
                port + 1
            );
            let mut c = Command::new(example());
            c.args(args);
            for k in ["BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_STORE", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"] {
                c.env_remove(k);
            }
            c.env("TF_CONFIG", spec).env("BRAID_JOB_KEY", &key);
            c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            c.spawn().expect("starting a TF_CONFIG worker")
        })
        .collect();
    let outs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().expect("worker")).collect();
    // Rank 0 (the chief) prints; the worker ends quietly.
    assert_eq!(final_line(&outs[0]), reference);
    assert!(outs[1].status.success(), "{}", String::from_utf8_lossy(&outs[1].stderr));
    assert!(stdout(&outs[0]).contains("replicas=2"), "{}", stdout(&outs[0]));
}

/// Issue 38, items 1 and 2: four workers, one killed with SIGKILL mid-epoch 3
/// and another mid-epoch 5; the two survivors train all 20 epochs and no step is
/// lost; then the same with a replacement joining after each kill.
#[test]
fn elastic_multi_worker_training_survives_two_killed_workers() {
    let common = ["--epochs", "20", "--global-batch", "32", "--seed", "1"];
    let one = example_run(&[&["--strategy", "one-device"][..], &common].concat(), &[]);
    let one_line = final_line(&one);
    let args = [&["--strategy", "multi-worker", "--replicas", "4", "--elastic", "--min-replicas", "2"][..], &common];
    let run = example_run(&args.concat(), &[("TRAIN_DIGITS_KILL", "1:3:10,2:5:10")]);
    let line = final_line(&run);
    let out = stdout(&run);
    assert!(accuracy_of(&line) >= 0.93, "{out}");
    assert!(out.contains("steps=900 expected=900"), "{out}");
    assert!(out.contains("launcher: workers [1, 2] were killed"), "{out}");
    let recoveries: Vec<&str> = out.lines().filter(|l| l.starts_with("recovery: ")).collect();
    assert_eq!(recoveries.len(), 2, "{out}");
    assert!(recoveries[0].contains("replicas 4 -> 3") && recoveries[1].contains("replicas 3 -> 2"), "{out}");
    for l in 1..=20 {
        assert!(out.contains(&format!("epoch {l} loss=")), "epoch {l} missing:\n{out}");
    }
    // Every step is the mean gradient of the global batch whatever the replica
    // count, so the weights end as one device's (the digest: sum of squares).
    let digest = |out: &str| -> f64 {
        let l = out.lines().rfind(|l| l.starts_with("weights digest=")).unwrap_or_else(|| panic!("{out}"));
        l["weights digest=".len()..].trim().parse().unwrap()
    };
    let one_digest = digest(&stdout(&one));
    assert!((digest(&out) / one_digest - 1.0).abs() <= 1e-5, "{out}\none device: {one_line} {one_digest}");
    // Item 2: a replacement is started after each kill, as a launcher's restart
    // would; each joins the running job, and the weights still end as one device's.
    let replaced =
        example_run(&[&args.concat()[..], &["--replace"]].concat(), &[("TRAIN_DIGITS_KILL", "1:3:10,2:5:10")]);
    let out = stdout(&replaced);
    assert!(accuracy_of(&final_line(&replaced)) >= 0.93, "{out}");
    assert!(out.contains("steps=900 expected=900"), "{out}");
    // The survivors hold the step after each loss until the replacement waits,
    // so each is taken in at once, back to four.
    let growths: Vec<&str> = out.lines().filter(|l| l.starts_with("growth: after step")).collect();
    assert_eq!(growths.len(), 2, "{out}");
    assert!(growths.iter().all(|l| l.ends_with("replicas 3 -> 4")), "{out}");
    assert_eq!(out.matches("worker joined as rank").count(), 2, "{out}");
    assert!(out.contains("epoch 20 loss=") && out.contains("replicas=4"), "{out}");
    assert!((digest(&out) / one_digest - 1.0).abs() <= 1e-5, "{out}\none device: {one_digest}");
    // Below the minimum the job fails instead of going on.
    let too_few = example_run(
        &[&["--strategy", "multi-worker", "--replicas", "3", "--elastic", "--min-replicas", "3"][..], &common].concat(),
        &[("TRAIN_DIGITS_KILL", "2:1:5")],
    );
    assert!(!too_few.status.success(), "{}", stdout(&too_few));
    assert!(String::from_utf8_lossy(&too_few.stderr).contains("fewer than the minimum of 3"), "{}", stdout(&too_few));
}
