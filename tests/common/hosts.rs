//! Emulated hosts on one machine: network namespaces joined by a veth pair, each with a
//! private /dev/shm (and, on request, its own hostname, /etc/hosts and an htb-shaped
//! link).
//!
//! Each host is a small "holder" process (`ip netns exec NS unshare -m sh -c 'mount -t
//! tmpfs tmpfs /dev/shm && exec sleep ...'`) that owns the host's network and mount
//! namespaces; every process of that host enters them with `nsenter --net --mount`, so
//! the ranks of a host share its /dev/shm and nothing else does. The namespaces are
//! fresh, so ports are free by construction, and the veth pair lives only inside them
//! (nothing is added to the root namespace), so parallel runs cannot collide.
//!
//! Needs root, iproute2 and util-linux. Without them [`Hosts::create`] fails when `CI`
//! is set and returns None (the test skips, saying why on stderr) when it is not.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::bounded::drain;

/// How to build the hosts.
#[derive(Clone, Debug)]
pub struct HostsSpec {
    /// Prefix of every namespace the test creates: `<prefix><pid>-<n>-<a|b>`. One per
    /// test file, so the stale-namespace sweep of one file never touches another's.
    pub prefix: &'static str,
    /// Shape each side's egress with an htb class at 1 Gbit/s (as the two-host
    /// measurements of results/ do), so the link is not an infinitely fast veth.
    pub htb: bool,
    /// Give each host its own UTS namespace and this hostname (host A first).
    pub hostnames: Option<[String; 2]>,
    /// Give each host its own /etc/hosts (a file bind-mounted over /etc/hosts in the
    /// host's mount namespace) with this initial content; [`Hosts::write_etc_hosts`]
    /// rewrites it later.
    pub etc_hosts: Option<[String; 2]>,
    /// A shell script run in each host's network namespace before the veth pair is
    /// made (host A first), so the interfaces it adds come before `eth0` in the
    /// system's order.
    pub before_link: Option<[String; 2]>,
}

impl HostsSpec {
    /// Two plain hosts: veth, private /dev/shm, nothing else.
    pub fn new(prefix: &'static str) -> HostsSpec {
        HostsSpec { prefix, htb: false, hostnames: None, etc_hosts: None, before_link: None }
    }
}

/// What one process started on a host left behind.
pub struct RankOutput {
    pub rank: usize,
    pub host: usize,
    /// None when it had to be killed at the deadline.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl RankOutput {
    pub fn passed(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// A process with threads draining its pipes (so a chatty rank cannot block).
struct Running {
    rank: usize,
    host: usize,
    child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

/// Kill the child with SIGKILL when the thread that spawned it (the test) dies, so a
/// killed test run leaves no rank or holder behind.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            Ok(())
        })
    }
}

/// Run a command to completion; Err carries its stderr.
pub fn sh(program: &str, args: &[&str]) -> Result<Output, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{program}`: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!("`{program} {}` failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr)))
    }
}

fn netns_list() -> String {
    sh("ip", &["netns", "list"]).map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
}

/// Delete namespaces of earlier runs whose process is gone (a run killed with SIGKILL
/// cannot run its guard).
fn sweep_stale(prefix: &str) {
    for line in netns_list().lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some(rest) = name.strip_prefix(prefix) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["-n", name, "link", "del", "eth0"]).stderr(Stdio::null()).status();
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// The environment cannot build namespaces: fail under CI, skip otherwise.
fn unavailable(reason: &str) {
    let msg = format!(
        "cannot build network namespaces: {reason}\n\
         (these tests need root, iproute2 (`ip`, `tc`) and util-linux (`unshare`, `nsenter`))"
    );
    if std::env::var_os("CI").is_some() {
        panic!("{msg}\nCI is set, so this is a failure, not a skip");
    }
    // Straight to the stderr handle: the test harness captures `eprintln!`.
    let _ = writeln!(std::io::stderr(), "{msg}\nSKIPPED (CI is not set)");
}

/// Two emulated hosts. Dropping it (also while a failed assertion unwinds) kills every
/// process started on them and deletes the links and namespaces.
pub struct Hosts {
    spec: HostsSpec,
    /// Namespaces created so far (A first).
    pub netns: Vec<String>,
    /// Address of host A and host B on the veth pair (`eth0` on both).
    pub addrs: [String; 2],
    /// Per host, the file bind-mounted over its /etc/hosts (when the spec asks for one).
    etc_hosts_files: Vec<std::path::PathBuf>,
    /// The holder process of each host, owning its namespaces.
    holders: Vec<Child>,
    /// Processes started with [`Hosts::spawn`] and not yet collected.
    ranks: Vec<Running>,
}

impl Hosts {
    /// Build the two hosts; None when the machine cannot (and CI is not set).
    pub fn create(spec: HostsSpec) -> Option<Hosts> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id() as usize;
        // A subnet per run; the pair lives only inside its namespaces, so this is
        // tidiness, not a requirement.
        let net = (pid * 7 + seq) % 250 + 1;
        let prefix = spec.prefix;
        let mut hosts = Hosts {
            spec,
            netns: Vec::new(),
            addrs: [format!("10.77.{net}.1"), format!("10.77.{net}.2")],
            etc_hosts_files: Vec::new(),
            holders: Vec::new(),
            ranks: Vec::new(),
        };
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            unavailable("not running as root");
            return None;
        }
        sweep_stale(prefix);
        if let Err(e) = hosts.build(&format!("{prefix}{pid}-{seq}")) {
            unavailable(&e);
            return None;
        }
        Some(hosts)
    }

    fn build(&mut self, base: &str) -> Result<(), String> {
        for side in ["a", "b"] {
            let name = format!("{base}-{side}");
            sh("ip", &["netns", "add", &name])?;
            self.netns.push(name);
        }
        let (a, b) = (self.netns[0].clone(), self.netns[1].clone());
        if let Some(scripts) = self.spec.before_link.clone() {
            for (ns, script) in [&a, &b].into_iter().zip(scripts.iter()) {
                sh("ip", &["netns", "exec", ns, "sh", "-ec", script])?;
            }
        }
        // One veth pair, created directly inside the namespaces: `eth0` on both hosts.
        sh("ip", &["link", "add", "eth0", "netns", &a, "type", "veth", "peer", "name", "eth0", "netns", &b])?;
        for (ns, addr) in [(&a, &self.addrs[0]), (&b, &self.addrs[1])] {
            sh("ip", &["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
            sh("ip", &["-n", ns, "link", "set", "eth0", "up"])?;
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
            if self.spec.htb {
                sh(
                    "ip",
                    &[
                        "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb",
                        "default", "10",
                    ],
                )?;
                sh(
                    "ip",
                    &[
                        "netns", "exec", ns, "tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10",
                        "htb", "rate", "1gbit", "ceil", "1gbit",
                    ],
                )?;
            }
        }
        if let Some(contents) = self.spec.etc_hosts.clone() {
            for (h, text) in contents.iter().enumerate() {
                let path = std::env::temp_dir().join(format!("{}-hosts-{h}", self.netns[h]));
                std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                self.etc_hosts_files.push(path);
            }
        }
        for h in 0..2 {
            self.start_holder(h)?;
        }
        Ok(())
    }

    /// A process in host `h`'s network namespace and a new mount namespace with its own
    /// tmpfs on /dev/shm (and its /etc/hosts, hostname when asked); it prints its pid
    /// once the mounts are there, then sleeps.
    fn start_holder(&mut self, h: usize) -> Result<(), String> {
        let mut script = String::from("mount -t tmpfs -o size=2g,mode=1777 tmpfs /dev/shm");
        if let Some(file) = self.etc_hosts_files.get(h) {
            script += &format!(" && mount --bind {} /etc/hosts", file.display());
        }
        if let Some(names) = &self.spec.hostnames {
            script += &format!(" && hostname {}", names[h]);
        }
        script += " && echo $$ && exec sleep 600";
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns[h], "unshare", "--mount", "--propagation", "private"]);
        if self.spec.hostnames.is_some() {
            cmd.arg("--uts");
        }
        cmd.args(["sh", "-c", &script]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = die_with_parent(&mut cmd).spawn().map_err(|e| format!("cannot run `ip netns exec`: {e}"))?;
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        let ok = line.trim().parse::<u32>().map(|p| p == child.id()).unwrap_or(false);
        if !ok {
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            return Err(format!("host {}: holder setup failed (printed {line:?}): {err}", self.netns[h]));
        }
        self.holders.push(child);
        Ok(())
    }

    /// `nsenter` into host `h` (its network and mount namespaces, and UTS when it has
    /// its own hostname); the caller appends the program and its arguments.
    pub fn enter(&self, h: usize) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["--target", &self.holders[h].id().to_string(), "--net", "--mount"]);
        if self.spec.hostnames.is_some() {
            cmd.arg("--uts");
        }
        cmd.arg("--");
        cmd
    }

    /// `sh -c script` on host `h`.
    pub fn shell(&self, h: usize, script: &str) -> Output {
        self.enter(h).args(["sh", "-c", script]).stdin(Stdio::null()).output().expect("nsenter")
    }

    /// `sh -c script` on host `h`, panicking with its stderr when it fails.
    pub fn must(&self, h: usize, script: &str) {
        let out = self.shell(h, script);
        assert!(out.status.success(), "host {h}: `{script}` failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Replace host `h`'s /etc/hosts (the spec must have asked for one). Written in
    /// place, so the bind mount keeps showing it.
    pub fn write_etc_hosts(&self, h: usize, text: &str) {
        let path = self.etc_hosts_files.get(h).expect("HostsSpec::etc_hosts was not set");
        std::fs::write(path, text).expect("rewriting a host's /etc/hosts");
    }

    /// Start `cmd` (built from [`Hosts::enter`]`(host)`) as `rank`, its output piped and
    /// drained; [`Hosts::wait`] collects it.
    pub fn spawn(&mut self, rank: usize, host: usize, mut cmd: Command) {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = die_with_parent(&mut cmd).spawn().expect("spawning a rank with nsenter");
        let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
        self.ranks.push(Running { rank, host, child, out, err });
    }

    /// Wait for every spawned process (at most `deadline`, then kill the rest) and
    /// return what each printed, in spawn order.
    pub fn wait(&mut self, deadline: Duration) -> Vec<RankOutput> {
        let started = Instant::now();
        let mut statuses: Vec<Option<ExitStatus>> = vec![None; self.ranks.len()];
        while statuses.iter().any(Option::is_none) && started.elapsed() < deadline {
            for (i, r) in self.ranks.iter_mut().enumerate() {
                if statuses[i].is_none() {
                    statuses[i] = r.child.try_wait().expect("try_wait");
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.ranks
            .drain(..)
            .zip(statuses)
            .map(|(mut r, status)| {
                if status.is_none() {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
                let join = |h: Option<JoinHandle<String>>| h.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
                RankOutput {
                    rank: r.rank,
                    host: r.host,
                    status,
                    stdout: join(r.out.take()),
                    stderr: join(r.err.take()),
                }
            })
            .collect()
    }

    /// Bytes host `h` has sent on its veth.
    pub fn tx_bytes(&self, h: usize) -> u64 {
        let out = self.shell(h, "cat /sys/class/net/eth0/statistics/tx_bytes");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("tx_bytes")
    }

    /// Tear down now and check that no namespace of ours is left.
    pub fn finish(self) {
        let names = self.netns.clone();
        drop(self);
        let left = netns_list();
        for n in &names {
            assert!(!left.lines().any(|l| l.split_whitespace().next() == Some(n)), "namespace {n} left behind: {left}");
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for r in &mut self.ranks {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
        for h in &mut self.holders {
            let _ = h.kill();
            let _ = h.wait();
        }
        // Deleting one end of the pair deletes both; the namespaces go with their names.
        if let Some(a) = self.netns.first() {
            let _ = Command::new("ip").args(["-n", a, "link", "del", "eth0"]).stderr(Stdio::null()).status();
        }
        for ns in &self.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for f in &self.etc_hosts_files {
            let _ = std::fs::remove_file(f);
        }
        let left = netns_list();
        for ns in &self.netns {
            if left.lines().any(|l| l.split_whitespace().next() == Some(ns)) {
                eprintln!("hosts: WARNING: could not delete namespace {ns}");
            }
        }
    }
}

/// Every process's status and output, for assertion messages.
pub fn describe(outs: &[RankOutput]) -> String {
    outs.iter()
        .map(|o| {
            let status = o.status.map(|s| s.to_string()).unwrap_or_else(|| "KILLED at the deadline".into());
            format!("--- rank {} (host {}): {status}\nstdout:\n{}\nstderr:\n{}", o.rank, o.host, o.stdout, o.stderr)
        })
        .collect::<Vec<_>>()
        .join("\n")
}
