//! `train_digits --strategy multi-worker --elastic`: the launcher that tolerates
//! (and, with `--replace`, replaces) killed workers, the worker's training loop,
//! and the `TRAIN_DIGITS_KILL` fault points.

use std::process::{Child, Command};
use std::time::Duration;

use braid::strategy::{ApplyFn, MultiWorkerMirrored, Reduction, StepFn, Strategy, Tensors};
use braid::Communicator;

use super::mlp;

/// Where replacement workers wait to join.
const JOIN_NAME: &str = "train_digits";

/// A job key for a launcher's ranks.
pub fn job_key() -> String {
    format!(
        "{:x}{:x}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    )
}

/// Start this program as rank `rank` of `ranks` meeting at the store on `port`;
/// a `joiner` waits to be taken into the running job instead.
pub fn start_rank(rank: usize, ranks: usize, port: u16, key: &str, joiner: bool) -> Result<Child, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(me);
    cmd.args(std::env::args().skip(1)).env("BRAID_STORE", format!("tcp://127.0.0.1:{port}")).env("BRAID_JOB_KEY", key);
    if joiner {
        // Its rank and world come from the members when they take it in.
        cmd.env("TRAIN_DIGITS_JOIN", "1").env("BRAID_RANK", "0").env("BRAID_WORLD_SIZE", "1");
    } else {
        let rank = rank.to_string();
        cmd.env("BRAID_RANK", &rank).env("BRAID_WORLD_SIZE", ranks.to_string()).env("BRAID_LOCAL_RANK", &rank);
    }
    cmd.spawn().map_err(|e| format!("starting rank {rank}: {e}"))
}

/// The elastic launcher: it hosts the store (rank 0 may be the one lost), counts
/// workers killed by SIGKILL as lost rather than failed, and with `replace`
/// starts a joiner in place of each one while the job runs.
pub fn launch(ranks: usize, min_replicas: usize, replace: bool) -> Result<(), String> {
    let key = job_key();
    let server = braid::bootstrap::TcpStoreServer::bind("127.0.0.1:0", braid::JobKey::from_text(&key))
        .map_err(|e| e.to_string())?;
    let port = server.local_addr().port();
    let mut running: Vec<(usize, Child)> =
        (0..ranks).map(|r| start_rank(r, ranks, port, &key, false).map(|c| (r, c))).collect::<Result<_, _>>()?;
    let (mut failed, mut killed, mut next) = (Vec::new(), Vec::new(), ranks);
    while !running.is_empty() {
        let mut still = Vec::new();
        for (id, mut child) in running {
            match child.try_wait() {
                Ok(None) => still.push((id, child)),
                Ok(Some(s)) if s.success() => {}
                Ok(Some(s)) if std::os::unix::process::ExitStatusExt::signal(&s) == Some(9) => {
                    killed.push(id);
                    if replace {
                        println!("launcher: worker {id} was killed; starting worker {next} to join");
                        still.push((next, start_rank(next, ranks, port, &key, true)?));
                        next += 1;
                    }
                }
                Ok(Some(s)) => failed.push(format!("worker {id}: {s}")),
                Err(e) => failed.push(format!("worker {id}: {e}")),
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(20));
    }
    if !killed.is_empty() {
        println!("launcher: workers {killed:?} were killed; the others finished");
    }
    drop(server);
    let left = if replace { ranks } else { ranks - killed.len().min(ranks) };
    if failed.is_empty() && left >= min_replicas {
        Ok(())
    } else {
        Err(format!("workers failed: {}; killed: {killed:?}", failed.join("; ")))
    }
}

/// How long the survivors hold training for a replacement the launcher restarts.
const REPLACEMENT_WAIT: Duration = Duration::from_secs(30);

/// One worker's training: a replica that goes on without lost workers and takes
/// in joiners (`replaced`: holding the step after a loss until they come); a
/// joiner (`TRAIN_DIGITS_JOIN`) starts at the step it was taken in. Every epoch's
/// line is printed by whichever worker leads then.
pub fn train(
    plan: mlp::Schedule,
    min_replicas: usize,
    replaced: bool,
    init: Tensors,
    data: (&mlp::Data, &mlp::Data),
) -> Result<(), String> {
    let e = |e: braid::Error| e.to_string();
    let joiner = std::env::var_os("TRAIN_DIGITS_JOIN").is_some();
    let mw = if joiner {
        match Communicator::join_from_env(JOIN_NAME) {
            Ok(comm) => MultiWorkerMirrored::join(comm, init).map_err(e)?,
            Err(closed @ braid::Error::JoinClosed { .. }) => {
                // Restarted as the job ended: nothing left to do.
                println!("worker not needed: {closed}");
                return Ok(());
            }
            Err(other) => return Err(e(other)),
        }
    } else {
        MultiWorkerMirrored::from_env(init).map_err(e)?
    };
    let mut mw = mw.elastic(min_replicas).joinable(JOIN_NAME);
    if replaced {
        mw = mw.await_replacements(REPLACEMENT_WAIT);
    }
    let per_epoch = data.0.len().div_ceil(plan.global_batch);
    let first_rank = mw.communicator().rank();
    let skip = mw.steps_done();
    let mut s = Killing { inner: mw, per_epoch, kills: kill_points(first_rank)?, steps: 0, skip };
    if joiner {
        println!("worker joined as rank {first_rank} at step {skip} of {} replicas", s.num_replicas_in_sync());
    } else if first_rank == 0 {
        println!(
            "strategy=multi-worker elastic min_replicas={min_replicas} replicas={} train={} test={} global_batch={} seed={}",
            s.num_replicas_in_sync(),
            data.0.len(),
            data.1.len(),
            plan.global_batch,
            plan.seed
        );
    }
    let epochs = plan.epochs;
    let last = mlp::train(&mut s, data, plan, |s, e| {
        if s.local_replicas().start == 0 {
            println!(
                "epoch {} loss={:.5} accuracy={:.4} replicas={}",
                e.epoch,
                e.loss,
                e.accuracy,
                s.num_replicas_in_sync()
            );
        }
        Ok(())
    })?;
    s.inner.close_joining().map_err(e)?;
    if s.local_replicas().start == 0 {
        for r in s.inner.recoveries() {
            println!(
                "recovery: step {} replicas {} -> {} in {:.3} s ({}): {}",
                r.step,
                r.replicas.0,
                r.replicas.1,
                r.took.as_secs_f64(),
                if r.adopted { "took the step from a worker ahead" } else { "redone" },
                r.cause
            );
        }
        for (step, before, after) in s.inner.growths() {
            println!("growth: after step {step} replicas {before} -> {after}");
        }
        println!("steps={} expected={}", s.inner.steps_done(), per_epoch as u64 * epochs);
        println!("weights digest={:.9e}", digest(s.variables()));
        println!("final loss={:.5} accuracy={:.4}", last.loss, last.accuracy);
    }
    Ok(())
}

/// Sum of squares of every weight: equal runs give equal digests.
pub fn digest(vars: &Tensors) -> f64 {
    vars.iter().flatten().map(|&w| f64::from(w) * f64::from(w)).sum()
}

/// The elastic replica, dying with SIGKILL before chosen steps; a joiner's loop
/// passes over the steps done before it joined.
struct Killing {
    inner: MultiWorkerMirrored,
    per_epoch: usize,
    /// `(epoch, step in epoch)` before which to die.
    kills: Vec<(u64, usize)>,
    /// Steps the training loop asked for so far.
    steps: u64,
    /// Steps done before this process joined.
    skip: u64,
}

impl Strategy for Killing {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn num_replicas_in_sync(&self) -> usize {
        self.inner.num_replicas_in_sync()
    }
    fn local_replicas(&self) -> std::ops::Range<usize> {
        self.inner.local_replicas()
    }
    fn step(&mut self, global_batch: usize, step: &StepFn<'_>, apply: &ApplyFn<'_>) -> braid::Result<f64> {
        let here = (self.steps / self.per_epoch as u64, (self.steps % self.per_epoch as u64) as usize);
        self.steps += 1;
        if self.steps <= self.skip {
            // Done by the others before this process joined.
            return Ok(f64::NAN);
        }
        if self.kills.contains(&here) {
            eprintln!("train_digits: killing this worker (SIGKILL) before step {} of epoch {}", here.1, here.0);
            // SAFETY: a signal to this very process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        self.inner.step(global_batch, step, apply)
    }
    fn reduce(&mut self, op: Reduction, local: &[f64]) -> braid::Result<f64> {
        self.inner.reduce(op, local)
    }
    fn variables(&self) -> &Tensors {
        self.inner.variables()
    }
    fn set_variables(&mut self, vars: Tensors) -> braid::Result<()> {
        self.inner.set_variables(vars)
    }
}

/// `TRAIN_DIGITS_KILL=W:E:S[,...]`: the points where worker `rank` dies.
fn kill_points(rank: usize) -> Result<Vec<(u64, usize)>, String> {
    let Ok(spec) = std::env::var("TRAIN_DIGITS_KILL") else { return Ok(Vec::new()) };
    if std::env::var_os("TRAIN_DIGITS_JOIN").is_some() {
        // Fault points name the workers the launcher started first.
        return Ok(Vec::new());
    }
    let mut points = Vec::new();
    for item in spec.split(',').filter(|s| !s.is_empty()) {
        let bad = || format!("TRAIN_DIGITS_KILL=`{spec}`: expected WORKER:EPOCH:STEP items");
        let mut it = item.split(':').map(|p| p.trim().parse::<u64>().map_err(|_| bad()));
        let (w, e, s) = (it.next().ok_or_else(bad)??, it.next().ok_or_else(bad)??, it.next().ok_or_else(bad)??);
        if w as usize == rank {
            points.push((e, s as usize));
        }
    }
    Ok(points)
}
