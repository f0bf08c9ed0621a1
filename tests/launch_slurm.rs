//! `braid perf --check` under a real single-node Slurm (Debian's slurm-wlm) with
//! `srun -n 4` and no `BRAID_*` variable: without PMIx (the store on the nodelist's
//! first host, at a port derived from the job and step ids) and with
//! `srun --mpi=pmix` (rank 0 publishes the store through PMIx).
//!
//! The test starts munged, slurmctld and slurmd as its children, with every file in
//! a temporary directory (`SLURM_CONF` points srun at it), ports picked free on
//! loopback, and tears them all down at the end, pass or fail. Needs root (slurmd
//! starts the tasks) and slurm-wlm + munge: in CI (`CI=true`) their absence fails the
//! test, elsewhere it skips it with a reason.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::bounded::{can_run, find_program, run_bounded, signal_group, spawn_group, without_braid_env, Outcome};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const OPS: [&str; 7] = ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "barrier"];
/// One srun of 4 ranks over a small sweep.
const SRUN_LIMIT: Duration = Duration::from_secs(60);
/// From the daemons' start to an idle node.
const START_LIMIT: Duration = Duration::from_secs(30);

/// A single-node cluster of this host: munged, slurmctld and slurmd, stopped and
/// removed on drop.
struct Cluster {
    dir: PathBuf,
    daemons: Vec<(&'static str, Child)>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: writable buffer of the given length.
    assert_eq!(unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) }, 0);
    let end = buf.iter().position(|&b| b == 0).unwrap();
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl Cluster {
    fn start() -> Cluster {
        let dir = std::env::temp_dir().join(format!("braid-slurm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["state", "spool"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let key: Vec<u8> = (0..1024).map(|_| rand_byte()).collect();
        let key_file = dir.join("munge.key");
        std::fs::write(&key_file, key).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o400)).unwrap();
        let mut cluster = Cluster { dir: dir.clone(), daemons: Vec::new() };
        let p = |name: &str| dir.join(name).display().to_string();
        let munged = spawn_group(Command::new(find_program("munged").unwrap()).args([
            "-F",
            "--force",
            &format!("--socket={}", p("munge.sock")),
            &format!("--key-file={}", p("munge.key")),
            &format!("--pid-file={}", p("munged.pid")),
            &format!("--seed-file={}", p("munged.seed")),
            &format!("--log-file={}", p("munged.log")),
        ]));
        cluster.daemons.push(("munged", munged));
        let host = host_name();
        let conf = format!(
            "ClusterName=braidtest\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={sock}\n\
             SlurmctldPort={ctld_port}\nSlurmdPort={d_port}\n\
             StateSaveLocation={state}\nSlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={dir}/slurmctld.pid\nSlurmdPidFile={dir}/slurmd.pid\n\
             SlurmctldLogFile={dir}/slurmctld.log\nSlurmdLogFile={dir}/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             JobCompType=jobcomp/none\nSchedulerType=sched/builtin\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
             SlurmdParameters=config_overrides\nMpiDefault=none\nReturnToService=2\n\
             NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN\n\
             PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
            sock = p("munge.sock"),
            ctld_port = free_port(),
            d_port = free_port(),
            state = p("state"),
            spool = p("spool"),
            dir = dir.display(),
        );
        std::fs::write(dir.join("slurm.conf"), conf).unwrap();
        // munged must be answering before the Slurm daemons authenticate.
        let t0 = Instant::now();
        while !dir.join("munge.sock").exists() {
            assert!(t0.elapsed() < START_LIMIT, "munged did not start: {}", cluster.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
        let conf = p("slurm.conf");
        let ctld = spawn_group(Command::new(find_program("slurmctld").unwrap()).args(["-D", "-i", "-f", &conf]));
        cluster.daemons.push(("slurmctld", ctld));
        let d = spawn_group(Command::new(find_program("slurmd").unwrap()).args(["-D", "-f", &conf]));
        cluster.daemons.push(("slurmd", d));
        let t0 = Instant::now();
        loop {
            let out = run_bounded(cluster.command("sinfo").args(["-h", "-o", "%t"]), Duration::from_secs(10));
            if out.stdout.trim() == "idle" {
                break;
            }
            assert!(
                t0.elapsed() < START_LIMIT,
                "the node is not idle after {START_LIMIT:?}: {}\n{}",
                out.dump(),
                cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        cluster
    }

    /// A Slurm client command pointed at this cluster, with no `BRAID_*` variable.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        without_braid_env(&mut cmd).env("SLURM_CONF", self.dir.join("slurm.conf"));
        for k in ["PMIX_RANK", "PMIX_NAMESPACE", "OMPI_COMM_WORLD_RANK", "PMI_RANK"] {
            cmd.env_remove(k);
        }
        cmd
    }

    /// `srun -n 4 extra... braid perf --op op --check`; `debug` sets `BRAID_DEBUG`
    /// in srun's environment, which its tasks inherit.
    fn srun(&self, op: &str, extra: &[&str], debug: bool) -> Outcome {
        let mut cmd = self.command("srun");
        if debug {
            cmd.env("BRAID_DEBUG", "braid::config=debug,braid::bootstrap=debug");
        }
        cmd.args(["-n", "4"]).args(extra).arg(BRAID);
        cmd.args(["perf", "--op", op, "-b", "1K", "-e", "16K", "-n", "5", "-w", "1", "--check"]);
        run_bounded(&mut cmd, SRUN_LIMIT)
    }

    fn logs(&self) -> String {
        ["munged.log", "slurmctld.log", "slurmd.log"]
            .iter()
            .map(|f| format!("--- {f}\n{}", tail(&self.dir.join(f))))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn rand_byte() -> u8 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish() as u8
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Slurm's daemons first (slurmd takes its tasks down), munged last.
        for (_, child) in self.daemons.iter_mut().rev() {
            signal_group(child, libc::SIGTERM);
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) && child.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            signal_group(child, libc::SIGKILL);
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn passed(out: &Outcome, what: &str, cluster: &Cluster) {
    assert!(out.ok(), "{what}: {}\n{}", out.dump(), cluster.logs());
    assert!(
        out.stdout.contains("Out of bounds values : 0 OK") && out.stdout.contains("world=4"),
        "{what}: {}",
        out.dump()
    );
}

#[test]
fn srun_with_no_braid_variable_passes_every_collective() {
    let missing = ["munged", "slurmctld", "slurmd", "srun", "sinfo"].into_iter().find(|p| find_program(p).is_none());
    if !can_run(missing.map(|p| format!("`{p}` is not installed (apt-get install slurm-wlm munge)"))) {
        return;
    }
    // SAFETY: geteuid cannot fail.
    if !can_run((unsafe { libc::geteuid() } != 0).then(|| "slurmd must run as root to start tasks".to_string())) {
        return;
    }
    let cluster = Cluster::start();
    for op in OPS {
        passed(&cluster.srun(op, &[], false), op, &cluster);
    }
    // Which path each took, from the debug log.
    let out = cluster.srun("all-reduce", &[], true);
    passed(&out, "all-reduce with the debug log", &cluster);
    assert!(out.stderr.contains("the first of SLURM_STEP_NODELIST"), "{}", out.dump());
    assert!(out.stderr.contains("hosting the store derived from the Slurm nodelist"), "{}", out.dump());
    assert!(!out.stderr.contains("through PMIx"), "{}", out.dump());
    // With Slurm's PMIx plugin, rank 0 publishes the store through PMIx.
    let plugins = run_bounded(cluster.command("srun").arg("--mpi=list"), Duration::from_secs(10));
    let pmix = plugins.stdout.contains("pmix") || plugins.stderr.contains("pmix");
    if can_run((!pmix).then(|| format!("srun has no PMIx plugin: {}", plugins.dump()))) {
        for op in ["all-reduce", "all-to-all"] {
            passed(&cluster.srun(op, &["--mpi=pmix"], false), &format!("{op} with --mpi=pmix"), &cluster);
        }
        let out = cluster.srun("broadcast", &["--mpi=pmix"], true);
        passed(&out, "broadcast with --mpi=pmix and the debug log", &cluster);
        assert!(out.stderr.contains("publishing the store through PMIx"), "{}", out.dump());
        assert_eq!(out.stderr.matches("read rank 0's store address through PMIx").count(), 3, "{}", out.dump());
    }
}
