//! Train a small MLP on the handwritten-digits data set with any braid strategy:
//!
//! ```text
//! cargo run --release --example train_digits -- \
//!     --strategy one-device|mirrored|multi-worker|central-storage|parameter-server|sharded \
//!     --replicas N --epochs E --global-batch B --seed S [--lr LR] [--checkpoint DIR] \
//!     [--ps K] [--staleness S] [--momentum M]
//! ```
//!
//! Prints a line per epoch and ends with `final loss=<x> accuracy=<y>` (test set).
//! `multi-worker` and `sharded` run one process per replica, and `parameter-server` one per
//! worker (`--replicas`) plus one per server (`--ps`, default 1; ranks `0..K`
//! serve): under a launcher (`braid run`, torchrun, mpirun, Slurm) they join the
//! job; otherwise they start their own ranks (copies of this program on this
//! host, meeting through a TCP store). With `--checkpoint DIR` training saves
//! after every epoch and, when DIR already holds a checkpoint, resumes from its
//! epoch. `TRAIN_DIGITS_CRASH=W:E` makes parameter-server worker W abort after
//! epoch E (how the tests kill a worker mid-training).
//!
//! `--elastic --min-replicas M` (multi-worker): a lost worker does not end
//! training; the survivors shrink and go on while at least M remain, redoing the
//! step that failed (`MultiWorkerMirrored::elastic`). The launcher then hosts the
//! store itself, so any worker may be lost. `TRAIN_DIGITS_KILL=W:E:S[,W:E:S]`
//! makes worker W (its first rank) kill itself with SIGKILL before step S of
//! epoch E. With `--replace` the launcher starts a replacement for each killed
//! worker (as torchrun's `--max-restarts` would), which joins the running job
//! (`MultiWorkerMirrored::join`) and trains from the step it was taken in at; the
//! survivors hold the step after a loss until the replacement waits
//! (`await_replacements`), and close joining when training ends. The
//! last leader prints `steps=N` (steps completed), each recovery and growth, and
//! a digest of the final weights (as every strategy does).
//!
//! `sharded` (ZeRO stages 1 and 2): each replica updates its shard of the weights
//! and keeps its shard of the optimizer state; every replica prints how many state
//! values it holds against one device's. `--momentum M` (sharded only) trains with
//! SGD with momentum M, whose state is sharded; without it the update is plain SGD.

#[path = "digits/mlp.rs"]
mod mlp;

#[path = "digits/elastic.rs"]
mod elastic;

use std::path::PathBuf;
use std::process::ExitCode;

use braid::strategy::{
    CentralStorage, CrossReplica, Mirrored, Momentum, MultiWorkerMirrored, OneDevice, ParameterServer, Sharded,
    Strategy, Tensors,
};

struct Args {
    strategy: String,
    replicas: usize,
    epochs: u64,
    global_batch: usize,
    seed: u64,
    lr: f32,
    checkpoint: Option<PathBuf>,
    data: PathBuf,
    servers: usize,
    staleness: Option<u64>,
    elastic: bool,
    min_replicas: usize,
    replace: bool,
    momentum: f32,
}

const USAGE: &str = "usage: train_digits --strategy one-device|mirrored|multi-worker|central-storage|parameter-server|sharded \
[--replicas N] [--epochs E] [--global-batch B] [--seed S] [--lr LR] [--checkpoint DIR] [--data FILE] [--ps K] [--staleness S] \
[--elastic [--min-replicas M] [--replace]] [--momentum M]";

fn parse() -> Result<Args, String> {
    let mut a = Args {
        strategy: String::new(),
        replicas: 1,
        epochs: 20,
        global_batch: 32,
        seed: 1,
        lr: 0.1,
        checkpoint: None,
        data: mlp::default_path(),
        servers: 1,
        staleness: None,
        elastic: false,
        min_replicas: 1,
        replace: false,
        momentum: 0.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|_| format!("{flag}: `{v}` is not a number"));
        match flag.as_str() {
            "--strategy" => a.strategy = value()?,
            "--replicas" => a.replicas = num(value()?)? as usize,
            "--epochs" => a.epochs = num(value()?)?,
            "--global-batch" => a.global_batch = num(value()?)? as usize,
            "--seed" => a.seed = num(value()?)?,
            "--lr" => a.lr = value()?.parse().map_err(|_| "--lr: not a number".to_string())?,
            "--checkpoint" => a.checkpoint = Some(PathBuf::from(value()?)),
            "--data" => a.data = PathBuf::from(value()?),
            "--ps" => a.servers = num(value()?)? as usize,
            "--staleness" => a.staleness = Some(num(value()?)?),
            "--elastic" => a.elastic = true,
            "--min-replicas" => a.min_replicas = num(value()?)? as usize,
            "--replace" => a.replace = true,
            "--momentum" => a.momentum = value()?.parse().map_err(|_| "--momentum: not a number".to_string())?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    if a.replicas == 0 || a.global_batch == 0 || a.servers == 0 {
        return Err("--replicas, --global-batch and --ps must be at least 1".into());
    }
    if a.elastic && a.strategy != "multi-worker" {
        return Err("--elastic applies to --strategy multi-worker".into());
    }
    if a.momentum != 0.0 && a.strategy != "sharded" {
        return Err("--momentum applies to --strategy sharded".into());
    }
    Ok(a)
}

fn make(a: &Args, vars: Tensors) -> Result<Box<dyn Strategy>, String> {
    let e = |e: braid::Error| e.to_string();
    Ok(match a.strategy.as_str() {
        "one-device" => Box::new(OneDevice::new(vars)),
        "mirrored" => Box::new(Mirrored::new(a.replicas, vars, CrossReplica::AllReduce).map_err(e)?),
        "central-storage" => Box::new(CentralStorage::new(a.replicas, vars).map_err(e)?),
        "multi-worker" => Box::new(MultiWorkerMirrored::from_env(vars).map_err(e)?),
        "sharded" => {
            let comm = braid::Communicator::from_env().map_err(e)?;
            let s = if a.momentum == 0.0 {
                Sharded::new(comm, vars).map_err(e)?
            } else {
                let opt = Momentum { lr: a.lr, momentum: a.momentum };
                Sharded::with_optimizer(comm, vars, Box::new(opt)).map_err(e)?
            };
            let whole = s.communicator().world_size();
            let shard = s.shard();
            let total: usize = s.variables().iter().map(Vec::len).sum();
            let per = usize::from(a.momentum != 0.0);
            println!(
                "replica {}: shard {}..{} of {total} weights; optimizer state {} values, one device's {} (1/{whole})",
                s.communicator().rank(),
                shard.start,
                shard.end,
                s.optimizer_state_len(),
                per * total
            );
            Box::new(s)
        }
        other => return Err(format!("unknown strategy `{other}`\n{USAGE}")),
    })
}

/// Whether a launcher already made this process a rank.
fn launched() -> bool {
    ["BRAID_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "TF_CONFIG"]
        .iter()
        .any(|k| std::env::var_os(k).is_some())
}

/// Start `replicas` copies of this program as the ranks of a multi-worker job and
/// wait for them; rank 0 hosts the store.
fn launch(ranks: usize) -> Result<(), String> {
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
    let key = elastic::job_key();
    let mut children = Vec::new();
    for rank in 0..ranks {
        children.push(elastic::start_rank(rank, ranks, port, &key, false)?);
    }
    let mut failed = Vec::new();
    for (rank, mut c) in children.into_iter().enumerate() {
        match c.wait() {
            Ok(s) if s.success() => {}
            Ok(s) => failed.push(format!("rank {rank}: {s}")),
            Err(e) => failed.push(format!("rank {rank}: {e}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("ranks failed: {}", failed.join("; ")))
    }
}

fn run(a: &Args) -> Result<(), String> {
    let ps = a.strategy == "parameter-server";
    if (a.strategy == "multi-worker" || a.strategy == "sharded" || ps) && !launched() {
        if a.elastic {
            return elastic::launch(a.replicas, a.min_replicas, a.replace);
        }
        return launch(a.replicas + if ps { a.servers } else { 0 });
    }
    let all = mlp::load(&a.data)?;
    let (train, test) = mlp::split(&all, a.seed);
    let ckpt = a.checkpoint.as_ref().map(|dir| dir.join("digits.ckpt"));
    let mut s: Box<dyn Strategy> = if ps {
        let mut p = ParameterServer::from_env(a.servers, mlp::init(a.seed), a.staleness).map_err(|e| e.to_string())?;
        if p.is_server() {
            return serve(&mut p, ckpt.as_deref(), a.lr);
        }
        Box::new(p)
    } else if a.elastic {
        let plan = mlp::Schedule { from: 0, epochs: a.epochs, global_batch: a.global_batch, seed: a.seed, lr: a.lr };
        return elastic::train(plan, a.min_replicas, a.replace, mlp::init(a.seed), (&train, &test));
    } else {
        make(a, mlp::init(a.seed))?
    };
    let crash = crash_point(a)?;
    let leader = s.local_replicas().start == 0;
    let mut from = 0;
    if let Some(path) = ckpt.as_ref().filter(|p| p.exists()) {
        from = s.restore(path).map_err(|e| e.to_string())?;
        if leader {
            println!("resumed from {} at epoch {from}", path.display());
        }
    }
    if let Some(dir) = &a.checkpoint {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    if leader {
        println!(
            "strategy={} replicas={} train={} test={} global_batch={} seed={}",
            s.name(),
            s.num_replicas_in_sync(),
            train.len(),
            test.len(),
            a.global_batch,
            a.seed
        );
    }
    let plan = mlp::Schedule { from, epochs: a.epochs, global_batch: a.global_batch, seed: a.seed, lr: a.lr };
    let last = mlp::train(s.as_mut(), (&train, &test), plan, |s, e| {
        if let Some(path) = &ckpt {
            s.save(path, e.epoch).map_err(|e| e.to_string())?;
        }
        if leader {
            println!("epoch {} loss={:.5} accuracy={:.4}", e.epoch, e.loss, e.accuracy);
        }
        if crash == Some((s.local_replicas().start, e.epoch)) {
            eprintln!(
                "train_digits: worker {} crashing after epoch {} (TRAIN_DIGITS_CRASH)",
                s.local_replicas().start,
                e.epoch
            );
            std::process::abort();
        }
        Ok(())
    })?;
    if leader {
        println!("weights digest={:.9e}", elastic::digest(s.variables()));
        println!("final loss={:.5} accuracy={:.4}", last.loss, last.accuracy);
    }
    Ok(())
}

/// A parameter server: take the checkpoint's shard if there is one, then serve
/// until every worker is done or lost.
fn serve(p: &mut ParameterServer, ckpt: Option<&std::path::Path>, lr: f32) -> Result<(), String> {
    if let Some(path) = ckpt.filter(|p| p.exists()) {
        let c = braid::strategy::read_checkpoint(path, Some(p.variables())).map_err(|e| e.to_string())?;
        p.set_variables(c.vars).map_err(|e| e.to_string())?;
    }
    let report = p.serve(&mlp::sgd(lr)).map_err(|e| e.to_string())?;
    if !report.lost.is_empty() {
        eprintln!("train_digits: parameter server: workers {:?} finished, {:?} lost", report.finished, report.lost);
    }
    Ok(())
}

/// `TRAIN_DIGITS_CRASH=W:E`: parameter-server worker W aborts after epoch E.
fn crash_point(a: &Args) -> Result<Option<(usize, u64)>, String> {
    let Ok(spec) = std::env::var("TRAIN_DIGITS_CRASH") else { return Ok(None) };
    let bad = || format!("TRAIN_DIGITS_CRASH=`{spec}`: expected WORKER:EPOCH");
    let (w, e) = spec.split_once(':').ok_or_else(bad)?;
    if a.strategy != "parameter-server" {
        return Err("TRAIN_DIGITS_CRASH applies to --strategy parameter-server".into());
    }
    Ok(Some((w.parse().map_err(|_| bad())?, e.parse().map_err(|_| bad())?)))
}

fn main() -> ExitCode {
    match parse().and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train_digits: {e}");
            ExitCode::FAILURE
        }
    }
}
