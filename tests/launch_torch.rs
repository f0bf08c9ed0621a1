//! braid started by torch, with the real torch (the venv at /opt/peers-venv, or the
//! python in `BRAID_TORCH_PYTHON`) and no `BRAID_*` variable:
//! - `torchrun --nproc-per-node=3`, with the c10d rendezvous (`--standalone`) and the
//!   static one, running `braid perf --check` over every collective: every rank,
//!   rank 0 included, joins the agent's TCPStore at `MASTER_PORT`;
//! - a restart (`--max-restarts 1`) on the same agent store after an attempt that
//!   failed on purpose, leaving its keys behind;
//! - a python script that calls `init_process_group("gloo")` and then braid in the
//!   same process through the C ABI: braid finds torch's store on `MASTER_PORT`;
//! - braid's torch store client against torch's own server, with torch's client
//!   reading what braid wrote.
//!
//! Without torch, the tests fail under `CI=true` saying what is missing, and skip
//! with a message otherwise. Every process has a deadline; its whole process group
//! is killed on failure.

mod torch;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use braid::bootstrap::{Store, TorchStore};
use torch::{spawn, torch_python, Job, TorchServer};

/// A torchrun job, perf included, ends well within this (braid's own deadline is 60 s).
const JOB_DEADLINE: Duration = Duration::from_secs(150);
/// Every collective `braid perf` measures.
const OPS: [&str; 7] = ["all-reduce", "broadcast", "all-gather", "reduce-scatter", "reduce", "barrier", "all-to-all"];
/// Small sizes: this is about starting, not speed.
const PERF_ARGS: [&str; 11] = ["-b", "1K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "--check"];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn torchrun(python: &Path, rendezvous: &[String], program: &[&str]) -> Command {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "torch.distributed.run", "--nproc-per-node=3"]).args(rendezvous).arg("--no-python").args(program);
    cmd
}

fn static_rendezvous() -> Vec<String> {
    let port = free_port().to_string();
    ["--rdzv-backend=static", "--master-addr", "127.0.0.1", "--master-port", &port, "--nnodes", "1", "--node-rank", "0"]
        .map(String::from)
        .to_vec()
}

/// `braid perf --check` over every collective, each op a torchrun job of 3 ranks.
fn every_collective_under(python: &Path, rendezvous: impl Fn() -> Vec<String>, label: &str) {
    let braid = env!("CARGO_BIN_EXE_braid");
    for op in OPS {
        let program = [&[braid, "perf", "--op", op][..], &PERF_ARGS].concat();
        let job = spawn(torchrun(python, &rendezvous(), &program), &format!("torchrun ({label}) braid perf --op {op}"));
        let out = job.expect("torchrun starts").finish(JOB_DEADLINE);
        assert!(out.status.success(), "{label}, {op}: torchrun failed\n{}", out.show());
        assert!(
            out.stdout.contains("# Out of bounds values : 0 OK") && out.stdout.contains("world=3"),
            "{label}, {op}: no checked result of 3 ranks\n{}",
            out.show()
        );
    }
}

#[test]
fn torchrun_c10d_rendezvous_runs_every_collective() {
    let Some(python) = torch_python() else { return };
    every_collective_under(&python, || vec!["--standalone".into()], "c10d, --standalone");
}

#[test]
fn torchrun_static_rendezvous_runs_every_collective() {
    let Some(python) = torch_python() else { return };
    every_collective_under(&python, static_rendezvous, "static");
}

#[test]
fn a_restarted_worker_group_meets_again_on_the_same_agent_store() {
    let Some(python) = torch_python() else { return };
    // Attempt 0: ranks 0 and 1 claim their ranks and wait in braid's set-up;
    // rank 2 fails, so the agent stops them and starts attempt 1 with the store
    // (and attempt 0's keys) as they were.
    let script = format!(
        "echo \"attempt $TORCHELASTIC_RESTART_COUNT rank $RANK\"; \
         if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 2 ]; then sleep 3; exit 3; fi; \
         exec \"$0\" perf --op all-reduce {}",
        PERF_ARGS.join(" ")
    );
    let mut rendezvous = static_rendezvous();
    rendezvous.push("--max-restarts=1".into());
    let program = ["sh", "-c", &script, env!("CARGO_BIN_EXE_braid")];
    let out = spawn(torchrun(&python, &rendezvous, &program), "torchrun --max-restarts 1")
        .expect("torchrun starts")
        .finish(JOB_DEADLINE);
    assert!(out.status.success(), "the restarted group failed\n{}", out.show());
    for r in 0..3 {
        assert!(out.stdout.contains(&format!("attempt 1 rank {r}")), "rank {r} was not restarted\n{}", out.show());
    }
    assert!(out.stdout.contains("attempt 0 rank 0"), "{}", out.show());
    assert!(out.stdout.contains("# Out of bounds values : 0 OK"), "{}", out.show());
}

/// Build libbraid.so (the C ABI) into this test's target directory and profile.
fn libbraid() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "test",
        Some(other) => other,
        None => panic!("no profile directory in {}", exe.display()),
    };
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", profile_dir.parent().expect("target/<profile>"))
        .args(["build", "--profile", profile, "-p", "braid-ffi", "--lib"]);
    let out = spawn(cargo, "cargo build -p braid-ffi").expect("cargo runs").finish(Duration::from_secs(600));
    assert!(out.status.success(), "building libbraid failed\n{}", out.show());
    let lib = profile_dir.join("libbraid.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

#[test]
fn braid_after_init_process_group_in_the_same_process() {
    let Some(python) = torch_python() else { return };
    let lib = libbraid();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torch/init_process_group_then_braid.py");
    let port = free_port().to_string();
    let world = 3;
    let jobs: Vec<Job> = (0..world)
        .map(|rank| {
            let mut cmd = Command::new(&python);
            cmd.arg(&script).arg(&lib);
            let rank_s = rank.to_string();
            let world_s = world.to_string();
            for (k, v) in [
                ("RANK", rank_s.as_str()),
                ("LOCAL_RANK", &rank_s),
                ("WORLD_SIZE", &world_s),
                ("LOCAL_WORLD_SIZE", &world_s),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", &port),
            ] {
                cmd.env(k, v);
            }
            let mut job = spawn(cmd, &format!("rank {rank} of the init_process_group script")).expect("python starts");
            // spawn() removed the launcher's variables inherited from here; these are the script's own.
            job.name.push_str(" (RANK/WORLD_SIZE/MASTER_* set)");
            job
        })
        .collect();
    for (rank, job) in jobs.into_iter().enumerate() {
        let out = job.finish(JOB_DEADLINE);
        assert!(out.status.success(), "rank {rank} failed\n{}", out.show());
        assert!(out.stdout.contains(&format!("rank {rank} of 3: braid and torch agree")), "{}", out.show());
    }
}

#[test]
fn the_torch_store_client_against_torchs_own_server_and_client() {
    let Some(python) = torch_python() else { return };
    for backend in ["libuv", "legacy"] {
        let mut server = TorchServer::start(&python, backend);
        let addr = format!("127.0.0.1:{}", server.port);
        let s = TorchStore::connect(&addr, Duration::from_secs(10)).unwrap();
        // torch's client puts `/` before every key; braid's keys are as given.
        assert_eq!(s.get("/from-braid").unwrap(), None, "{backend}");
        s.set("/from-braid", b"hello torch").unwrap();
        assert_eq!(s.add("/counter", 40).unwrap(), 40);
        assert_eq!(s.add("/counter", 2).unwrap(), 42);
        writeln!(server.stdin, "check").unwrap();
        assert_eq!(server.line(), "checked", "{backend}");
        s.wait(&["/from-torch"], Duration::from_secs(10)).unwrap();
        assert_eq!(s.get("/from-torch").unwrap().unwrap(), b"hello braid", "{backend}");
        // A wait that times out is cancelled, names what is missing, and leaves
        // the connection usable.
        let start = Instant::now();
        let err = s.wait(&["/from-torch", "/never"], Duration::from_millis(200)).unwrap_err().to_string();
        assert!(err.contains("/never") && !err.contains("from-torch"), "{backend}: {err}");
        assert!(start.elapsed() < Duration::from_secs(10), "{backend}: took {:?}", start.elapsed());
        s.ping().unwrap();
        assert!(s.delete("/from-braid").unwrap(), "{backend}");
        assert!(!s.delete("/from-braid").unwrap(), "{backend}");
        assert_eq!(s.get("/from-braid").unwrap(), None, "{backend}");
        // And through a tcp:// address, as torchrun's MASTER_PORT would be given.
        let store = braid::bootstrap::connect_store(
            &format!("tcp://{addr}"),
            true,
            2,
            braid::JobKey::none(),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(store.get("/from-torch").unwrap().unwrap(), b"hello braid", "{backend}");
        drop(server.stdin);
        let out = server.job.finish(Duration::from_secs(30));
        assert!(out.status.success(), "{backend}: {}", out.show());
    }
}
