//! The Redis store against a real `redis-server` started here (loopback, no
//! persistence): `braid perf --check` ranks that meet only through Redis, keys
//! kept inside their prefix with a TTL, and credentials proven with Redis's own
//! ACLs yet never shown. The cases every store shares are in store_conformance.rs.

mod redis_server;

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use braid::bootstrap::{RedisStore, Store};
use redis_server::RedisServer;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
/// A rank process still running after this has hung: it is killed and the test fails.
const RANK_DEADLINE: Duration = Duration::from_secs(90);

/// Variables through which a launcher could hand a rank its identity or a store:
/// none may leak in from the test's environment.
fn is_launcher_variable(name: &str) -> bool {
    const PREFIXES: [&str; 7] = ["BRAID_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "TORCHELASTIC_", "MASTER_"];
    PREFIXES.iter().any(|p| name.starts_with(p))
        || ["TF_CONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"].contains(&name)
}

/// Rank `rank` of `braid perf` over `store`, with nothing else to go on.
fn perf_rank(rank: usize, world: usize, store: &str, op: &str) -> Child {
    let mut cmd = Command::new(BRAID);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_launcher_variable) {
            cmd.env_remove(name);
        }
    }
    cmd.args(["perf", "--op", op, "--min-bytes", "1K", "--max-bytes", "64K", "--factor", "8"])
        .args(["--iters", "2", "--warmup", "1", "--check"])
        .env("BRAID_RANK", rank.to_string())
        .env("BRAID_WORLD_SIZE", world.to_string())
        .env("BRAID_STORE", store)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait for every rank, killing all of them if one outlives the deadline;
/// returns each rank's (success, stdout, stderr).
fn finish(mut kids: Vec<Child>) -> Vec<(bool, String, String)> {
    let t0 = Instant::now();
    let mut status = vec![None; kids.len()];
    while status.iter().any(Option::is_none) {
        for (k, s) in kids.iter_mut().zip(&mut status) {
            if s.is_none() {
                *s = k.try_wait().unwrap();
            }
        }
        if t0.elapsed() > RANK_DEADLINE {
            for k in &mut kids {
                let _ = k.kill();
                let _ = k.wait();
            }
            panic!("ranks still running after {RANK_DEADLINE:?}: {status:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kids.iter_mut()
        .zip(status)
        .map(|(k, s)| {
            let (mut out, mut err) = (String::new(), String::new());
            k.stdout.take().unwrap().read_to_string(&mut out).unwrap();
            k.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            (s.unwrap().success(), out, err)
        })
        .collect()
}

/// The count in a reply such as `*3` (array) or `:3` (integer).
fn count(reply: &str) -> i64 {
    reply[1..].parse().unwrap_or_else(|_| panic!("not a count: {reply}"))
}

#[test]
fn braid_perf_checks_every_collective_meeting_only_through_redis() {
    let Some(server) = RedisServer::start() else { return };
    let world = 3;
    for op in ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "barrier"] {
        // Each run is a job of its own, so each has its own prefix.
        let store = server.url(&format!("?prefix=job1/{op}"));
        let results = finish((0..world).map(|r| perf_rank(r, world, &store, op)).collect());
        for (rank, (ok, out, err)) in results.iter().enumerate() {
            assert!(ok, "{op}: rank {rank} failed\n{out}\n{err}");
        }
        assert!(results[0].1.contains("# Out of bounds values : 0 OK"), "{op}: {}", results[0].1);
        // The job's keys are in Redis, under its prefix, with a TTL.
        let claim = format!("job1/{op}/braid/comm0/claim/0");
        let ttl_ms = count(&server.command(&["PTTL", &claim]));
        assert!(ttl_ms > 0 && ttl_ms <= 24 * 3600 * 1000, "{op}: {claim} has PTTL {ttl_ms}");
    }
    // Nothing was written outside the prefixes.
    let all = count(&server.command(&["KEYS", "*"]));
    assert!(all > 0);
    assert_eq!(count(&server.command(&["KEYS", "job1/*"])), all, "keys outside the jobs' prefixes");
}

#[test]
fn every_key_lives_under_the_prefix_with_the_ttl_or_none_with_ttl_zero() {
    let Some(server) = RedisServer::start() else { return };
    let timeout = Duration::from_secs(10);
    let bounded = RedisStore::connect(&server.url("?prefix=jobA&ttl=90s"), timeout).unwrap();
    assert_eq!((bounded.prefix(), bounded.ttl()), ("jobA", Some(Duration::from_secs(90))));
    bounded.set("k", b"v").unwrap();
    bounded.add("n", 3).unwrap();
    for key in ["jobA/k", "jobA/n"] {
        let ttl_ms = count(&server.command(&["PTTL", key]));
        assert!(ttl_ms > 0 && ttl_ms <= 90_000, "{key}: PTTL {ttl_ms}");
    }
    assert_eq!(server.command(&["GET", "k"]), "$-1", "a key escaped its prefix");
    // An add renews the TTL, as a set does.
    server.command(&["PEXPIRE", "jobA/n", "5000"]);
    bounded.add("n", 1).unwrap();
    assert!(count(&server.command(&["PTTL", "jobA/n"])) > 5000);
    // ttl=0: keys never expire, even one that an add creates; db 2 is another keyspace.
    let forever = RedisStore::connect(&server.url("2?prefix=jobB&ttl=0"), timeout).unwrap();
    forever.set("k", b"v").unwrap();
    forever.add("n", 1).unwrap();
    for key in ["jobB/k", "jobB/n"] {
        assert_eq!(server.command_in(2, &["PTTL", key]), ":-1", "{key} expires");
        assert_eq!(server.command(&["EXISTS", key]), ":0", "{key} is in db 0, not db 2");
    }
}

#[test]
fn credentials_go_to_redis_acls_and_never_into_messages() {
    let Some(server) = RedisServer::start() else { return };
    let password = "s3cret-pw";
    assert_eq!(server.command(&["ACL", "SETUSER", "alice", "on", &format!(">{password}"), "~job1/*", "+@all"]), "+OK");
    let port = server.port;
    let timeout = Duration::from_secs(20);
    let url = |prefix: &str| format!("redis://alice:{password}@127.0.0.1:{port}/?prefix={prefix}");
    let ok = RedisStore::connect(&url("job1"), timeout).unwrap();
    ok.set("k", b"v").unwrap();
    assert_eq!(ok.get("k").unwrap().as_deref(), Some(&b"v"[..]));
    assert!(!format!("{ok:?}").contains(password) && !ok.url().contains(password));
    // The ACL confines alice to job1/*: another prefix is refused by Redis.
    let other = RedisStore::connect(&url("job2"), timeout).unwrap();
    let msg = other.set("k", b"v").expect_err("alice may not write job2/*").to_string();
    assert!(msg.contains("NOPERM") || msg.to_lowercase().contains("permission"), "{msg}");
    assert!(msg.contains("alice:***@") && !msg.contains(password), "{msg}");
    // A wrong password fails at once (it is not retried until the timeout).
    let t0 = Instant::now();
    let wrong = format!("redis://alice:not-{password}@127.0.0.1:{port}/");
    let msg = RedisStore::connect(&wrong, timeout).expect_err("a wrong password is refused").to_string();
    assert!(t0.elapsed() < timeout / 2, "refused only after {:?}", t0.elapsed());
    assert!(!msg.contains(password) && msg.contains("alice:***@"), "{msg}");
}

#[test]
fn a_wedged_server_gives_an_error_within_the_command_timeout() {
    let Some(server) = RedisServer::start() else { return };
    let timeout = Duration::from_millis(500);
    let store = RedisStore::connect(&server.url("?prefix=j"), timeout).unwrap();
    store.set("k", b"v").unwrap();
    // Stopped, the server still holds its connections open but answers nothing.
    server.signal(libc::SIGSTOP);
    let calls = std::thread::spawn(move || {
        let t0 = Instant::now();
        let get = store.get("k");
        let wait = store.wait(&["absent"], Duration::from_secs(30));
        (get, wait, t0.elapsed())
    });
    // Resume the server after a bound either way, so a client that hangs fails
    // the test instead of hanging it.
    let t0 = Instant::now();
    while !calls.is_finished() && t0.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(20));
    }
    server.signal(libc::SIGCONT);
    let (get, wait, took) = calls.join().unwrap();
    assert!(took < Duration::from_secs(15), "two calls took {took:?} with a 500 ms command timeout");
    let get = get.expect_err("a get from a stopped server must fail").to_string();
    assert!(get.contains("no reply within 500ms"), "{get}");
    let wait = wait.expect_err("a wait on a stopped server must fail").to_string();
    assert!(wait.contains("EXISTS"), "{wait}");
}
