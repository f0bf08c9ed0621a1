//! Started as a TensorFlow cluster manager starts workers: every process gets only
//! `TF_CONFIG` (the cluster spec and its own task), no `BRAID_*` variable, and
//! `braid perf --check` must pass over every collective and send/recv: the chief's
//! address hosts the store, ranks follow chief then workers.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const OPS: [&str; 8] =
    ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "barrier", "send-recv"];
/// A rank still running this long after its start is killed and the test fails.
const DEADLINE: Duration = Duration::from_secs(60);

/// A command with none of the variables that name a rank or a store, whatever the
/// environment of the test runner holds.
fn bare(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars() {
        let launcher = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"];
        if k.starts_with("BRAID_")
            || k.starts_with("OMPI_")
            || k.starts_with("PMI")
            || k.starts_with("SLURM_")
            || launcher.contains(&k.as_str())
        {
            cmd.env_remove(k);
        }
    }
    cmd
}

#[test]
fn perf_checks_every_call_under_tf_config_alone() {
    for op in OPS {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cluster = format!(
            r#""cluster": {{"chief": ["127.0.0.1:{port}"], "worker": ["127.0.0.1:{}", "127.0.0.1:{}"]}}"#,
            port + 1,
            port + 2
        );
        let tasks = [("chief", 0), ("worker", 0), ("worker", 1)];
        let mut kids: Vec<_> = tasks
            .iter()
            .map(|(kind, i)| {
                let spec = format!(r#"{{{cluster}, "task": {{"type": "{kind}", "index": {i}}}}}"#);
                bare(&mut Command::new(BRAID))
                    .args(["perf", "--op", op, "-b", "4K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1", "--check"])
                    .env("TF_CONFIG", spec)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let t0 = Instant::now();
        while kids.iter_mut().any(|k| k.try_wait().unwrap().is_none()) && t0.elapsed() < DEADLINE {
            std::thread::sleep(Duration::from_millis(20));
        }
        let outs: Vec<_> = kids
            .into_iter()
            .map(|mut k| {
                let _ = k.kill();
                k.wait_with_output().unwrap()
            })
            .collect();
        for (rank, out) in outs.iter().enumerate() {
            let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{op}: rank {rank} ({:?}): {text}\n{err}", tasks[rank]);
            if rank == 0 {
                assert!(text.contains("world=3"), "{op}: {text}");
                assert!(text.contains("# Out of bounds values : 0 OK"), "{op}: {text}");
            }
        }
    }
}
