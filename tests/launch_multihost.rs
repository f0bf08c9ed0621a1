//! Launchers across two emulated hosts (network namespaces with their own hostname,
//! /etc/hosts and /dev/shm: tests/common/hosts.rs), with no `BRAID_*` variable:
//!
//! - `mpirun` (Open MPI) started on host A, reaching host B through a `plm_rsh_agent`
//!   script that runs its command inside B's namespaces: through PMIx every
//!   collective passes; with PMIx hidden from the ranks they fail within 5 s with
//!   the `-x BRAID_STORE` hint.
//! - Slurm's variables as srun sets them (`SLURM_STEP_NODELIST=node[01-02]`, job and
//!   step ids, `SLURMD_NODENAME`) on hosts called node01 and node02 whose /etc/hosts
//!   name each other: the store is found on node01.
//!
//! Needs root, iproute2, util-linux and (for mpirun) openmpi-bin with libpmix2: in
//! CI (`CI=true`) their absence fails the tests, elsewhere it skips them.

mod common;

use std::time::Duration;

use common::bounded::{require, spawn_group, wait_bounded, Outcome};
use common::hosts::{describe, Hosts, HostsSpec};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const PREFIX: &str = "braid-lmh-";
const OPS: [&str; 7] = ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "barrier"];
const RUN_LIMIT: Duration = Duration::from_secs(60);
const HINT: &str = "-x BRAID_STORE=tcp://HOST:PORT";
const PERF: [&str; 9] = ["perf", "-b", "1K", "-e", "16K", "-n", "5", "-w", "1"];

/// Two hosts named `names`, each /etc/hosts naming both.
fn hosts(names: [&str; 2]) -> Option<Hosts> {
    // The addresses are chosen by Hosts::create; /etc/hosts is rewritten once they are known.
    let spec = HostsSpec {
        hostnames: Some(names.map(String::from)),
        etc_hosts: Some([String::new(), String::new()]),
        ..HostsSpec::new(PREFIX)
    };
    let hosts = Hosts::create(spec)?;
    let table = format!("127.0.0.1 localhost\n{} {}\n{} {}\n", hosts.addrs[0], names[0], hosts.addrs[1], names[1]);
    for h in 0..2 {
        hosts.write_etc_hosts(h, &table);
    }
    Some(hosts)
}

/// A scratch directory for the hostfile and the agent script, removed on drop.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The hostfile (2 slots a host) and a `plm_rsh_agent` that runs its command inside
/// the named host's namespaces.
fn mpirun_files(hosts: &Hosts, names: [&str; 2]) -> Scratch {
    use std::os::unix::fs::PermissionsExt;
    // Named after host A's namespace: one per test, even when tests run at once.
    let dir = std::env::temp_dir().join(format!("{}-mpirun", hosts.netns[0]));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hostfile"), format!("{} slots=2\n{} slots=2\n", names[0], names[1])).unwrap();
    let mut cases = String::new();
    for (h, name) in names.iter().enumerate() {
        let enter = hosts.enter(h);
        let args: Vec<String> = enter.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        cases += &format!("  {name}) exec nsenter {} sh -c \"$*\" ;;\n", args.join(" "));
    }
    let agent = format!(
        "#!/bin/sh\n# mpirun's remote shell: $1 is the host, the rest the command to run there.\n\
         host=$1; shift\ncase \"$host\" in\n{cases}  *) echo \"agent: unknown host $host\" >&2; exit 1 ;;\nesac\n"
    );
    let path = dir.join("agent");
    std::fs::write(&path, agent).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    Scratch(dir)
}

/// `mpirun -np 4` on host A over both hosts; `wrap` goes before braid.
fn mpirun(hosts: &Hosts, files: &Scratch, wrap: &[&str], braid_args: &[&str], limit: Duration) -> Outcome {
    let mut cmd = hosts.enter(0);
    cmd.args(["mpirun", "--allow-run-as-root", "-np", "4", "--hostfile"]).arg(files.0.join("hostfile"));
    cmd.args(["--mca", "plm_rsh_agent"]).arg(files.0.join("agent"));
    cmd.args(wrap).arg(BRAID).args(braid_args);
    for (k, _) in std::env::vars() {
        if k.starts_with("BRAID_") {
            cmd.env_remove(k);
        }
    }
    wait_bounded(spawn_group(&mut cmd), limit)
}

fn have_mpi() -> bool {
    require("mpirun", "openmpi-bin libpmix2")
}

#[test]
fn mpirun_across_two_hosts_passes_every_collective_through_pmix() {
    if !have_mpi() {
        return;
    }
    let names = ["hosta", "hostb"];
    let Some(hosts) = hosts(names) else { return };
    let files = mpirun_files(&hosts, names);
    for op in OPS {
        let args: Vec<&str> = PERF.iter().copied().chain(["--op", op, "--check"]).collect();
        let out = mpirun(&hosts, &files, &[], &args, RUN_LIMIT);
        assert!(out.ok(), "{op}: {}", out.dump());
        assert!(out.stdout.contains("Out of bounds values : 0 OK"), "{op}: {}", out.dump());
        // Two ranks a host: shared memory within, TCP between.
        assert!(out.stdout.contains("# rank 0: 1=shm 2=tcp 3=tcp"), "{op}: {}", out.dump());
    }
    hosts.finish();
}

#[test]
fn mpirun_across_two_hosts_without_pmix_fails_at_once_with_the_hint() {
    if !have_mpi() {
        return;
    }
    let names = ["hosta", "hostb"];
    let Some(hosts) = hosts(names) else { return };
    let files = mpirun_files(&hosts, names);
    let hidden = ["env", "-u", "PMIX_RANK", "-u", "PMIX_NAMESPACE"];
    let args: Vec<&str> = PERF.iter().copied().chain(["--check"]).collect();
    let out = mpirun(&hosts, &files, &hidden, &args, Duration::from_secs(5));
    assert!(out.status.is_some(), "still running after 5 s: {}", out.dump());
    assert!(!out.ok(), "{}", out.dump());
    assert!(out.stderr.contains(HINT) && out.stderr.contains("OMPI_COMM_WORLD_LOCAL_SIZE=2"), "{}", out.dump());
    hosts.finish();
}

#[test]
fn slurm_variables_on_two_hosts_find_the_store_on_the_first_node() {
    let names = ["node01", "node02"];
    let Some(mut hosts) = hosts(names) else { return };
    for op in ["all-reduce", "all-to-all", "broadcast"] {
        for rank in 0..4 {
            let host = rank / 2;
            let mut cmd = hosts.enter(host);
            cmd.arg(BRAID).args(PERF).args(["--op", op, "--check"]);
            for (k, _) in std::env::vars() {
                if k.starts_with("BRAID_") || k.starts_with("SLURM") || k.starts_with("PMIX_") || k.starts_with("OMPI_")
                {
                    cmd.env_remove(k);
                }
            }
            let local = (rank % 2).to_string();
            let procid = rank.to_string();
            cmd.envs([
                ("SLURM_PROCID", procid.as_str()),
                ("SLURM_NTASKS", "4"),
                ("SLURM_LOCALID", &local),
                ("SLURM_NTASKS_PER_NODE", "2"),
                ("SLURM_STEP_NODELIST", "node[01-02]"),
                ("SLURM_JOB_NODELIST", "node[01-02]"),
                ("SLURM_JOB_ID", "4242"),
                ("SLURM_STEP_ID", "0"),
                ("SLURMD_NODENAME", names[host]),
            ]);
            if op == "all-reduce" {
                cmd.env("BRAID_DEBUG", "braid::config=debug");
            }
            hosts.spawn(rank, host, cmd);
        }
        let outs = hosts.wait(RUN_LIMIT);
        assert!(outs.iter().all(|o| o.passed()), "{op}: {}", describe(&outs));
        assert!(outs[0].stdout.contains("Out of bounds values : 0 OK"), "{op}: {}", describe(&outs));
        if op == "all-reduce" {
            for o in &outs {
                assert!(o.stderr.contains("\"slurm://node01:"), "rank {}: {}", o.rank, describe(&outs));
            }
        }
    }
    hosts.finish();
}
