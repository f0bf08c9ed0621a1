//! `braid`: launch ranks (`braid run`) and measure collectives (`braid perf`).

mod launch;
mod perf;
mod perf_device;

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
    };
    std::process::exit(code);
}
