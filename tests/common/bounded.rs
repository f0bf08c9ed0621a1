//! Run a launcher (mpirun, srun, a daemon) bounded in time: it starts in a process
//! group of its own, its output is drained on threads, and past its limit the whole
//! group gets SIGTERM (so a launcher can take its ranks down), then SIGKILL.
//! Part of the shared test harness (`common::bounded`).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a bounded run left behind.
pub struct Outcome {
    /// None when it was killed at its limit.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    /// Everything it printed, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "status {:?} after {:.1?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// Read `r` to its end on a thread of its own (a chatty child cannot fill its pipe).
pub fn drain(r: Option<impl Read + Send + 'static>) -> Option<JoinHandle<String>> {
    r.map(|mut r| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    })
}

/// Signal the process group `child` leads.
pub fn signal_group(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a group this test started.
    unsafe { libc::kill(-(child.id() as i32), sig) };
}

/// Start `cmd` in its own process group with its output piped.
pub fn spawn_group(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    cmd.spawn().unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"))
}

/// Wait for `child` until `limit`; past it, SIGTERM its group, then SIGKILL.
pub fn wait_bounded(mut child: Child, limit: Duration) -> Outcome {
    let t0 = Instant::now();
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let mut status = None;
    while t0.elapsed() < limit {
        if let Some(s) = child.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if status.is_none() {
        signal_group(&child, libc::SIGTERM);
        let grace = Instant::now();
        while grace.elapsed() < Duration::from_secs(3) && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        signal_group(&child, libc::SIGKILL);
        let _ = child.wait();
    }
    let text = |h: Option<JoinHandle<String>>| h.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
    Outcome { status, stdout: text(out), stderr: text(err), elapsed: t0.elapsed() }
}

/// Run `cmd` to completion or `limit`.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Outcome {
    wait_bounded(spawn_group(cmd), limit)
}

/// Remove every `BRAID_*` variable this test process has from `cmd`'s environment.
pub fn without_braid_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("BRAID_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Where `program` is: on PATH, or in /usr/sbin or /sbin (daemons).
pub fn find_program(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| p.is_file());
    found
}

/// Whether the test can go on: when `missing` names what it lacks, in CI
/// (`CI=true`) the test fails saying so; elsewhere it is skipped with the reason on
/// stderr.
pub fn can_run(missing: Option<String>) -> bool {
    match missing {
        None => true,
        Some(why) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            eprintln!("skipped: {why}");
            false
        }
    }
}

/// Whether `program` is installed (see [`can_run`]); `install` names the package.
pub fn require(program: &str, install: &str) -> bool {
    can_run(
        find_program(program).is_none().then(|| format!("`{program}` is not installed (apt-get install {install})")),
    )
}

/// Rank processes of one job, killed (and reaped) however the test ends: a
/// stopped process dies of SIGKILL too.
pub struct Ranks(pub Vec<Option<std::process::Child>>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `program ARGS` as rank `rank` of `world` meeting at `store` with job key `key`,
/// without the test's own `BRAID_*` variables and without the tuner's start-up probe.
pub fn rank_command(program: &str, args: &[&str], (rank, world): (usize, usize), store: &str, key: &str) -> Command {
    let mut cmd = Command::new(program);
    without_braid_env(&mut cmd)
        .args(args)
        .env("BRAID_RANK", rank.to_string())
        .env("BRAID_WORLD_SIZE", world.to_string())
        .env("BRAID_STORE", store)
        .env("BRAID_JOB_KEY", key)
        .env("BRAID_TUNER_PROBE", "0");
    cmd
}
