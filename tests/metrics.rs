//! Metrics as operators read them: a real Prometheus server (Debian's `prometheus`,
//! started here with a 1 s scrape interval) scrapes a running 2-rank job of `braid
//! drill` through `BRAID_METRICS_ADDR`, and its HTTP query API returns the ranks'
//! all-reduce byte counter equal to what the job moved. In CI (`CI=true`) a missing
//! `prometheus` is a failure; elsewhere the test is skipped.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use braid::bootstrap::TcpStoreServer;
use braid::JobKey;
use common::bounded::{rank_command, require, spawn_group, Ranks};
use common::hosts::die_with_parent;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const KEY: &str = "metrics-test-key";
const WORLD: usize = 2;
const CALLS: usize = 30;
/// f32 elements per all-reduce.
const COUNT: usize = 65536;
/// Bounds on a loaded machine, not speed targets.
const START_BOUND: Duration = Duration::from_secs(60);
const SCRAPE_BOUND: Duration = Duration::from_secs(90);

/// Two free ports in a row (`BRAID_METRICS_ADDR`'s port plus each local rank).
fn free_port_pair() -> u16 {
    loop {
        let p = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if p < 65000 && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The body of `GET path` at `127.0.0.1:port`, or None while nothing answers.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(c, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    c.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?;
    (head.starts_with("HTTP/1.") && status == "200").then(|| body.to_string())
}

/// The value of `name{...labels}` on rank `rank`'s endpoint exposition.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Start `braid drill` on every rank, lingering after its all-reduces.
fn start_job(metrics_port: u16) -> (Ranks, TcpStoreServer) {
    let server = TcpStoreServer::bind("127.0.0.1:0", JobKey::from_text(KEY)).unwrap();
    let store = format!("tcp://{}", server.local_addr());
    let ranks = (0..WORLD)
        .map(|rank| {
            let (calls, count) = (CALLS.to_string(), COUNT.to_string());
            let args = ["drill", "--calls", "all-reduce", "--linger", "300", "--repeat", &calls, "--count", &count];
            let mut cmd = rank_command(BRAID, &args, (rank, WORLD), &store, KEY);
            cmd.env("BRAID_LOCAL_RANK", rank.to_string())
                .env("BRAID_LOCAL_WORLD_SIZE", WORLD.to_string())
                .env("BRAID_METRICS_ADDR", format!("127.0.0.1:{metrics_port}"));
            Some(spawn_group(die_with_parent(&mut cmd)))
        })
        .collect();
    (Ranks(ranks), server)
}

/// Wait until every rank says it lingers (its calls done, its endpoint up).
fn wait_lingering(ranks: &mut Ranks) {
    let (tx, rx) = mpsc::channel();
    for child in ranks.0.iter_mut().flatten() {
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.contains("lingering") {
                    let _ = tx.send(());
                }
            }
        });
    }
    for r in 0..WORLD {
        rx.recv_timeout(START_BOUND).unwrap_or_else(|_| panic!("{r} of {WORLD} ranks finished their calls in time"));
    }
}

fn start_prometheus(dir: &Path, targets: &[u16], web: u16) -> Ranks {
    let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: braid\n    \
         scrape_interval: 1s\n    static_configs:\n      - targets: [{}]\n",
        targets.join(", ")
    );
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", file.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{web}"));
    Ranks(vec![Some(spawn_group(die_with_parent(&mut cmd)))])
}

/// The one value of an instant query's vector result (None while it has none).
fn query(web: u16, promql: &str) -> Option<f64> {
    let encoded: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let body = http_get(web, &format!("/api/v1/query?query={encoded}"))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    assert_eq!(v["status"], "success", "{body}");
    v["data"]["result"].as_array()?.first()?["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_scrapes_the_all_reduce_byte_counter_of_a_running_job() {
    if !require("prometheus", "prometheus") {
        return;
    }
    let port = free_port_pair();
    let (mut ranks, _store) = start_job(port);
    wait_lingering(&mut ranks);
    let moved_per_rank = (CALLS * COUNT * 4) as f64;
    // Each rank's own endpoint first: rank r serves on port + r.
    for r in 0..WORLD {
        let text = http_get(port + r as u16, "/metrics").unwrap_or_else(|| panic!("rank {r}'s endpoint answered"));
        let rank = format!("rank=\"{r}\"");
        let op = "op=\"all-reduce\"";
        assert_eq!(sample(&text, "braid_bytes_total", &[&rank, op]), Some(moved_per_rank), "{text}");
        assert_eq!(sample(&text, "braid_calls_total", &[&rank, op]), Some(CALLS as f64), "{text}");
        assert_eq!(sample(&text, "braid_call_seconds_count", &[&rank, op]), Some(CALLS as f64), "{text}");
        assert_eq!(sample(&text, "braid_errors_total", &[&rank, "kind=\"timeout\""]), Some(0.0), "{text}");
    }
    let dir = std::env::temp_dir().join(format!("braid-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let web = free_port();
    let _prometheus = start_prometheus(&dir, &[port, port + 1], web);
    let promql = "sum(braid_bytes_total{op=\"all-reduce\"})";
    let deadline = Instant::now() + SCRAPE_BOUND;
    let mut last = None;
    while Instant::now() < deadline {
        last = query(web, promql);
        if last == Some(WORLD as f64 * moved_per_rank) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(last, Some(WORLD as f64 * moved_per_rank), "Prometheus's answer to {promql}");
    let up = query(web, "sum(up{job=\"braid\"})");
    assert_eq!(up, Some(WORLD as f64), "both ranks' endpoints are up in Prometheus");
    drop(ranks);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Communicator::stats` in code: None when off; with `Config::metrics`, each op's
/// calls and bytes as the ranks made them, time in the histogram, no failures.
#[test]
fn stats_count_each_op_of_each_rank() {
    use braid::{Communicator, Config, OpKind, ReduceOp};
    let off = Communicator::in_process(2).unwrap();
    assert!(off[0].stats().is_none(), "off by default");
    let mut cfg = Config::new(0, 3);
    cfg.metrics = true;
    let comms = Communicator::in_process_with(cfg).unwrap();
    common::on_ranks(comms, |c| {
        let mut buf = vec![c.rank() as i32; 1000];
        for _ in 0..3 {
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        }
        c.broadcast(&mut buf, 1).unwrap();
        let input = [7u8; 10];
        let mut output = [0u8; 30];
        c.all_gather(&input, &mut output).unwrap();
        let s = c.stats().expect("on");
        assert_eq!((s.rank, s.world), (c.rank(), 3));
        let ar = s.op(OpKind::AllReduce).unwrap();
        assert_eq!((ar.calls, ar.failed, ar.bytes), (3, 0, 3 * 4000));
        assert_eq!(ar.time_buckets.iter().sum::<u64>(), 3);
        assert!(ar.seconds > 0.0);
        assert_eq!(s.op(OpKind::Broadcast).unwrap().bytes, 4000);
        assert_eq!(s.op(OpKind::AllGather).unwrap().bytes, 30, "an all-gather counts its output");
        assert!(s.errors.iter().all(|&(_, n)| n == 0), "{:?}", s.errors);
    });
}

/// A failed call counts as a call and a failure of its kind, not as bytes.
#[test]
fn failures_are_counted_by_kind() {
    use braid::{Communicator, Config, ReduceOp};
    let mut cfg = Config::new(0, 2);
    cfg.metrics = true;
    cfg.timeout = Duration::from_secs(20);
    let comms = Communicator::in_process_with(cfg).unwrap();
    common::on_ranks(comms, |c| {
        let mut buf = vec![1i32; 64];
        // Rank 1 calls a broadcast where rank 0 calls an all-reduce.
        let r = if c.rank() == 0 { c.all_reduce_in_place(&mut buf, ReduceOp::Sum) } else { c.broadcast(&mut buf, 0) };
        assert!(r.is_err());
        let s = c.stats().unwrap();
        let op = &s.ops[0];
        assert_eq!((s.ops.len(), op.calls, op.failed, op.bytes), (1, 1, 1, 0), "{s:?}");
        let kinds: Vec<&str> = s.errors.iter().filter(|e| e.1 > 0).map(|e| e.0).collect();
        assert_eq!(kinds.len(), 1, "{s:?}");
        assert!(["mismatch", "peer-aborted"].contains(&kinds[0]), "{s:?}");
    });
}

/// An address set in code turns the counting on, as `BRAID_METRICS_ADDR` does.
#[test]
fn an_address_in_code_turns_the_counting_on() {
    use braid::{Communicator, Config};
    let mut cfg = Config::new(0, 1);
    cfg.metrics_addr = Some("127.0.0.1:0".into());
    let c = Communicator::in_process_with(cfg).unwrap().pop().unwrap();
    c.barrier().unwrap();
    assert_eq!(c.stats().expect("on").op(braid::OpKind::Barrier).map(|o| o.calls), Some(1));
}
