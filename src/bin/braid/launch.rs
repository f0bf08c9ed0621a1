//! `braid run`: start local ranks, prefix their output, stop them all when one fails.
//!
//! The ranks meet through a TCP store this launcher hosts. It serves only
//! clients proving the job key, which every rank gets in `BRAID_JOB_KEY`: the
//! one in the launcher's own environment when set (so ranks started elsewhere
//! can join), a fresh random one otherwise.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use braid::bootstrap::{StoreLimits, TcpStoreServer};
use braid::JobKey;
use clap::Args;

/// Arguments of `braid run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Number of ranks to start on this host.
    #[arg(short = 'n', long = "ranks", default_value_t = 2)]
    pub ranks: usize,
    /// Seconds the other ranks get to finish after one fails, before they are killed.
    #[arg(long, default_value_t = 3.0)]
    pub grace: f64,
    /// Do not prefix output lines with the rank.
    #[arg(long)]
    pub no_prefix: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub program: Vec<String>,
}

/// What to start.
pub struct Launch {
    pub ranks: usize,
    pub program: String,
    pub args: Vec<String>,
    pub prefix: bool,
    pub grace: Duration,
    pub extra_env: Vec<(String, String)>,
}

pub fn run(a: RunArgs) -> i32 {
    let mut it = a.program.into_iter();
    let program = it.next().expect("clap requires a program");
    launch(Launch {
        ranks: a.ranks,
        program,
        args: it.collect(),
        prefix: !a.no_prefix,
        grace: Duration::from_secs_f64(a.grace.max(0.0)),
        extra_env: Vec::new(),
    })
}

fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown status".into(),
    }
}

fn pump(
    rank: usize,
    prefix: bool,
    src: impl std::io::Read + Send + 'static,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let reader = BufReader::new(src);
        for line in reader.split(b'\n') {
            let Ok(line) = line else { break };
            let text = String::from_utf8_lossy(&line);
            let out = if prefix { format!("[{rank}] {text}\n") } else { format!("{text}\n") };
            let _ = if to_stderr {
                std::io::stderr().lock().write_all(out.as_bytes())
            } else {
                std::io::stdout().lock().write_all(out.as_bytes())
            };
        }
    })
}

/// Start the ranks and supervise them; returns the process exit code.
pub fn launch(l: Launch) -> i32 {
    if l.ranks == 0 {
        eprintln!("braid run: --ranks must be at least 1");
        return 2;
    }
    let key_text = match std::env::var("BRAID_JOB_KEY") {
        Ok(k) if !k.is_empty() => k,
        _ => JobKey::generate_text(),
    };
    let server =
        match TcpStoreServer::bind_with("127.0.0.1:0", JobKey::from_text(&key_text), StoreLimits::for_world(l.ranks)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("braid run: cannot host the store: {e}");
                return 1;
            }
        };
    let store = format!("tcp://{}", server.local_addr());
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pumps = Vec::new();
    for rank in 0..l.ranks {
        let mut cmd = Command::new(&l.program);
        cmd.args(&l.args)
            .env("BRAID_RANK", rank.to_string())
            .env("BRAID_WORLD_SIZE", l.ranks.to_string())
            .env("BRAID_LOCAL_RANK", rank.to_string())
            .env("BRAID_LOCAL_WORLD_SIZE", l.ranks.to_string())
            .env("BRAID_STORE", &store)
            .env("BRAID_JOB_KEY", &key_text)
            .envs(l.extra_env.iter().map(|(k, v)| (k, v)))
            // Own process group: stopping a rank stops everything it started, so
            // no grandchild keeps the output pipes (and this launcher) alive.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match cmd.spawn() {
            Ok(mut child) => {
                pumps.push(pump(rank, l.prefix, child.stdout.take().expect("piped"), false));
                pumps.push(pump(rank, l.prefix, child.stderr.take().expect("piped"), true));
                children.push(Some(child));
            }
            Err(e) => {
                eprintln!("braid run: cannot start `{}` for rank {rank}: {e}", l.program);
                kill_all(&mut children);
                return 1;
            }
        }
    }
    forward_stop_signals();
    let code = supervise(&mut children, l.grace);
    for p in pumps {
        let _ = p.join();
    }
    drop(server);
    code
}

/// The signal that asked this launcher to stop (0: none yet).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
}

/// Ranks run in their own process groups, so terminal signals do not reach them:
/// catch SIGINT/SIGTERM here and pass them on.
fn forward_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
}

fn kill_group(c: &mut Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the process group this launcher created for the rank.
    unsafe { libc::kill(-(c.id() as i32), sig) };
}

fn kill_all(children: &mut [Option<Child>]) {
    for c in children.iter_mut().flatten() {
        kill_group(c, libc::SIGKILL);
        let _ = c.wait();
    }
}

/// Wait for every rank; once one fails, give the rest `grace` to exit, then kill them.
fn supervise(children: &mut [Option<Child>], grace: Duration) -> i32 {
    let mut code = 0;
    let mut failed_at: Option<Instant> = None;
    loop {
        let mut running = 0;
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("braid run: rank {rank} failed ({})", describe(&status));
                        if code == 0 {
                            code = status.code().filter(|c| *c != 0).unwrap_or(1);
                        }
                        failed_at.get_or_insert_with(Instant::now);
                    }
                    *slot = None;
                }
                Ok(None) => running += 1,
                Err(e) => {
                    eprintln!("braid run: cannot wait for rank {rank}: {e}");
                    *slot = None;
                    code = 1;
                }
            }
        }
        if running == 0 {
            return code;
        }
        let sig = STOP_SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            eprintln!("braid run: got signal {sig}; passing it to the ranks");
            for c in children.iter_mut().flatten() {
                kill_group(c, sig);
            }
            failed_at.get_or_insert_with(Instant::now);
            if code == 0 {
                code = 128 + sig;
            }
        }
        if let Some(t) = failed_at {
            if t.elapsed() >= grace {
                for (rank, slot) in children.iter_mut().enumerate() {
                    if let Some(child) = slot {
                        eprintln!("braid run: stopping rank {rank} after a peer failed");
                        kill_group(child, libc::SIGKILL);
                        let _ = child.wait();
                        *slot = None;
                    }
                }
                return code;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
