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

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use braid::bootstrap::{Store, TorchStore};

/// A torchrun job, perf included, ends well within this (braid's own deadline is 60 s).
const JOB_DEADLINE: Duration = Duration::from_secs(150);
/// Every collective `braid perf` measures.
const OPS: [&str; 7] = ["all-reduce", "broadcast", "all-gather", "reduce-scatter", "reduce", "barrier", "all-to-all"];
/// Small sizes: this is about starting, not speed.
const PERF_ARGS: [&str; 11] = ["-b", "1K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "--check"];

/// The python with torch, or None (skip) outside CI when it has none.
fn torch_python() -> Option<PathBuf> {
    let python = std::env::var_os("BRAID_TORCH_PYTHON")
        .map_or_else(|| PathBuf::from("/opt/peers-venv/bin/python"), PathBuf::from);
    let mut probe = Command::new(&python);
    probe.args(["-c", "import torch, torch.distributed.run; print(torch.__version__)"]);
    let why = match spawn(probe, "probe") {
        Err(e) => format!("{} does not run: {e}", python.display()),
        Ok(job) => {
            let out = job.finish(Duration::from_secs(120));
            if out.status.success() {
                return Some(python);
            }
            format!("{} cannot import torch:\n{}", python.display(), out.stderr)
        }
    };
    let msg = format!(
        "torch is missing: {why}\n(.ci/run installs torch==2.15.0 into a venv and exports BRAID_TORCH_PYTHON; \
         or point BRAID_TORCH_PYTHON at a python with torch)"
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI: {msg}");
    }
    eprintln!("skipping: {msg}");
    None
}

/// A process running in its own process group, its output collected by threads.
struct Job {
    name: String,
    child: Child,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: Option<std::thread::JoinHandle<String>>,
    /// Reaped: nothing left to kill.
    reaped: bool,
}

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn show(&self) -> String {
        format!("status {}\n--- stdout\n{}\n--- stderr\n{}", self.status, self.stdout, self.stderr)
    }
}

fn collect(r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(r).read_to_string(&mut s);
        s
    })
}

/// Start `cmd` without any `BRAID_*` or torch launcher variable from this
/// process's environment, in a process group of its own.
fn spawn(cmd: Command, name: &str) -> std::io::Result<Job> {
    spawn_with(cmd, name, true)
}

/// [`spawn`], leaving the child's stdout to the caller unless `collect_stdout`.
fn spawn_with(mut cmd: Command, name: &str, collect_stdout: bool) -> std::io::Result<Job> {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let launcher = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"];
        if k.starts_with("BRAID_") || k.starts_with("TORCHELASTIC_") || launcher.contains(&k.as_str()) {
            cmd.env_remove(&k);
        }
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn()?;
    let stdout = if collect_stdout { child.stdout.take().map(collect) } else { None };
    let stderr = child.stderr.take().map(collect);
    Ok(Job { name: name.to_owned(), child, stdout, stderr, reaped: false })
}

impl Job {
    fn kill(&mut self) {
        // SAFETY: kill(2) on the process group this job's child leads.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
        self.reaped = true;
    }

    /// Wait for the job until `deadline`; past it the job is killed and the test fails.
    fn finish(mut self, deadline: Duration) -> Finished {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for a child") {
                break Some(status);
            }
            if start.elapsed() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // Whatever it left running (a torchrun worker) goes with it.
        self.kill();
        let out = Finished {
            status: status.unwrap_or_else(|| self.child.wait().expect("the killed child is reaped")),
            stdout: self.stdout.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default(),
            stderr: self.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default(),
        };
        if status.is_none() {
            panic!("{} was still running after {deadline:?}; killed it\n{}", self.name, out.show());
        }
        out
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill();
        }
    }
}

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

/// torch's own TCPStore server (`libuv` or `legacy`) in a python process that also
/// acts as torch's client on command; its stdout arrives line by line.
struct TorchServer {
    job: Job,
    port: u16,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl TorchServer {
    fn start(python: &Path, backend: &str) -> TorchServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torch/store_server.py");
        let mut cmd = Command::new(python);
        cmd.arg(script).arg(backend).stdin(Stdio::piped());
        let mut job = spawn_with(cmd, &format!("torch's {backend} TCPStore"), false).expect("python starts");
        let stdin = job.child.stdin.take().expect("piped stdin");
        // Lines, rather than the collector's whole output.
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = job.child.stdout.take();
        job.stdout = Some(std::thread::spawn(move || {
            for line in BufReader::new(stdout.expect("piped stdout")).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
            String::new()
        }));
        let mut server = TorchServer { job, port: 0, stdin, lines };
        server.port = server.line().parse().expect("the first line is the port");
        server
    }

    /// The next line, within 60 s.
    fn line(&mut self) -> String {
        self.lines.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| {
            self.job.kill();
            panic!(
                "{} said nothing more ({e}); stderr:\n{}",
                self.job.name,
                self.job.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default()
            )
        })
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
