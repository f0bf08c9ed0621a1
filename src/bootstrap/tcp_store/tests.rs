//! Tests of the TCP store client and server together.

use super::*;
use std::io::Read;
use std::net::TcpListener;
use std::sync::{Arc, Barrier};

mod admission;
mod hosting;

const KEY: &str = "store-test-job-key";

fn key() -> JobKey {
    JobKey::from_text(KEY)
}

fn server_and_client() -> (TcpStoreServer, TcpStore) {
    let server = TcpStoreServer::bind("127.0.0.1:0", key()).unwrap();
    let client = TcpStore::connect(&server.local_addr().to_string(), key(), Duration::from_secs(5)).unwrap();
    (server, client)
}

fn server_with(limits: StoreLimits) -> TcpStoreServer {
    TcpStoreServer::bind_with("127.0.0.1:0", key(), limits).unwrap()
}

fn client_of(server: &TcpStoreServer) -> TcpStore {
    TcpStore::connect(&server.local_addr().to_string(), key(), Duration::from_secs(5)).unwrap()
}

/// A port nothing listens on right now (bound, read, released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn set_get_overwrite_delete() {
    let (_server, s) = server_and_client();
    assert_eq!(s.get("a").unwrap(), None);
    s.set("a", b"one").unwrap();
    assert_eq!(s.get("a").unwrap().unwrap(), b"one");
    s.set("a", b"two!").unwrap();
    assert_eq!(s.get("a").unwrap().unwrap(), b"two!");
    s.set("empty", b"").unwrap();
    assert_eq!(s.get("empty").unwrap().unwrap(), b"");
    assert!(s.delete("a").unwrap());
    assert!(!s.delete("a").unwrap());
    assert_eq!(s.get("a").unwrap(), None);
    s.ping().unwrap();
}

#[test]
fn values_are_shared_between_clients_and_large_values_round_trip() {
    let (server, a) = server_and_client();
    let b = TcpStore::connect(&server.local_addr().to_string(), key(), Duration::from_secs(5)).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    a.set("rank0/addr", &big).unwrap();
    assert_eq!(b.get("rank0/addr").unwrap().unwrap(), big);
    let err = a.set(&"k".repeat(MAX_KEY + 1), b"v").unwrap_err().to_string();
    assert!(err.contains("limit"), "{err}");
    // The client stays usable after refusing an oversized key.
    assert_eq!(a.add("n", 5).unwrap(), 5);
    assert_eq!(b.get("n").unwrap().unwrap(), b"5");
    let err = a.add("rank0/addr", 1).unwrap_err().to_string();
    assert!(err.contains("`rank0/addr`") && err.contains("integer"), "{err}");
}

#[test]
fn wait_sees_a_later_set_from_another_thread() {
    let (_server, s) = server_and_client();
    let s = Arc::new(s);
    let setter = {
        let s = s.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            s.set("late", b"v").unwrap();
        })
    };
    let start = Instant::now();
    assert_eq!(s.wait_get("late", Duration::from_secs(5)).unwrap(), b"v");
    assert!(start.elapsed() < Duration::from_secs(2));
    setter.join().unwrap();
    // An add also wakes waiters.
    let adder = {
        let s = s.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            s.add("counter", 3).unwrap();
        })
    };
    s.wait(&["late", "counter"], Duration::from_secs(5)).unwrap();
    adder.join().unwrap();
}

#[test]
fn a_blocked_wait_does_not_hold_up_other_calls() {
    let (_server, s) = server_and_client();
    let s = Arc::new(s);
    let waiter = {
        let s = s.clone();
        std::thread::spawn(move || s.wait(&["release"], Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    for i in 0..20 {
        s.set(&format!("k{i}"), b"x").unwrap();
        assert!(s.get(&format!("k{i}")).unwrap().is_some());
    }
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    assert!(!waiter.is_finished());
    s.set("release", b"").unwrap();
    waiter.join().unwrap().unwrap();
}

#[test]
fn wait_times_out_naming_the_missing_key() {
    let (server, s) = server_and_client();
    s.set("here", b"1").unwrap();
    let start = Instant::now();
    let err = s.wait(&["here", "missing/key"], Duration::from_millis(100)).unwrap_err();
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    assert!(matches!(err, Error::Store(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("\"missing/key\"") && !msg.contains("\"here\""), "{msg}");
    assert!(msg.contains(&server.local_addr().to_string()), "{msg}");
    // The connection that carried the timed-out wait is still in good order.
    assert_eq!(s.get("here").unwrap().unwrap(), b"1");
}

#[test]
fn concurrent_add_from_8_threads_counts_exactly() {
    let (server, shared) = server_and_client();
    let shared = Arc::new(shared);
    let addr = server.local_addr().to_string();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let shared = shared.clone();
            let addr = addr.clone();
            std::thread::spawn(move || {
                // Half the threads share one client (its pool), half have their own.
                let own = (t % 2 == 1).then(|| TcpStore::connect(&addr, key(), Duration::from_secs(5)).unwrap());
                let s: &TcpStore = own.as_ref().unwrap_or(&shared);
                for _ in 0..100 {
                    s.add("n", 1).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(shared.get("n").unwrap().unwrap(), b"800");
    assert_eq!(shared.add("n", 0).unwrap(), 800);
}

#[test]
fn concurrent_set_if_absent_gives_every_thread_the_first_value() {
    let (server, shared) = server_and_client();
    let addr = server.local_addr().to_string();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let s = TcpStore::connect(&addr, key(), Duration::from_secs(5)).unwrap();
                (0..20).map(|k| s.set_if_absent(&format!("d{k}"), format!("t{t}").as_bytes()).unwrap()).collect()
            })
        })
        .collect();
    let seen: Vec<Vec<Vec<u8>>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for k in 0..20 {
        let stored = shared.get(&format!("d{k}")).unwrap().unwrap();
        assert!(stored.starts_with(b"t"), "{stored:?}");
        // Every thread saw the value that stayed: one winner per key.
        assert!(seen.iter().all(|s| s[k] == stored), "key d{k}");
    }
    // A plain set still overwrites; a conditional one then reads that value.
    shared.set("d0", b"x").unwrap();
    assert_eq!(shared.set_if_absent("d0", b"y").unwrap(), b"x");
}

/// Read until the server closes `raw`; the bytes it sent. Panics if it stays open for 5 s.
fn read_to_close(raw: &mut TcpStream) -> Vec<u8> {
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        match raw.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("server kept a connection open (got {got:02x?}): {e}"),
        }
    }
}

/// Write `bytes` on a raw connection and check that the server closes it,
/// having sent nothing but its hello.
fn assert_garbage_dropped(addr: SocketAddr, bytes: &[u8]) {
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(bytes).unwrap();
    let got = read_to_close(&mut raw);
    assert!(got.len() <= SERVER_HELLO_LEN, "server answered garbage {bytes:02x?} with {got:02x?}");
}

/// A raw connection that did the client's side of the handshake with `key`.
fn raw_client(addr: SocketAddr, key: &JobKey) -> TcpStream {
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let server = decode_server_hello(&read_array::<SERVER_HELLO_LEN>(&mut raw).unwrap()).unwrap();
    raw.write_all(&encode_client_hello(key, &auth::challenge(), &server)).unwrap();
    raw
}

/// An authenticated raw connection (the server's proof read and dropped).
fn authed_raw(addr: SocketAddr) -> TcpStream {
    let mut raw = raw_client(addr, &key());
    read_array::<PROOF_LEN>(&mut raw).unwrap();
    raw
}

/// Send an authenticated but invalid request and check that the server closes the connection.
fn assert_bad_request_dropped(addr: SocketAddr, bytes: &[u8]) {
    let mut raw = authed_raw(addr);
    raw.write_all(bytes).unwrap();
    let got = read_to_close(&mut raw);
    assert!(got.is_empty(), "server answered bad request {bytes:02x?} with {got:02x?}");
}

#[test]
fn garbage_is_dropped_and_the_server_keeps_serving() {
    // Junk that starts like a hello and stops is dropped at the proof deadline.
    let server = server_with(StoreLimits { proof_deadline: Duration::from_secs(1), ..StoreLimits::default() });
    let s = client_of(&server);
    s.set("before", b"1").unwrap();
    let addr = server.local_addr();
    // Before the handshake.
    assert_garbage_dropped(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_garbage_dropped(addr, &[0xff; 16]);
    assert_garbage_dropped(addr, &[OP_SET, 0xff, 0xff, 0xff, 0xff, 0, 0]);
    assert_garbage_dropped(addr, &STORE_MAGIC[..5]);
    for i in 0..16u32 {
        let random: Vec<u8> =
            (0..(i * 29 + 1) % 200).map(|j| (j.wrapping_mul(2654435761).wrapping_add(i) >> 7) as u8).collect();
        assert_garbage_dropped(addr, &random);
    }
    // After it, from a client that proved the key: bad requests still drop the connection.
    // SET with a key length of 4 GiB - 1.
    assert_bad_request_dropped(addr, &[OP_SET, 0xff, 0xff, 0xff, 0xff, 0, 0]);
    // SET with a valid key and a 1 GiB value.
    let mut huge = vec![OP_SET];
    put_bytes(&mut huge, b"k");
    huge.extend_from_slice(&(1u32 << 30).to_le_bytes());
    assert_bad_request_dropped(addr, &huge);
    // A key that is not UTF-8.
    let mut bad = vec![OP_GET];
    put_bytes(&mut bad, &[0xc3, 0x28]);
    assert_bad_request_dropped(addr, &bad);
    // WAIT for an absurd number of keys, or for one more than the limit.
    assert_bad_request_dropped(addr, &[OP_WAIT, 0xff, 0xff, 0xff, 0x7f]);
    let mut over = vec![OP_WAIT];
    over.extend_from_slice(&(MAX_WAIT_KEYS as u32 + 1).to_le_bytes());
    assert_bad_request_dropped(addr, &over);
    // An unknown opcode.
    assert_bad_request_dropped(addr, &[0x77]);
    // A request cut short by the peer closing is dropped, not waited on forever.
    drop(authed_raw(addr).write_all(&[OP_ADD, 3, 0]));

    // The existing client and a new one are both served.
    assert_eq!(s.get("before").unwrap().unwrap(), b"1");
    let fresh = TcpStore::connect(&addr.to_string(), key(), Duration::from_secs(5)).unwrap();
    fresh.set("after", b"2").unwrap();
    assert_eq!(s.get("after").unwrap().unwrap(), b"2");
}

#[test]
fn a_client_without_the_key_can_neither_read_nor_write() {
    let (server, s) = server_and_client();
    s.set("secret", b"42").unwrap();
    let addr = server.local_addr();
    for wrong in [JobKey::none(), JobKey::from_text("guess")] {
        let err = TcpStore::connect(&addr.to_string(), wrong.clone(), Duration::from_secs(5)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("job key") && msg.contains(&addr.to_string()), "{msg}");
        // By hand: a wrong proof, then requests regardless. Nothing is answered.
        let mut raw = raw_client(addr, &wrong);
        let mut get = vec![OP_GET];
        put_bytes(&mut get, b"secret");
        let mut set = vec![OP_SET];
        put_bytes(&mut set, b"intruder");
        put_bytes(&mut set, b"x");
        let mut add = vec![OP_ADD];
        put_bytes(&mut add, b"secret");
        add.extend_from_slice(&1i64.to_le_bytes());
        let mut del = vec![OP_DELETE];
        put_bytes(&mut del, b"secret");
        for req in [&get, &set, &add, &del] {
            let _ = raw.write_all(req); // may fail once the server has closed
        }
        assert!(read_to_close(&mut raw).is_empty(), "the server answered a client without the key");
    }
    // A server with another key is refused by a client, too.
    let other = TcpStoreServer::bind("127.0.0.1:0", JobKey::from_text("other")).unwrap();
    let err = TcpStore::connect(&other.local_addr().to_string(), key(), Duration::from_secs(5)).unwrap_err();
    assert!(err.to_string().contains("job key"), "{err}");
    // Nothing changed.
    assert_eq!(s.get("secret").unwrap().unwrap(), b"42");
    assert_eq!(s.get("intruder").unwrap(), None);
}

#[test]
fn a_slow_client_is_dropped_at_the_read_deadline() {
    let server = server_with(StoreLimits {
        read_deadline: Duration::from_millis(300),
        proof_deadline: Duration::from_millis(300),
        ..StoreLimits::default()
    });
    let addr = server.local_addr();
    let s = client_of(&server);
    // Silent after connecting: dropped after the hello.
    let mut silent = TcpStream::connect(addr).unwrap();
    assert_eq!(read_to_close(&mut silent).len(), SERVER_HELLO_LEN);
    // Half a request, then nothing.
    let mut half = authed_raw(addr);
    half.write_all(&[OP_SET, 200, 0, 0, 0, b'k']).unwrap();
    assert!(read_to_close(&mut half).is_empty());
    // One byte every 100 ms: each gap is within the deadline, the request is not.
    let mut req = vec![OP_SET];
    put_bytes(&mut req, b"dribble");
    put_bytes(&mut req, &[7; 16]);
    let mut dribbler = authed_raw(addr);
    let start = Instant::now();
    let mut cut = false;
    for b in &req {
        if dribbler.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(cut || read_to_close(&mut dribbler).is_empty());
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(s.get("dribble").unwrap(), None, "a request past its deadline was served");
    // Real clients are served throughout.
    s.set("k", b"v").unwrap();
    assert_eq!(client_of(&server).get("k").unwrap().unwrap(), b"v");
}

#[test]
fn an_idle_connection_closed_by_the_server_is_retried_transparently() {
    let server = server_with(StoreLimits { idle_timeout: Duration::from_millis(100), ..StoreLimits::default() });
    let s = client_of(&server);
    assert_eq!(s.add("n", 1).unwrap(), 1);
    for round in 2..5 {
        // The pooled connection is closed by the server meanwhile.
        std::thread::sleep(Duration::from_millis(300));
        // ADD is not idempotent: the retry must not count twice.
        assert_eq!(s.add("n", 1).unwrap(), round);
        std::thread::sleep(Duration::from_millis(300));
        s.set("k", &[round as u8]).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(s.get("k").unwrap().unwrap(), [round as u8]);
    }
    assert_eq!(s.get("n").unwrap().unwrap(), b"4");
}

#[test]
fn stored_bytes_are_capped() {
    let server = server_with(StoreLimits { max_stored_bytes: 1000, ..StoreLimits::default() });
    let s = client_of(&server);
    s.set("a", &[1; 500]).unwrap();
    let err = s.set("b", &[2; 600]).unwrap_err().to_string();
    assert!(err.contains("cap of 1000 bytes") && err.contains("`b`"), "{err}");
    assert_eq!(s.get("b").unwrap(), None);
    // Overwriting counts the new size only; deleting frees.
    s.set("a", &[3; 995]).unwrap();
    let err = s.add("counter", 1).unwrap_err().to_string();
    assert!(err.contains("cap of 1000 bytes"), "{err}");
    assert!(s.delete("a").unwrap());
    s.set("b", &[2; 600]).unwrap();
    assert_eq!(s.add("counter", 7).unwrap(), 7);
    assert_eq!(s.get("b").unwrap().unwrap(), vec![2; 600]);
}

#[test]
fn the_server_bounds_wait() {
    let server = server_with(StoreLimits { max_wait: Duration::from_millis(200), ..StoreLimits::default() });
    let s = client_of(&server);
    let start = Instant::now();
    let err = s.wait(&["never"], Duration::from_secs(3600)).unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_secs(30), "{:?}", start.elapsed());
    assert!(err.contains("server's limit") && err.contains("\"never\""), "{err}");
    let keys: Vec<String> = (0..=MAX_WAIT_KEYS).map(|i| format!("k{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let err = s.wait(&refs, Duration::from_secs(1)).unwrap_err().to_string();
    assert!(err.contains("limit"), "{err}");
}

#[test]
fn round_trips_honour_the_client_timeout() {
    // A server that proves the key and then never answers a request.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mute = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for _ in 0..2 {
            let (mut c, _) = listener.accept().unwrap();
            let ours = auth::challenge();
            c.write_all(&encode_server_hello(&ours)).unwrap();
            let hello = read_array::<CLIENT_HELLO_LEN>(&mut c).unwrap();
            let theirs = decode_client_hello(&hello, &key(), &ours).unwrap();
            c.write_all(&server_proof(&key(), &ours, &theirs)).unwrap();
            conns.push(c);
        }
        conns
    });
    let s = TcpStore::connect(&addr.to_string(), key(), Duration::from_millis(300)).unwrap();
    let start = Instant::now();
    let err = s.get("k").unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_secs(20), "{:?}", start.elapsed());
    assert!(err.contains("no reply within 300ms"), "{err}");
    // A timed-out request is not retried (it may be in progress): the next call opens the second connection.
    let err = s.set("k", b"v").unwrap_err().to_string();
    assert!(err.contains("no reply within 300ms"), "{err}");
    drop(mute.join().unwrap());
}

#[test]
fn connect_or_host_race_one_hosts_both_work() {
    let addr = format!("127.0.0.1:{}", free_port());
    let barrier = Arc::new(Barrier::new(2));
    let racers: Vec<_> = (0..2)
        .map(|i| {
            let (addr, barrier) = (addr.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let s = TcpStore::connect_or_host(&addr, true, 2, key(), Duration::from_secs(5)).unwrap();
                s.set(&format!("racer{i}"), b"here").unwrap();
                s
            })
        })
        .collect();
    let stores: Vec<TcpStore> = racers.into_iter().map(|t| t.join().unwrap()).collect();
    let hosts = stores.iter().filter(|s| s.hosts_server()).count();
    assert_eq!(hosts, 1, "{stores:?}");
    for s in &stores {
        s.wait(&["racer0", "racer1"], Duration::from_secs(5)).unwrap();
        assert!((1..=2).contains(&s.add("both", 1).unwrap()));
    }
    assert_eq!(stores[0].get("both").unwrap().unwrap(), b"2");
    // A rank that is not asked to host never does, even on a free port.
    let client = TcpStore::connect_or_host(&addr, false, 2, key(), Duration::from_secs(5)).unwrap();
    assert!(!client.hosts_server());
    assert_eq!(client.get("racer1").unwrap().unwrap(), b"here");
}

#[test]
fn connect_or_host_on_port_zero_reports_the_real_port() {
    let s = TcpStore::connect_or_host("127.0.0.1:0", true, 2, key(), Duration::from_secs(5)).unwrap();
    let real = s.hosted_addr().unwrap();
    assert_ne!(real.port(), 0);
    let other = TcpStore::connect(&real.to_string(), key(), Duration::from_secs(5)).unwrap();
    s.set("k", b"v").unwrap();
    assert_eq!(other.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn connect_to_nothing_fails_after_the_timeout_naming_the_address() {
    let addr = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    let err = TcpStore::connect(&addr, key(), Duration::from_millis(300)).unwrap_err();
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    let msg = err.to_string();
    assert!(msg.contains(&addr), "{msg}");
    let err = TcpStore::connect("no-port-here", key(), Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
}

#[test]
fn a_late_server_is_found_by_the_retry_loop() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let client = {
        let addr = addr.clone();
        std::thread::spawn(move || TcpStore::connect(&addr, key(), Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(100));
    let _server = TcpStoreServer::bind(&addr, key()).unwrap();
    let s = client.join().unwrap().unwrap();
    s.set("k", b"v").unwrap();
    assert_eq!(s.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn host_names_resolve() {
    let server = TcpStoreServer::bind("127.0.0.1:0", key()).unwrap();
    let port = server.local_addr().port();
    // "localhost" may resolve to ::1 first; the client must fall through to 127.0.0.1.
    let s = TcpStore::connect(&format!("localhost:{port}"), key(), Duration::from_secs(5)).unwrap();
    s.set("k", b"v").unwrap();
    assert_eq!(s.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn ipv6_loopback_works() {
    let server = match TcpStoreServer::bind("[::1]:0", key()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIPPED ipv6_loopback_works: this machine cannot bind [::1]: {e}");
            return;
        }
    };
    let addr = format!("[::1]:{}", server.local_addr().port());
    let s = TcpStore::connect(&addr, key(), Duration::from_secs(5)).unwrap();
    s.set("v6", b"yes").unwrap();
    assert_eq!(s.get("v6").unwrap().unwrap(), b"yes");
    assert_eq!(s.add("n", 2).unwrap(), 2);
    let hosted = TcpStore::connect_or_host("[::1]:0", true, 2, key(), Duration::from_secs(5)).unwrap();
    assert!(hosted.hosted_addr().unwrap().is_ipv6());
    hosted.set("k", b"v").unwrap();
    assert_eq!(hosted.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn dropping_the_server_stops_it_and_wakes_waiters() {
    let (server, s) = server_and_client();
    let addr = server.local_addr();
    let s = Arc::new(s);
    let waiter = {
        let s = s.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            (s.wait(&["never"], Duration::from_secs(30)), start.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    drop(server);
    assert!(start.elapsed() < Duration::from_secs(2), "drop took {:?}", start.elapsed());
    let (result, waited) = waiter.join().unwrap();
    assert!(result.is_err());
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(TcpStream::connect(addr).is_err(), "listener still open after drop");
    assert!(s.get("x").is_err());
}

#[test]
fn store_handshake_decoders_reject_what_they_should() {
    let (server, client) = (auth::challenge(), auth::challenge());
    let hello = encode_client_hello(&key(), &client, &server);
    assert_eq!(decode_client_hello(&hello, &key(), &server).unwrap(), client);
    assert!(decode_client_hello(&hello, &JobKey::from_text("x"), &server).unwrap_err().contains(KEY_NOT_PROVEN));
    assert!(decode_client_hello(&hello, &key(), &auth::challenge()).is_err());
    assert!(decode_client_hello(&hello[..CLIENT_HELLO_LEN - 1], &key(), &server).is_err());
    let mut v2 = hello;
    v2[8] = 2;
    assert!(decode_client_hello(&v2, &key(), &server).unwrap_err().contains("version 2"));
    let proof = server_proof(&key(), &server, &client);
    assert!(verify_server_proof(&key(), &client, &server, &proof));
    // The client's own proof reflected back is not the server's.
    assert!(!verify_server_proof(&key(), &client, &server, &hello[12 + auth::CHALLENGE_LEN..]));
    assert_eq!(decode_server_hello(&encode_server_hello(&server)).unwrap(), server);
    assert!(decode_server_hello(&[0; SERVER_HELLO_LEN]).unwrap_err().contains("magic"));
}

#[test]
fn client_and_server_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<TcpStore>();
    check::<TcpStoreServer>();
}

/// Counts the bytes this thread has allocated and not freed while tracking is
/// on, and the peak of that count: what decoding one request cost in memory.
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Counting;

    thread_local! {
        // Const-initialised and without destructors: usable from inside the allocator.
        static TRACKING: Cell<bool> = const { Cell::new(false) };
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    fn note(delta: isize) {
        let _ = TRACKING.try_with(|t| {
            if t.get() {
                let live = LIVE.get() + delta;
                LIVE.set(live);
                PEAK.set(PEAK.get().max(live));
            }
        });
    }

    // SAFETY: every call is forwarded unchanged to the system allocator, which
    // upholds GlobalAlloc's contract; the bookkeeping touches only thread-locals.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same layout contract as our caller's.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                note(layout.size() as isize);
            }
            p
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            note(-(layout.size() as isize));
            // SAFETY: `ptr` came from `alloc`/`realloc` above with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: forwarded with the caller's guarantees on `ptr`, `layout` and `new_size`.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                note(new_size as isize - layout.size() as isize);
            }
            p
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// Run `f` and return its result and the peak of the bytes it held allocated.
    pub fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
        LIVE.set(0);
        PEAK.set(0);
        TRACKING.set(true);
        let out = f();
        TRACKING.set(false);
        (out, PEAK.get().max(0) as usize)
    }
}

/// Requests that start well-formed and then turn into arbitrary bytes: lengths
/// that lie, counts that lie, bodies cut short.
fn request_prefix() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    prop_oneof![
        Just(vec![]),
        (any::<u32>()).prop_map(|len| [&[OP_SET][..], &len.to_le_bytes()].concat()),
        (any::<u32>()).prop_map(|len| [&[OP_SET, 1, 0, 0, 0, b'k'][..], &len.to_le_bytes()].concat()),
        (any::<u32>()).prop_map(|n| [&[OP_WAIT][..], &n.to_le_bytes()].concat()),
        (0u32..=MAX_WAIT_KEYS as u32).prop_map(|n| [&[OP_WAIT][..], &n.to_le_bytes(), &[0, 16, 0, 0]].concat()),
        Just(vec![OP_GET, 0, 16, 0, 0]),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 1500, ..Default::default() })]

    /// Arbitrary bytes never panic the request decoder, and decoding never holds
    /// more memory than a small multiple of the bytes that arrived plus one
    /// 64 KiB chunk and a key, whatever lengths and counts the bytes claim. (The
    /// multiple: a value's buffer doubles as it fills, and each key of a WAIT
    /// costs a 24-byte `String` for its 4 length bytes, doubled by the `Vec`.)
    #[test]
    fn read_request_survives_arbitrary_bytes(
        prefix in request_prefix(),
        tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
        zeros in proptest::prelude::any::<bool>(),
        repeat in 0usize..40,
    ) {
        let mut input = prefix;
        // Zeros are the cheapest keys there are: the worst case for a WAIT.
        let tail = if zeros { vec![0; tail.len()] } else { tail };
        for _ in 0..=repeat {
            input.extend_from_slice(&tail);
        }
        let (requests, peak) = counting::peak_of(|| {
            let mut r = &input[..];
            let mut n = 0usize;
            // Every request the bytes hold, until they run out or stop making sense.
            while let Ok(Some(req)) = read_request(&mut r) {
                drop(req);
                n += 1;
            }
            n
        });
        proptest::prop_assert!(requests <= input.len(), "{requests} requests from {} bytes", input.len());
        let bound = 16 * input.len() + (64 << 10) + MAX_KEY + 4096;
        proptest::prop_assert!(peak <= bound, "decoding {} bytes held {peak} bytes at once", input.len());
    }

    /// The client's hello never passes without the key's proof.
    #[test]
    fn client_hello_decoder_rejects_arbitrary_bytes(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120),
        with_prefix in proptest::prelude::any::<bool>(),
    ) {
        let mut bytes = bytes;
        if with_prefix && bytes.len() >= 12 {
            bytes[..8].copy_from_slice(&STORE_MAGIC);
            bytes[8..12].copy_from_slice(&STORE_VERSION.to_le_bytes());
        }
        let server = auth::challenge();
        proptest::prop_assert!(decode_client_hello(&bytes, &key(), &server).is_err());
        let _ = decode_server_hello(&bytes);
    }
}
