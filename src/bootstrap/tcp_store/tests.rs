//! Tests of the TCP store client and server together.

use super::*;
use std::io::Read;
use std::net::TcpListener;
use std::sync::{Arc, Barrier};

fn server_and_client() -> (TcpStoreServer, TcpStore) {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let client = TcpStore::connect(&server.local_addr().to_string(), Duration::from_secs(5)).unwrap();
    (server, client)
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
    let b = TcpStore::connect(&server.local_addr().to_string(), Duration::from_secs(5)).unwrap();
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
                let own = (t % 2 == 1).then(|| TcpStore::connect(&addr, Duration::from_secs(5)).unwrap());
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

/// Write `bytes` on a raw connection and check that the server closes it.
fn assert_garbage_dropped(addr: SocketAddr, bytes: &[u8]) {
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(bytes).unwrap();
    let mut buf = [0u8; 64];
    match raw.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("server kept a garbage connection open after {bytes:02x?}: {other:?}"),
    }
}

#[test]
fn garbage_is_dropped_and_the_server_keeps_serving() {
    let (server, s) = server_and_client();
    s.set("before", b"1").unwrap();
    let addr = server.local_addr();
    assert_garbage_dropped(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_garbage_dropped(addr, &[0xff; 16]);
    // SET with a key length of 4 GiB - 1.
    assert_garbage_dropped(addr, &[OP_SET, 0xff, 0xff, 0xff, 0xff, 0, 0]);
    // SET with a valid key and a 1 GiB value.
    let mut huge = vec![OP_SET];
    put_bytes(&mut huge, b"k");
    huge.extend_from_slice(&(1u32 << 30).to_le_bytes());
    assert_garbage_dropped(addr, &huge);
    // A key that is not UTF-8.
    let mut bad = vec![OP_GET];
    put_bytes(&mut bad, &[0xc3, 0x28]);
    assert_garbage_dropped(addr, &bad);
    // WAIT for an absurd number of keys.
    assert_garbage_dropped(addr, &[OP_WAIT, 0xff, 0xff, 0xff, 0x7f]);
    // A request cut short by the peer closing is dropped, not waited on forever.
    drop(TcpStream::connect(addr).unwrap().write_all(&[OP_ADD, 3, 0]));

    // The existing client and a new one are both served.
    assert_eq!(s.get("before").unwrap().unwrap(), b"1");
    let fresh = TcpStore::connect(&addr.to_string(), Duration::from_secs(5)).unwrap();
    fresh.set("after", b"2").unwrap();
    assert_eq!(s.get("after").unwrap().unwrap(), b"2");
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
                let s = TcpStore::connect_or_host(&addr, true, Duration::from_secs(5)).unwrap();
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
    let client = TcpStore::connect_or_host(&addr, false, Duration::from_secs(5)).unwrap();
    assert!(!client.hosts_server());
    assert_eq!(client.get("racer1").unwrap().unwrap(), b"here");
}

#[test]
fn connect_or_host_on_port_zero_reports_the_real_port() {
    let s = TcpStore::connect_or_host("127.0.0.1:0", true, Duration::from_secs(5)).unwrap();
    let real = s.hosted_addr().unwrap();
    assert_ne!(real.port(), 0);
    let other = TcpStore::connect(&real.to_string(), Duration::from_secs(5)).unwrap();
    s.set("k", b"v").unwrap();
    assert_eq!(other.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn connect_to_nothing_fails_after_the_timeout_naming_the_address() {
    let addr = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    let err = TcpStore::connect(&addr, Duration::from_millis(300)).unwrap_err();
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    let msg = err.to_string();
    assert!(msg.contains(&addr), "{msg}");
    let err = TcpStore::connect("no-port-here", Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
}

#[test]
fn a_late_server_is_found_by_the_retry_loop() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let client = {
        let addr = addr.clone();
        std::thread::spawn(move || TcpStore::connect(&addr, Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(100));
    let _server = TcpStoreServer::bind(&addr).unwrap();
    let s = client.join().unwrap().unwrap();
    s.set("k", b"v").unwrap();
    assert_eq!(s.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn host_names_resolve() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().port();
    // "localhost" may resolve to ::1 first; the client must fall through to 127.0.0.1.
    let s = TcpStore::connect(&format!("localhost:{port}"), Duration::from_secs(5)).unwrap();
    s.set("k", b"v").unwrap();
    assert_eq!(s.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn ipv6_loopback_works() {
    let server = match TcpStoreServer::bind("[::1]:0") {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIPPED ipv6_loopback_works: this machine cannot bind [::1]: {e}");
            return;
        }
    };
    let addr = format!("[::1]:{}", server.local_addr().port());
    let s = TcpStore::connect(&addr, Duration::from_secs(5)).unwrap();
    s.set("v6", b"yes").unwrap();
    assert_eq!(s.get("v6").unwrap().unwrap(), b"yes");
    assert_eq!(s.add("n", 2).unwrap(), 2);
    let hosted = TcpStore::connect_or_host("[::1]:0", true, Duration::from_secs(5)).unwrap();
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
fn client_and_server_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<TcpStore>();
    check::<TcpStoreServer>();
}
