//! The command line: `braid run` supervision and `braid perf` failure reporting,
//! with real processes.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use braid::bootstrap::TcpStoreServer;
use braid::JobKey;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
/// The job key of the ranks these tests start by hand, and of their store.
const KEY: &str = "cli-test-job-key";

#[test]
fn run_prefixes_output_with_the_rank_and_sets_the_environment() {
    let out = Command::new(BRAID)
        .args(["run", "-n", "3", "--", "sh", "-c", "echo rank=$BRAID_RANK of $BRAID_WORLD_SIZE at $BRAID_STORE"])
        .env_remove("BRAID_JOB_KEY")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for r in 0..3 {
        assert!(text.lines().any(|l| l.starts_with(&format!("[{r}] rank={r} of 3 at tcp://127.0.0.1:"))), "{text}");
    }
}

/// The `BRAID_JOB_KEY` each rank of `braid run -n 2` saw, with `outer` in the launcher's environment.
fn keys_given_to_ranks(outer: Option<&str>) -> Vec<String> {
    let mut cmd = Command::new(BRAID);
    cmd.args(["run", "-n", "2", "--", "sh", "-c", "echo key=$BRAID_JOB_KEY"]);
    match outer {
        Some(k) => cmd.env("BRAID_JOB_KEY", k),
        None => cmd.env_remove("BRAID_JOB_KEY"),
    };
    let out = cmd.output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    (0..2)
        .map(|r| {
            let prefix = format!("[{r}] key=");
            text.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("{text}")).to_owned()
        })
        .collect()
}

#[test]
fn run_gives_every_rank_the_same_job_key() {
    // Generated: 64 hex digits, the same for every rank, new for every job.
    let first = keys_given_to_ranks(None);
    assert_eq!(first[0].len(), 64, "{first:?}");
    assert!(first[0].bytes().all(|b| b.is_ascii_hexdigit()), "{first:?}");
    assert_eq!(first[0], first[1]);
    assert_ne!(keys_given_to_ranks(None)[0], first[0]);
    // Inherited when the launcher's environment has one.
    assert_eq!(keys_given_to_ranks(Some("given-key")), vec!["given-key", "given-key"]);
}

#[test]
fn run_stops_everyone_when_a_rank_fails() {
    let t0 = Instant::now();
    let out = Command::new(BRAID)
        .args([
            "run",
            "-n",
            "3",
            "--grace",
            "0.5",
            "--",
            "sh",
            "-c",
            "if [ $BRAID_RANK = 1 ]; then exit 3; fi; sleep 60",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 failed (exit code 3)"), "{err}");
}

/// Start rank processes of `braid perf` by hand (so the test knows their pids).
fn perf_ranks(
    store: &str,
    world: usize,
    transport: &str,
    args: impl Fn(usize) -> Vec<String>,
) -> Vec<std::process::Child> {
    (0..world)
        .map(|rank| {
            Command::new(BRAID)
                .arg("perf")
                .args(args(rank))
                .env("BRAID_RANK", rank.to_string())
                .env("BRAID_WORLD_SIZE", world.to_string())
                .env("BRAID_STORE", store)
                .env("BRAID_JOB_KEY", KEY)
                .env("BRAID_TIMEOUT", "30")
                .env("BRAID_TRANSPORTS", transport)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

fn stderr_of(c: &mut std::process::Child) -> String {
    let mut s = String::new();
    c.stderr.take().unwrap().read_to_string(&mut s).unwrap();
    s
}

#[test]
fn ranks_running_different_collectives_both_fail_naming_both() {
    for transport in ["tcp", "shm"] {
        different_collectives(transport);
    }
}

fn different_collectives(transport: &str) {
    let server = TcpStoreServer::bind("127.0.0.1:0", JobKey::from_text(KEY)).unwrap();
    let store = format!("tcp://{}", server.local_addr());
    let mut kids = perf_ranks(&store, 2, transport, |rank| {
        let op = if rank == 0 { "all-reduce" } else { "broadcast" };
        ["--op", op, "--min-bytes", "4K", "--max-bytes", "4K", "--check"].map(String::from).to_vec()
    });
    for (rank, k) in kids.iter_mut().enumerate() {
        let status = k.wait().unwrap();
        let err = stderr_of(k);
        assert!(!status.success(), "{transport}: rank {rank} should fail");
        assert!(err.contains("all-reduce(") && err.contains("broadcast("), "{transport}: rank {rank}: {err}");
    }
}

#[test]
fn killing_a_rank_mid_sweep_fails_the_others_naming_it() {
    for transport in ["tcp", "shm"] {
        kill_mid_sweep(transport);
    }
}

fn kill_mid_sweep(transport: &str) {
    let server = TcpStoreServer::bind("127.0.0.1:0", JobKey::from_text(KEY)).unwrap();
    let store = format!("tcp://{}", server.local_addr());
    let mut kids = perf_ranks(&store, 3, transport, |_| {
        ["--min-bytes", "1K", "--max-bytes", "64M", "--iters", "100000"].map(String::from).to_vec()
    });
    std::thread::sleep(Duration::from_millis(1500));
    let victim = kids[1].id() as i32;
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    let killed_at = Instant::now();
    for rank in [0usize, 2] {
        let k = &mut kids[rank];
        let status = loop {
            if let Some(s) = k.try_wait().unwrap() {
                break s;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(10),
                "{transport}: rank {rank} running 10 s after the kill"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = stderr_of(k);
        assert!(!status.success(), "{transport}: rank {rank} must exit non-zero");
        assert!(err.contains("rank 1"), "{transport}: rank {rank} must name the dead rank: {err}");
    }
    let _ = kids[1].wait();
}

/// The rows of `braid perf`'s table, split at whitespace: `size count type redop root`,
/// then `time algbw busbw #wrong` out of place and in place, then the algorithm.
fn perf_table(text: &str) -> Vec<Vec<&str>> {
    let rows: Vec<Vec<&str>> =
        text.lines().filter(|l| l.starts_with("  ")).map(|l| l.split_whitespace().collect()).collect();
    for row in &rows {
        assert_eq!(row.len(), 14, "5 + 4 + 4 columns and the algorithm: {row:?}\n{text}");
    }
    rows
}

/// Every collective at 3 ranks, each size out of place then in place in one run, side
/// by side, both checked; `root` agrees between the header and the rows.
#[test]
fn perf_checks_every_collective_in_place_and_out_of_place() {
    let ops = ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "barrier", "gather"];
    for op in ops.into_iter().chain(["scatter"]) {
        let mut cmd = Command::new(BRAID);
        cmd.args(["perf", "--op", op, "--ranks", "3", "--transport", "tcp", "--min-bytes", "1K"])
            .args(["--max-bytes", "300K", "--factor", "17", "--iters", "3", "--warmup", "1", "--check"])
            .args(["--dtype", "bf16", "--root", "2"]);
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{op}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("# Out of bounds values : 0 OK"), "{op}: {text}");
        let rows = perf_table(&text);
        assert!(!rows.is_empty(), "{op}: no rows\n{text}");
        let rooted = matches!(op, "broadcast" | "reduce" | "gather" | "scatter");
        assert_eq!(text.contains(" root=2 "), rooted, "{op}: the header names a root only where rows do: {text}");
        for row in &rows {
            assert_eq!(row[4], if rooted { "2" } else { "-1" }, "{op}: {row:?}");
            // A barrier has no buffers: one measurement, in the in-place columns.
            let out_of_place = if op == "barrier" { "n/a" } else { "0" };
            assert_eq!((row[8], row[12]), (out_of_place, "0"), "{op}: #wrong of each mode: {row:?}");
        }
        // Host buffers moving bytes have a memory bound, one `# bound` line per row and
        // mode (`size place algo time bound bound%`); a barrier has none.
        let bounds: Vec<Vec<&str>> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# bound "))
            .map(|l| l.split_whitespace().collect())
            .filter(|f: &Vec<&str>| f.first().is_some_and(|s| s.parse::<u64>().is_ok()))
            .collect();
        if op == "barrier" {
            assert!(bounds.is_empty() && text.contains("# Memory bound: none"), "{op}: {text}");
        } else {
            assert_eq!(bounds.len(), 2 * rows.len(), "{op}: a bound for each mode of each row\n{text}");
            for b in &bounds {
                let pct: f64 = b[5].parse().unwrap_or_else(|_| panic!("{op}: bound% in {b:?}"));
                assert!(pct > 0.0 && pct.is_finite(), "{op}: {b:?}");
            }
        }
    }
    // One mode alone: the other's columns say n/a.
    for (flag, measured, absent) in [("--out-of-place", 5, 9), ("--in-place", 9, 5)] {
        let out = Command::new(BRAID)
            .args([
                "perf",
                "--op",
                "reduce-scatter",
                "--ranks",
                "3",
                "-b",
                "3K",
                "-e",
                "3K",
                "-n",
                "2",
                "-c",
                "1",
                flag,
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{flag}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        let rows = perf_table(&text);
        assert_eq!(rows.len(), 1, "{text}");
        assert!(rows[0][absent..absent + 4].iter().all(|c| *c == "n/a"), "{flag}: {text}");
        assert_eq!(rows[0][measured + 3], "0", "{flag}: {text}");
    }
}

/// A wrong element in one mode is counted in that mode's `#wrong` (and fails the run),
/// not in the other's: rank 0's result is spoiled in one mode through the test hook.
#[test]
fn perf_counts_wrong_elements_per_mode() {
    for (spoiled, wrong_at, right_at) in [("in-place", 12, 8), ("out-of-place", 8, 12)] {
        let out = Command::new(BRAID)
            .args([
                "perf",
                "--op",
                "all-reduce",
                "--ranks",
                "3",
                "-b",
                "1K",
                "-e",
                "4K",
                "-f",
                "4",
                "-n",
                "2",
                "-w",
                "1",
            ])
            .args(["--check"])
            .env("BRAID_PERF_TEST_CORRUPT", spoiled)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{spoiled}: a wrong element must fail the run: {text}");
        assert!(text.contains("# Out of bounds values : 2 FAILED"), "{spoiled}: {text}");
        let rows = perf_table(&text);
        assert_eq!(rows.len(), 2, "{text}");
        for row in rows {
            assert_eq!((row[wrong_at], row[right_at]), ("1", "0"), "{spoiled}: {row:?}");
        }
    }
}

/// The device path end to end across processes and across threads: every
/// collective on simulated device buffers, checked element by element.
#[test]
fn perf_on_device_buffers_checks_every_collective() {
    // Processes (shared memory, staged) and threads (devices bound, single copy).
    for (op, transport) in ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all"]
        .into_iter()
        .flat_map(|op| [(op, "auto"), (op, "inproc")])
    {
        let out = Command::new(BRAID)
            .args([
                "perf",
                "--op",
                op,
                "--ranks",
                "3",
                "--device",
                "sim",
                "--transport",
                transport,
                "--min-bytes",
                "1K",
            ])
            .args(["--max-bytes", "3M", "--factor", "50", "--iters", "2", "--warmup", "1", "--check"])
            .args(["--dtype", "i32", "--out-of-place"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{op}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("# device buffers: 0=sim:rank0 1=sim:rank1 2=sim:rank2"), "{op}: {text}");
        assert!(text.contains("# Out of bounds values : 0 OK"), "{op}: {text}");
        assert!(text.lines().filter(|l| l.starts_with("  ")).count() >= 2, "{op}: no rows\n{text}");
    }
}

/// `--mixed`: the odd ranks' buffers on the host, the even ranks' on the device, in one
/// job whose every rank takes part in the same calls (the device names are gathered
/// from all of them), checked element by element; threads are refused.
#[test]
fn perf_mixes_host_and_device_ranks() {
    for op in ["all-reduce", "all-gather", "all-to-all"] {
        let out = Command::new(BRAID)
            .args(["perf", "--op", op, "--ranks", "3", "--device", "sim", "--mixed", "-b", "1K", "-e", "64K"])
            .args(["-f", "8", "-n", "2", "-w", "1", "--check"])
            .env("BRAID_TIMEOUT", "30")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{op}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("# device buffers: 0=sim:rank0 1=host 2=sim:rank2"), "{op}: {text}");
        assert!(text.contains("# Out of bounds values : 0 OK"), "{op}: {text}");
    }
    let out = Command::new(BRAID)
        .args(["perf", "--ranks", "2", "--device", "sim", "--mixed", "--transport", "inproc"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mixed needs"));
}

/// `--op send-recv`: every rank sends to rank + 1 and receives from rank - 1, checked
/// element by element against the sender's values, on host buffers over each
/// transport (odd and even worlds), on simulated device buffers as processes and
/// threads, and with host and device ranks mixed; one rank alone is refused.
#[test]
fn perf_checks_send_recv_on_host_device_and_mixed_ranks() {
    let cases: [(&str, &[&str]); 7] = [
        ("2", &["--transport", "tcp"]),
        ("3", &["--transport", "shm"]),
        ("4", &["--transport", "inproc"]),
        ("3", &["--device", "sim"]),
        ("4", &["--device", "sim", "--transport", "inproc"]),
        ("3", &["--device", "sim", "--mixed"]),
        ("2", &["--device", "sim", "--mixed", "--registered"]),
    ];
    for (ranks, extra) in cases {
        let out = Command::new(BRAID)
            .args(["perf", "--op", "send-recv", "--ranks", ranks, "-b", "1K", "-e", "3M", "-f", "40", "-n", "2"])
            .args(["-w", "1", "-d", "i32", "--check"])
            .args(extra)
            .env("BRAID_TIMEOUT", "30")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{ranks} {extra:?}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("# braid perf: send-recv world="), "{ranks} {extra:?}: {text}");
        assert!(text.contains("# Out of bounds values : 0 OK"), "{ranks} {extra:?}: {text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("  ") && l.ends_with("p2p")).count(), 3, "{text}");
    }
    let out = Command::new(BRAID).args(["perf", "--op", "send-recv", "--ranks", "1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("send-recv needs at least 2 ranks"));
}

/// nccl-tests' short flags (`-b -e -f -n -w -c -o -d -r`) mean what they mean there.
#[test]
fn perf_takes_nccl_tests_short_flags() {
    let out = Command::new(BRAID)
        .args(["perf", "--op", "reduce", "--ranks", "2", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "1"])
        .args(["-c", "1", "-o", "max", "-d", "int32", "-r", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("# Out of bounds values : 0 OK"), "-c 1 checks: {text}");
    let rows: Vec<Vec<&str>> =
        text.lines().filter(|l| l.starts_with("  ")).map(|l| l.split_whitespace().collect()).collect();
    let sizes: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, ["1024", "4096"], "-b 1K -e 4K -f 4: {text}");
    for r in &rows {
        assert_eq!((r[2], r[3], r[4]), ("i32", "max", "1"), "-d int32 -o max -r 1: {text}");
    }
    let off = Command::new(BRAID)
        .args(["perf", "--ranks", "2", "-b", "4K", "-e", "4K", "-n", "2", "-c", "0"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&off.stdout).contains("not checked"), "-c 0 does not check");
}

#[test]
fn perf_without_check_says_nothing_was_checked() {
    let out = Command::new(BRAID)
        .args(["perf", "--op", "all-reduce", "--ranks", "2", "--transport", "tcp", "--min-bytes", "1K"])
        .args(["--max-bytes", "4K", "--iters", "2", "--warmup", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("# Out of bounds values : not checked"), "{text}");
    assert!(!text.contains(" OK"), "nothing was checked, so nothing may be called OK: {text}");
}

#[test]
fn perf_over_an_unavailable_transport_says_why_in_one_line() {
    for (transport, why) in [("cuda", "cuda transport"), ("rdma", "rdma transport")] {
        let out = Command::new(BRAID).args(["perf", "--transport", transport, "--max-bytes", "4K"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{transport}: must fail");
        assert_eq!(err.trim().lines().count(), 1, "{transport}: one line, not a backtrace: {err}");
        assert!(err.contains(why) && !err.contains("panicked"), "{transport}: {err}");
    }
}

#[test]
fn perf_writes_json_lines() {
    let rows = perf_json_rows("json", "perf --ranks 2 --min-bytes 4K --max-bytes 64K --factor 16 --iters 5 --check");
    // Each size out of place, then in place.
    assert_eq!(rows.len(), 4);
    for key in [
        "op",
        "bytes",
        "count",
        "dtype",
        "ranks",
        "transport",
        "algo",
        "place",
        "time_us",
        "algbw_gbps",
        "busbw_gbps",
        "wrong",
    ] {
        assert!(rows[0].get(key).is_some(), "missing {key}: {}", rows[0]);
    }
    let places: Vec<_> = rows.iter().map(|r| (r["bytes"].as_u64().unwrap(), r["place"].as_str().unwrap())).collect();
    assert_eq!(places, [(4096, "out-of-place"), (4096, "in-place"), (65536, "out-of-place"), (65536, "in-place")]);
    assert!(rows.iter().all(|r| r["wrong"] == 0), "{rows:?}");
    // Each row's memory bound is the library's for a 2-rank all-reduce at the rates
    // measured in the run, and its fraction is that bound over the row's time.
    for r in &rows {
        let num = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("missing {k}: {r}"));
        let rates = braid::ceiling::MemoryRates {
            copy: num("ceiling_copy_gbps") * 1e9,
            reduce: num("ceiling_reduce_gbps") * 1e9,
        };
        assert!(rates.copy > 0.0 && rates.reduce > 0.0, "{r}");
        let in_place = r["place"] == "in-place";
        let work = braid::ceiling::memory_work(
            braid::OpKind::AllReduce,
            2,
            r["bytes"].as_u64().unwrap() as usize,
            in_place,
            rates,
        );
        let bound_us = braid::ceiling::bound_seconds(work, rates) * 1e6;
        assert!((num("bound_us") - bound_us).abs() <= 1e-6 * bound_us, "{bound_us}: {r}");
        assert!((num("bound_fraction") - bound_us / num("time_us")).abs() <= 1e-6, "{r}");
    }
}

/// The rows `braid ARGS --json FILE` wrote (ARGS split at spaces; a file of its own
/// per `name`), after checking that it succeeded.
fn perf_json_rows(name: &str, args: &str) -> Vec<serde_json::Value> {
    let path = std::env::temp_dir().join(format!("braid-perf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let out = Command::new(BRAID).args(args.split_whitespace()).arg("--json").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `--algo all` alternates the tuner's pick and every all-reduce algorithm in passes
/// at each size, and still reports one checked row for each, in rotation order.
#[test]
fn perf_algo_all_reports_every_algorithm_once_per_size_checked() {
    // 7 timed calls over 5 passes: blocks of 2, 2, 1, 1 and 1.
    let rows = perf_json_rows(
        "all",
        "perf --op all-reduce --ranks 3 -b 4K -e 64K -f 16 -n 7 -w 1 --algo all --check --in-place",
    );
    let algos = ["tree", "halving-doubling", "direct", "ring", "doubling", "hierarchical"];
    assert_eq!(rows.len(), 2 * (1 + algos.len()), "{rows:?}");
    for (size, block) in [4096, 65536].into_iter().zip(rows.chunks(1 + algos.len())) {
        let auto = block[0]["algo"].as_str().unwrap();
        assert!(auto.strip_prefix("auto:").is_some_and(|a| algos.contains(&a)), "{auto}");
        for (row, want) in block[1..].iter().zip(algos) {
            assert_eq!(row["algo"], want, "{row}");
        }
        for row in block {
            assert_eq!(row["bytes"], size, "{row}");
            assert_eq!(row["wrong"], 0, "{row}");
            assert!(row["time_us"].as_f64().unwrap() > 0.0, "{row}");
        }
    }
}

#[test]
fn perf_checks_every_collective_over_shared_memory_for_world_sizes_1_to_8() {
    for ranks in 1..=8 {
        let ops =
            ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "barrier", "gather"];
        for op in ops.into_iter().chain(["scatter"]) {
            let oop = ranks % 3 == 0;
            let mut cmd = Command::new(BRAID);
            cmd.args(["perf", "--op", op, "--ranks", &ranks.to_string(), "--transport", "shm"])
                .args(["--min-bytes", "1K", "--max-bytes", "2M", "--factor", "45", "--iters", "2", "--warmup", "1"])
                .args(["--check", "--dtype", "i32", "--reduce-op", "max", "--root", &(ranks / 2).to_string()])
                .args(oop.then_some("--out-of-place"));
            let out = cmd.output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{op} n={ranks}: {text}\n{err}");
            assert!(text.contains("# Out of bounds values : 0 OK"), "{op} n={ranks}: {text}");
            // Every peer of every rank is reached through shared memory.
            for r in 0..ranks {
                let line = text.lines().find(|l| l.starts_with(&format!("# rank {r}: "))).unwrap();
                let (links, cpus) = line.split_once("   cpus ").expect("each rank's CPUs are listed");
                assert!(ranks == 1 || links.split(' ').skip(3).all(|p| p.ends_with("=shm")), "{line}");
                assert!(cpus.chars().all(|c| c.is_ascii_digit() || c == '-' || c == ','), "{line}");
            }
        }
    }
}

/// Long transfers between processes go through the shared ring, except where two
/// ranks exchange plain data in one round (a 2-rank all-gather): those go
/// single-copy through `process_vm_readv` with `BRAID_CMA=exchange` (and by default
/// where timed calls find it faster, see the next test). `BRAID_CMA=0` keeps every plain
/// transfer in the ring, `BRAID_CMA=1` sends them all single-copy, and registered
/// buffers (`--registered`) always go single-copy. Each path must give exact results
/// and must really be taken (the executor traces every single-copy read).
#[test]
fn perf_checks_the_single_copy_paths_over_shared_memory() {
    let single_copy_lines = |err: &str, what: &str| err.lines().filter(|l| l.contains(what)).count();
    const CMA: &str = "single copy through the link (shm)";
    for ranks in [2, 3] {
        for (extra, cma, what) in [
            (None, Some("0"), None),
            (None, Some("exchange"), Some("exchanges")),
            (Some("--registered"), Some("0"), Some("registered segment")),
            (None, Some("1"), Some(CMA)),
        ] {
            for op in ["all-reduce", "all-gather", "reduce-scatter", "broadcast"] {
                let mut cmd = Command::new(BRAID);
                cmd.args(["perf", "--op", op, "--ranks", &ranks.to_string(), "--transport", "shm"])
                    .args(["--min-bytes", "64K", "--max-bytes", "6M", "--factor", "9", "--iters", "2", "--warmup", "1"])
                    .args(["--check", "--dtype", "f32"])
                    .args(extra)
                    .env("BRAID_DEBUG", "braid::executor=trace");
                match cma {
                    Some(v) => cmd.env("BRAID_CMA", v),
                    None => cmd.env_remove("BRAID_CMA"),
                };
                let out = cmd.output().unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                let err = String::from_utf8_lossy(&out.stderr);
                let label = format!("{op} n={ranks} {extra:?} BRAID_CMA={cma:?}");
                assert!(out.status.success(), "{label}: {text}\n{err}");
                assert!(text.contains("# Out of bounds values : 0 OK"), "{label}: {text}");
                let any_single = single_copy_lines(&err, "single copy");
                match what {
                    // By default only a 2-rank all-gather exchanges plain data here (3 ranks'
                    // all-gathers may send and receive with different peers each round).
                    Some("exchanges") if op == "all-gather" && ranks == 2 => {
                        assert!(single_copy_lines(&err, CMA) > 0, "{label}: the exchange went through the ring\n{err}")
                    }
                    Some("exchanges") if op == "all-gather" => {}
                    Some("exchanges") => {
                        assert_eq!(any_single, 0, "{label}: a one-way or reducing transfer went single-copy")
                    }
                    Some(what) => assert!(single_copy_lines(&err, what) > 0, "{label}: no `{what}` trace\n{err}"),
                    None => assert_eq!(any_single, 0, "{label}: plain buffers went single-copy with BRAID_CMA=0"),
                }
            }
        }
    }
}

/// By default (`BRAID_CMA=auto`) the exchanges of a 2-rank all-gather are timed
/// both ways, single-copy and through the ring, so a run of 20 calls takes both:
/// fewer single-copy reads (the trace names each) than with `BRAID_CMA=exchange`,
/// where every call reads, but some. Every result is exact either way.
#[test]
fn perf_times_exchanges_both_ways_by_default() {
    let single_copy_reads = |cma: &str| {
        let out = Command::new(BRAID)
            .args(["perf", "--op", "all-gather", "--ranks", "2", "--transport", "shm", "--in-place"])
            .args(["--min-bytes", "1M", "--max-bytes", "1M", "--iters", "20", "--warmup", "1", "--check"])
            .env("BRAID_DEBUG", "braid::executor=trace")
            .env("BRAID_CMA", cma)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "BRAID_CMA={cma}: {text}\n{err}");
        assert!(text.contains("# Out of bounds values : 0 OK"), "BRAID_CMA={cma}: {text}");
        err.lines().filter(|l| l.contains("single copy through the link (shm)")).count()
    };
    let every = single_copy_reads("exchange");
    let timed = single_copy_reads("");
    assert!(timed > 0, "no exchange went single-copy under BRAID_CMA=auto");
    assert!(timed < every, "{timed} single-copy reads, as many as with every exchange single-copy");
}

#[test]
fn rank_zero_hosting_the_store_keeps_it_up_for_slower_ranks() {
    // Rank 0 hosts the store when nothing listens at BRAID_STORE. It used to stop
    // serving as soon as its own setup finished, failing ranks still setting up.
    for attempt in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let store = format!("tcp://127.0.0.1:{port}");
        let mut kids: Vec<_> = (0..4)
            .map(|rank| {
                Command::new(BRAID)
                    .args(["perf", "--op", "all-gather", "--min-bytes", "1K", "--max-bytes", "1K", "--iters", "2"])
                    .args(["--check"])
                    .env("BRAID_RANK", rank.to_string())
                    .env("BRAID_WORLD_SIZE", "4")
                    .env("BRAID_STORE", &store)
                    .env("BRAID_TRANSPORTS", "tcp")
                    .env("BRAID_TIMEOUT", "20")
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for (rank, k) in kids.iter_mut().enumerate() {
            let status = k.wait().unwrap();
            assert!(status.success(), "attempt {attempt}, rank {rank}: {}", stderr_of(k));
        }
    }
}

/// `braid perf --plot` draws its own sweep; `braid plot` draws runs saved with `--json`.
#[test]
fn perf_plots_its_sweep_and_braid_plot_combines_saved_runs() {
    let dir = std::env::temp_dir().join(format!("braid-perf-plot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (svg, runs) = (dir.join("x.svg"), dir.join("runs.jsonl"));
    let out = Command::new(BRAID)
        .args(["perf", "--ranks", "2", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--plot"])
        .arg(&svg)
        .arg("--json")
        .arg(&runs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&svg).expect("rank 0 wrote the plot");
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"), "{text}");
    assert!(text.contains("all-reduce ") && text.contains(" 2 ranks f32"), "the line names the op: {text}");
    assert_eq!(text.matches("stroke-width=\"2\"").count(), 2, "a line per mode of one sweep: {text}");
    assert!(text.contains(" out-of-place") && text.contains(" in-place"), "the lines name their mode: {text}");
    // A second sweep appended to the same file, then both drawn from it.
    let out = Command::new(BRAID)
        .args(["perf", "--op", "all-gather", "--ranks", "2", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--json"])
        .arg(&runs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let both = dir.join("both.svg");
    let out = Command::new(BRAID).arg("plot").arg(&both).arg(&runs).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&both).unwrap();
    assert!(text.contains("all-reduce ") && text.contains("all-gather "), "{text}");
    assert_eq!(text.matches("stroke-width=\"2\"").count(), 4, "a line for each run and mode in the file: {text}");
    // A path that cannot be written is named, before any rank is launched for nothing.
    let nowhere = dir.join("no-such-dir").join("x.svg");
    let out =
        Command::new(BRAID).args(["perf", "--ranks", "2", "-b", "1K", "-e", "1K", "--plot"]).arg(&nowhere).output();
    let out = out.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&nowhere.display().to_string()) && !err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
