//! Rank 0 hosts the store as torch's TCPStore master does: on the wildcard address
//! at the port, whatever the host part names here.

use super::*;

const T: Duration = Duration::from_secs(5);

#[test]
fn the_hosted_server_listens_on_every_address_of_the_host() {
    let port = free_port();
    let hosted = TcpStore::connect_or_host(&format!("127.0.0.1:{port}"), true, 2, key(), T).unwrap();
    assert!(hosted.hosts_server());
    assert!(hosted.hosted_addr().unwrap().ip().is_unspecified(), "{:?}", hosted.hosted_addr());
    hosted.set("k", b"v").unwrap();
    // 127.0.0.2 is this host too, but not the address the store was named by: only a
    // wildcard listener answers there.
    let other = TcpStore::connect(&format!("127.0.0.2:{port}"), key(), T).unwrap();
    assert_eq!(other.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn a_name_that_does_not_resolve_yet_is_hosted_not_fatal() {
    let port = free_port();
    // `.invalid` never resolves (RFC 6761): a Kubernetes service before its pod is ready.
    let hosted = TcpStore::connect_or_host(&format!("braid-master.invalid:{port}"), true, 2, key(), T).unwrap();
    assert!(hosted.hosts_server());
    assert_eq!(hosted.addr(), format!("braid-master.invalid:{port}"));
    hosted.set("k", b"v").unwrap();
    let client = TcpStore::connect(&format!("127.0.0.1:{port}"), key(), T).unwrap();
    assert_eq!(client.get("k").unwrap().unwrap(), b"v");
    // Not resolvable, so no route to it is known yet.
    assert_eq!(hosted.route_source(), None);
}

#[test]
fn a_port_taken_here_makes_rank_zero_a_client() {
    let server = TcpStoreServer::bind("127.0.0.1:0", key()).unwrap();
    let addr = server.local_addr().to_string();
    let s = TcpStore::connect_or_host(&addr, true, 2, key(), T).unwrap();
    assert!(!s.hosts_server(), "{s:?}");
    s.set("k", b"v").unwrap();
    let direct = TcpStore::connect(&addr, key(), T).unwrap();
    assert_eq!(direct.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn a_name_of_another_host_is_not_hosted() {
    let port = free_port();
    // TEST-NET-3 is no address of this host: rank 0 connects (and finds nothing there).
    let err = TcpStore::connect_or_host(&format!("203.0.113.7:{port}"), true, 2, key(), Duration::from_millis(300))
        .unwrap_err()
        .to_string();
    assert!(err.contains("203.0.113.7") && err.contains("nothing answered"), "{err}");
    assert!(TcpListener::bind(("0.0.0.0", port)).is_ok(), "rank 0 must not have taken the port");
}

#[test]
fn a_name_that_never_resolves_is_named_with_the_fix() {
    let err =
        TcpStore::connect("braid-never.invalid:29500", key(), Duration::from_millis(300)).unwrap_err().to_string();
    assert!(
        err.contains("`braid-never.invalid`") && err.contains("never resolved") && err.contains("MASTER_ADDR"),
        "{err}"
    );
}

#[test]
fn the_route_to_the_store_is_the_clients_local_address() {
    let port = free_port();
    let hosted = TcpStore::connect_or_host(&format!("127.0.0.1:{port}"), true, 2, key(), T).unwrap();
    let client = TcpStore::connect(&format!("127.0.0.2:{port}"), key(), T).unwrap();
    // The kernel's source for 127.0.0.2 is lo's primary address.
    assert_eq!(client.route_source(), Some("127.0.0.1".parse().unwrap()), "{client:?}");
    // The host's own connection is over loopback; its route is the one to the name.
    assert_eq!(hosted.route_source(), Some("127.0.0.1".parse().unwrap()));
}
