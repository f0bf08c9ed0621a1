//! `braid perf`: an nccl-tests-style sweep, out of place and in place side by side.
//! What the buffers hold and how results are checked: [`crate::perf_check`].

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid::config::parse_size;
use braid::device::Device;
use braid::TransportKind;
use braid::{CallSig, Communicator, Config, DType, OpKind, ReduceOp};
use clap::Args;

use crate::launch::{launch, Launch};
use crate::perf_ceiling::{self, Ceiling};
use crate::perf_check::{check, fill_inputs};
use crate::perf_device::{self, DeviceBufs, DeviceChoice};
use crate::plot;

/// Arguments of `braid perf`. The short flags are nccl-tests' (`-b -e -f -n -w -c -o
/// -d -r`), so its command lines port as they are.
#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// Collective to measure, or `send-recv`: each rank sends the size to rank + 1 and
    /// receives it from rank - 1 (even ranks send first), from a send buffer into a
    /// separate receive buffer; busbw is the bytes one rank sends over the time.
    #[arg(long, default_value = "all-reduce", value_parser = parse_op)]
    pub op: OpKind,
    /// Ranks to launch locally when not already running under a launcher.
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// Smallest size (bytes; K/M/G suffixes are powers of 1024).
    #[arg(short = 'b', long, default_value = "1K", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size.
    #[arg(short = 'e', long, default_value = "64M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiply the size by this factor between steps.
    #[arg(short = 'f', long, default_value_t = 2.0)]
    pub factor: f64,
    /// Timed iterations per size (default: 200 up to 64 KiB, 50 up to 1 MiB, 20 above).
    #[arg(short = 'n', long)]
    pub iters: Option<usize>,
    /// Untimed warm-up iterations per size.
    #[arg(short = 'w', long, default_value_t = 5)]
    pub warmup: usize,
    /// Element type (also nccl-tests' names: float, half, bfloat16, double, int8, ...).
    #[arg(short = 'd', long, default_value = "f32")]
    pub dtype: DType,
    /// Reduction operator.
    #[arg(short = 'o', long = "reduce-op", default_value = "sum")]
    pub reduce_op: ReduceOp,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long, default_value_t = 0)]
    pub root: usize,
    /// `auto` (the tuner picks), an algorithm (`ring`, `tree`, `hierarchical`, ...),
    /// a list in `BRAID_ALGO`'s syntax (`ring,tree`, `^direct`), or `all`: the
    /// tuner's pick (`auto:<algo>`) and every algorithm of the op in turn at each
    /// size, one row each.
    #[arg(long, default_value = "auto")]
    pub algo: String,
    /// Transport: `auto` (shared memory within a host, RDMA verbs or else TCP across),
    /// `shm`, `tcp`, `rdma` (needs the `rdma` feature and a device), `inproc` (threads
    /// of one process), `cuda` (buffers on GPUs, moved over the automatic links: the
    /// same as `--device cuda`). Where one cannot run, one line says why.
    #[arg(long, default_value = "auto")]
    pub transport: String,
    /// Where the buffers live: `none` (host memory), `sim` (the simulated device),
    /// `cuda` (GPU `rank % count` of this host).
    #[arg(long, value_enum, default_value = "none")]
    pub device: DeviceChoice,
    /// Odd ranks keep their buffers in host memory while even ranks use `--device`,
    /// to check host and device ranks in one job (ranks as processes only).
    #[arg(long)]
    pub mixed: bool,
    /// Measure only out of place (separate input and output buffers). By default each
    /// size is measured out of place, then in place, and printed side by side as
    /// nccl-tests does.
    #[arg(long, conflicts_with = "in_place")]
    pub out_of_place: bool,
    /// Measure only in place (the result overwrites the input).
    #[arg(long)]
    pub in_place: bool,
    /// Allocate the buffers as registered shared memory (`braid::registered`), so
    /// peers on the host read them without a system call.
    #[arg(long)]
    pub registered: bool,
    /// Compare every element of the result; exit non-zero if any is wrong. `-c 1`
    /// or `-c 0` as in nccl-tests; `--check` alone means 1.
    #[arg(short = 'c', long, num_args = 0..=1, default_value = "0", default_missing_value = "1", value_parser = parse_switch)]
    pub check: bool,
    /// Append one JSON object per size and mode (`"place"`) to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Draw busbw against message size into this SVG file (rank 0 writes it), one line
    /// labelled by op, algorithm, transport, ranks and type. To draw several runs in one
    /// plot, save each with `--json` and give the files to `braid plot OUT.svg FILE...`.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
}

/// `0`/`1` (nccl-tests) or `false`/`true`.
fn parse_switch(s: &str) -> Result<bool, String> {
    match s {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        other => Err(format!("`{other}` is not 0 or 1")),
    }
}

/// `send-recv` (also `sendrecv`, `send`, `recv`) is [`OpKind::Send`]: the point-to-point
/// sweep; anything else names a collective.
pub fn parse_op(s: &str) -> Result<OpKind, String> {
    if matches!(s.to_ascii_lowercase().as_str(), "send-recv" | "sendrecv" | "send_recv") {
        return Ok(OpKind::Send);
    }
    let op: OpKind = s.parse()?;
    if op.varies() {
        return Err(format!("braid perf does not time {op}: its blocks' sizes are per rank (time all-gather, reduce-scatter or all-to-all)"));
    }
    Ok(if op == OpKind::Recv { OpKind::Send } else { op })
}

/// The op as `braid perf` prints it.
fn op_label(op: OpKind) -> &'static str {
    if op == OpKind::Send {
        "send-recv"
    } else {
        op.name()
    }
}

/// Where a call's result goes: into a separate output buffer, or over its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    OutOfPlace,
    InPlace,
}

impl Place {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Place::OutOfPlace => "out-of-place",
            Place::InPlace => "in-place",
        }
    }
}

/// The modes measured at each size, in the order nccl-tests prints them.
fn places(a: &PerfArgs) -> Vec<Place> {
    match a.op {
        // A rank's send and receive buffers are always apart: a receive in place would
        // overwrite what an odd rank (which receives first) has yet to send.
        OpKind::Send => vec![Place::OutOfPlace],
        // No buffers at all: one measurement, shown in the in-place columns.
        OpKind::Barrier => vec![Place::InPlace],
        _ if a.out_of_place => vec![Place::OutOfPlace],
        _ if a.in_place => vec![Place::InPlace],
        _ => vec![Place::OutOfPlace, Place::InPlace],
    }
}

pub fn main(mut args: PerfArgs) -> i32 {
    if args.transport.eq_ignore_ascii_case("cuda") {
        if args.device == DeviceChoice::Sim {
            eprintln!("braid perf: --transport cuda puts the buffers on GPUs; it does not go with --device sim");
            return 2;
        }
        args.device = DeviceChoice::Cuda;
    }
    if args.plot.is_some() && args.op == OpKind::Barrier {
        eprintln!("braid perf: --plot draws busbw against size, and a barrier moves no bytes");
        return 2;
    }
    if args.factor <= 1.0 && args.min_bytes != args.max_bytes {
        eprintln!("braid perf: --factor must be greater than 1");
        return 2;
    }
    let transport = args.transport.to_ascii_lowercase();
    if args.mixed && (args.device == DeviceChoice::None || transport == "inproc") {
        eprintln!("braid perf: --mixed needs --device, and ranks as processes (not --transport inproc)");
        return 2;
    }
    if transport == "inproc" {
        return threads(args);
    }
    if transport != "auto" {
        match transport.parse::<TransportKind>() {
            Err(e) => {
                eprintln!("braid perf: {e}");
                return 2;
            }
            // Said once here, not by every rank after launching them.
            Ok(kind) => {
                if let Err(why) = kind.available() {
                    eprintln!("braid perf: {why}");
                    return 2;
                }
            }
        }
    }
    match Config::from_env() {
        Ok(cfg) => one_rank(args, cfg),
        // Under a launcher, its variables are wrong or incomplete: say so, rather
        // than start ranks of our own.
        Err(e) if Config::launcher_present(|k| std::env::var(k).ok()) => {
            eprintln!("braid perf: {e}");
            1
        }
        Err(_) => {
            // Not under a launcher: start --ranks copies of ourselves.
            if !plot_target_ok(&args) {
                return 2;
            }
            let exe = match std::env::current_exe() {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(e) => {
                    eprintln!("braid perf: cannot find own executable: {e}");
                    return 1;
                }
            };
            launch(Launch {
                ranks: args.ranks,
                program: exe,
                args: std::env::args().skip(1).collect(),
                prefix: false,
                grace: Duration::from_secs(2),
                extra_env: vec![],
            })
        }
    }
}

fn one_rank(args: PerfArgs, mut cfg: Config) -> i32 {
    // CUDA buffers move over the automatic links (see `--device`).
    if let Ok(kind) = args.transport.parse::<TransportKind>().map_err(|_| ()).and_then(|k| {
        if k == TransportKind::Cuda {
            Err(())
        } else {
            Ok(k)
        }
    }) {
        cfg.transports = Some(vec![kind]);
    }
    let rank = cfg.rank;
    // The device is bound to the communicator (as NCCL binds one to a GPU), so
    // ranks whose devices reach each other's memory copy from it directly.
    let choice = if args.mixed && rank % 2 == 1 { DeviceChoice::None } else { args.device };
    let result = perf_device::open(choice, rank).and_then(|device| {
        let mut builder = braid::CommunicatorBuilder::from_config(cfg);
        if let Some(d) = device {
            builder = builder.device(d);
        }
        builder.build().and_then(|comm| sweep(&comm, &args))
    });
    finish(rank, result)
}

/// Before ranks are started for nothing: can the `--plot` file be written? Under a
/// launcher only rank 0 asks, in [`sweep`].
fn plot_target_ok(args: &PerfArgs) -> bool {
    match args.plot.as_deref().map(plot::check_writable) {
        Some(Err(e)) => {
            eprintln!("braid perf: --plot: {e}");
            false
        }
        _ => true,
    }
}

fn threads(args: PerfArgs) -> i32 {
    if !plot_target_ok(&args) {
        return 2;
    }
    let devices: braid::Result<Vec<_>> = (0..args.ranks).map(|r| perf_device::open(args.device, r)).collect();
    let comms = match devices.map(|d| d.into_iter().flatten().collect::<Vec<_>>()) {
        Ok(d) if !d.is_empty() => Communicator::in_process_on(d),
        Ok(_) => Communicator::in_process(args.ranks),
        Err(e) => Err(e),
    };
    let comms = match comms {
        Ok(c) => c,
        Err(e) => {
            eprintln!("braid perf: {e}");
            return 1;
        }
    };
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let a = args.clone();
            std::thread::spawn(move || {
                let rank = c.rank();
                finish(rank, sweep(&c, &a))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap_or(1)).max().unwrap_or(0)
}

fn finish(rank: usize, result: braid::Result<u64>) -> i32 {
    match result {
        Ok(0) => 0,
        Ok(wrong) => {
            if rank == 0 {
                eprintln!("braid perf: {wrong} wrong element(s)");
            }
            1
        }
        Err(e) => {
            eprintln!("braid perf: rank {rank}: error: {e}");
            1
        }
    }
}

/// One size of the sweep: buffers, how to run the op, how to check it.
type Buf = Box<dyn std::ops::DerefMut<Target = [u8]> + Send>;

pub(crate) struct Case {
    pub(crate) sig: CallSig,
    bytes: usize,
    pub(crate) out_of_place: bool,
    input: Buf,
    pub(crate) output: Buf,
    /// The filled input, copied in before every iteration (a memcpy, not a re-encode).
    pristine: Vec<u8>,
    /// With `--device`: the buffers the collective runs on (`output` then receives
    /// a copy of the result for `--check`).
    pub(crate) dev: Option<DeviceBufs>,
}

fn alloc(a: &PerfArgs, len: usize) -> braid::Result<Buf> {
    Ok(if a.registered { Box::new(braid::registered::SharedBuffer::<u8>::new(len)?) } else { Box::new(vec![0u8; len]) })
}

fn case(
    comm: &Communicator,
    a: &PerfArgs,
    size: usize,
    place: Place,
    device: Option<&Arc<dyn Device>>,
) -> braid::Result<Case> {
    let (n, dt, esz) = (comm.world_size(), a.dtype, a.dtype.size());
    let out_of_place = place == Place::OutOfPlace;
    let count = match a.op {
        OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll | OpKind::Gather | OpKind::Scatter => {
            size / (n * esz)
        }
        OpKind::Barrier => 0,
        _ => size / esz,
    };
    let sig = CallSig::new(a.op, dt, count as u64, a.root as u32, a.reduce_op);
    let (in_len, out_len, bytes) = match a.op {
        OpKind::AllGather => (count * esz, n * count * esz, n * count * esz),
        // In place, the result lands inside the full input buffer.
        OpKind::ReduceScatter if !out_of_place => (0, n * count * esz, n * count * esz),
        OpKind::ReduceScatter => (n * count * esz, count * esz, n * count * esz),
        OpKind::AllToAll => (n * count * esz, n * count * esz, n * count * esz),
        OpKind::Barrier => (0, 0, 0),
        // Rooted: only the root holds all blocks; in place, one buffer per rank.
        OpKind::Gather | OpKind::Scatter => {
            let (block, all) = (count * esz, n * count * esz);
            let root_buf = |on_root: usize, off_root: usize| if comm.rank() == a.root { on_root } else { off_root };
            match (a.op, out_of_place) {
                (OpKind::Gather, true) => (block, root_buf(all, 0), all),
                (OpKind::Scatter, true) => (root_buf(all, 0), block, all),
                _ => (0, root_buf(all, block), all),
            }
        }
        _ => (count * esz, count * esz, count * esz),
    };
    let dev = device.map(|d| DeviceBufs::new(d, in_len, out_len)).transpose()?;
    let (input, output) = (alloc(a, in_len)?, alloc(a, out_len)?);
    let mut c = Case { sig, bytes, out_of_place, input, output, pristine: Vec::new(), dev };
    let mut p = vec![0u8; if out_of_place { in_len } else { out_len }];
    fill_inputs(comm, a, &c, &mut p);
    c.pristine = p;
    Ok(c)
}

/// Refill the inputs (untimed) so every iteration reduces the same values.
fn prepare(c: &mut Case) -> braid::Result<()> {
    if let Some(d) = &mut c.dev {
        let target = if c.out_of_place { &mut d.input } else { &mut d.output };
        return target.write(&c.pristine);
    }
    let target = if c.out_of_place { &mut c.input } else { &mut c.output };
    target.copy_from_slice(&c.pristine);
    Ok(())
}

/// One timed iteration.
fn run(comm: &Communicator, a: &PerfArgs, c: &mut Case) -> braid::Result<()> {
    if a.op == OpKind::Send {
        return send_recv(comm, a.dtype, c);
    }
    match &mut c.dev {
        Some(d) => comm.collective_device(c.sig, c.out_of_place.then_some(&d.input), &mut d.output),
        None if c.out_of_place => comm.collective_bytes(c.sig, Some(&c.input), &mut c.output),
        None => comm.collective_bytes(c.sig, None, &mut c.output),
    }
}

/// One iteration of `send-recv`: to rank + 1, from rank - 1. Even ranks send first and
/// odd ranks receive first, so a blocking send always meets a posted receive (with an
/// odd world the last rank and rank 0 both send first, and the chain still resolves
/// from rank 1).
fn send_recv(comm: &Communicator, dt: DType, c: &mut Case) -> braid::Result<()> {
    let (n, r) = (comm.world_size(), comm.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for step in if r % 2 == 0 { [0, 1] } else { [1, 0] } {
        match (&mut c.dev, step) {
            (Some(d), 0) => comm.send_device(&d.input, dt, next)?,
            (Some(d), _) => comm.recv_device(&mut d.output, dt, prev)?,
            (None, 0) => comm.send_bytes(&c.input, dt, next)?,
            (None, _) => comm.recv_bytes(&mut c.output, dt, prev)?,
        }
    }
    Ok(())
}

/// Name of a transport code from the gather in [`sweep`] (0: no link).
fn transport_label(code: u8) -> &'static str {
    [TransportKind::InProcess, TransportKind::Tcp, TransportKind::Shm, TransportKind::Cuda, TransportKind::Rdma]
        .into_iter()
        .find(|k| *k as u8 + 1 == code)
        .map_or("none", |k| k.name())
}

fn busbw_factor(op: OpKind, n: usize) -> f64 {
    let n = n as f64;
    match op {
        OpKind::AllReduce => 2.0 * (n - 1.0) / n,
        OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll | OpKind::Gather | OpKind::Scatter => {
            (n - 1.0) / n
        }
        _ => 1.0,
    }
}

fn sizes(a: &PerfArgs) -> Vec<usize> {
    if a.op == OpKind::Barrier {
        return vec![0];
    }
    let mut v = Vec::new();
    let mut s = a.min_bytes.max(1) as f64;
    while s <= a.max_bytes as f64 * 1.000001 {
        v.push(s.round() as usize);
        if a.factor <= 1.0 {
            break;
        }
        s *= a.factor;
    }
    v
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    }
}

/// Untimed calls at each size before `--algo all` times its rotation.
const SETTLE_CALLS: usize = 10;
/// Passes of `--algo all`'s rotation at each size: each algorithm's timed calls are
/// cut into this many blocks that alternate with the others', so a drift of the
/// machine while a size is swept spreads over every algorithm instead of landing on
/// whichever ran at that moment (4 ranks on 2 cores: the tuner's own calls of an
/// algorithm differed from the same algorithm forced by up to 1.33x in one block each).
const ROTATION_PASSES: usize = 5;

/// Run the sweep on this rank; rank 0 prints. Returns the total of wrong elements.
fn sweep(comm: &Communicator, a: &PerfArgs) -> braid::Result<u64> {
    let (n, rank) = (comm.world_size(), comm.rank());
    if a.op == OpKind::Send && n < 2 {
        return Err(braid::Error::InvalidArgument("send-recv needs at least 2 ranks".into()));
    }
    if a.root >= n {
        return Err(braid::Error::InvalidArgument(format!("--root {} is not below --ranks {n}", a.root)));
    }
    // `all` alternates the tuner's pick (None, printed `auto:<algo>`) and every
    // algorithm at each size, so the pick is compared with each in the same run;
    // anything else is a policy.
    let rotating = a.algo.eq_ignore_ascii_case("all");
    let rotation: Vec<Option<braid::algorithm::Algorithm>> = if rotating {
        std::iter::once(None).chain(braid::algorithm::algorithms_for(a.op).iter().copied().map(Some)).collect()
    } else {
        let policy: braid::tuner::AlgoPolicy =
            a.algo.parse().map_err(|e| braid::Error::InvalidArgument(format!("--algo: {e}")))?;
        comm.set_algorithms(policy);
        vec![None]
    };
    // Every rank's transport to every peer, gathered so rank 0 can print them all.
    let codes: Vec<u8> = comm.transports().iter().map(|t| t.map_or(0, |k| k as u8 + 1)).collect();
    let mut all_codes = vec![0u8; n * n];
    comm.all_gather(&codes, &mut all_codes)?;
    // And the CPUs each rank may run on (after placement).
    let mut cpus = [0u8; 32];
    let aff = braid::placement::describe_affinity();
    let len = aff.len().min(cpus.len());
    cpus[..len].copy_from_slice(&aff.as_bytes()[..len]);
    let mut all_cpus = vec![0u8; 32 * n];
    comm.all_gather(&cpus, &mut all_cpus)?;
    let cpus_of =
        |r: usize| String::from_utf8_lossy(&all_cpus[r * 32..(r + 1) * 32]).trim_end_matches('\0').to_string();
    let mut json = match (&a.json, rank) {
        (Some(path), 0) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| braid::Error::io(format!("opening {}", path.display()), e))?,
        ),
        _ => None,
    };
    if let (Some(path), 0) = (&a.plot, rank) {
        plot::check_writable(path).map_err(|e| braid::Error::InvalidArgument(format!("--plot: {e}")))?;
    }
    // Rank 0's rows for --plot, read back from the same JSON that --json writes.
    let mut plot_rows = Vec::new();
    let mut kinds: Vec<&str> = all_codes.iter().filter(|c| **c != 0).map(|c| transport_label(*c)).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let transport_name = if kinds.is_empty() { "none".to_string() } else { kinds.join("+") };
    let modes = places(a);
    let mut ceiling = Ceiling::new(comm, a);
    // Every size's modes, for the ceiling measured after the sweep; rank 0's rows
    // (their JSON), completed with their bound then.
    let mut measured_sizes: Vec<(usize, Vec<Place>)> = Vec::new();
    let mut rows_out: Vec<(Place, serde_json::Value)> = Vec::new();
    if rank == 0 {
        let redop = if a.op.reduces() { format!(" redop={}", a.reduce_op) } else { String::new() };
        let root = if a.op.rooted() { format!(" root={}", a.root) } else { String::new() };
        let measured: Vec<&str> = modes.iter().map(|p| p.name()).collect();
        println!(
            "# braid perf: {} world={n} dtype={}{redop}{root} {}",
            op_label(a.op),
            a.dtype,
            measured.join(" and ")
        );
        println!("# transport: {transport_name}   algorithm: {}", a.algo);
        for r in 0..n {
            let peers: Vec<String> =
                (0..n).filter(|&p| p != r).map(|p| format!("{p}={}", transport_label(all_codes[r * n + p]))).collect();
            let links = if peers.is_empty() { "(alone)".into() } else { peers.join(" ") };
            println!("# rank {r}: {links}   cpus {}", cpus_of(r));
        }
        println!("#");
        let groups = format!("# {:47} {:^43} {:^43}", "", "out-of-place", "in-place");
        println!("{}", groups.trim_end());
        let mode_cols = format!("{:>10} {:>11} {:>11} {:>8}", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        println!(
            "# {:>12} {:>12} {:>6} {:>6} {:>5} {mode_cols} {mode_cols} {:>6}",
            "size", "count", "type", "redop", "root", "algo"
        );
    }
    let mut total_wrong = 0u64;
    let mut busbw_sum = 0.0;
    let mut sizes_done = 0;
    let device = comm.device();
    // Every rank asks whether any rank has a device (under --mixed some do not), so
    // all of them call the gather below or none does.
    if a.device != DeviceChoice::None {
        // Every rank's device, gathered so rank 0 can print them all.
        let mut mine = [0u8; 64];
        let name = device.as_ref().map_or_else(|| "host".to_string(), |d| d.describe());
        let len = name.len().min(mine.len());
        mine[..len].copy_from_slice(&name.as_bytes()[..len]);
        let mut all = vec![0u8; 64 * n];
        comm.all_gather(&mine, &mut all)?;
        if rank == 0 {
            let names: Vec<String> = all
                .chunks(64)
                .enumerate()
                .map(|(r, b)| format!("{r}={}", String::from_utf8_lossy(b).trim_end_matches('\0')))
                .collect();
            println!("# device buffers: {}", names.join(" "));
        }
    }
    for size in sizes(a) {
        // Each mode in turn at this size (nccl-tests' order), each entry of the rotation
        // in each; a row then shows every mode of one entry.
        let mut per_mode = Vec::with_capacity(modes.len());
        for &place in &modes {
            if let Some(m) = measure(comm, a, size, place, device.as_ref(), &rotation, rotating)? {
                per_mode.push((place, m));
            }
        }
        let Some((_, first)) = per_mode.first() else { continue };
        let (bytes, count) = (first.bytes, first.count);
        measured_sizes.push((bytes, per_mode.iter().map(|(p, _)| *p).collect::<Vec<Place>>()));
        for entry in 0..rotation.len() {
            let mut cols = Vec::new();
            let mut labels: Vec<&str> = Vec::new();
            for place in [Place::OutOfPlace, Place::InPlace] {
                let Some((_, m)) = per_mode.iter().find(|(p, _)| *p == place) else {
                    cols.push(format!("{:>10} {:>11} {:>11} {:>8}", "n/a", "n/a", "n/a", "n/a"));
                    continue;
                };
                let (algo, t, wrong) = &m.rows[entry];
                total_wrong += wrong.unwrap_or(0);
                let algbw = if *t > 0.0 { bytes as f64 / t / 1e9 } else { 0.0 };
                let busbw = algbw * busbw_factor(a.op, n);
                busbw_sum += busbw;
                sizes_done += 1;
                if !labels.contains(&algo.as_str()) {
                    labels.push(algo);
                }
                let w = wrong.map(|w| w.to_string()).unwrap_or_else(|| "N/A".into());
                cols.push(format!("{:>10.2} {:>11.3} {:>11.3} {:>8}", t * 1e6, algbw, busbw, w));
                if rank == 0 {
                    let line = serde_json::json!({
                        "op": op_label(a.op), "bytes": bytes, "count": count, "dtype": a.dtype.name(),
                        "ranks": n, "transport": transport_name, "algo": algo, "place": place.name(),
                        "time_us": t * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": wrong,
                    });
                    rows_out.push((place, line));
                }
            }
            if rank == 0 {
                // nccl-tests prints -1 where an op has no root, and the header then names none.
                let root = if a.op.rooted() { a.root.to_string() } else { "-1".into() };
                let redop = if a.op.reduces() { a.reduce_op.name() } else { "none" };
                println!(
                    "  {:>12} {:>12} {:>6} {:>6} {:>5} {} {} {:>6}",
                    bytes,
                    count,
                    a.dtype.name(),
                    redop,
                    root,
                    cols[0],
                    cols[1],
                    labels.join("/")
                );
                let _ = std::io::stdout().flush();
            }
        }
    }
    if rank == 0 {
        if a.check {
            println!("# Out of bounds values : {} {}", total_wrong, if total_wrong == 0 { "OK" } else { "FAILED" });
        } else {
            println!("# Out of bounds values : not checked (run with --check)");
        }
        println!(
            "# Avg bus bandwidth    : {:.4} GB/s",
            if sizes_done > 0 { busbw_sum / sizes_done as f64 } else { 0.0 }
        );
    }
    // The memory ceiling, measured only now: between sizes, its copies on every core
    // slowed the latency-bound calls of the next sizes (TCP all-reduce of 16 KiB: 10
    // µs against 7.5), in the way a machine changing state does.
    for (bytes, places) in &measured_sizes {
        ceiling.measure(comm, *bytes, places)?;
    }
    if rank == 0 {
        if !rows_out.is_empty() {
            println!("{}", ceiling.header());
        }
        for (place, mut line) in rows_out {
            let (bytes, t) = (line["bytes"].as_u64().unwrap_or(0) as usize, line["time_us"].as_f64().unwrap_or(0.0));
            let bound = ceiling.row(bytes, place, t / 1e6);
            if let Some(b) = &bound {
                line["bound_fraction"] = b.fraction.into();
                line["bound_us"] = b.bound_us().into();
                line["ceiling_copy_gbps"] = (b.rates.copy / 1e9).into();
                line["ceiling_reduce_gbps"] = (b.rates.reduce / 1e9).into();
            }
            if let Some(text) = perf_ceiling::line(&line, bound.as_ref()) {
                println!("{text}");
            }
            if let Some(f) = json.as_mut() {
                writeln!(f, "{line}").map_err(|e| braid::Error::io("writing --json", e))?;
            }
            if a.plot.is_some() {
                plot_rows.push(plot::Row::from_json(&line).map_err(braid::Error::InvalidArgument)?);
            }
        }
        if let Some(line) = ceiling.footer() {
            println!("{line}");
        }
    }
    if let (Some(path), 0) = (&a.plot, rank) {
        let series = plot::series_from_rows(&plot_rows);
        plot::write(path, &series).map_err(|e| braid::Error::InvalidArgument(format!("--plot: {e}")))?;
        println!("# Plot                 : {}", path.display());
    }
    Ok(total_wrong)
}

/// One mode at one size: per entry of the rotation, its label, the median over the
/// timed calls of the slowest rank's time (seconds), and its wrong elements (summed
/// over the ranks; `None` without `--check`).
struct Measured {
    bytes: usize,
    count: u64,
    rows: Vec<(String, f64, Option<u64>)>,
}

/// Measures one mode at one size; `None` where the size holds no element.
fn measure(
    comm: &Communicator,
    a: &PerfArgs,
    size: usize,
    place: Place,
    device: Option<&Arc<dyn Device>>,
    rotation: &[Option<braid::algorithm::Algorithm>],
    rotating: bool,
) -> braid::Result<Option<Measured>> {
    if rotating {
        // The first calls of a new size pay for what later ones reuse (the engine's
        // scratch growing, the copy policy's first trials for the size): untimed calls
        // first, so the algorithm that happens to come first at each size (the
        // tuner's pick) is not charged for them.
        comm.set_algorithm(None);
        let mut c = case(comm, a, size, place, device)?;
        if c.sig.count > 0 || a.op == OpKind::Barrier {
            for _ in 0..SETTLE_CALLS {
                prepare(&mut c)?;
                run(comm, a, &mut c)?;
            }
        }
    }
    let mut c = case(comm, a, size, place, device)?;
    if c.sig.count == 0 && a.op != OpKind::Barrier {
        return Ok(None);
    }
    let iters = a
        .iters
        .unwrap_or(if size <= 64 << 10 {
            200
        } else if size <= 1 << 20 {
            50
        } else {
            20
        })
        .max(1);
    let passes = if rotating { ROTATION_PASSES.min(iters) } else { 1 };
    // Per entry of the rotation: its label, its times, its wrong elements.
    let mut rows: Vec<(String, Vec<f64>, Option<u64>)> = Vec::with_capacity(rotation.len());
    for pass in 0..passes {
        let timed = iters / passes + usize::from(pass < iters % passes);
        // Every block after the first starts with one untimed call: the call after
        // another algorithm's pays for its access pattern, which a run of one
        // algorithm never does.
        let warmup = if pass == 0 { a.warmup } else { a.warmup.min(1) };
        for (i, forced) in rotation.iter().enumerate() {
            if rotating {
                comm.set_algorithm(*forced);
            }
            if pass == 0 {
                let picked = if a.op == OpKind::Send {
                    "p2p"
                } else {
                    match c.dev.as_ref().map(|d| d.output.device()) {
                        Some(d) => comm.plan_device(&c.sig, d),
                        None => comm.plan(&c.sig),
                    }
                    .map(|s| s.algorithm.name())
                    .unwrap_or("?")
                };
                let label = if rotating && forced.is_none() { format!("auto:{picked}") } else { picked.to_string() };
                rows.push((label, Vec::with_capacity(iters), None));
            }
            for it in 0..warmup + timed {
                prepare(&mut c)?;
                comm.barrier()?;
                let t0 = Instant::now();
                run(comm, a, &mut c)?;
                let dt = t0.elapsed().as_secs_f64();
                if it >= warmup {
                    rows[i].1.push(dt);
                }
            }
            if a.check && pass + 1 == passes {
                let mut w = [check(comm, a, &mut c)? as i64];
                comm.all_reduce_in_place(&mut w, ReduceOp::Sum)?;
                rows[i].2 = Some(w[0] as u64);
            }
        }
    }
    let mut measured = Vec::with_capacity(rows.len());
    for (label, mut times, wrong) in rows {
        // The op's time is the slowest rank's, per iteration.
        comm.all_reduce_in_place(&mut times, ReduceOp::Max)?;
        measured.push((label, median(&mut times), wrong));
    }
    Ok(Some(Measured { bytes: c.bytes, count: c.sig.count, rows: measured }))
}
