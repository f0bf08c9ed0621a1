//! Two emulated hosts on one machine: network namespaces joined by a veth pair, each
//! with a private /dev/shm, two `braid perf` ranks per host (world 4: ranks 0,1 on host
//! A, ranks 2,3 on host B).
//!
//! Each host is a small "holder" process (`ip netns exec NS unshare -m sh -c 'mount -t
//! tmpfs tmpfs /dev/shm && exec sleep ...'`) that owns the host's network and mount
//! namespaces; every rank of that host enters both with `nsenter --net --mount`, so the
//! two ranks of a host share its /dev/shm and nothing else does. The namespaces are fresh,
//! so the store port is free by construction, and the veth pair lives only inside them
//! (nothing is added to the root namespace), so parallel runs cannot collide.
//!
//! Needs root (CI runs as root with iproute2). Without it the tests fail when `CI` is
//! set and are skipped, with an explanation on stderr, when it is not.

mod common;

use std::time::{Duration, Instant};

use common::hosts::{describe, Hosts, HostsSpec, RankOutput};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
/// Prefix of every namespace these tests create: `braid-mh-<pid>-<n>-<a|b>`.
const PREFIX: &str = "braid-mh-";
/// Ranks still running this long after their start are killed.
const RANK_DEADLINE: Duration = Duration::from_secs(60);
/// The store port, inside host A's (fresh, empty) network namespace.
const STORE_PORT: u16 = 29500;
const WORLD: usize = 4;
const RANKS_PER_HOST: usize = 2;
const OPS: [&str; 7] = ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "barrier"];

/// Which host (0 = A, 1 = B) a rank lives on.
fn host_of(rank: usize) -> usize {
    rank / RANKS_PER_HOST
}

/// Start the four ranks of `braid perf --op op ... --check`, wait for all of them (at
/// most RANK_DEADLINE, then kill), and return what each printed.
fn perf(hosts: &mut Hosts, op: &str) -> Vec<RankOutput> {
    let store = format!("tcp://{}:{STORE_PORT}", hosts.addrs[0]);
    for rank in 0..WORLD {
        let mut cmd = hosts.enter(host_of(rank));
        cmd.arg(BRAID)
            .args(["perf", "--op", op, "--min-bytes", "1K", "--max-bytes", "1M", "--factor", "32"])
            .args(["--iters", "3", "--warmup", "1", "--check"])
            .env("BRAID_RANK", rank.to_string())
            .env("BRAID_WORLD_SIZE", WORLD.to_string())
            .env("BRAID_LOCAL_RANK", (rank % RANKS_PER_HOST).to_string())
            .env("BRAID_STORE", &store)
            .env("BRAID_SOCKET_IFNAME", "=eth0")
            .env("BRAID_TIMEOUT", "30")
            .env_remove("BRAID_TRANSPORTS");
        hosts.spawn(rank, host_of(rank), cmd);
    }
    hosts.wait(RANK_DEADLINE)
}

/// Every rank exited 0 and rank 0 reports no wrong element.
fn assert_passed(op: &str, outs: &[RankOutput]) {
    for o in outs {
        assert!(o.status.is_some_and(|s| s.success()), "{op}: rank {} did not pass\n{}", o.rank, describe(outs));
    }
    let text = &outs[0].stdout;
    assert!(text.contains("# Out of bounds values : 0 OK"), "{op}: no `0 OK` from rank 0\n{}", describe(outs));
    assert!(text.lines().any(|l| l.starts_with("  ")), "{op}: no result rows\n{}", describe(outs));
}

/// The perf header lists, per rank, the transport to each peer and its CPUs:
/// `# rank R: 0=shm 1=tcp ...   cpus C`
/// (self omitted). Peers on the same host must use shared memory, the others TCP.
/// The lines are looked for in every rank's stdout (rank 0 may print them for everyone).
fn assert_shm_within_hosts_tcp_across(outs: &[RankOutput]) {
    let mut seen: Vec<Option<Vec<(usize, String)>>> = vec![None; WORLD];
    for line in outs.iter().flat_map(|o| o.stdout.lines()) {
        let Some(rest) = line.strip_prefix("# rank ") else { continue };
        let Some((r, peers)) = rest.split_once(':') else { continue };
        let Ok(r) = r.trim().parse::<usize>() else { continue };
        // The line ends with the rank's CPUs: `# rank 0: 1=shm 2=tcp   cpus 0-1`.
        let peers = peers.split_once("   cpus ").map_or(peers, |(links, _)| links);
        let peers = peers
            .split_whitespace()
            .map(|t| {
                let (p, kind) = t.split_once('=').unwrap_or_else(|| panic!("bad peer entry `{t}` in `{line}`"));
                (p.parse::<usize>().unwrap_or_else(|_| panic!("bad peer `{p}` in `{line}`")), kind.to_string())
            })
            .collect();
        assert!(r < WORLD, "`{line}` names a rank outside the world of {WORLD}");
        seen[r] = Some(peers);
    }
    let header = outs[0].stdout.lines().filter(|l| l.starts_with('#')).collect::<Vec<_>>().join("\n");
    for (r, peers) in seen.iter().enumerate() {
        let peers = peers.as_ref().unwrap_or_else(|| {
            panic!("no `# rank {r}: 0=shm 1=tcp ...` line in the perf header (one per rank expected):\n{header}")
        });
        let mut got: Vec<usize> = peers.iter().map(|(p, _)| *p).collect();
        got.sort_unstable();
        let want: Vec<usize> = (0..WORLD).filter(|&p| p != r).collect();
        assert_eq!(got, want, "rank {r} must list every peer but itself once:\n{header}");
        for (p, kind) in peers {
            let expected = if host_of(*p) == host_of(r) { "shm" } else { "tcp" };
            assert_eq!(
                kind,
                expected,
                "rank {r} (host {}) to peer {p} (host {}): expected {expected}, got {kind}:\n{header}",
                host_of(r),
                host_of(*p)
            );
        }
    }
}

#[test]
fn hosts_have_private_shm_and_reach_each_other() {
    let Some(hosts) = Hosts::create(HostsSpec::new(PREFIX)) else { return };
    let marker = format!("/dev/shm/{PREFIX}{}-marker", std::process::id());
    // Created on host A by one process, seen by another process of host A ...
    assert!(hosts.shell(0, &format!("touch {marker}")).status.success());
    assert!(hosts.shell(0, &format!("test -e {marker}")).status.success(), "host A's ranks must share /dev/shm");
    // ... but neither by host B nor by the machine itself.
    assert!(!hosts.shell(1, &format!("test -e {marker}")).status.success(), "host B must not see A's /dev/shm");
    assert!(!std::path::Path::new(&marker).exists(), "the machine's /dev/shm must not see A's");
    hosts.finish();
}

#[test]
fn four_ranks_on_two_hosts_pass_every_collective() {
    let Some(mut hosts) = Hosts::create(HostsSpec::new(PREFIX)) else { return };
    let t0 = Instant::now();
    let tx0 = hosts.tx_bytes(0);
    for op in OPS {
        let outs = perf(&mut hosts, op);
        assert_passed(op, &outs);
        eprintln!("multihost: {op} passed on 2 hosts x 2 ranks ({:.1?} so far)", t0.elapsed());
    }
    // The 1 MiB all-reduce alone moves well over 1 MiB between the hosts.
    let sent = hosts.tx_bytes(0) - tx0;
    assert!(sent > 1 << 20, "host A sent only {sent} bytes over its veth: did traffic cross hosts?");
    hosts.finish();
}

/// Fails until the perf header prints `# rank R: ...` per rank and the shm transport is
/// chosen between ranks that share /dev/shm.
#[test]
fn same_host_peers_use_shm_and_cross_host_peers_use_tcp() {
    let Some(mut hosts) = Hosts::create(HostsSpec::new(PREFIX)) else { return };
    let outs = perf(&mut hosts, "all-reduce");
    assert_passed("all-reduce", &outs);
    assert_shm_within_hosts_tcp_across(&outs);
    hosts.finish();
}
