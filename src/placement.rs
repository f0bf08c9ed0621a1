//! Rank placement: each local rank on a core of its own.
//!
//! Left to the scheduler, two ranks of a host sometimes share a core or migrate
//! mid-transfer, and a whole run collapses (issue 17 measured 64 MiB all-reduce at
//! about a quarter of its speed in 3 runs of 12). Under [`BindPolicy::Auto`] braid
//! binds, as Open MPI does by default, when:
//! - the ranks are processes started by a launcher (`braid run`, torchrun, mpirun,
//!   srun: [`Config::launcher`](crate::config::Config) is not `code`): threads of a
//!   program are the program's business;
//! - nobody narrowed the affinity already (`taskset`, `mpirun --bind-to`,
//!   `srun --cpu-bind`): then it is left exactly as it is;
//! - the rank has neighbours on its node: a rank alone on its host as probed
//!   (no other rank opens its `/dev/shm`) is bound only when the launcher says
//!   how many ranks share the node (`LOCAL_WORLD_SIZE`,
//!   `OMPI_COMM_WORLD_LOCAL_SIZE`, `SLURM_NTASKS_PER_NODE`), by the launcher's
//!   local rank. Containers or pods of one node, each with a private `/dev/shm`
//!   (Kubernetes' default), otherwise all probed as rank 0 of 1 and took CPU 0.
//!
//! Cores are handed out in topology order — package, then core, one hardware
//! thread per core before any sibling — so local ranks `i` and `i + 1` (ring
//! neighbours) sit on neighbouring cores of one package, sharing its cache.
//! When the local ranks outnumber the CPUs, they go round robin over them (4 ranks
//! on 2 cores: 0 and 2 on the first, 1 and 3 on the second), and keep the
//! executor's yield/sleep waiting, which counts the CPUs from before binding.
//! Unbound, such ranks were placed anew by the scheduler in every run, and one
//! run's timings could be twice another's (see `plan`).
//! [`BindPolicy::Core`] binds even a narrowed or in-code rank (within the allowed
//! set); [`BindPolicy::None`] never binds.
//!
//! `auto` is the default. It waited on the executor's wait policy: a bound rank
//! beside a busy loop used to take its core's few CPUs for "more ranks than cores"
//! and yield its slice to the loop on every poll (4 KiB all-reduce about 4 ms). The
//! policy now counts the CPUs the host's ranks had before binding: beside one busy
//! loop, bound ranks took 0.48–0.55x Open MPI's time at 64 KiB and 1 MiB (unbound
//! ones 0.42–0.47x), and 4 KiB is about even (results/busy-2026-11-24.md).
//!
//! The deciding is pure (`plan`) and tested on made-up machines; `apply` reads
//! this machine and sets the calling thread's affinity (threads it starts later,
//! such as the communicator's worker, inherit it).

use std::fmt;
use std::str::FromStr;

/// Whether braid binds local ranks to cores (`BRAID_BIND`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BindPolicy {
    /// Bind processes started by a launcher whose affinity nobody narrowed (the
    /// default); oversubscribed ranks share the CPUs round robin.
    #[default]
    Auto,
    /// Bind whenever a core is free for the rank, within the allowed CPUs.
    Core,
    /// Never bind.
    None,
}

impl FromStr for BindPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(BindPolicy::Auto),
            "core" | "cores" => Ok(BindPolicy::Core),
            "none" | "no" | "off" => Ok(BindPolicy::None),
            other => Err(format!("`{other}` is not a binding policy (auto, core or none)")),
        }
    }
}

impl fmt::Display for BindPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BindPolicy::Auto => "auto",
            BindPolicy::Core => "core",
            BindPolicy::None => "none",
        })
    }
}

/// Where a CPU sits: package and core ids from `/sys/devices/system/cpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuInfo {
    /// Logical CPU number.
    pub cpu: usize,
    /// `physical_package_id`.
    pub package: usize,
    /// `core_id` (unique within a package).
    pub core: usize,
}

/// What placement decided for this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Bind to this logical CPU.
    Bind(usize),
    /// Leave the affinity alone, for this reason.
    Leave(String),
}

/// The allowed CPUs in binding order: packages in order, then cores, the first
/// hardware thread of every core before any second one.
pub(crate) fn binding_order(allowed: &[CpuInfo]) -> Vec<usize> {
    let mut by_core: Vec<(usize, usize, Vec<usize>)> = Vec::new();
    for c in allowed {
        match by_core.iter_mut().find(|(p, k, _)| *p == c.package && *k == c.core) {
            Some((_, _, cpus)) => cpus.push(c.cpu),
            None => by_core.push((c.package, c.core, vec![c.cpu])),
        }
    }
    by_core.sort();
    for (_, _, cpus) in &mut by_core {
        cpus.sort_unstable();
    }
    let depth = by_core.iter().map(|(_, _, c)| c.len()).max().unwrap_or(0);
    (0..depth).flat_map(|t| by_core.iter().filter_map(move |(_, _, c)| c.get(t).copied())).collect()
}

/// Decide for local rank `local_rank` of `local_size` (as probed: the ranks that
/// share its `/dev/shm`), which may run on `allowed` of the machine's `online`
/// CPUs; `launched` says whether a launcher started it, `launcher_local` the
/// local rank and size the launcher gave, if it did.
pub(crate) fn plan(
    policy: BindPolicy,
    launched: bool,
    local_rank: usize,
    local_size: usize,
    launcher_local: Option<(usize, usize)>,
    allowed: &[CpuInfo],
    online: usize,
) -> Decision {
    let leave = |why: String| Decision::Leave(why);
    match policy {
        BindPolicy::None => return leave("BRAID_BIND=none".into()),
        BindPolicy::Auto if !launched => {
            return leave("not started by a launcher (threads of a program are its own business)".into())
        }
        BindPolicy::Auto if allowed.len() < online => {
            let cpus: Vec<usize> = allowed.iter().map(|c| c.cpu).collect();
            return leave(format!("affinity already narrowed to CPUs {cpus:?} (launcher or user): left as is"));
        }
        _ => {}
    }
    // Ranks that cannot share a `/dev/shm` (containers or pods on one node, each
    // with its own) each probe as alone on their host: 4 of them on this machine
    // all took CPU 0. The launcher, when it says how many ranks share the node,
    // knows where this one stands among them.
    let (local_rank, local_size) = match launcher_local {
        Some((rank, size)) if local_size == 1 && size > 1 => (rank, size),
        _ => (local_rank, local_size),
    };
    if policy == BindPolicy::Auto && local_size == 1 {
        return leave(
            "alone on its host as probed, and no launcher says other ranks share the node: no neighbour to sit near"
                .into(),
        );
    }
    let order = binding_order(allowed);
    if order.is_empty() || local_rank >= local_size {
        return leave(format!("local rank {local_rank} of {local_size} has no CPU among {} allowed", order.len()));
    }
    if local_size > order.len() {
        // Oversubscribed: round robin over the CPUs, as Open MPI maps by core. Left
        // to the scheduler, 4 ranks on 2 cores were placed anew in every run: the
        // same 256 KiB all-reduce took 87 µs in some runs and 160-170 µs in others,
        // and the tuner calibrated to whichever it met. Bound, it takes the same
        // time in every run. Round robin against neighbours in pairs (0 and 1 on
        // one core), 3 runs each: the tuner's pick ran within 6% of the best
        // algorithm forced at every size from 4 KiB to 64 MiB, against 18% in
        // pairs, and its calls took 0.69-0.89x the time from 16 KiB to 256 KiB
        // and 1.03-1.06x from 1 MiB up (results/tuner-2026-11-26b.md, data in results/data/bind-2026-11-26/).
        return Decision::Bind(order[local_rank % order.len()]);
    }
    match order.get(local_rank) {
        Some(&cpu) => Decision::Bind(cpu),
        None => leave(format!("local rank {local_rank} has no CPU left")),
    }
}

/// The CPUs the calling thread may run on.
pub(crate) fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).map_err(std::io::Error::from)?;
    Ok((0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect())
}

fn read_id(cpu: usize, what: &str) -> Option<usize> {
    let p = format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}");
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Where each of `cpus` sits (a CPU whose topology cannot be read counts as a
/// core of its own in package 0).
pub(crate) fn cpu_info(cpus: &[usize]) -> Vec<CpuInfo> {
    cpus.iter()
        .map(|&cpu| CpuInfo {
            cpu,
            package: read_id(cpu, "physical_package_id").unwrap_or(0),
            core: read_id(cpu, "core_id").unwrap_or(cpu),
        })
        .collect()
}

/// Online CPUs of the machine (`/sys/devices/system/cpu/online`, e.g. `0-3,6`).
pub(crate) fn online_cpus() -> usize {
    match std::fs::read_to_string("/sys/devices/system/cpu/online").ok().and_then(|t| parse_cpu_list(&t)) {
        Some(cpus) => cpus.len(),
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    }
}

/// `cpus` when known (non-zero), else the machine's online CPUs: what a count of
/// 0 ("unknown", as in `Topology::local_cpus`) stands for.
pub(crate) fn cpus_or_online(cpus: usize) -> usize {
    if cpus == 0 {
        online_cpus()
    } else {
        cpus
    }
}

/// The largest CPU number a list may name: lists also come from peers (through
/// the store), so a range is bounded before it is expanded.
const MAX_CPU: usize = 1 << 16;

/// Parse a CPU list in the kernel's format (`0-3,6`) into ascending, distinct CPU
/// numbers; `None` when it is malformed or names a CPU above 65535.
pub(crate) fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = std::collections::BTreeSet::new();
    for part in text.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        if a > b || b > MAX_CPU {
            return None;
        }
        cpus.extend(a..=b);
    }
    Some(cpus.into_iter().collect())
}

/// `cpus` (ascending) as a short list in the kernel's format (`0`, `0-3`, `0,2`).
pub(crate) fn format_cpu_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    parts.join(",")
}

/// Decide (see [`plan`]) and, if binding, set the calling thread's affinity.
/// Returns what was done.
pub(crate) fn apply(
    policy: BindPolicy,
    launched: bool,
    rank: usize,
    (local_rank, local_size): (usize, usize),
    launcher_local: Option<(usize, usize)>,
) -> Decision {
    let allowed = match allowed_cpus() {
        Ok(a) => a,
        Err(e) => return Decision::Leave(format!("reading the affinity failed: {e}")),
    };
    let decision = plan(policy, launched, local_rank, local_size, launcher_local, &cpu_info(&allowed), online_cpus());
    if let Decision::Bind(cpu) = decision {
        let mut set = nix::sched::CpuSet::new();
        let bound = set.set(cpu).and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
        if let Err(e) = bound {
            let why = format!("binding to CPU {cpu} failed: {e}");
            tracing::debug!(rank, "{why}");
            return Decision::Leave(why);
        }
        tracing::debug!(rank, local_rank, cpu, "bound to a core");
    } else if let Decision::Leave(why) = &decision {
        tracing::debug!(rank, local_rank, "not binding: {why}");
    }
    decision
}

/// Give the calling thread (alone: Linux keeps a niceness per thread) the
/// niceness `nice`; `0` leaves it as it is. Failure (raising priority without the
/// privilege to) is logged and harmless: the thread keeps its niceness.
pub(crate) fn set_thread_nice(nice: i32) {
    if nice == 0 {
        return;
    }
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    let (tid, set) = unsafe {
        let tid = libc::gettid();
        (tid, libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice))
    };
    if set != 0 {
        tracing::debug!(tid, nice, "setting the thread's niceness failed: {}", std::io::Error::last_os_error());
    }
}

/// The calling thread's allowed CPUs as a short list (`0`, `0-3`, `0,2`), for reports.
pub fn describe_affinity() -> String {
    allowed_cpus().map(|cpus| format_cpu_list(&cpus)).unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's niceness (glibc's getpriority returns it as is).
    fn own_nice() -> i32 {
        // SAFETY: gettid and getpriority take plain integers and touch no memory of ours.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn a_thread_lowers_its_own_priority_only() {
        let before = own_nice();
        let (inside, after_zero) = std::thread::spawn(move || {
            set_thread_nice(0);
            let after_zero = own_nice();
            set_thread_nice((before + 7).min(19));
            (own_nice(), after_zero)
        })
        .join()
        .unwrap();
        assert_eq!(after_zero, before, "0 leaves the niceness alone");
        assert_eq!(inside, (before + 7).min(19), "the thread took the niceness");
        assert_eq!(own_nice(), before, "the calling thread kept its own");
    }

    fn machine(packages: usize, cores: usize, threads: usize) -> Vec<CpuInfo> {
        // Linux numbers the first thread of every core first, then the siblings.
        let mut v = Vec::new();
        for t in 0..threads {
            for p in 0..packages {
                for c in 0..cores {
                    v.push(CpuInfo { cpu: t * packages * cores + p * cores + c, package: p, core: c });
                }
            }
        }
        v
    }

    #[test]
    fn ranks_get_distinct_cores_package_by_package_before_any_sibling_thread() {
        let m = machine(2, 4, 2); // 16 CPUs: 0-7 first threads, 8-15 siblings
        assert_eq!(binding_order(&m), vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
        let picks: Vec<Decision> = (0..4).map(|r| plan(BindPolicy::Auto, true, r, 4, None, &m, 16)).collect();
        assert_eq!(picks, (0..4).map(Decision::Bind).collect::<Vec<_>>(), "neighbours share package 0");
        // Siblings listed first by the kernel still come after every core's first thread.
        let odd = vec![
            CpuInfo { cpu: 0, package: 0, core: 0 },
            CpuInfo { cpu: 1, package: 0, core: 0 },
            CpuInfo { cpu: 2, package: 0, core: 1 },
            CpuInfo { cpu: 3, package: 0, core: 1 },
        ];
        assert_eq!(binding_order(&odd), vec![0, 2, 1, 3]);
    }

    #[test]
    fn narrowed_in_code_or_none_are_left_alone_saying_why() {
        let m = machine(1, 2, 1);
        assert_eq!(plan(BindPolicy::Auto, true, 1, 2, None, &m, 2), Decision::Bind(1));
        let leave = |d: Decision, want: &str| match d {
            Decision::Leave(why) => assert!(why.contains(want), "{why}"),
            other => panic!("expected to leave it ({want}), got {other:?}"),
        };
        leave(plan(BindPolicy::Auto, true, 0, 2, None, &m[..1], 2), "narrowed");
        leave(plan(BindPolicy::Auto, false, 0, 2, None, &m, 2), "launcher");
        leave(plan(BindPolicy::Auto, true, 4, 4, None, &m, 2), "no CPU");
        leave(plan(BindPolicy::Core, true, 0, 4, None, &[], 2), "no CPU");
        leave(plan(BindPolicy::None, true, 0, 2, None, &m, 2), "none");
        // Core binds a narrowed or in-code rank within what it may use.
        let narrowed = [CpuInfo { cpu: 1, package: 0, core: 1 }];
        assert_eq!(plan(BindPolicy::Core, false, 0, 1, None, &narrowed, 2), Decision::Bind(1));
    }

    #[test]
    fn oversubscribed_ranks_share_cpus_round_robin() {
        let m = machine(1, 2, 1);
        let picks = |n: usize, policy| (0..n).map(|r| plan(policy, true, r, n, None, &m, 2)).collect::<Vec<_>>();
        let bind = |cpus: &[usize]| cpus.iter().map(|&c| Decision::Bind(c)).collect::<Vec<_>>();
        assert_eq!(picks(4, BindPolicy::Auto), bind(&[0, 1, 0, 1]));
        assert_eq!(picks(3, BindPolicy::Core), bind(&[0, 1, 0]));
        assert_eq!(picks(5, BindPolicy::Auto), bind(&[0, 1, 0, 1, 0]));
        // With sibling threads, every core's first thread before any sibling.
        let smt = machine(1, 2, 2); // CPUs 0, 1 first threads; 2, 3 their siblings
        let six: Vec<Decision> = (0..6).map(|r| plan(BindPolicy::Auto, true, r, 6, None, &smt, 4)).collect();
        assert_eq!(six, bind(&[0, 1, 2, 3, 0, 1]));
        // Narrowed or in-code ranks stay as they are under auto, oversubscribed or not.
        assert!(matches!(plan(BindPolicy::Auto, true, 1, 4, None, &m[..1], 2), Decision::Leave(_)));
        assert!(matches!(plan(BindPolicy::Auto, false, 1, 4, None, &m, 2), Decision::Leave(_)));
    }

    #[test]
    fn a_rank_alone_on_its_probed_host_binds_only_by_the_launchers_local_rank() {
        let m = machine(1, 4, 1);
        // Four ranks in containers of one node, each with its own /dev/shm: each
        // probes as rank 0 of 1. Without a launcher's local size, none is bound
        // (they all took CPU 0).
        for r in 0..4 {
            match plan(BindPolicy::Auto, true, 0, 1, None, &m, 4) {
                Decision::Leave(why) => assert!(why.contains("alone"), "{why}"),
                other => panic!("rank {r}, alone without a launcher's local size, was bound: {other:?}"),
            }
        }
        // A launcher that says 4 ranks share the node places them by its local ranks.
        let picks: Vec<Decision> = (0..4).map(|r| plan(BindPolicy::Auto, true, 0, 1, Some((r, 4)), &m, 4)).collect();
        assert_eq!(picks, (0..4).map(Decision::Bind).collect::<Vec<_>>());
        // ...round robin when they outnumber the CPUs, as probed neighbours would.
        assert_eq!(plan(BindPolicy::Auto, true, 0, 1, Some((5, 6)), &m, 4), Decision::Bind(1));
        // A launcher that says the rank is alone on its node leaves it alone too.
        assert!(matches!(plan(BindPolicy::Auto, true, 0, 1, Some((0, 1)), &m, 4), Decision::Leave(_)));
        // A local rank the launcher's size cannot hold is no CPU of its own.
        assert!(matches!(plan(BindPolicy::Auto, true, 0, 1, Some((4, 4)), &m, 4), Decision::Leave(_)));
        // Neighbours found by probing keep the probed places, whatever the launcher says.
        assert_eq!(plan(BindPolicy::Auto, true, 1, 2, Some((3, 4)), &m, 4), Decision::Bind(1));
        // `core` still binds a lone rank when asked to, by the launcher's rank if it has one.
        assert_eq!(plan(BindPolicy::Core, true, 0, 1, None, &m, 4), Decision::Bind(0));
        assert_eq!(plan(BindPolicy::Core, true, 0, 1, Some((2, 4)), &m, 4), Decision::Bind(2));
    }

    #[test]
    fn policies_parse_and_print() {
        for p in [BindPolicy::Auto, BindPolicy::Core, BindPolicy::None] {
            assert_eq!(p.to_string().parse::<BindPolicy>(), Ok(p));
        }
        assert!("sometimes".parse::<BindPolicy>().unwrap_err().contains("auto, core or none"));
    }

    #[test]
    fn binding_a_thread_narrows_its_affinity_to_that_cpu() {
        // In a thread of its own, so no other test's affinity changes.
        std::thread::spawn(|| {
            let before = allowed_cpus().unwrap();
            let d = apply(BindPolicy::Core, false, 0, (0, 1), None);
            let Decision::Bind(cpu) = d else { panic!("one rank on {before:?} must bind: {d:?}") };
            assert!(before.contains(&cpu));
            assert_eq!(allowed_cpus().unwrap(), vec![cpu]);
            assert_eq!(describe_affinity(), cpu.to_string());
            // Now narrowed: auto leaves it alone.
            assert!(matches!(apply(BindPolicy::Auto, true, 0, (0, 1), None), Decision::Leave(_)) || online_cpus() == 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn cpu_lists_round_trip_and_reject_garbage() {
        assert_eq!(parse_cpu_list("0-3,6\n"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("5,1-2,2"), Some(vec![1, 2, 5]));
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(parse_cpu_list(&format_cpu_list(&[4, 7, 8, 9])), Some(vec![4, 7, 8, 9]));
        for bad in ["", "x", "3-1", "0-99999999999", "1,,2", "-1", "0-65537"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad}");
        }
    }
}
