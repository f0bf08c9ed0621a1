//! Strangers at a running job's doors (issue 15, acceptance 2): clients without the
//! job key and clients sending random bytes hit the store port and every data port
//! during and after set-up, while two `braid perf --check` ranks run. They can
//! neither read nor write the store nor take a rank's place, the ranks log them,
//! and the job's results stay exact.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use braid::bootstrap::{Store, TcpStore, TcpStoreServer};
use braid::JobKey;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Connect, write `bytes`, and report whether the other end answered anything
/// before closing (it must not: strangers get no reply).
fn poke(addr: SocketAddr, bytes: &[u8]) -> Option<bool> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    let _ = s.write_all(bytes);
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut buf = [0u8; 256];
    // The store server greets every connection with its challenge; what matters is
    // that nothing but that greeting ever comes back.
    let mut got = 0;
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got += n;
    }
    Some(got > 64)
}

/// The IPv4 addresses process `pid` listens on (its data-link listener during set-up).
fn listening_addrs(pid: u32) -> Vec<SocketAddr> {
    let mut inodes = HashSet::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in dir.flatten() {
            if let Ok(t) = std::fs::read_link(e.path()) {
                let t = t.to_string_lossy().into_owned();
                if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    inodes.insert(i.to_owned());
                }
            }
        }
    }
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else { return Vec::new() };
    let mut addrs = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st ... inode: state 0A is LISTEN; the address
        // is the IPv4 address as a native-endian hex u32, then the port in hex.
        if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
            let Some((ip, port)) = f[1].split_once(':') else { continue };
            let (Ok(ip), Ok(port)) = (u32::from_str_radix(ip, 16), u16::from_str_radix(port, 16)) else { continue };
            let mut ip = std::net::Ipv4Addr::from(ip.to_ne_bytes());
            if ip.is_unspecified() {
                ip = std::net::Ipv4Addr::LOCALHOST;
            }
            addrs.push(SocketAddr::from((ip, port)));
        }
    }
    addrs
}

/// A byte-for-byte proxy to the store at `to` that holds any request naming a
/// data-link address key (`mesh/tcp/`) for two seconds before passing it on.
fn stalling_proxy(to: SocketAddr) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(to) else { return };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = c_in.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if buf[..n].windows(9).any(|w| w == b"mesh/tcp/") {
                        std::thread::sleep(Duration::from_secs(2));
                    }
                    if s_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = s_out.shutdown(std::net::Shutdown::Write);
            });
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_in, &mut c_out);
                let _ = c_out.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    addr
}

fn perf_rank(rank: usize, world: usize, store: &str, key: &str, transport: &str) -> Child {
    Command::new(BRAID)
        .args(["perf", "--op", "all-reduce", "--min-bytes", "4K", "--max-bytes", "1M", "--factor", "16"])
        .args(["--iters", "20", "--warmup", "2", "--check"])
        .env("BRAID_RANK", rank.to_string())
        .env("BRAID_WORLD_SIZE", world.to_string())
        .env("BRAID_STORE", store)
        .env("BRAID_JOB_KEY", key)
        .env("BRAID_TIMEOUT", "30")
        .env("BRAID_TRANSPORTS", transport)
        .env("BRAID_DEBUG", "braid=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn run_job_under_attack(transport: &str) {
    let key_text = JobKey::generate_text();
    let key = JobKey::from_text(&key_text);
    let server = TcpStoreServer::bind("127.0.0.1:0", key.clone()).unwrap();
    let store_addr = server.local_addr();
    let url = format!("tcp://{store_addr}");
    let stop = Arc::new(AtomicBool::new(false));
    let data_pokes = Arc::new(AtomicUsize::new(0));

    // Store attackers: wrong key, no key, random bytes; all the time.
    let store_attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for k in [JobKey::from_text("guessed"), JobKey::none()] {
                    let r = TcpStore::connect(&store_addr.to_string(), k, Duration::from_millis(500));
                    assert!(r.is_err(), "a client without the job key connected to the store");
                }
                let answered = poke(store_addr, &noise(rounds, 700));
                assert_ne!(answered, Some(true), "the store answered random bytes");
                rounds += 1;
            }
            rounds
        })
    };

    // Over TCP the last rank reaches the store through a proxy that holds back its
    // reads of the other ranks' data-link addresses for a while: the others then sit
    // in set-up, listening, while the strangers knock. (Shared memory has no ports.)
    let world = if transport == "tcp" { 3 } else { 2 };
    let slow_url = if transport == "tcp" { format!("tcp://{}", stalling_proxy(store_addr)) } else { url.clone() };
    let mut ranks: Vec<Child> = (0..world)
        .map(|r| perf_rank(r, world, if r == world - 1 { &slow_url } else { &url }, &key_text, transport))
        .collect();
    let data_attacker = {
        let (stop, pokes) = (stop.clone(), data_pokes.clone());
        let pids: Vec<u32> = ranks[..world - 1].iter().map(Child::id).collect();
        std::thread::spawn(move || {
            let mut seed = 7u64;
            while !stop.load(Ordering::Relaxed) {
                for addr in pids.iter().flat_map(|&pid| listening_addrs(pid)) {
                    // Random bytes, then bytes that start like a braid hello claiming a rank.
                    let mut hello = b"BRAIDTCP".to_vec();
                    hello.extend_from_slice(&2u32.to_le_bytes()); // protocol version
                    hello.extend_from_slice(&1u32.to_le_bytes()); // kind: hello
                    hello.extend_from_slice(&noise(seed, 8)); // a guessed communicator id
                    hello.extend_from_slice(&2u32.to_le_bytes()); // from rank 2
                    hello.extend_from_slice(&0u32.to_le_bytes()); // to rank 0
                    hello.extend_from_slice(&noise(seed + 1, 32)); // a challenge
                    for bytes in [noise(seed, 300), hello] {
                        if poke(addr, &bytes).is_some() {
                            pokes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    seed += 2;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    // Both pipes of every rank are drained at once: the strangers make the ranks log
    // a lot, and a rank blocked on a full stderr pipe would never finish its stdout.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let readers: Vec<_> = ranks
        .iter_mut()
        .map(|c| {
            let out = drain(c.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
            let err = drain(c.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
            (out, err)
        })
        .collect();
    let mut outs = Vec::new();
    for (child, (out, err)) in ranks.iter_mut().zip(readers) {
        let status = child.wait().unwrap();
        outs.push((status, out.join().unwrap(), err.join().unwrap()));
    }
    stop.store(true, Ordering::Relaxed);
    let store_rounds = store_attacker.join().expect("store attacker assertion failed");
    data_attacker.join().unwrap();

    for (rank, (status, out, err)) in outs.iter().enumerate() {
        assert!(status.success(), "{transport}: rank {rank} failed under attack\n{out}\n{err}");
    }
    let (_, out0, err0) = &outs[0];
    assert!(out0.contains("# Out of bounds values : 0 OK"), "{transport}: results not exact\n{out0}");
    assert!(store_rounds >= 1, "the store attacker never ran");
    if transport == "tcp" {
        let pokes = data_pokes.load(Ordering::Relaxed);
        assert!(pokes >= 4, "only {pokes} connections reached the data ports during set-up");
        assert!(err0.contains("tcp mesh: dropping"), "{transport}: rank 0 did not log the strangers\n{err0}");
    }
    // The job's own keys are in the store and readable with the key only.
    let legit = TcpStore::connect(&store_addr.to_string(), key, Duration::from_secs(5)).unwrap();
    assert!(legit.get("braid/comm0/nonce").unwrap().is_some(), "the job's keys are where the job put them");
}

#[test]
fn strangers_at_the_store_and_data_ports_change_nothing_over_tcp() {
    run_job_under_attack("tcp");
}

#[test]
fn strangers_at_the_store_change_nothing_over_shared_memory() {
    run_job_under_attack("shm");
}
