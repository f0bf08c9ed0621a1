//! Telling torch's store from braid's at a `tcp://` address, and the store
//! torchrun's variables name.

use super::*;
use crate::auth::JobKey;
use crate::bootstrap::torch_store::detect::{connect_tcp_url, identify, Server, SPEAK_FIRST};
use crate::bootstrap::{TcpStore, TcpStoreServer};
use std::collections::HashMap;

fn key() -> JobKey {
    JobKey::from_text("detection-test-key")
}

#[test]
fn rank_0_joins_torchs_store_where_it_would_have_waited_for_a_greeting() {
    let m = mock();
    let addr = m.addr().to_string();
    for host_if_absent in [true, false] {
        let start = Instant::now();
        let url = format!("tcp://{addr}");
        let store = crate::bootstrap::connect_store(&url, host_if_absent, 3, key(), Duration::from_secs(3)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
        store.set(&format!("from/{host_if_absent}"), b"v").unwrap();
        assert_eq!(client(&m).get(&format!("from/{host_if_absent}")).unwrap().unwrap(), b"v");
    }
}

#[test]
fn braids_own_server_is_still_joined_as_braids_store() {
    let server = TcpStoreServer::bind("127.0.0.1:0", key()).unwrap();
    let addr = server.local_addr().to_string();
    for host_if_absent in [true, false] {
        let store = connect_tcp_url(&addr, host_if_absent, 2, key(), T).unwrap();
        store.set("k", b"braid").unwrap();
        assert_eq!(TcpStore::connect(&addr, key(), T).unwrap().get("k").unwrap().unwrap(), b"braid");
    }
    let (s, _) = connect_until(&addr, Instant::now() + T, false).unwrap().unwrap();
    assert_eq!(identify(&s, &addr, T).unwrap(), Server::Braid);
}

#[test]
fn a_braid_greeting_later_than_the_window_is_still_recognised() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        std::thread::sleep(SPEAK_FIRST + Duration::from_millis(200));
        c.write_all(&[&b"BRAIDKVS"[..], &[0u8; 36]].concat()).unwrap();
        // Hold the connection until the client is done with it.
        let _ = c.read(&mut [0u8; 64]);
    });
    let (s, _) = connect_until(&addr, Instant::now() + T, false).unwrap().unwrap();
    assert_eq!(identify(&s, &addr, T).unwrap(), Server::Braid);
    drop(s);
    server.join().unwrap();
}

#[test]
fn with_nothing_listening_rank_0_hosts_braids_store() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let store = connect_tcp_url(&addr, true, 2, key(), T).unwrap();
    store.set("k", b"hosted").unwrap();
    assert_eq!(TcpStore::connect(&addr, key(), T).unwrap().get("k").unwrap().unwrap(), b"hosted");
    drop(store);
    // A non-host finds nothing, and says so at its deadline.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let err = connect_tcp_url(&format!("127.0.0.1:{port}"), false, 2, key(), Duration::from_millis(300))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("nothing accepted"), "{err}");
}

#[test]
fn a_server_that_is_neither_store_is_refused_naming_braid_store() {
    let silent = MockTorchServer::start(MockFault::Silent).unwrap();
    let start = Instant::now();
    let err = connect_tcp_url(&silent.addr().to_string(), true, 2, key(), Duration::from_millis(500))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    assert!(err.contains("neither greeted") && err.contains("BRAID_STORE"), "{err}");

    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        c.write_all(b"SSH-2.0-OpenSSH\r\n").unwrap();
        let _ = c.read(&mut [0u8; 64]);
    });
    let err = connect_tcp_url(&addr, false, 2, key(), T).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("spoke first") && err.contains("BRAID_STORE"), "{err}");
    server.join().unwrap();
}

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| map.get(k).cloned()
}

const TORCHRUN: &[(&str, &str)] = &[
    ("RANK", "2"),
    ("WORLD_SIZE", "3"),
    ("LOCAL_RANK", "2"),
    ("LOCAL_WORLD_SIZE", "3"),
    ("MASTER_ADDR", "localhost"),
    ("MASTER_PORT", "29511"),
    ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ("TORCHELASTIC_RUN_ID", "44cf-2a85"),
    ("TORCHELASTIC_RESTART_COUNT", "1"),
];

#[test]
fn under_torchruns_agent_every_rank_is_a_client_keyed_by_run_and_restart() {
    let cfg = crate::config::Config::from_lookup(env(TORCHRUN)).unwrap();
    assert_eq!((cfg.rank, cfg.world_size, cfg.launcher), (2, 3, "torchrun"));
    assert_eq!(cfg.store.as_deref(), Some("torch://localhost:29511?prefix=braid/44cf-2a85/1"));
    // rank 0 too; BRAID_STORE still wins.
    let rank0 = [TORCHRUN, &[("RANK", "0")]].concat();
    let url = torchrun_store_url(&env(&rank0)).unwrap().unwrap();
    assert!(url.starts_with("torch://"), "{url}");
    let chosen = [TORCHRUN, &[("BRAID_STORE", "file:///tmp/x")]].concat();
    assert_eq!(crate::config::Config::from_lookup(env(&chosen)).unwrap().store.as_deref(), Some("file:///tmp/x"));

    let get = |extra: &[(&str, &str)]| torchrun_store_url(&env(&[TORCHRUN, extra].concat()));
    assert_eq!(
        get(&[("TORCHELASTIC_RUN_ID", "job/a b")]).unwrap().unwrap(),
        "torch://localhost:29511?prefix=braid/job%2Fa%20b/1"
    );
    assert_eq!(get(&[("TORCHELASTIC_RUN_ID", "")]).unwrap().unwrap(), "torch://localhost:29511?prefix=braid/none/1");
    assert_eq!(
        get(&[("MASTER_ADDR", "fd00::1")]).unwrap().unwrap(),
        "torch://[fd00::1]:29511?prefix=braid/44cf-2a85/1"
    );
    assert_eq!(get(&[("TORCHELASTIC_USE_AGENT_STORE", "False")]).unwrap().unwrap(), "tcp://localhost:29511");
    for bad in
        [("MASTER_PORT", "0"), ("MASTER_PORT", "http"), ("TORCHELASTIC_RESTART_COUNT", "-1"), ("MASTER_ADDR", " ")]
    {
        let err = get(&[bad]).unwrap_err();
        assert!(matches!(&err, Error::Config(m) if m.contains(bad.0)), "{bad:?}: {err}");
    }
    let long = "r".repeat(2000);
    assert!(get(&[("TORCHELASTIC_RUN_ID", long.as_str())]).is_err());
    assert_eq!(torchrun_store_url(&env(&[("RANK", "0")])).unwrap(), None);
}

#[test]
fn a_restarted_group_does_not_meet_the_keys_of_the_last_attempt() {
    let m = mock();
    let open = |restart: &str| {
        let url = torchrun_store_url(&env(&[
            TORCHRUN,
            &[("MASTER_ADDR", "127.0.0.1")],
            &[("MASTER_PORT", &m.addr().port().to_string())],
            &[("TORCHELASTIC_RESTART_COUNT", restart)],
        ]
        .concat()))
        .unwrap()
        .unwrap();
        crate::bootstrap::connect_store(&url, true, 3, key(), T).unwrap()
    };
    // A rank's claim in attempt 0 is left behind by its failure.
    assert_eq!(open("0").add("braid/comm0/claim/0", 1).unwrap(), 1);
    assert_eq!(open("1").add("braid/comm0/claim/0", 1).unwrap(), 1);
    // The same attempt sees its own keys.
    assert_eq!(open("1").add("braid/comm0/claim/0", 1).unwrap(), 2);
}

#[test]
fn a_failure_to_meet_names_the_launcher_what_it_derived_and_the_fix() {
    let silent = MockTorchServer::start(MockFault::Silent).unwrap();
    let port = silent.addr().port().to_string();
    let vars = [TORCHRUN, &[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port.as_str()), ("BRAID_TIMEOUT", "300ms")]]
        .concat();
    let cfg = crate::config::Config::from_lookup(env(&vars)).unwrap();
    let err = crate::CommunicatorBuilder::from_config(cfg).build().map(|_| ()).unwrap_err().to_string();
    for part in ["launcher torchrun", "rank 2 of 3", "torch://127.0.0.1:", "did not answer torch's ping", "BRAID_STORE"]
    {
        assert!(err.contains(part), "`{part}` missing from: {err}");
    }
}
