//! One conformance suite for every [`Store`]: the same cases, through the public
//! trait only, against each store. A store is added with one line,
//! `conformance!(name, fixture_fn)` (or `conformance!(name, fixture_fn, with_server)` for a
//! store that talks to a server, which adds the case of the server dying mid-wait);
//! the macro makes one `#[test]` per case, named `name::case`. A fixture function
//! returns None when the store's server is not installed (outside CI only; under
//! CI=true it fails naming what is missing).
//!
//! A [`Fixture`] opens clients on one fresh store: each client is what a separate
//! process of the job would hold, so cases that need "another client" really use a
//! second connection, not a second handle on the same object.

#[cfg(feature = "redis")]
mod redis_server;

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use braid::bootstrap::{FileStore, MemStore, PrefixStore, Store, TcpStore, TcpStoreServer, TorchStore};
use braid::{Communicator, Error, JobKey, ReduceOp, TransportKind};

/// What a client gets for connecting and each request (the TCP store's
/// `BRAID_TIMEOUT`); the cases' own waits are given explicitly.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a communicator build may take before it gives up.
const BUILD_TIMEOUT: Duration = Duration::from_secs(30);
/// Beyond a wait's own timeout, how late its error may come (scheduling on a busy
/// 2-core CI machine; a hang would run far past it).
const LATE: Duration = Duration::from_secs(5);

/// The python with torch and torch's own TCPStore server (shared with launch_torch.rs).
mod torch;

/// One fresh store under test.
struct Fixture {
    /// A new client on the fixture's data, as another process of the job would open.
    open: Box<dyn Fn() -> Arc<dyn Store> + Send + Sync>,
    /// Stops the store's server as abruptly as the store allows (None: no server).
    kill: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Whatever must live as long as the fixture (a temporary directory, a server).
    _keep: Vec<Box<dyn std::any::Any + Send>>,
}

impl Fixture {
    fn client(&self) -> Arc<dyn Store> {
        (self.open)()
    }

    fn kill_server(&self) {
        let kill = self.kill.lock().unwrap().take().expect("this store has a server to kill");
        kill();
    }
}

// ---------------------------------------------------------------------------
// The stores.

fn mem_fixture() -> Option<Fixture> {
    let mem: Arc<dyn Store> = Arc::new(MemStore::new());
    // Each client is a distinct object on the same data, as each process's client
    // is: the builder numbers communicators per store object, so handing every rank
    // the very same object would make a "second job" a second communicator.
    Some(Fixture {
        open: Box::new(move || Arc::new(PrefixStore::new("client", mem.clone()))),
        kill: Mutex::new(None),
        _keep: vec![],
    })
}

/// A directory removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let nonce: u64 = rand_u64();
        let p = std::env::temp_dir().join(format!("braid-conformance-{what}-{}-{nonce:x}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}

fn file_fixture() -> Option<Fixture> {
    let dir = TempDir::new("file");
    let path = dir.0.join("store");
    Some(Fixture {
        open: Box::new(move || Arc::new(FileStore::open(&path).expect("opening the file store"))),
        kill: Mutex::new(None),
        _keep: vec![Box::new(dir)],
    })
}

fn tcp_fixture() -> Option<Fixture> {
    let key = JobKey::from_text("conformance");
    let server = TcpStoreServer::bind("127.0.0.1:0", key.clone()).expect("binding a tcp store server");
    let addr = server.local_addr().to_string();
    // Dropping the server closes its listener and every connection, which is what
    // the kernel does to a killed process's sockets.
    let server = Arc::new(Mutex::new(Some(server)));
    let held = server.clone();
    Some(Fixture {
        open: Box::new(move || {
            Arc::new(TcpStore::connect(&addr, key.clone(), CLIENT_TIMEOUT).expect("tcp store client"))
        }),
        kill: Mutex::new(Some(Box::new(move || drop(held.lock().unwrap().take())))),
        _keep: vec![Box::new(server)],
    })
}

/// A `redis-server` of its own (None: not installed, outside CI), under a prefix
/// so the cases also check that keys stay inside it.
#[cfg(feature = "redis")]
fn redis_fixture() -> Option<Fixture> {
    let server = redis_server::RedisServer::start()?;
    let url = server.url("?prefix=conformance/job1&ttl=10m");
    let server = Arc::new(Mutex::new(server));
    let held = server.clone();
    Some(Fixture {
        open: Box::new(move || {
            Arc::new(braid::bootstrap::RedisStore::connect(&url, CLIENT_TIMEOUT).expect("redis store client"))
        }),
        kill: Mutex::new(Some(Box::new(move || held.lock().unwrap().kill()))),
        _keep: vec![Box::new(server)],
    })
}

// ---------------------------------------------------------------------------
// The cases.

fn set_get_overwrite_delete(f: &Fixture) {
    let s = f.client();
    s.set("k", b"first").unwrap();
    assert_eq!(s.get("k").unwrap().as_deref(), Some(&b"first"[..]));
    s.set("k", b"second, longer").unwrap();
    assert_eq!(s.get("k").unwrap().as_deref(), Some(&b"second, longer"[..]));
    s.set("k", b"3").unwrap();
    assert_eq!(s.get("k").unwrap().as_deref(), Some(&b"3"[..]), "a shorter value replaces, not overlays");
    // Another client sees the same value.
    assert_eq!(f.client().get("k").unwrap().as_deref(), Some(&b"3"[..]));
    assert!(s.delete("k").unwrap());
    assert_eq!(s.get("k").unwrap(), None);
    assert_eq!(f.client().get("k").unwrap(), None);
    // Keys are distinct: one that is a prefix of another, or shares a path part.
    s.set("a/b", b"ab").unwrap();
    s.set("a/bc", b"abc").unwrap();
    s.set("a", b"a").unwrap();
    assert_eq!(s.get("a/b").unwrap().as_deref(), Some(&b"ab"[..]));
    assert_eq!(s.get("a/bc").unwrap().as_deref(), Some(&b"abc"[..]));
    assert_eq!(s.get("a").unwrap().as_deref(), Some(&b"a"[..]));
}

fn absent_keys(f: &Fixture) {
    let s = f.client();
    assert_eq!(s.get("never set").unwrap(), None);
    assert!(!s.delete("never set").unwrap(), "deleting an absent key reports it was absent");
    s.set("gone", b"x").unwrap();
    assert!(s.delete("gone").unwrap());
    assert!(!s.delete("gone").unwrap(), "a second delete finds nothing");
    assert_eq!(s.get("gone").unwrap(), None);
    // add counts an absent key as 0, and a deleted one starts again.
    assert_eq!(s.add("counter", 5).unwrap(), 5);
    assert_eq!(s.add("counter", -7).unwrap(), -2);
    assert!(s.delete("counter").unwrap());
    assert_eq!(s.add("counter", 0).unwrap(), 0);
    // A counter reads back as its decimal text, as torch's store keeps it.
    assert_eq!(s.add("counter", 42).unwrap(), 42);
    assert_eq!(s.get("counter").unwrap().as_deref(), Some(&b"42"[..]));
    // add on a value that is not an integer fails and leaves it as it was.
    s.set("text", b"not a number").unwrap();
    let err = s.add("text", 1).expect_err("adding to text must fail");
    assert!(matches!(err, Error::Store(_)), "{err:?}");
    assert_eq!(s.get("text").unwrap().as_deref(), Some(&b"not a number"[..]));
}

fn binary_values_empty_and_large(f: &Fixture) {
    let s = f.client();
    s.set("empty", b"").unwrap();
    assert_eq!(s.get("empty").unwrap().as_deref(), Some(&b""[..]), "an empty value is present, not absent");
    s.wait(&["empty"], Duration::from_secs(1)).unwrap();
    let every_byte: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    s.set("bytes", &every_byte).unwrap();
    assert_eq!(s.get("bytes").unwrap().unwrap(), every_byte);
    // 4 MiB that is not text (NULs, CR LF, invalid UTF-8) through another client.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let large: Vec<u8> = (0..4 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    s.set("large", &large).unwrap();
    let got = f.client().get("large").unwrap().expect("the large value is there");
    assert_eq!(got.len(), large.len());
    assert!(got == large, "the large value came back changed");
}

fn concurrent_adds_sum_exactly(f: &Fixture) {
    const CLIENTS: usize = 4;
    const THREADS_PER_CLIENT: usize = 3;
    const ADDS: usize = 40;
    let start = Arc::new(Barrier::new(CLIENTS * THREADS_PER_CLIENT));
    let mut handles = Vec::new();
    for _ in 0..CLIENTS {
        let client = f.client();
        for _ in 0..THREADS_PER_CLIENT {
            let (client, start) = (client.clone(), start.clone());
            handles.push(std::thread::spawn(move || {
                start.wait();
                (0..ADDS).map(|_| client.add("n", 1).unwrap()).collect::<Vec<i64>>()
            }));
        }
    }
    let mut seen: Vec<i64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    seen.sort_unstable();
    let total = (CLIENTS * THREADS_PER_CLIENT * ADDS) as i64;
    // Each add returned the count after it: every value from 1 to the total once.
    assert_eq!(seen, (1..=total).collect::<Vec<_>>(), "an add was lost or two saw the same count");
    assert_eq!(f.client().add("n", 0).unwrap(), total);
}

fn wait_returns_when_keys_appear_from_another_client(f: &Fixture) {
    let waiter = f.client();
    let setter = f.client();
    waiter.wait(&[], Duration::from_millis(1)).expect("waiting for no key returns at once");
    setter.set("early", b"1").unwrap();
    waiter.wait(&["early"], Duration::from_millis(1)).expect("a key that is there is waited for at once");
    let t = std::thread::spawn(move || {
        waiter.wait(&["early", "a", "b"], Duration::from_secs(20)).map(|()| waiter.get("b").unwrap())
    });
    std::thread::sleep(Duration::from_millis(150));
    setter.set("a", b"A").unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert!(!t.is_finished(), "the wait returned while `b` was still missing");
    setter.set("b", b"B").unwrap();
    let t0 = Instant::now();
    while !t.is_finished() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = t.join().unwrap().expect("the wait succeeds once every key is set");
    assert_eq!(got.as_deref(), Some(&b"B"[..]));
    // wait_get hands back the value set by another client.
    let (waiter, setter) = (f.client(), f.client());
    let t = std::thread::spawn(move || waiter.wait_get("late", Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(100));
    setter.set("late", b"\0value").unwrap();
    assert_eq!(t.join().unwrap().unwrap(), b"\0value");
}

fn wait_times_out_naming_the_missing_keys(f: &Fixture) {
    let s = f.client();
    s.set("present-key", b"1").unwrap();
    let timeout = Duration::from_millis(400);
    let t0 = Instant::now();
    let err = s.wait(&["present-key", "missing-one", "missing-two"], timeout).expect_err("the wait must time out");
    let took = t0.elapsed();
    assert!(took >= timeout, "gave up after {took:?}, before its timeout of {timeout:?}");
    assert!(took < timeout + LATE, "gave up only after {took:?} (timeout {timeout:?})");
    assert!(matches!(err, Error::Store(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("missing-one") && msg.contains("missing-two"), "{msg}");
    assert!(!msg.contains("present-key"), "the message names a key that is there: {msg}");
    // The store still works after a timed-out wait.
    s.set("missing-one", b"now").unwrap();
    assert_eq!(s.get("missing-one").unwrap().as_deref(), Some(&b"now"[..]));
}

/// Build a `world`-rank communicator, each rank a thread with its own client.
fn build_job(f: &Fixture, world: usize) -> Vec<braid::Result<Communicator>> {
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let store = f.client();
            std::thread::spawn(move || {
                Communicator::builder(rank, world)
                    .store(store)
                    .socket_ifname("lo")
                    .transports(vec![TransportKind::Tcp])
                    .timeout(BUILD_TIMEOUT)
                    .build()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

/// Two jobs that were handed the same store and prefix (a copied launch script, a
/// restarted job whose old keys are still there): the second must fail at once,
/// naming the clash, rather than wait out its timeout or link with the first.
fn second_job_on_the_same_prefix_fails_fast(f: &Fixture) {
    let first: Vec<Communicator> = build_job(f, 2).into_iter().map(|c| c.expect("the first job builds")).collect();
    let t0 = Instant::now();
    let second = build_job(f, 2);
    let took = t0.elapsed();
    assert!(took < BUILD_TIMEOUT / 3, "the second job took {took:?} to fail (its timeout is {BUILD_TIMEOUT:?})");
    for (rank, r) in second.into_iter().enumerate() {
        let err = r.err().expect("the second job must not build");
        let msg = err.to_string();
        assert!(msg.contains(&format!("rank {rank} of communicator braid/comm0 was already claimed")), "{msg}");
        assert!(msg.contains("is another job using store"), "{msg}");
    }
    // The first job was not disturbed: its ranks still reduce exactly.
    let sums: Vec<Vec<i32>> = first
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let mut v = vec![c.rank() as i32 + 1; 7];
                c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                v
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(sums, vec![vec![3; 7]; 2]);
}

/// A client blocked in `wait` when its server dies gets an error, well before the
/// wait's own timeout, and later calls fail within the client's timeout too.
fn server_killed_mid_wait_fails_within_the_timeout(f: &Fixture) {
    let s = f.client();
    s.set("here", b"1").unwrap();
    let wait_timeout = Duration::from_secs(20);
    let waiter = s.clone();
    let t0 = Instant::now();
    let t = std::thread::spawn(move || {
        let r = waiter.wait(&["never"], wait_timeout);
        (r, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!t.is_finished(), "the wait returned before the server died");
    f.kill_server();
    let (r, took) = t.join().unwrap();
    let err = r.expect_err("a wait on a dead server must fail");
    assert!(took < wait_timeout, "the wait noticed the dead server only after {took:?}: {err}");
    assert!(matches!(err, Error::Store(_) | Error::Io { .. }), "{err:?}");
    let t0 = Instant::now();
    let err = s.get("here").expect_err("a get on a dead server must fail");
    assert!(t0.elapsed() < CLIENT_TIMEOUT + LATE, "a get on a dead server took {:?}: {err}", t0.elapsed());
}

// ---------------------------------------------------------------------------
// torch's TCPStore, through braid's client: the mock of torch's server and the real one.

/// braid's torch store client on the mock of torch's server (the byte transcripts
/// in src/bootstrap/torch_store pin the mock to torch's own replies).
fn torch_mock_fixture() -> Option<Fixture> {
    let server = Arc::new(braid::bootstrap::MockTorchServer::start(braid::bootstrap::MockFault::None).unwrap());
    let addr = server.addr().to_string();
    let held = server.clone();
    Some(Fixture {
        open: Box::new(move || Arc::new(TorchStore::connect(&addr, CLIENT_TIMEOUT).expect("torch store client"))),
        kill: Mutex::new(Some(Box::new(move || held.kill()))),
        _keep: vec![Box::new(server)],
    })
}

/// braid's torch store client on torch's own (libuv) TCPStore server, in a python
/// process of its own that the kill case kills (None: no torch, outside CI).
fn torch_real_fixture() -> Option<Fixture> {
    let python = torch::torch_python()?;
    let server = torch::TorchServer::start(&python, "libuv");
    let addr = format!("127.0.0.1:{}", server.port);
    let server = Arc::new(Mutex::new(server));
    let held = server.clone();
    Some(Fixture {
        open: Box::new(move || Arc::new(TorchStore::connect(&addr, CLIENT_TIMEOUT).expect("torch store client"))),
        kill: Mutex::new(Some(Box::new(move || held.lock().unwrap().job.kill()))),
        _keep: vec![Box::new(server)],
    })
}

// ---------------------------------------------------------------------------
// One #[test] per case per store.

macro_rules! conformance {
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let Some(f): Option<Fixture> = ($fixture)() else { return };
                super::$case(&f);
            }
        )*
    };
    (@module $store:ident, $fixture:expr; $($extra:ident)?) => {
        mod $store {
            use super::*;
            conformance!(@cases $fixture;
                set_get_overwrite_delete,
                absent_keys,
                binary_values_empty_and_large,
                concurrent_adds_sum_exactly,
                wait_returns_when_keys_appear_from_another_client,
                wait_times_out_naming_the_missing_keys,
                second_job_on_the_same_prefix_fails_fast,
                $($extra)?
            );
        }
    };
    // A store with a server also gets the case of the server dying mid-wait.
    ($store:ident, $fixture:expr, with_server) => {
        conformance!(@module $store, $fixture; server_killed_mid_wait_fails_within_the_timeout);
    };
    ($store:ident, $fixture:expr) => {
        conformance!(@module $store, $fixture;);
    };
}

conformance!(mem, mem_fixture);
conformance!(file, file_fixture);
conformance!(tcp, tcp_fixture, with_server);
#[cfg(feature = "redis")]
conformance!(redis, redis_fixture, with_server);
conformance!(torch_mock, torch_mock_fixture, with_server);
conformance!(torch_real, torch_real_fixture, with_server);
