//! `braid perf --check` under a real `mpirun` (Open MPI from Debian) with no
//! `BRAID_*` variable: through PMIx, through the one-host private store when PMIx is
//! hidden or cannot be loaded, and failing at once with the `-x BRAID_STORE` hint
//! when the job claims several hosts without PMIx.
//!
//! Needs `mpirun` (openmpi-bin) and `libpmix.so.2` (libpmix2): in CI (`CI=true`)
//! their absence fails the tests, elsewhere it skips them with a reason.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::bounded::{can_run, require, run_bounded, without_braid_env, Outcome};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const OPS: [&str; 7] = ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "barrier"];
/// One mpirun of 4 ranks over a small sweep.
const MPIRUN_LIMIT: Duration = Duration::from_secs(60);
/// The exact hint of a multi-host job without PMIx.
const HINT: &str = "-x BRAID_STORE=tcp://HOST:PORT";

fn have_mpi() -> bool {
    if !require("mpirun", "openmpi-bin") {
        return false;
    }
    let pmix =
        Command::new("sh").args(["-c", "ldconfig -p | grep -q 'libpmix.so.2 '"]).status().is_ok_and(|s| s.success());
    can_run((!pmix).then(|| "libpmix.so.2 is not installed (apt-get install libpmix2)".into()))
}

/// `mpirun -np 4 [prefix...] braid perf --op op --check` over 1K-16K, plus `env` (`-x K=V`).
fn mpirun(op: &str, prefix: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut cmd = Command::new("mpirun");
    without_braid_env(&mut cmd).args(["--allow-run-as-root", "--oversubscribe", "-np", "4"]);
    for (k, v) in env {
        cmd.arg("-x").arg(format!("{k}={v}"));
    }
    cmd.args(prefix).arg(BRAID).args(["perf", "--op", op, "-b", "1K", "-e", "16K", "-n", "5", "-w", "1", "--check"]);
    run_bounded(&mut cmd, MPIRUN_LIMIT)
}

fn passed(out: &Outcome, what: &str) {
    assert!(out.ok(), "{what}: {}", out.dump());
    // Rank 0 reports; any rank whose check fails exits non-zero, and so does mpirun.
    assert!(out.stdout.contains("Out of bounds values : 0 OK"), "{what}: {}", out.dump());
    assert!(out.stdout.contains("world=4"), "{what}: {}", out.dump());
}

/// This user's private store directories of Open MPI jobs.
fn private_stores() -> BTreeSet<String> {
    // SAFETY: geteuid cannot fail.
    let prefix = format!("braid-{}-ompi-", unsafe { libc::geteuid() });
    let mut found = BTreeSet::new();
    for dir in ["/dev/shm".into(), std::env::temp_dir()] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            found.extend(
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&prefix)),
            );
        }
    }
    found
}

#[test]
fn mpirun_with_no_braid_variable_passes_every_collective_through_pmix() {
    if !have_mpi() {
        return;
    }
    for op in OPS {
        passed(&mpirun(op, &[], &[]), op);
    }
    // The same job with the debug log on says which path it took.
    let out = mpirun("all-reduce", &[], &[("BRAID_DEBUG", "braid::config=debug,braid::bootstrap=debug")]);
    passed(&out, "all-reduce with the debug log");
    assert!(out.stderr.contains("publishing the store through PMIx"), "{}", out.dump());
    assert_eq!(out.stderr.matches("read rank 0's store address through PMIx").count(), 3, "{}", out.dump());
    assert!(out.stderr.contains("launcher=\"mpi\"") || out.stderr.contains("launcher mpi"), "{}", out.dump());
}

#[test]
fn mpirun_without_pmix_on_one_host_meets_in_a_private_store() {
    if !have_mpi() {
        return;
    }
    let before = private_stores();
    let debug = [("BRAID_DEBUG", "braid::bootstrap=debug")];
    // PMIx's variables hidden from the ranks: the job id keys a private store.
    let hidden = ["env", "-u", "PMIX_RANK", "-u", "PMIX_NAMESPACE"];
    for op in ["all-reduce", "all-to-all"] {
        let out = mpirun(op, &hidden, &debug);
        passed(&out, &format!("{op} with PMIx hidden"));
        assert!(out.stderr.contains("hosting the private store"), "{}", out.dump());
        assert!(!out.stderr.contains("through PMIx"), "{}", out.dump());
    }
    // PMIx's variables there, but the library cannot be loaded.
    let missing = [debug[0], ("BRAID_PMIX_LIBRARY", "/nonexistent/libpmix.so.2")];
    let out = mpirun("reduce-scatter", &[], &missing);
    passed(&out, "reduce-scatter without libpmix");
    assert!(out.stderr.contains("cannot load /nonexistent/libpmix.so.2"), "{}", out.dump());
    assert!(out.stderr.contains("hosting the private store"), "{}", out.dump());
    assert_eq!(private_stores(), before, "the private store directories are removed");
}

#[test]
fn mpirun_across_hosts_without_pmix_fails_at_once_with_the_hint() {
    // A fake rank, no mpirun needed: Open MPI's variables say 2 of the 4 ranks share
    // this host.
    let mut cmd = Command::new(BRAID);
    without_braid_env(&mut cmd)
        .args(["perf", "--check", "-e", "4K"])
        .env("OMPI_COMM_WORLD_RANK", "0")
        .env("OMPI_COMM_WORLD_SIZE", "4")
        .env("OMPI_COMM_WORLD_LOCAL_RANK", "0")
        .env("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
        .env("OMPI_MCA_ess_base_jobid", "12345")
        .env_remove("PMIX_RANK")
        .env_remove("PMIX_NAMESPACE");
    let out = run_bounded(&mut cmd, Duration::from_secs(5));
    assert!(out.status.is_some_and(|s| !s.success()), "{}", out.dump());
    assert!(out.stderr.contains(HINT) && out.stderr.contains("launcher mpi"), "{}", out.dump());
    // PMIx's variables set but its library missing: no one-host fallback, so the
    // same hint, and what to install.
    cmd.env("PMIX_RANK", "0").env("PMIX_NAMESPACE", "12345").env("BRAID_PMIX_LIBRARY", "/nonexistent/libpmix.so.2");
    let out = run_bounded(&mut cmd, Duration::from_secs(5));
    assert!(out.status.is_some_and(|s| !s.success()), "{}", out.dump());
    assert!(out.stderr.contains(HINT) && out.stderr.contains("apt install libpmix2"), "{}", out.dump());
    assert!(out.stderr.contains("cannot load /nonexistent/libpmix.so.2"), "{}", out.dump());
    if !have_mpi() {
        return;
    }
    // The same under a real mpirun: every rank fails within the bound.
    let hidden = ["env", "-u", "PMIX_RANK", "-u", "PMIX_NAMESPACE", "OMPI_COMM_WORLD_LOCAL_SIZE=2"];
    let mut cmd = Command::new("mpirun");
    without_braid_env(&mut cmd)
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .args(hidden)
        .arg(BRAID)
        .args(["perf", "--check", "-e", "4K"]);
    let out = run_bounded(&mut cmd, Duration::from_secs(5));
    assert!(out.status.is_some_and(|s| !s.success()), "{}", out.dump());
    assert!(out.stderr.matches(HINT).count() >= 1, "{}", out.dump());
}

#[test]
fn a_rank_that_never_joins_the_fence_fails_the_others_within_their_timeout() {
    if !have_mpi() {
        return;
    }
    // Rank 3 is not braid: the fence that carries rank 0's address never completes.
    let mut cmd = Command::new("mpirun");
    without_braid_env(&mut cmd).args(["--allow-run-as-root", "--oversubscribe", "-x", "BRAID_TIMEOUT=3s", "-np", "3"]);
    cmd.arg(BRAID).args(["perf", "-e", "4K", "--check", ":", "-np", "1", "sleep", "30"]);
    let out = run_bounded(&mut cmd, Duration::from_secs(20));
    assert!(out.status.is_some_and(|s| !s.success()), "{}", out.dump());
    // The first rank to fail ends the job (mpirun aborts the rest), so at least one
    // says why; every one that does names PMIx, the namespace and the fix.
    let lines: Vec<&str> = out.stderr.lines().filter(|l| l.contains("(launcher PMIx, namespace")).collect();
    assert!(!lines.is_empty(), "no rank named PMIx: {}", out.dump());
    for line in lines {
        assert!(line.contains("every rank of the job must start braid") && line.contains("BRAID_STORE"), "{line}");
    }
}
