//! Tests of the torch store client: its bytes against torch's recorded ones, its
//! behaviour against the mock, and its deadlines against servers that misbehave.

use super::mock::{MockFault, MockTorchServer};
use super::transcript::STEPS;
use super::*;
use std::io::{Read, Write};
use std::net::TcpListener;

mod detection;

const T: Duration = Duration::from_secs(5);

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
}

fn mock() -> MockTorchServer {
    MockTorchServer::start(MockFault::None).unwrap()
}

fn client(m: &MockTorchServer) -> TorchStore {
    TorchStore::connect(&m.addr().to_string(), T).unwrap()
}

/// What this client sends for the call torch's client made in `step` (torch's
/// GET waits first; its keys carry its `/` prefix).
fn ours(step: &str, nonce: u32) -> Vec<u8> {
    let r = match step {
        "connect" => wire::validate().then(wire::ping(nonce)),
        "set" => wire::set("/key1", b"value1"),
        "wait_then_get" => wire::keys(wire::OP_WAIT, &["/key1"]).then(wire::get("/key1")),
        "add_5" => wire::add("/ctr", 5),
        "add_minus_2" => wire::add("/ctr", -2),
        "check_ready" => wire::keys(wire::OP_CHECK, &["/key1"]),
        "check_not_ready" => wire::keys(wire::OP_CHECK, &["/key1", "/nokey"]),
        "wait_ready" => wire::keys(wire::OP_WAIT, &["/key1"]),
        "wait_then_cancel" => wire::keys(wire::OP_WAIT, &["/nokey"]).then(wire::cancel_wait()),
        "delete_present" | "delete_absent" => wire::delete("/key1"),
        "wait_then_get_counter" => wire::keys(wire::OP_WAIT, &["/ctr"]).then(wire::get("/ctr")),
        other => panic!("transcript step `{other}` has no counterpart here: pin it"),
    };
    r.0
}

#[test]
fn requests_are_the_bytes_torchs_own_client_sends() {
    let connect = &STEPS[0];
    assert_eq!(connect.name, "connect");
    let nonce = u32::from_le_bytes(unhex(connect.server).try_into().expect("the echo is 4 bytes"));
    for step in STEPS {
        assert_eq!(ours(step.name, nonce), unhex(step.client), "step `{}`", step.name);
    }
}

#[test]
fn the_mock_answers_torchs_client_byte_for_byte_as_torchs_server_did() {
    let m = mock();
    let mut s = TcpStream::connect(m.addr()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    for step in STEPS {
        s.write_all(&unhex(step.client)).unwrap();
        let want = unhex(step.server);
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got).unwrap_or_else(|e| panic!("step `{}`: {e}", step.name));
        assert_eq!(got, want, "step `{}`", step.name);
    }
    // Nothing more than torch answered (SET has no reply).
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut extra = [0u8; 1];
    assert!(s.read(&mut extra).is_err(), "the mock said more than torch did");
}

/// A connected pair of loopback sockets.
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    (a, l.accept().unwrap().0)
}

#[test]
fn torchs_recorded_replies_decode() {
    let reply = |name: &str| unhex(STEPS.iter().find(|s| s.name == name).unwrap().server);
    let (ours, theirs) = pair();
    let mut feed = &theirs;
    let deadline = || Instant::now() + T;
    feed.write_all(&reply("wait_then_get")).unwrap();
    assert_eq!(wire::read_u8(&ours, deadline()).unwrap(), wire::WAIT_STOP_WAITING);
    assert_eq!(wire::read_value(&ours, deadline()).unwrap(), b"value1");
    feed.write_all(&reply("add_5")).unwrap();
    assert_eq!(wire::read_i64(&ours, deadline()).unwrap(), 5);
    feed.write_all(&reply("add_minus_2")).unwrap();
    assert_eq!(wire::read_i64(&ours, deadline()).unwrap(), 3);
    feed.write_all(&[reply("check_ready"), reply("check_not_ready")].concat()).unwrap();
    assert!(check_reply(wire::read_u8(&ours, deadline()).unwrap()).unwrap());
    assert!(!check_reply(wire::read_u8(&ours, deadline()).unwrap()).unwrap());
    feed.write_all(&reply("wait_then_cancel")).unwrap();
    assert_eq!(wire::read_u8(&ours, deadline()).unwrap(), wire::WAIT_CANCELED);
    // ADD stores decimal text, as the mock does.
    feed.write_all(&reply("wait_then_get_counter")).unwrap();
    assert_eq!(wire::read_u8(&ours, deadline()).unwrap(), wire::WAIT_STOP_WAITING);
    assert_eq!(wire::read_value(&ours, deadline()).unwrap(), b"3");
}

#[test]
fn set_get_add_delete_ping() {
    let m = mock();
    let s = client(&m);
    // The mock closes the connection on GET of an absent key, as torch's older
    // server does: an absent key must be found by CHECK first.
    assert_eq!(s.get("a").unwrap(), None);
    s.set("a", b"one").unwrap();
    assert_eq!(s.get("a").unwrap().unwrap(), b"one");
    s.set("a", b"").unwrap();
    assert_eq!(s.get("a").unwrap().unwrap(), b"");
    assert_eq!(s.add("n", 5).unwrap(), 5);
    assert_eq!(s.add("n", -7).unwrap(), -2);
    assert_eq!(s.get("n").unwrap().unwrap(), b"-2");
    assert!(s.delete("a").unwrap());
    assert!(!s.delete("a").unwrap());
    assert_eq!(s.get("a").unwrap(), None);
    s.ping().unwrap();
    let big: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
    s.set("big", &big).unwrap();
    assert_eq!(client(&m).get("big").unwrap().unwrap(), big);
    let err = s.set(&"k".repeat(wire::MAX_KEY + 1), b"v").unwrap_err().to_string();
    assert!(err.contains("limit"), "{err}");
}

#[test]
fn a_wait_sees_a_later_set_while_other_calls_go_on() {
    let m = mock();
    let s = Arc::new(client(&m));
    let waiter = {
        let s = s.clone();
        std::thread::spawn(move || s.wait(&["x", "y"], Duration::from_secs(20)))
    };
    std::thread::sleep(Duration::from_millis(50));
    // The waiting thread holds one connection; these calls use another.
    s.set("x", b"1").unwrap();
    assert_eq!(s.add("count", 1).unwrap(), 1);
    s.set("y", b"2").unwrap();
    waiter.join().unwrap().unwrap();
    s.wait(&[], Duration::from_millis(1)).unwrap();
    // Keys that are set satisfy a wait whose timeout is over before it is sent.
    s.wait(&["x", "y"], Duration::from_nanos(1)).unwrap();
}

#[test]
fn a_wait_whose_keys_come_as_it_is_cancelled_succeeds() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut hello = [0u8; 10];
        c.read_exact(&mut hello).unwrap();
        c.write_all(&hello[6..]).unwrap();
        let wait = wire::keys(wire::OP_WAIT, &["k"]).0;
        let mut req = vec![0u8; wait.len()];
        c.read_exact(&mut req).unwrap();
        assert_eq!(req, wait);
        let mut cancel = [0u8; 1];
        c.read_exact(&mut cancel).unwrap();
        assert_eq!(cancel[0], wire::OP_CANCEL_WAIT);
        // The keys were set just before the cancel arrived: torch answers both.
        c.write_all(&[wire::WAIT_STOP_WAITING, wire::WAIT_CANCELED]).unwrap();
        let _ = c.read(&mut cancel);
    });
    let s = TorchStore::connect(&addr.to_string(), T).unwrap();
    s.wait(&["k"], Duration::from_millis(100)).unwrap();
    drop(s);
    server.join().unwrap();
}

#[test]
fn a_timed_out_wait_names_only_the_missing_keys_and_leaves_the_client_usable() {
    let m = mock();
    let s = client(&m);
    s.set("here", b"1").unwrap();
    let start = Instant::now();
    let err = s.wait(&["here", "gone1", "gone2"], Duration::from_millis(150)).unwrap_err().to_string();
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(150), "returned after {took:?}");
    assert!(took < Duration::from_secs(5), "hung for {took:?}");
    assert!(err.contains("gone1") && err.contains("gone2") && !err.contains("\"here\""), "{err}");
    assert!(err.contains("timed out after 150ms"), "{err}");
    // The cancel was answered, so the pooled connection's framing is intact.
    s.set("gone1", b"x").unwrap();
    assert_eq!(s.get("gone1").unwrap().unwrap(), b"x");
}

#[test]
fn concurrent_adds_count_exactly() {
    let m = mock();
    let s = Arc::new(client(&m));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    s.add("n", 1).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(s.add("n", 0).unwrap(), 300);
}

/// TCP links listen on the route to the store by default: torch's store gives it as
/// braid's does (the mock listens on loopback, so the route starts there).
#[test]
fn the_route_to_torchs_store_is_known() {
    let m = mock();
    assert_eq!(client(&m).route_source(), Some(m.addr().ip()));
}

#[test]
fn a_torch_url_keys_under_its_prefix() {
    let m = mock();
    let url = format!("{}?prefix=braid/run%2F1/0", m.addr());
    let scoped = open_url(&url, T).unwrap();
    scoped.set("k", b"v").unwrap();
    assert_eq!(client(&m).get("braid/run%2F1/0/k").unwrap().unwrap(), b"v");
    assert_eq!(client(&m).get("k").unwrap(), None);
    let plain = open_url(&m.addr().to_string(), T).unwrap();
    assert_eq!(plain.get("braid/run%2F1/0/k").unwrap().unwrap(), b"v");
    for bad in [format!("{}?ttl=3", m.addr()), "localhost".into(), "localhost:99999".into(), ":80".into()] {
        let err = open_url(&bad, T).map(|_| ()).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{bad}: {err}");
    }
}

fn connect_err(m: &MockTorchServer, timeout: Duration) -> String {
    let start = Instant::now();
    let err = TorchStore::connect(&m.addr().to_string(), timeout).unwrap_err().to_string();
    assert!(start.elapsed() < timeout + Duration::from_secs(3), "took {:?}", start.elapsed());
    err
}

#[test]
fn a_server_that_does_not_echo_the_ping_is_refused_naming_braid_store() {
    let silent = MockTorchServer::start(MockFault::Silent).unwrap();
    let err = connect_err(&silent, Duration::from_millis(300));
    assert!(err.contains("did not answer torch's ping") && err.contains("BRAID_STORE"), "{err}");
    let wrong = MockTorchServer::start(MockFault::WrongEcho).unwrap();
    let err = connect_err(&wrong, T);
    assert!(err.contains("not its nonce") && err.contains("BRAID_STORE"), "{err}");
    let braid = crate::bootstrap::TcpStoreServer::bind("127.0.0.1:0", crate::auth::JobKey::none()).unwrap();
    let err = TorchStore::connect(&braid.local_addr().to_string(), T).unwrap_err().to_string();
    assert!(err.contains("braid's own store") && err.contains("tcp://"), "{err}");
}

#[test]
fn nothing_listening_fails_at_the_deadline() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let start = Instant::now();
    let err = TorchStore::connect(&format!("127.0.0.1:{port}"), Duration::from_millis(300)).unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    assert!(err.contains("nothing accepted") && err.contains("BRAID_STORE"), "{err}");
}

#[test]
fn an_oversized_value_length_is_refused_before_reading_it() {
    let m = MockTorchServer::start(MockFault::HugeValue).unwrap();
    let s = client(&m);
    s.set("k", b"v").unwrap();
    let err = s.get("k").unwrap_err().to_string();
    assert!(err.contains("over the limit"), "{err}");
}

#[test]
fn a_wait_ends_with_an_error_when_the_server_closes_or_answers_garbage() {
    let m = MockTorchServer::start(MockFault::CloseInWait).unwrap();
    let s = client(&m);
    let start = Instant::now();
    let err = s.wait(&["never"], Duration::from_secs(30)).unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert!(err.contains("closed") || err.contains("reset"), "{err}");

    let m = MockTorchServer::start(MockFault::GarbageWait).unwrap();
    let err = client(&m).wait(&["never"], Duration::from_secs(30)).unwrap_err().to_string();
    assert!(err.contains("WAIT answered 7"), "{err}");
}

#[test]
fn a_wait_ends_within_its_timeout_when_the_server_is_killed() {
    let m = mock();
    let s = Arc::new(client(&m));
    let waiter = {
        let s = s.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            (s.wait(&["never"], Duration::from_secs(30)), start.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    m.kill();
    let (result, took) = waiter.join().unwrap();
    let err = result.unwrap_err().to_string();
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(err.contains("torch store"), "{err}");
}

#[test]
fn a_server_trickling_a_reply_cannot_stretch_the_deadline() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut hello = [0u8; 10];
        c.read_exact(&mut hello).unwrap();
        c.write_all(&hello[6..]).unwrap();
        let mut req = [0u8; 64];
        let _ = c.read(&mut req);
        // READY, then a 40-byte value one byte every 100 ms.
        c.write_all(&[wire::CHECK_READY]).unwrap();
        let _ = c.read(&mut req);
        let _ = c.write_all(&40u64.to_le_bytes());
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(100));
            if c.write_all(b"x").is_err() {
                return;
            }
        }
    });
    let s = TorchStore::connect(&addr.to_string(), Duration::from_millis(500)).unwrap();
    let start = Instant::now();
    let err = s.get("k").unwrap_err().to_string();
    // Each byte came well within the 500 ms timeout; the whole reply would take 4 s.
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    assert!(err.contains("no reply within"), "{err}");
    server.join().unwrap();
}
