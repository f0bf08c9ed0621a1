//! Running torch from the tests: the python with torch (or why there is none),
//! processes with a deadline in process groups of their own, and torch's own
//! TCPStore server in a python process. Shared by `launch_torch.rs` and
//! `store_conformance.rs`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The python with torch, or None (skip) outside CI when it has none.
pub fn torch_python() -> Option<PathBuf> {
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
pub struct Job {
    pub name: String,
    pub child: Child,
    pub stdout: Option<std::thread::JoinHandle<String>>,
    pub stderr: Option<std::thread::JoinHandle<String>>,
    /// Reaped: nothing left to kill.
    reaped: bool,
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn show(&self) -> String {
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
pub fn spawn(cmd: Command, name: &str) -> std::io::Result<Job> {
    spawn_with(cmd, name, true)
}

/// [`spawn`], leaving the child's stdout to the caller unless `collect_stdout`.
pub fn spawn_with(mut cmd: Command, name: &str, collect_stdout: bool) -> std::io::Result<Job> {
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
    pub fn kill(&mut self) {
        // SAFETY: kill(2) on the process group this job's child leads.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
        self.reaped = true;
    }

    /// Wait for the job until `deadline`; past it the job is killed and the test fails.
    pub fn finish(mut self, deadline: Duration) -> Finished {
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

/// torch's own TCPStore server (`libuv` or `legacy`) in a python process that also
/// acts as torch's client on command; its stdout arrives line by line.
pub struct TorchServer {
    pub job: Job,
    pub port: u16,
    pub stdin: std::process::ChildStdin,
    pub lines: std::sync::mpsc::Receiver<String>,
}

impl TorchServer {
    pub fn start(python: &Path, backend: &str) -> TorchServer {
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
    pub fn line(&mut self) -> String {
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
