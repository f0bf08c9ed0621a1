//! The environment reference: every variable braid reads, what it means and its
//! default, as one table. `docs/environment.md` is rendered from it
//! ([`markdown`]), and tests fail when that file, this table and the code drift
//! apart: a `BRAID_*` name the code reads that the table lacks, a row the code
//! no longer reads, or a docs page older than the table. Defaults that are a
//! single value are printed from the constants the code uses, not retyped.

use std::time::Duration;

use super::defaults::{Tuning, DEFAULT_TIMEOUT, STREAM_RECV_MAX, STREAM_RECV_MIN};
use crate::executor::peer_copy::{MAX_UNIT_PIECES, UNITS_PER_TRANSFER};
use crate::fusion::FusionConfig;
use crate::recorder::{DEFAULT_CALLS, MAX_CALLS};
use crate::transport::shm::{SHM_RING_BUDGET, SHM_RING_BYTES, SHM_RING_BYTES_OVERSUBSCRIBED};

/// One environment variable of the reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variable {
    /// The variable's name (`BRAID_…`).
    pub name: &'static str,
    /// What a rank does when it is unset.
    pub default: String,
    /// What it means and the values it takes.
    pub meaning: String,
}

/// A group of variables under one heading of the reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// The heading.
    pub title: &'static str,
    /// Its variables, in the order the page lists them.
    pub variables: Vec<Variable>,
}

/// Names the code reads or mentions that are not part of the reference: switches
/// of tests and development tools, and strings that only look like variables.
pub const NOT_REFERENCED: &[&str] = &[
    "BRAID_REQUIRE_NVRTC",     // CI: fail instead of skip when NVRTC is missing
    "BRAID_WRITE_PTX",         // development: regenerate src/device/cuda/kernels.ptx
    "BRAID_DUMP_PTX",          // development: print the PTX NVRTC produced
    "BRAID_SHM_TEST_STORE",    // shm tests: the child process's store
    "BRAID_SHM_TEST_ROLE",     // shm tests: the child process's role
    "BRAID_PERF_TEST_CORRUPT", // CLI tests: perf's self-check must catch a wrong result
    "BRAID_DEV",               // a macro in the CUDA kernels' source text
    "BRAID_ERR_UNSUPPORTED",   // a C error code, not a variable
    "BRAID_BLESS",             // this module's test: rewrite docs/environment.md
];

fn size(n: usize) -> String {
    match n {
        0 => "0".into(),
        n if n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

fn duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn var(name: &'static str, default: impl Into<String>, meaning: impl Into<String>) -> Variable {
    Variable { name, default: default.into(), meaning: meaning.into() }
}

/// The reference, section by section.
pub fn sections() -> Vec<Section> {
    let tuning = Tuning::default();
    let fusion = FusionConfig::default();
    vec![
        Section {
            title: "Who this process is, and where the ranks meet",
            variables: vec![
                var("BRAID_RANK", "from the launcher", "this rank, `0..BRAID_WORLD_SIZE` (`braid run` sets it; torchrun, mpirun, srun and `TF_CONFIG` are recognised without it)"),
                var("BRAID_WORLD_SIZE", "from the launcher", "number of ranks"),
                var("BRAID_LOCAL_RANK", "from the launcher", "rank among the ranks of this host"),
                var("BRAID_LOCAL_WORLD_SIZE", "from the launcher", "how many ranks share this host"),
                var("BRAID_STORE", "derived from the launcher (see [launching](launching.md))", "rendezvous store: `tcp://HOST:PORT`, `torch://HOST:PORT[?prefix=P]` (torch's TCPStore), `file:///PATH`, or with the `redis` feature `redis://[USER:PASS@]HOST[:PORT][/DB][?prefix=P&ttl=T]`"),
                var("BRAID_PMIX_LIBRARY", "`libpmix.so.2`", "the PMIx library mpirun and srun jobs load to publish rank 0's store"),
                var("BRAID_JOB_KEY", "none (`braid run` generates one)", "shared secret every TCP link and TCP store connection proves by challenge and response; never sent"),
            ],
        },
        Section {
            title: "Algorithms and the tuner",
            variables: vec![
                var("BRAID_ALGO", "`auto`: the tuner picks among all", "algorithms each collective may use, in NCCL's syntax: `ring,tree`, `allreduce:ring;broadcast:chain`, `^tree`"),
                var("BRAID_DETERMINISTIC", "`0`", "`1`: reducing collectives fold each element in rank order, so results are bitwise identical whatever the algorithm, chunk size or host split"),
                var("BRAID_CHECK_ROOTS", "`1`", "rooted calls (broadcast, reduce, gather, scatter) agree on their signature, so ranks given different roots fail in that call; `0` skips the check"),
                var("BRAID_TUNER_PROBE", "`1`", "`0`: the tuner keeps its built-in link costs instead of measuring them at start-up"),
                var("BRAID_CACHE_DIR", "`$XDG_CACHE_HOME/braid`, else `$HOME/.cache/braid`", "per-host cache of the probed link costs"),
            ],
        },
        Section {
            title: "Transports",
            variables: vec![
                var("BRAID_TRANSPORTS", "every transport that can run here", "comma list restricting transports: `shm`, `rdma`, `tcp` (one that cannot run is dropped, saying why at debug level)"),
                var("BRAID_SOCKET_IFNAME", "the interface of the route to the store", "interfaces TCP links listen on, in NCCL's syntax: `eth`, `^docker`, `=eth0`"),
                var("BRAID_SOCKET_FAMILY", "either, IPv4 first", "`AF_INET` (`4`) or `AF_INET6` (`6`): the address family TCP links listen on"),
                var("BRAID_SHM_RING_BYTES", format!("{}, {} when the host's ranks outnumber their CPUs, less with many ranks ({} per rank in all)", size(SHM_RING_BYTES), size(SHM_RING_BYTES_OVERSUBSCRIBED), size(SHM_RING_BUDGET)), "bytes per direction of a shared-memory link's ring (a multiple of 4K)"),
                var("BRAID_RENDEZVOUS_BYTES", size(tuning.rendezvous_bytes), "transfers at least this long go single-copy between the ranks of a host"),
                var("BRAID_CMA", "`auto`", "plain buffers between processes of a host go single-copy through `process_vm_readv`: in exchanges (both ranks send and receive in the same round) where timed calls find it faster than the shared ring (`auto`), in every exchange (`exchange`), in every transfer (`1`) or never (`0`)"),
                var("BRAID_STREAM_RECV_BYTES", format!("a sixteenth of the last-level cache, {} to {}", size(STREAM_RECV_MIN), size(STREAM_RECV_MAX)), "plain receives at least this long leave shared rings through non-temporal stores"),
                var("BRAID_NT_STORES", "`auto`: time plain and non-temporal copies into the rings and keep the faster", "`on`, `off`: whether writes into shared-memory rings use non-temporal stores"),
                var("BRAID_FORWARD_GRAIN", size(tuning.forward_grain), "smallest piece of a forward written on memory links while its reduction goes on"),
                var("BRAID_FORWARD_PASS_BYTES", size(tuning.forward_pass_bytes), "bytes of a forwarded segment reduced per pass before its forward gets a turn"),
                var("BRAID_PEER_CHUNK", size(tuning.peer_chunk), "single-copy reductions read the peer's data in chunks of this size"),
                var("BRAID_IB_HCA", "the first device, port 1", "RDMA device, `name` or `name:port`"),
                var("BRAID_IB_GID_INDEX", "`0`", "GID index for RoCE"),
            ],
        },
        Section {
            title: "Waiting, deadlines and placement",
            variables: vec![
                var("BRAID_TIMEOUT", duration(DEFAULT_TIMEOUT), "deadline of every wait: `30`, `500ms`, `5m`; a call that makes no progress for this long fails on every rank, naming whom it waited for"),
                var("BRAID_SPIN", duration(tuning.spin), "how long a rank with a core of its own polls its links before it yields, then sleeps"),
                var("BRAID_WORKER_NICE", format!("`{}`", tuning.worker_nice), "niceness of each communicator's async worker thread, which moves data while the caller computes (`0`: the caller's priority)"),
                var("BRAID_BIND", "`auto`: launched ranks whose affinity nobody narrowed get one core each, round robin when they outnumber the cores", "`core`, `none`: how local ranks are bound to cores"),
            ],
        },
        Section {
            title: "Fusion",
            variables: vec![
                var("BRAID_FUSION_BYTES", size(fusion.threshold_bytes), "largest bucket of a `Fuser`; `0`: one collective per tensor"),
                var("BRAID_FUSION_CYCLE", duration(fusion.cycle), "how long a fuser's request waits for others to share its bucket; `0`: not at all"),
                var("BRAID_FUSION_PIPELINE", "`auto`", format!("a fuser's bucket goes out in pieces of this size, packed and unpacked while another is on the wire; `auto`: pieces of {} when a peer is reached over TCP or RDMA; `0`: off; ranks use the largest any asks for", size(crate::fusion::AUTO_PIECE_BYTES))),
                var("BRAID_FUSION_COMPRESSION", "`none`", "`fp16`, `bf16`: a fuser sends f32 sums and averages as halves, with error feedback"),
            ],
        },
        Section {
            title: "Observability",
            variables: vec![
                var("BRAID_DEBUG", "`warn` in the `braid` command and the C library; a Rust program logs through the `tracing` subscriber it installs", "log filter for `tracing`: `info`, `debug`, `braid=trace`"),
                var("BRAID_TRACE_BUFFER", DEFAULT_CALLS.to_string(), format!("calls each communicator's flight recorder keeps, 0 to {MAX_CALLS}; `0`: off")),
                var("BRAID_TRACE_DIR", "none: records are only returned on demand", "where each rank writes its flight record (JSON) when a call fails, on abort, on SIGUSR1 and on SIGTERM, SIGINT, SIGHUP and SIGQUIT"),
                var("BRAID_TIMELINE", "none", "write every call and its rounds as Chrome trace events, one file per rank named after this one; `braid timeline` draws them"),
                var("BRAID_METRICS", "`0`", "`1`: count calls, bytes, time and bus bandwidth per op, and failures by kind (`Communicator::stats`)"),
                var("BRAID_METRICS_ADDR", "none", "`HOST:PORT`: turn the metrics on and serve them to Prometheus at `http://HOST:PORT+L/metrics`, L the local rank of the process's first communicator"),
            ],
        },
        Section {
            title: "GPU buffers",
            variables: vec![
                var("BRAID_NVRTC", "`0`: the reductions are the PTX built into the library", "`1`: compile the CUDA reductions at run time with NVRTC"),
                var("BRAID_PEER_COPY_UNITS", UNITS_PER_TRANSFER.to_string(), format!("units a single-copy transfer between GPUs of a host is cut into (1 to {MAX_UNIT_PIECES}); every rank must see the same value")),
            ],
        },
        Section {
            title: "The Python package",
            variables: vec![var(
                "BRAID_LIBRARY",
                "the `libbraid.so` inside the package",
                "path of the C library `import braid` loads",
            )],
        },
    ]
}

/// Every variable of the reference, in page order.
pub fn variables() -> Vec<Variable> {
    sections().into_iter().flat_map(|s| s.variables).collect()
}

/// `docs/environment.md`, as the tests require it to be.
pub fn markdown() -> String {
    let mut s = String::from(
        "# Environment variables\n\n\
         <!-- Generated from src/config/environment.rs: edit the table there, then run\n     \
         BRAID_BLESS=1 cargo test --lib config::environment to rewrite this page. -->\n\n\
         Every variable braid reads. A value set in code (`Config`, `Tuning`, the builder) \
         wins over the environment. A malformed value is an error naming the variable, \
         never a silent default. How launchers are recognised without `BRAID_RANK` is in \
         [launching](launching.md).\n",
    );
    for section in sections() {
        s.push_str(&format!("\n## {}\n\n| variable | default | meaning |\n|---|---|---|\n", section.title));
        for v in section.variables {
            s.push_str(&format!("| `{}` | {} | {} |\n", v.name, v.default, v.meaning));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// Every `"BRAID_…` string literal in the library, the C library and the
    /// Python package: the names the code can read.
    fn names_in_code() -> BTreeSet<String> {
        fn walk(dir: &Path, out: &mut BTreeSet<String>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let p = entry.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|e| e == "rs" || e == "py") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for (i, _) in text.match_indices("\"BRAID_") {
                        let name: String = text[i + 1..]
                            .chars()
                            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                            .collect();
                        if name.len() > "BRAID_".len() {
                            out.insert(name);
                        }
                    }
                }
            }
        }
        let mut names = BTreeSet::new();
        for dir in ["src", "ffi/src", "python/braid"] {
            walk(&repo().join(dir), &mut names);
        }
        names
    }

    #[test]
    fn every_variable_the_code_reads_has_a_row_and_every_row_is_read() {
        let listed: BTreeSet<String> = variables().iter().map(|v| v.name.to_string()).collect();
        assert_eq!(listed.len(), variables().len(), "a variable is listed twice");
        let code = names_in_code();
        let missing: Vec<_> =
            code.iter().filter(|n| !listed.contains(*n) && !NOT_REFERENCED.contains(&n.as_str())).collect();
        assert!(missing.is_empty(), "read by the code but not in src/config/environment.rs: {missing:?}");
        let stale: Vec<_> = listed.iter().filter(|n| !code.contains(*n)).collect();
        assert!(stale.is_empty(), "in the reference but read nowhere: {stale:?}");
        let stale_internal: Vec<_> = NOT_REFERENCED.iter().filter(|n| !code.contains(**n)).collect();
        assert!(stale_internal.is_empty(), "NOT_REFERENCED names nothing the code has: {stale_internal:?}");
    }

    #[test]
    fn the_docs_page_is_the_rendered_table() {
        let path = repo().join("docs/environment.md");
        let want = markdown();
        if std::env::var_os("BRAID_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/environment.md is not what src/config/environment.rs renders: run \
             `BRAID_BLESS=1 cargo test --lib config::environment` and commit the page"
        );
    }

    #[test]
    fn defaults_print_as_the_variables_parse_them() {
        assert_eq!(size(128 << 10), "128K");
        assert_eq!(size(1 << 20), "1M");
        assert_eq!(size(3 << 30), "3G");
        assert_eq!(size(1000), "1000");
        assert_eq!(duration(Duration::from_secs(60)), "60s");
        assert_eq!(duration(Duration::from_millis(20)), "20ms");
        // What the page prints for a size or a duration parses back to the default.
        let t = Tuning::default();
        assert_eq!(super::super::parse_size(&size(t.forward_pass_bytes)), Ok(t.forward_pass_bytes));
        assert_eq!(super::super::parse_duration(&duration(t.spin)), Ok(t.spin));
        assert_eq!(super::super::parse_duration(&duration(DEFAULT_TIMEOUT)), Ok(DEFAULT_TIMEOUT));
    }
}
