//! `braid`: launch ranks (`braid run`), measure collectives (`braid perf`) and draw
//! saved measurements (`braid plot`), show the tuner's reasoning (`braid explain`,
//! `braid simulate`), and read a failed job's flight records (`braid doctor`).

mod doctor;
mod drill;
mod explain;
mod launch;
mod perf;
mod perf_ceiling;
mod perf_check;
mod perf_device;
mod plot;
mod soak;
mod timeline;

use clap::{Parser, Subcommand};

/// braid: collective communication for CPU and mixed clusters.
#[derive(Parser)]
#[command(name = "braid", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start N local ranks of PROGRAM with BRAID_* set and a store hosted here.
    Run(launch::RunArgs),
    /// Measure a collective over a sweep of sizes (nccl-tests columns).
    Perf(perf::PerfArgs),
    /// Draw runs saved with `braid perf --json` into one SVG: busbw against size.
    ///
    /// One line per run: a file may hold several (`--json` appends), and any number of
    /// files may be given. Example: `braid perf --algo ring --json ring.jsonl`, then
    /// `braid perf --algo direct --json direct.jsonl`, then
    /// `braid plot busbw.svg ring.jsonl direct.jsonl`.
    Plot(plot::PlotArgs),
    /// Price every algorithm of one call with the tuner's cost model and show the pick.
    ///
    /// Example: `braid explain --op all-reduce --bytes 16M --ranks 4 --hosts 2 --link tcp`.
    Explain(explain::ExplainArgs),
    /// Predict busbw by size for every algorithm on a cluster of any size.
    ///
    /// Example: `braid simulate --ranks 1024 --hosts 128 --link rdma --gbps 200 --latency-us 3`.
    Simulate(explain::SimulateArgs),
    /// Read the flight records of a failed or hung job and name the rank to look at.
    ///
    /// Reads every `*.json` record the ranks wrote into DIR (`BRAID_TRACE_DIR`); exits
    /// 1 when it finds a fault, 0 when all looks healthy, 2 when DIR holds no record.
    ///
    /// Example: `BRAID_TRACE_DIR=/tmp/traces braid run -n 4 ./train`, then `braid doctor /tmp/traces`.
    Doctor(doctor::DoctorArgs),
    /// Rehearse a failure: every rank runs the same collectives, one misbehaves.
    ///
    /// Under a launcher with `BRAID_TRACE_DIR` set, then `braid doctor` on it.
    /// Example: `BRAID_TRACE_DIR=/tmp/t braid run -n 4 -- braid drill --calls all-reduce,broadcast --repeat 3 --skip 2:3`.
    Drill(drill::DrillArgs),
    /// Random collectives with random kills and joins, every result checked.
    ///
    /// Hosts a store, starts --ranks workers, SIGKILLs one every --kill-every
    /// seconds and starts a replacement that joins; the survivors shrink and go
    /// on. Exits 0 only if no result was wrong and resident memory stayed flat.
    /// Example: `braid soak --ranks 4 --seconds 60 --kill-every 10`.
    Soak(soak::SoakArgs),
    /// Draw the ranks' timelines (`BRAID_TIMELINE` files) as one SVG picture.
    ///
    /// Example: `braid timeline /tmp/tl -o tl.svg --merge all.json`.
    Timeline(timeline::TimelineArgs),
}

fn main() {
    let filter = std::env::var("BRAID_DEBUG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .try_init();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => launch::run(args),
        Command::Perf(args) => perf::main(args),
        Command::Plot(args) => plot::main(args),
        Command::Explain(args) => explain::explain(args),
        Command::Simulate(args) => explain::simulate(args),
        Command::Doctor(args) => doctor::main(args),
        Command::Drill(args) => drill::run(args),
        Command::Soak(args) => soak::run(args),
        Command::Timeline(args) => timeline::main(args),
    };
    std::process::exit(code);
}
