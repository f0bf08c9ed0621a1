//! Launch as Kubernetes and plain hosts do, on two emulated hosts (network
//! namespaces joined by an htb-shaped veth; each host's ranks share its /dev/shm),
//! with no `BRAID_*` variable at all: only torch's `RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`. Rank 0 hosts the store (no
//! `TORCHELASTIC_USE_AGENT_STORE`), and every rank must find where to listen by itself:
//!
//! - `MASTER_ADDR` is a service name that resolves only 2 s after the ranks start;
//! - `MASTER_ADDR` is rank 0's host name, which its own /etc/hosts maps to 127.0.1.1;
//! - each host lists a decoy interface first (a veth whose subnet leads nowhere) and
//!   carries the same private address as the other host (docker0's 172.17.0.1 on a
//!   veth not named docker);
//! - both of the last two at once, so rank 0 cannot use its route to the store and
//!   publishes the decoy first: its peers must pass over it.
//!
//! Needs root, iproute2 and util-linux: fails under CI without them, skips otherwise.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::hosts::{describe, Hosts, HostsSpec, RankOutput};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const PREFIX: &str = "braid-lh-";
/// Longer than braid's default 60 s timeout, so a rank that gives up is seen failing.
const RANK_DEADLINE: Duration = Duration::from_secs(80);
const MASTER_PORT: &str = "29500";
const WORLD: usize = 4;
const RANKS_PER_HOST: usize = 2;
const OPS: [&str; 2] = ["all-reduce", "all-to-all"];
const SERVICE: &str = "braid-master.job.svc.cluster.local";

fn host_of(rank: usize) -> usize {
    rank / RANKS_PER_HOST
}

/// Start the four ranks of `braid perf --op op --check` under torch's variables and
/// nothing else (the environment is cleared: no `BRAID_*`, no other launcher's).
fn start(hosts: &mut Hosts, master_addr: &str, op: &str) {
    for rank in 0..WORLD {
        let mut cmd: Command = hosts.enter(host_of(rank));
        cmd.arg(BRAID)
            .args(["perf", "--op", op, "--min-bytes", "1K", "--max-bytes", "256K", "--factor", "16"])
            .args(["--iters", "3", "--warmup", "1", "--check"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()))
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", WORLD.to_string())
            .env("LOCAL_RANK", (rank % RANKS_PER_HOST).to_string())
            .env("LOCAL_WORLD_SIZE", RANKS_PER_HOST.to_string())
            .env("MASTER_ADDR", master_addr)
            .env("MASTER_PORT", MASTER_PORT);
        hosts.spawn(rank, host_of(rank), cmd);
    }
}

/// Every rank exited 0 and rank 0 reports no wrong element.
fn assert_passed(case: &str, op: &str, outs: &[RankOutput]) {
    for o in outs {
        assert!(o.passed(), "{case}, {op}: rank {} did not pass\n{}", o.rank, describe(outs));
    }
    let text = &outs[0].stdout;
    assert!(text.contains("# Out of bounds values : 0 OK"), "{case}, {op}: no `0 OK` from rank 0\n{}", describe(outs));
}

fn run_ops(hosts: &mut Hosts, case: &str, master_addr: &str) {
    let t0 = Instant::now();
    let tx0 = hosts.tx_bytes(0);
    for op in OPS {
        start(hosts, master_addr, op);
        let outs = hosts.wait(RANK_DEADLINE);
        assert_passed(case, op, &outs);
        eprintln!("launch_hosts: {case}: {op} passed ({:.1?} so far)", t0.elapsed());
    }
    let sent = hosts.tx_bytes(0) - tx0;
    assert!(sent > 256 << 10, "{case}: host A sent only {sent} bytes over its veth: did traffic cross hosts?");
}

fn plain_etc_hosts() -> String {
    "127.0.0.1 localhost\n::1 localhost ip6-localhost\n".to_owned()
}

/// Each host: an interface listed before eth0 whose /24 leads nowhere (one end of a
/// veth pair whose other end has no address, so a connect to the other host's
/// address in it goes unanswered rather than refused), and the same private address
/// as the other host on a second such pair.
fn decoys() -> [String; 2] {
    [1, 2].map(|n| {
        format!(
            "ip link add aaa0 type veth peer name aaa0-end; ip addr add 10.99.0.{n}/24 dev aaa0; \
             ip link add dup0 type veth peer name dup0-end; ip addr add 172.17.0.1/16 dev dup0; \
             for i in aaa0 aaa0-end dup0 dup0-end; do ip link set $i up; done"
        )
    })
}

/// The decoy comes before eth0 in the order interfaces are listed.
fn assert_decoy_listed_first(hosts: &Hosts) {
    for h in 0..2 {
        let out = hosts.shell(h, "ip -o -4 addr show | awk '$2 != \"lo\" {print $2}'");
        let names = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(names.lines().next(), Some("aaa0"), "host {h}: interfaces in order:\n{names}");
        assert!(names.lines().any(|l| l == "eth0") && names.lines().any(|l| l == "dup0"), "{names}");
    }
}

/// Name the hosts node-a and node-b, each with an /etc/hosts (written once the
/// hosts' addresses are known: [`name_hosts`]).
fn named(mut spec: HostsSpec) -> HostsSpec {
    spec.hostnames = Some(["node-a".into(), "node-b".into()]);
    spec.etc_hosts = Some([plain_etc_hosts(), plain_etc_hosts()]);
    spec
}

/// Each host's /etc/hosts maps its own name to 127.0.1.1, as Debian's installer
/// does, and the other's to its veth address.
fn name_hosts(hosts: &Hosts) {
    let [a, b] = &hosts.addrs;
    hosts.write_etc_hosts(0, &format!("{}127.0.1.1 node-a\n{b} node-b\n", plain_etc_hosts()));
    hosts.write_etc_hosts(1, &format!("{}127.0.1.1 node-b\n{a} node-a\n", plain_etc_hosts()));
}

fn shaped() -> HostsSpec {
    let mut spec = HostsSpec::new(PREFIX);
    spec.htb = true;
    spec
}

#[test]
fn a_master_addr_that_resolves_only_after_two_seconds() {
    let mut spec = shaped();
    spec.etc_hosts = Some([plain_etc_hosts(), plain_etc_hosts()]);
    let Some(mut hosts) = Hosts::create(spec) else { return };
    let resolved = format!("{}{} {SERVICE}\n", plain_etc_hosts(), hosts.addrs[0]);
    let t0 = Instant::now();
    for op in OPS {
        for h in 0..2 {
            hosts.write_etc_hosts(h, &plain_etc_hosts());
        }
        start(&mut hosts, SERVICE, op);
        std::thread::sleep(Duration::from_secs(2));
        // Still unresolvable when the ranks have been running for 2 s.
        for h in 0..2 {
            let out = hosts.shell(h, &format!("getent hosts {SERVICE}"));
            assert!(!out.status.success(), "host {h} resolved {SERVICE} too early");
        }
        for h in 0..2 {
            hosts.write_etc_hosts(h, &resolved);
        }
        let outs = hosts.wait(RANK_DEADLINE);
        assert_passed("late service name", op, &outs);
        eprintln!("launch_hosts: late service name: {op} passed ({:.1?} so far)", t0.elapsed());
    }
    hosts.finish();
}

#[test]
fn rank_zeros_host_name_maps_to_loopback_on_its_own_host() {
    let Some(mut hosts) = Hosts::create(named(shaped())) else { return };
    name_hosts(&hosts);
    let out = hosts.shell(0, "hostname; getent hosts node-a");
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(seen.starts_with("node-a\n") && seen.contains("127.0.1.1"), "host A: {seen}");
    run_ops(&mut hosts, "host name on 127.0.1.1", "node-a");
    hosts.finish();
}

#[test]
fn a_decoy_listed_first_and_a_duplicate_private_address() {
    let mut spec = shaped();
    spec.before_link = Some(decoys());
    let Some(mut hosts) = Hosts::create(spec) else { return };
    assert_decoy_listed_first(&hosts);
    let master = hosts.addrs[0].clone();
    run_ops(&mut hosts, "decoy interfaces", &master);
    hosts.finish();
}

#[test]
fn decoys_with_rank_zeros_name_on_loopback_make_peers_pass_over_addresses() {
    let mut spec = named(shaped());
    spec.before_link = Some(decoys());
    let Some(mut hosts) = Hosts::create(spec) else { return };
    assert_decoy_listed_first(&hosts);
    name_hosts(&hosts);
    run_ops(&mut hosts, "decoys and a loopback host name", "node-a");
    hosts.finish();
}
