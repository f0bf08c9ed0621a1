//! `braid drill`: rehearse a failure. Every rank runs the same list of collectives,
//! over and over, except where the command says one rank misbehaves: it skips a
//! call, calls another collective in its place, or stops (exits, or sits without
//! polling its links). Run it under a launcher with `BRAID_TRACE_DIR` set, then
//! `braid doctor` on that directory shows what operators would see after a real
//! incident — and tests check that it names the rank that misbehaved.

use std::time::Duration;

use braid::{CallSig, Communicator, Config, DType, OpKind, ReduceOp};
use clap::Args;

use crate::perf::parse_op;

/// `braid drill` arguments.
#[derive(Args, Debug)]
pub struct DrillArgs {
    /// Collectives every rank calls in turn, comma separated (all-reduce, broadcast,
    /// all-gather, reduce-scatter, barrier)
    #[arg(long, default_value = "all-reduce")]
    pub calls: String,
    /// Passes over the list
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Elements (f32) of each call's block
    #[arg(long, default_value_t = 1024)]
    pub count: usize,
    /// `RANK:CALL`: that rank skips its CALL-th call (0-based, across passes)
    #[arg(long)]
    pub skip: Option<String>,
    /// `RANK:CALL:OP`: that rank calls OP instead of its CALL-th call
    #[arg(long)]
    pub replace: Option<String>,
    /// `RANK:CALL`: that rank leaves the job (exits 3) before its CALL-th call
    #[arg(long)]
    pub exit: Option<String>,
    /// `RANK:CALL`: that rank sleeps before its CALL-th call (a rank stuck outside
    /// braid), for --hang-seconds
    #[arg(long)]
    pub hang: Option<String>,
    /// How long a --hang lasts
    #[arg(long, default_value_t = 600)]
    pub hang_seconds: u64,
    /// Seconds every rank stays after its calls, its communicator alive, for a
    /// scraper (BRAID_METRICS_ADDR) or a person to look at it
    #[arg(long, default_value_t = 0)]
    pub linger: u64,
    /// When a call fails, agree with the survivors and shrink to them
    /// (`Communicator::shrink`), then check an all-reduce on the shrunk
    /// communicator: every survivor adds rank + 1 of its old rank, exactly
    #[arg(long)]
    pub shrink: bool,
}

/// After call `i` failed with `e`: shrink to the survivors and check an exact
/// all-reduce on them; the exit code.
fn shrink_and_check(comm: &Communicator, i: usize, e: &braid::Error) -> i32 {
    let me = comm.rank();
    println!("rank {me}: call {i} failed: {e}");
    let started = std::time::Instant::now();
    let agreement = match comm.agree() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("braid drill: rank {me}: agree: {e}");
            return 1;
        }
    };
    let small = match comm.shrink_to(&agreement) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("braid drill: rank {me}: shrink: {e}");
            return 1;
        }
    };
    let want: i64 = agreement.live.iter().map(|&r| r as i64 + 1).sum();
    let mut v = vec![me as i64 + 1; 1001];
    if let Err(e) = small.all_reduce_in_place(&mut v, braid::ReduceOp::Sum) {
        eprintln!("braid drill: rank {me}: all-reduce after the shrink: {e}");
        return 1;
    }
    if let Some(bad) = v.iter().position(|&x| x != want) {
        eprintln!("braid drill: rank {me}: after the shrink, element {bad} is {} not {want}", v[bad]);
        return 1;
    }
    println!(
        "rank {me}: shrunk to {} ranks {:?} as rank {} after {} completed calls in {:.3} s; sum {want} ok",
        small.world_size(),
        agreement.live,
        small.rank(),
        agreement.completed_calls,
        started.elapsed().as_secs_f64()
    );
    0
}

/// `RANK:CALL[:REST]` of a drill flag.
fn at(flag: &str, spec: &str) -> Result<(usize, usize, Option<String>), String> {
    let mut parts = spec.splitn(3, ':');
    let mut num = |what: &str| -> Result<usize, String> {
        let p = parts.next().ok_or_else(|| format!("--{flag} {spec}: no {what}"))?;
        p.trim().parse().map_err(|_| format!("--{flag} {spec}: `{p}` is not a {what}"))
    };
    let (rank, call) = (num("rank")?, num("call index")?);
    Ok((rank, call, parts.next().map(str::to_string)))
}

fn one_call(comm: &Communicator, op: OpKind, count: usize) -> braid::Result<()> {
    let n = comm.world_size();
    let sig = |count: usize| CallSig::new(op, DType::F32, count as u64, 0, ReduceOp::Sum);
    match op {
        OpKind::Barrier => comm.barrier(),
        OpKind::AllGather => {
            let input = vec![1u8; count * 4];
            let mut output = vec![0u8; n * count * 4];
            comm.collective_bytes(sig(count), Some(&input), &mut output)
        }
        OpKind::ReduceScatter => {
            let mut buf = vec![0u8; n * count * 4];
            comm.collective_bytes(sig(count), None, &mut buf)
        }
        OpKind::AllReduce | OpKind::Broadcast => {
            let mut buf = vec![0u8; count * 4];
            comm.collective_bytes(sig(count), None, &mut buf)
        }
        other => Err(braid::Error::InvalidArgument(format!("braid drill does not call {other}"))),
    }
}

/// Run the drill on this rank (launched: `BRAID_RANK` and the rest set); the exit code.
pub fn run(a: DrillArgs) -> i32 {
    let calls: Result<Vec<OpKind>, String> = a.calls.split(',').map(|s| parse_op(s.trim())).collect();
    let flags = (|| -> Result<_, String> {
        let skip = a.skip.as_deref().map(|s| at("skip", s)).transpose()?;
        let replace = a.replace.as_deref().map(|s| at("replace", s)).transpose()?;
        let replace = match replace {
            Some((r, c, Some(op))) => Some((r, c, parse_op(&op)?)),
            Some(_) => return Err("--replace RANK:CALL:OP needs an OP".into()),
            None => None,
        };
        let exit = a.exit.as_deref().map(|s| at("exit", s)).transpose()?;
        let hang = a.hang.as_deref().map(|s| at("hang", s)).transpose()?;
        Ok((skip, replace, exit, hang))
    })();
    let (calls, (skip, replace, exit, hang)) = match (calls, flags) {
        (Ok(c), Ok(f)) if !c.is_empty() => (c, f),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("braid drill: {e}");
            return 2;
        }
        _ => {
            eprintln!("braid drill: --calls is empty");
            return 2;
        }
    };
    let comm = match Config::from_env().and_then(|cfg| braid::CommunicatorBuilder::from_config(cfg).build()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("braid drill: {e}");
            return 1;
        }
    };
    let me = comm.rank();
    let mine = |flag: Option<(usize, usize, Option<String>)>, i: usize| flag.is_some_and(|(r, c, _)| r == me && c == i);
    for i in 0..calls.len() * a.repeat {
        if mine(exit.clone(), i) {
            println!("rank {me}: leaving before call {i}");
            std::process::exit(3);
        }
        if mine(hang.clone(), i) {
            println!("rank {me}: hanging before call {i}");
            std::thread::sleep(Duration::from_secs(a.hang_seconds));
        }
        if mine(skip.clone(), i) {
            println!("rank {me}: skipping call {i} ({})", calls[i % calls.len()]);
            continue;
        }
        let op = match replace {
            Some((r, c, op)) if r == me && c == i => op,
            _ => calls[i % calls.len()],
        };
        if let Err(e) = one_call(&comm, op, a.count) {
            if a.shrink {
                return shrink_and_check(&comm, i, &e);
            }
            eprintln!("braid drill: rank {me}: call {i} ({op}): {e}");
            return 1;
        }
        // The first call connects everyone: a test may now stop or kill a rank.
        if i == 0 {
            println!("rank {me}: running");
        }
    }
    if a.linger > 0 {
        println!("rank {me}: lingering");
        std::thread::sleep(Duration::from_secs(a.linger));
    }
    println!("rank {me}: done");
    0
}
