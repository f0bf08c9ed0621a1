//! Which ranks share a host, found by probing rather than by hostname, and which
//! transport each pair of ranks uses.
//!
//! Hostnames lie both ways: containers on one machine may have different names
//! and a private `/dev/shm` each (then shared memory does not work between them),
//! and two machines may share a name. What matters for the shared-memory
//! transport is whether two ranks can open the same file in `/dev/shm`, so that
//! is what [`discover`] tests: every rank leaves a probe file with a random token
//! there, every rank tries to open every other rank's probe, and two ranks share
//! a host when both succeed. Hosts are the connected components of that relation,
//! computed from the full matrix (every rank publishes its row), so every rank
//! arrives at the same answer.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::bootstrap::Store;
use crate::error::{Error, OpContext, Result};
use crate::transport::shm::random_u64;
use crate::transport::TransportKind;

/// Transports between processes, best first; [`choose_transports`] takes the
/// first one allowed, available and able to connect a pair: shared memory on one
/// host, RDMA verbs across hosts (when built with `rdma` and a device is there),
/// then TCP.
pub const TRANSPORT_PREFERENCE: [TransportKind; 3] = [TransportKind::Shm, TransportKind::Rdma, TransportKind::Tcp];

/// The hosts of a job, as seen from one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Host index of every rank. Hosts are numbered in the order of their lowest
    /// rank, so host 0 holds rank 0.
    pub host_of: Vec<usize>,
    /// The ranks of every host, ascending.
    pub hosts: Vec<Vec<usize>>,
    /// This rank's index among the ranks of its host.
    pub local_rank: usize,
    /// Number of ranks on this rank's host.
    pub local_size: usize,
    /// CPUs the ranks of this host may run on together (the union of their
    /// affinities when they set up, before any binding); 0 when unknown. More
    /// local ranks than this means they take turns on cores.
    pub local_cpus: usize,
    /// The same for every host (`host_cpus[h]`), from what every rank published, so
    /// that all ranks agree on which hosts take turns on cores; 0 when unknown.
    pub host_cpus: Vec<usize>,
}

impl Topology {
    /// The topology of `rank` given any host labelling of all ranks (`labels[r]`
    /// names r's host; equal labels, same host). Hosts are renumbered by lowest rank.
    ///
    /// # Panics
    /// When `rank` is not below `labels.len()`.
    pub fn from_labels(rank: usize, labels: &[usize]) -> Topology {
        assert!(rank < labels.len(), "rank {rank} is not below world size {}", labels.len());
        let mut host_of = vec![usize::MAX; labels.len()];
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        for r in 0..labels.len() {
            if host_of[r] != usize::MAX {
                continue;
            }
            let h = hosts.len();
            let members: Vec<usize> = (r..labels.len()).filter(|&s| labels[s] == labels[r]).collect();
            for &s in &members {
                host_of[s] = h;
            }
            hosts.push(members);
        }
        let mine = &hosts[host_of[rank]];
        let local_rank = mine.iter().position(|&r| r == rank).unwrap_or(0);
        let local_size = mine.len();
        let host_cpus = vec![0; hosts.len()];
        Topology { host_of, hosts, local_rank, local_size, local_cpus: 0, host_cpus }
    }

    /// Every one of `world` ranks on one host (threads of one process, or a test).
    pub fn single_host(rank: usize, world: usize) -> Topology {
        Topology::from_labels(rank, &vec![0; world])
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.host_of.len()
    }

    /// Number of hosts.
    pub fn num_hosts(&self) -> usize {
        self.hosts.len()
    }

    /// Whether ranks `a` and `b` are on one host (false for ranks out of range).
    pub fn same_host(&self, a: usize, b: usize) -> bool {
        match (self.host_of.get(a), self.host_of.get(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        }
    }

    /// The ranks on the host of `rank`, ascending.
    #[cfg(test)]
    pub fn host_ranks(&self, rank: usize) -> &[usize] {
        &self.hosts[self.host_of[rank]]
    }

    /// Whether the ranks of each host outnumber the CPUs they may use (false where
    /// unknown).
    pub fn oversubscribed_hosts(&self) -> Vec<bool> {
        self.hosts.iter().zip(&self.host_cpus).map(|(ranks, &cpus)| cpus > 0 && ranks.len() > cpus).collect()
    }
}

/// Group ranks into hosts from a probe matrix: `reach[a][b]` says whether rank
/// `a` could open rank `b`'s probe. Two ranks are linked when both directions
/// succeeded; hosts are the connected components of the links. Returns each
/// rank's host index, hosts numbered by their lowest rank. Pure: no I/O.
pub fn group_hosts(reach: &[Vec<bool>]) -> Vec<usize> {
    let world = reach.len();
    let linked =
        |a: usize, b: usize| reach[a].get(b).copied().unwrap_or(false) && reach[b].get(a).copied().unwrap_or(false);
    let mut host_of = vec![usize::MAX; world];
    let mut next = 0;
    // Scanning ranks in order and flooding each new component from its lowest
    // rank numbers the hosts by lowest rank.
    for start in 0..world {
        if host_of[start] != usize::MAX {
            continue;
        }
        host_of[start] = next;
        let mut stack = vec![start];
        while let Some(a) = stack.pop() {
            for (b, h) in host_of.iter_mut().enumerate() {
                if *h == usize::MAX && linked(a, b) {
                    *h = next;
                    stack.push(b);
                }
            }
        }
        next += 1;
    }
    host_of
}

/// Whether `kind` can connect ranks `a` and `b` of `topo`.
pub fn can_connect(topo: &Topology, kind: TransportKind, a: usize, b: usize) -> bool {
    match kind {
        TransportKind::Shm => topo.same_host(a, b),
        TransportKind::Tcp => true,
        // Threads of one process are set up by the communicator, not per pair.
        TransportKind::InProcess => false,
        // Any two ranks with a device: across hosts it is the choice; on one host
        // shared memory comes first, so rdma is used there only when shm is not
        // allowed (queue pairs loop back through the device).
        TransportKind::Rdma => a != b,
        // Not a link: GPU buffers are staged over the links above.
        TransportKind::Cuda => false,
    }
}

/// The transport `rank` uses to each peer: the first of [`TRANSPORT_PREFERENCE`]
/// that is in `allowed` (None: all), available in this build and on this machine
/// ([`TransportKind::available`]) and can connect the pair. `None` at `rank`.
///
/// A preferred transport that cannot run (rdma without the feature or a device)
/// is skipped, saying why at debug level: its peers fall back to the next one
/// (tcp). Fails with [`Error::Unsupported`] when every allowed transport is
/// unavailable (e.g. `BRAID_TRANSPORTS=rdma` here), and with [`Error::Config`]
/// naming the peers no allowed transport reaches (e.g. `BRAID_TRANSPORTS=shm`
/// with ranks on two hosts).
pub fn choose_transports(
    topo: &Topology,
    rank: usize,
    allowed: Option<&[TransportKind]>,
) -> Result<Vec<Option<TransportKind>>> {
    choose_transports_with(topo, rank, allowed, |k| k.available())
}

/// [`choose_transports`] with the availability of each transport given.
fn choose_transports_with(
    topo: &Topology,
    rank: usize,
    allowed: Option<&[TransportKind]>,
    available: impl Fn(TransportKind) -> std::result::Result<(), String>,
) -> Result<Vec<Option<TransportKind>>> {
    let world = topo.world();
    if rank >= world {
        return Err(Error::InvalidArgument(format!("rank {rank} is not below world size {world}")));
    }
    // Transports this build or machine cannot run are dropped, saying why at debug
    // level; when nothing allowed is left, the error says why for each.
    if let Some(list) = allowed {
        let why: Vec<String> = list.iter().filter_map(|&k| available(k).err()).collect();
        if !list.is_empty() && why.len() == list.len() {
            return Err(Error::Unsupported(format!("rank {rank}: {}", why.join("; "))));
        }
    }
    // Asked once per transport (a device probe is not free).
    let usable: Vec<TransportKind> = TRANSPORT_PREFERENCE
        .iter()
        .copied()
        .filter(|k| allowed.is_none_or(|list| list.contains(k)))
        .filter(|&k| match available(k) {
            Ok(()) => true,
            Err(why) => {
                tracing::debug!(rank, transport = k.name(), "{why}; its peers use the next allowed transport");
                false
            }
        })
        .collect();
    let choice: Vec<Option<TransportKind>> = (0..world)
        .map(|p| {
            if p == rank {
                return None;
            }
            usable.iter().copied().find(|&k| can_connect(topo, k, rank, p))
        })
        .collect();
    let unreachable: Vec<usize> = (0..world).filter(|&p| p != rank && choice[p].is_none()).collect();
    if let Some(&first) = unreachable.first() {
        let names: Vec<&str> = allowed.unwrap_or(&[]).iter().map(|k| k.name()).collect();
        return Err(Error::Config(format!(
            "rank {rank} (host {}) cannot reach rank {first} (host {}){} with the allowed transports [{}]: \
             shm connects only ranks on one host; allow tcp too (BRAID_TRANSPORTS=shm,tcp)",
            topo.host_of[rank],
            topo.host_of[first],
            if unreachable.len() > 1 { format!(" nor ranks {:?}", &unreachable[1..]) } else { String::new() },
            names.join(","),
        )));
    }
    Ok(choice)
}

/// The transport `rank` uses to `peer` when RDMA was chosen but the peer cannot
/// run it: the next of [`TRANSPORT_PREFERENCE`] after rdma that is allowed,
/// available and connects the pair (tcp), if any.
pub fn fallback_from_rdma(
    topo: &Topology,
    rank: usize,
    peer: usize,
    allowed: Option<&[TransportKind]>,
) -> Option<TransportKind> {
    TRANSPORT_PREFERENCE
        .iter()
        .copied()
        .skip_while(|&k| k != TransportKind::Rdma)
        .skip(1)
        .filter(|k| allowed.is_none_or(|list| list.contains(k)))
        .find(|&k| k.available().is_ok() && can_connect(topo, k, rank, peer))
}

/// A probe file in `/dev/shm`, removed on drop.
struct Probe {
    path: PathBuf,
    token: String,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Probe {
    fn create(rank: usize) -> Result<Probe> {
        let token = format!("{:016x}{:016x}", random_u64(), random_u64());
        let path = PathBuf::from(format!("{PROBE_PREFIX}{}-{rank}-{:016x}", std::process::id(), random_u64()));
        let what = |e, path: &Path| Error::io(format!("rank {rank}: creating topology probe {}", path.display()), e);
        // Owner-only, like the shm segments: a rank that cannot open this could
        // not open a segment either, so it should not count as the same host.
        let mut f =
            OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(|e| what(e, &path))?;
        // From here on, an error removes the file (Probe's drop).
        let probe = Probe { path, token };
        f.write_all(probe.token.as_bytes()).map_err(|e| what(e, &probe.path))?;
        Ok(probe)
    }
}

/// Directory and name prefix of every probe file: the only paths [`probe_matches`] opens.
const PROBE_PREFIX: &str = "/dev/shm/braid-probe-";

/// Whether `path` names a probe file braid could have made: directly in
/// `/dev/shm`, named `braid-probe-` and then only letters, digits and `-`
/// (so no `/`, no `..`, nothing another directory could be reached through).
fn is_probe_path(path: &str) -> bool {
    path.strip_prefix(PROBE_PREFIX)
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}

/// Whether the probe at `path` exists here and holds `token`.
///
/// Both come from the store, so neither is trusted: only braid's own probe names
/// are opened, without following a link and without blocking (a FIFO planted
/// under such a name answers at once), only a regular file counts, and at most
/// one byte more than the token is read (a huge file cannot exhaust this rank).
fn probe_matches(path: &str, token: &str) -> bool {
    if !is_probe_path(path) {
        tracing::debug!(path, "topology: a probe path outside {PROBE_PREFIX}* is not opened");
        return false;
    }
    let Ok(f) = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path) else {
        return false;
    };
    if !f.metadata().is_ok_and(|m| m.file_type().is_file()) {
        return false;
    }
    let mut got = Vec::with_capacity(token.len() + 1);
    f.take(token.len() as u64 + 1).read_to_end(&mut got).is_ok() && got == token.as_bytes()
}

fn probe_key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/topo/probe/{rank}")
}

fn row_key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/topo/row/{rank}")
}

/// Wait until every rank's key is set; a timeout names the ranks whose key is missing.
fn wait_ranks(
    store: &dyn Store,
    key: impl Fn(usize) -> String,
    world: usize,
    deadline: Instant,
    rank: usize,
    timeout: Duration,
) -> Result<()> {
    let keys: Vec<String> = (0..world).map(&key).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    match store.wait(&refs, deadline.saturating_duration_since(Instant::now())) {
        Ok(()) => Ok(()),
        Err(e) => {
            let mut waiting_on = Vec::new();
            for (r, k) in keys.iter().enumerate() {
                if store.get(k)?.is_none() {
                    waiting_on.push(r);
                }
            }
            if waiting_on.is_empty() {
                return Err(e);
            }
            Err(Error::Timeout { ctx: OpContext { rank, call: None, seq: 0 }, timeout, waiting_on, chain: Vec::new() })
        }
    }
}

/// How many distinct CPUs the lists name together; 0 when any is unknown.
fn union_size<'a>(lists: impl Iterator<Item = Option<&'a [usize]>>) -> usize {
    let mut all = std::collections::BTreeSet::new();
    for list in lists {
        match list {
            Some(cpus) => all.extend(cpus.iter().copied()),
            None => return 0,
        }
    }
    all.len()
}

/// Find which of the `world` ranks share a host with which, by probing `/dev/shm`.
///
/// Every rank must call it with the same `key_prefix` (keys go under
/// `{key_prefix}/topo/`). Fails with [`Error::Timeout`] naming the ranks that
/// did not take part within `timeout`. The probe file is removed on every path.
pub fn discover(rank: usize, world: usize, store: &dyn Store, key_prefix: &str, timeout: Duration) -> Result<Topology> {
    if world == 0 || rank >= world {
        return Err(Error::InvalidArgument(format!("rank {rank} is not below world size {world}")));
    }
    let my_cpus = crate::placement::allowed_cpus().unwrap_or_default();
    if world == 1 {
        let mut topo = Topology::single_host(0, 1);
        topo.local_cpus = my_cpus.len();
        topo.host_cpus = vec![my_cpus.len()];
        return Ok(topo);
    }
    let deadline = Instant::now() + timeout;
    let probe = Probe::create(rank)?;
    let path = probe.path.to_str().expect("probe paths are ASCII");
    // The probe also carries this rank's CPUs, so the ranks of a host learn
    // whether they outnumber the cores they may use between them.
    let cpu_list = crate::placement::format_cpu_list(&my_cpus);
    store.set(&probe_key(key_prefix, rank), format!("{} {path} {cpu_list}", probe.token).as_bytes())?;
    wait_ranks(store, |r| probe_key(key_prefix, r), world, deadline, rank, timeout)?;

    let mut row = String::with_capacity(world);
    // The CPUs of every rank (None: unreadable or malformed), read from the store
    // for all ranks so that every rank sums the same lists per host.
    let mut rank_cpus: Vec<Option<Vec<usize>>> = vec![None; world];
    for (r, cpus) in rank_cpus.iter_mut().enumerate() {
        let raw = store.get(&probe_key(key_prefix, r))?.unwrap_or_default();
        let text = String::from_utf8_lossy(&raw);
        let mut fields = text.splitn(3, ' ');
        let ok = match (fields.next(), fields.next()) {
            (Some(token), Some(path)) => {
                *cpus = fields.next().and_then(crate::placement::parse_cpu_list);
                r == rank || probe_matches(path, token)
            }
            _ => r == rank,
        };
        row.push(if ok { '1' } else { '0' });
    }
    store.set(&row_key(key_prefix, rank), row.as_bytes())?;
    // Once every row is in, every rank has finished probing: ours can go.
    wait_ranks(store, |r| row_key(key_prefix, r), world, deadline, rank, timeout)?;
    drop(probe);

    let mut reach = Vec::with_capacity(world);
    for r in 0..world {
        let raw = store.get(&row_key(key_prefix, r))?.unwrap_or_default();
        if raw.len() != world || raw.iter().any(|&c| c != b'0' && c != b'1') {
            return Err(Error::Protocol {
                ctx: OpContext { rank, call: None, seq: 0 },
                peer: r,
                detail: format!("topology row `{}` is not {world} digits 0/1", String::from_utf8_lossy(&raw)),
            });
        }
        reach.push(raw.iter().map(|&c| c == b'1').collect::<Vec<bool>>());
    }
    let mut topo = Topology::from_labels(rank, &group_hosts(&reach));
    topo.host_cpus =
        topo.hosts.iter().map(|ranks| union_size(ranks.iter().map(|&r| rank_cpus[r].as_deref()))).collect();
    topo.local_cpus = topo.host_cpus[topo.host_of[rank]];
    tracing::debug!(rank, hosts = ?topo.hosts, local_cpus = topo.local_cpus, "topology discovered");
    Ok(topo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::MemStore;

    fn matrix(world: usize, linked: &[(usize, usize)]) -> Vec<Vec<bool>> {
        (0..world).map(|a| (0..world).map(|b| a == b || linked.contains(&(a, b))).collect()).collect()
    }

    fn sym(pairs: &[(usize, usize)]) -> Vec<(usize, usize)> {
        pairs.iter().flat_map(|&(a, b)| [(a, b), (b, a)]).collect()
    }

    #[test]
    fn grouping_finds_two_hosts_numbered_by_lowest_rank() {
        // Hosts {0,2,4} and {1,3}, as ranks interleaved across two machines.
        let reach = matrix(5, &sym(&[(0, 2), (2, 4), (0, 4), (1, 3)]));
        assert_eq!(group_hosts(&reach), vec![0, 1, 0, 1, 0]);
        let t = Topology::from_labels(3, &group_hosts(&reach));
        assert_eq!(t.hosts, vec![vec![0, 2, 4], vec![1, 3]]);
        assert_eq!((t.local_rank, t.local_size, t.num_hosts(), t.world()), (1, 2, 2, 5));
        assert!(t.same_host(0, 4) && !t.same_host(0, 1) && !t.same_host(0, 9));
        assert_eq!(t.host_ranks(1), &[1, 3]);
    }

    #[test]
    fn grouping_needs_both_directions_and_is_transitive() {
        // 0 sees 1 but not back: not linked. 1~2 and 2~3 chain into one host.
        let mut links = sym(&[(1, 2), (2, 3)]);
        links.push((0, 1));
        assert_eq!(group_hosts(&matrix(4, &links)), vec![0, 1, 1, 1]);
        assert_eq!(group_hosts(&matrix(3, &[])), vec![0, 1, 2]);
        assert_eq!(group_hosts(&[]), Vec::<usize>::new());
    }

    #[test]
    fn labels_are_renumbered_by_lowest_rank() {
        let t = Topology::from_labels(2, &[7, 3, 7, 3]);
        assert_eq!(t.host_of, vec![0, 1, 0, 1]);
        assert_eq!((t.local_rank, t.local_size), (1, 2));
        assert_eq!(Topology::single_host(1, 3).hosts, vec![vec![0, 1, 2]]);
    }

    #[test]
    fn threads_of_one_process_are_one_host_and_probes_are_removed() {
        let store = MemStore::new();
        let topos: Vec<Topology> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|r| {
                    let store = &store;
                    s.spawn(move || discover(r, 4, store, "job", Duration::from_secs(20)).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, t) in topos.iter().enumerate() {
            assert_eq!(t.hosts, vec![vec![0, 1, 2, 3]]);
            assert_eq!((t.local_rank, t.local_size), (r, 4));
            let raw = store.get(&probe_key("job", r)).unwrap().unwrap();
            let path = String::from_utf8(raw).unwrap().split(' ').nth(1).unwrap().to_owned();
            assert!(path.starts_with("/dev/shm/braid-probe-") && !Path::new(&path).exists(), "{path}");
            // Threads share the process's affinity: the host has exactly those CPUs.
            assert_eq!(t.local_cpus, crate::placement::allowed_cpus().unwrap().len());
        }
    }

    #[test]
    fn the_cpus_of_a_host_are_the_union_of_its_ranks_and_unknown_if_any_is() {
        assert_eq!(union_size([Some(&[0usize, 1][..]), Some(&[1, 2][..])].into_iter()), 3);
        assert_eq!(union_size([Some(&[4usize][..]), Some(&[4][..])].into_iter()), 1);
        assert_eq!(union_size([Some(&[0usize, 1][..]), None].into_iter()), 0);
        // A peer on this host whose CPU list is garbage makes the count unknown,
        // not a panic and not a guess.
        let store = MemStore::new();
        let probe = Probe::create(1).unwrap();
        let value = format!("{} {} 0-99999999", probe.token, probe.path.to_str().unwrap());
        store.set(&probe_key("g", 1), value.as_bytes()).unwrap();
        store.set(&row_key("g", 1), b"11").unwrap();
        let t = discover(0, 2, &store, "g", Duration::from_secs(10)).unwrap();
        assert_eq!((t.local_size, t.local_cpus), (2, 0));
    }

    #[test]
    fn a_rank_whose_probe_cannot_be_opened_is_another_host() {
        // Rank 3 plays a rank on another machine: its probe is not in our /dev/shm,
        // and it could open none of ours.
        let store = MemStore::new();
        store.set(&probe_key("x", 3), b"00112233 /dev/shm/braid-probe-elsewhere-3-0").unwrap();
        store.set(&row_key("x", 3), b"0001").unwrap();
        let topos: Vec<Topology> = std::thread::scope(|s| {
            let store = &store;
            let hs: Vec<_> =
                (0..3).map(|r| s.spawn(move || discover(r, 4, store, "x", Duration::from_secs(20)).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for t in &topos {
            assert_eq!(t.host_of, vec![0, 0, 0, 1]);
            assert_eq!(t.local_size, 3);
        }
        assert_eq!(store.get(&row_key("x", 1)).unwrap().unwrap(), b"1110");
    }

    #[test]
    fn discover_times_out_naming_absent_ranks_and_cleans_up() {
        let store = MemStore::new();
        match discover(0, 3, &store, "late", Duration::from_millis(100)).unwrap_err() {
            Error::Timeout { waiting_on, .. } => assert_eq!(waiting_on, vec![1, 2]),
            other => panic!("expected a timeout, got {other}"),
        }
        let raw = store.get(&probe_key("late", 0)).unwrap().unwrap();
        let path = String::from_utf8(raw).unwrap().split_once(' ').unwrap().1.to_owned();
        assert!(!Path::new(&path).exists(), "{path} left behind");
        assert!(matches!(discover(3, 3, &store, "late", Duration::ZERO), Err(Error::InvalidArgument(_))));
        assert_eq!(discover(0, 1, &store, "solo", Duration::ZERO).unwrap().local_size, 1);
    }

    #[test]
    fn rdma_comes_between_shm_and_tcp_when_it_can_run() {
        use TransportKind::{Rdma, Shm, Tcp};
        let t = Topology::from_labels(0, &[0, 0, 1, 1]);
        let all = |_: TransportKind| Ok(());
        let no_rdma = |k: TransportKind| if k == Rdma { Err("no RDMA devices".to_string()) } else { Ok(()) };
        assert_eq!(choose_transports_with(&t, 0, None, all).unwrap(), vec![None, Some(Shm), Some(Rdma), Some(Rdma)]);
        assert_eq!(choose_transports_with(&t, 0, None, no_rdma).unwrap(), vec![None, Some(Shm), Some(Tcp), Some(Tcp)]);
        let only_rdma = Some(&[Rdma][..]);
        assert_eq!(
            choose_transports_with(&t, 3, only_rdma, all).unwrap(),
            vec![Some(Rdma), Some(Rdma), Some(Rdma), None]
        );
        let err = choose_transports_with(&t, 3, only_rdma, no_rdma).unwrap_err();
        assert!(matches!(&err, Error::Unsupported(why) if why.contains("rank 3: no RDMA devices")), "{err}");
        let rdma_tcp = Some(&[Rdma, Tcp][..]);
        assert_eq!(
            choose_transports_with(&t, 1, rdma_tcp, no_rdma).unwrap(),
            vec![Some(Tcp), None, Some(Tcp), Some(Tcp)]
        );
    }

    #[test]
    fn transports_prefer_shm_on_one_host_and_tcp_across() {
        use TransportKind::{Shm, Tcp};
        let t = Topology::from_labels(0, &[0, 0, 1, 1]);
        // Across hosts: rdma where this build and machine have it, tcp otherwise.
        let across = if TransportKind::Rdma.available().is_ok() { TransportKind::Rdma } else { Tcp };
        assert_eq!(choose_transports(&t, 0, None).unwrap(), vec![None, Some(Shm), Some(across), Some(across)]);
        assert_eq!(choose_transports(&t, 3, Some(&[Tcp, Shm])).unwrap(), vec![Some(Tcp), Some(Tcp), Some(Shm), None]);
        assert_eq!(choose_transports(&t, 1, Some(&[Tcp])).unwrap(), vec![Some(Tcp), None, Some(Tcp), Some(Tcp)]);
        assert_eq!(Topology::single_host(0, 2).world(), 2);
        assert_eq!(choose_transports(&Topology::single_host(1, 2), 1, Some(&[Shm])).unwrap(), vec![Some(Shm), None]);
        assert!(matches!(choose_transports(&t, 4, None), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn a_peer_no_allowed_transport_reaches_is_a_config_error() {
        use TransportKind::{InProcess, Shm};
        let t = Topology::from_labels(1, &[0, 0, 1, 1]);
        let err = choose_transports(&t, 1, Some(&[Shm])).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("rank 1") && msg.contains("rank 2") && msg.contains("[3]") && msg.contains("[shm]"),
            "{msg}"
        );
        let err = choose_transports(&t, 0, Some(&[InProcess])).unwrap_err().to_string();
        assert!(err.contains("cannot reach rank 1") && err.contains("[inproc]"), "{err}");
    }

    #[test]
    fn probe_paths_outside_braids_own_names_are_not_followed() {
        let dir = format!("{PROBE_PREFIX}fifo-{}-{:016x}", std::process::id(), random_u64());
        let fifo = std::ffi::CString::new(dir.clone()).unwrap();
        // SAFETY: a NUL-terminated path; creates a FIFO nobody writes to.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let link = format!("{dir}-link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let started = Instant::now();
        for path in [
            dir.as_str(),
            link.as_str(),
            "/dev/zero",
            "/dev/shm/braid-probe-../../dev/zero",
            "/dev/shm/braid-probe-x/../../../dev/zero",
            "/dev/shm/other-name",
            "/dev/shm/braid-probe-",
            "/tmp/braid-probe-1",
        ] {
            assert!(!probe_matches(path, "00112233"), "{path}");
        }
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
        let _ = std::fs::remove_file(&dir);
        let _ = std::fs::remove_file(&link);
        assert!(is_probe_path("/dev/shm/braid-probe-123-0-00ff") && !is_probe_path("/dev/shm/braid-probe-a/b"));
    }

    #[test]
    fn a_probe_is_read_only_up_to_the_token_length() {
        let probe = Probe::create(0).unwrap();
        let path = probe.path.to_str().unwrap().to_owned();
        assert!(probe_matches(&path, &probe.token));
        // The same file with more after the token: not a match, and not read whole.
        std::fs::write(&path, format!("{}{}", probe.token, "x".repeat(1 << 20))).unwrap();
        assert!(!probe_matches(&path, &probe.token));
        assert!(!probe_matches(&path, "wrong"));
    }

    #[test]
    fn a_fifo_published_as_a_probe_is_another_host_without_a_hang() {
        let store = MemStore::new();
        let fifo = format!("{PROBE_PREFIX}evil-{}-{:016x}", std::process::id(), random_u64());
        let c = std::ffi::CString::new(fifo.clone()).unwrap();
        // SAFETY: a NUL-terminated path; creates a FIFO nobody writes to.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        store.set(&probe_key("f", 1), format!("00112233 {fifo}").as_bytes()).unwrap();
        store.set(&row_key("f", 1), b"01").unwrap();
        let started = Instant::now();
        let t = discover(0, 2, &store, "f", Duration::from_secs(10)).unwrap();
        assert_eq!(t.host_of, vec![0, 1]);
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        let _ = std::fs::remove_file(&fifo);
    }

    #[test]
    fn unavailable_transports_are_dropped_and_alone_are_an_error_saying_why() {
        let topo = Topology::single_host(0, 2);
        if TransportKind::Cuda.available().is_err() {
            let err = choose_transports(&topo, 0, Some(&[TransportKind::Cuda])).unwrap_err();
            assert!(matches!(err, Error::Unsupported(_)) && err.to_string().contains("cuda transport"), "{err}");
        }
        if TransportKind::Rdma.available().is_err() && TransportKind::Cuda.available().is_err() {
            let err = choose_transports(&topo, 1, Some(&[TransportKind::Rdma, TransportKind::Cuda])).unwrap_err();
            assert!(err.to_string().contains("rdma") && err.to_string().contains("cuda"), "{err}");
        }
        let mixed = choose_transports(&topo, 0, Some(&[TransportKind::Cuda, TransportKind::Tcp])).unwrap();
        assert_eq!(mixed, vec![None, Some(TransportKind::Tcp)]);
        assert_eq!(choose_transports(&topo, 0, None).unwrap(), vec![None, Some(TransportKind::Shm)]);
    }
}
