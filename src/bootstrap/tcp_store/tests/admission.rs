//! Admission: connections that have not proven the job key, the connection cap
//! and how a client meets a full server.

use super::*;

/// `n` connections that never send a byte.
fn silent(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
}

/// A real client connects and its calls are served.
fn assert_served(addr: SocketAddr, name: &str) {
    let s = TcpStore::connect(&addr.to_string(), key(), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{name}: a client with the key could not connect: {e}"));
    s.set(name, b"in").unwrap();
    assert_eq!(s.get(name).unwrap().unwrap(), b"in", "{name}");
}

#[test]
fn silent_connections_past_the_cap_do_not_lock_out_real_clients() {
    // Twice the cap of silent strangers: they count toward their own budget, not the cap.
    let server = server_with(StoreLimits { max_connections: 8, ..StoreLimits::default() });
    let addr = server.local_addr();
    let _flood = silent(addr, 16);
    assert_served(addr, "first");
    assert_served(addr, "second");
}

#[test]
fn a_flood_past_the_unproven_budget_evicts_the_oldest_not_real_clients() {
    // A proof deadline far past the test: only eviction can make room.
    let server = server_with(StoreLimits {
        max_unproven: 4,
        proof_deadline: Duration::from_secs(600),
        ..StoreLimits::default()
    });
    let addr = server.local_addr();
    let mut flood = silent(addr, 12);
    assert_served(addr, "real");
    // The oldest were closed to make room, each after the server's hello only.
    for (i, s) in flood.iter_mut().take(8).enumerate() {
        assert_eq!(read_to_close(s).len(), SERVER_HELLO_LEN, "flood connection {i}");
    }
}

#[test]
fn unproven_connections_are_closed_at_the_proof_deadline() {
    // The request deadline stays long: the proof has its own, short one.
    let server = server_with(StoreLimits { proof_deadline: Duration::from_millis(300), ..StoreLimits::default() });
    let addr = server.local_addr();
    let mut quiet = TcpStream::connect(addr).unwrap();
    // A hello cut short after a valid prefix.
    let mut half = TcpStream::connect(addr).unwrap();
    let server_hello = read_array::<SERVER_HELLO_LEN>(&mut half).unwrap();
    let theirs = decode_server_hello(&server_hello).unwrap();
    half.write_all(&encode_client_hello(&key(), &auth::challenge(), &theirs)[..20]).unwrap();
    assert_eq!(read_to_close(&mut quiet).len(), SERVER_HELLO_LEN);
    assert!(read_to_close(&mut half).is_empty());
    assert_served(addr, "after");
}

#[test]
fn a_client_at_the_cap_retries_with_backoff_and_gets_in_once_room_frees() {
    let server = server_with(StoreLimits { max_connections: 3, ..StoreLimits::default() });
    let addr = server.local_addr();
    let s = client_of(&server); // one connection, pooled
    let mut held = vec![authed_raw(addr), authed_raw(addr)];
    // Past the cap a connection is closed at once, before the server's hello.
    let mut refused = TcpStream::connect(addr).unwrap();
    assert!(read_to_close(&mut refused).is_empty());
    // A client retries until its timeout, then says so, naming the store.
    let err = TcpStore::connect(&addr.to_string(), key(), Duration::from_millis(300)).unwrap_err().to_string();
    assert!(err.contains(&addr.to_string()) && err.contains("connection cap") && err.contains("gave up"), "{err}");
    // The connections the server holds are still served.
    s.set("k", b"v").unwrap();
    // One closes while a client waits at the cap: that client gets in.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            held.pop();
        });
        let late = TcpStore::connect(&addr.to_string(), key(), Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("no connection once one closed: {e}"));
        assert_eq!(late.get("k").unwrap().unwrap(), b"v");
    });
}

#[test]
fn a_hosted_store_has_room_for_a_world_above_4096_ranks() {
    let world = 5000;
    let s = TcpStore::connect_or_host("127.0.0.1:0", true, world, key(), Duration::from_secs(5)).unwrap();
    let limits = s.server.as_ref().unwrap().limits().clone();
    assert!(limits.max_connections >= world * StoreLimits::CONNS_PER_RANK, "{limits:?}");
    s.set("k", b"v").unwrap();
}
