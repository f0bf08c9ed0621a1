//! Tests of TCP links and mesh setup: threads as ranks, a `MemStore` as the
//! store, port 0 everywhere (tests run in parallel).

use super::*;
use crate::auth::JobKey;
use crate::bootstrap::MemStore;
use crate::transport::ifaces::AddrFamily;
use std::io::Write;
use std::net::TcpStream;
use std::os::fd::BorrowedFd;

use super::handshake::PROTOCOL_VERSION;
use crate::auth::{Challenge, CHALLENGE_LEN};
use nix::poll::{PollFd, PollFlags, PollTimeout};

type Mesh = Result<Vec<Option<TcpLink>>>;

fn opts(rank: usize, world: usize, prefix: &str) -> MeshOptions {
    let mut o = MeshOptions::new(rank, world, prefix);
    o.ifname = Some("lo".into());
    o.timeout = Duration::from_secs(20);
    o.comm_id = 0xb7a1d;
    o
}

/// Run `body(rank, mesh)` on one thread per rank in `ranks`, all meeting in `store`.
fn run_ranks<T: Send>(
    store: &MemStore,
    ranks: &[usize],
    make: impl Fn(usize) -> MeshOptions + Sync,
    body: impl Fn(usize, Mesh) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let (make, body) = (&make, &body);
        let handles: Vec<_> =
            ranks.iter().map(|&r| s.spawn(move || body(r, connect_mesh(&make(r), store as &dyn Store)))).collect();
        handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// Sleep until the link's socket is ready for `events`, at most 100 ms.
fn wait_ready(link: &TcpLink, events: PollFlags) {
    let fd = link.poll_fd().expect("tcp links have a descriptor");
    // SAFETY: the link owns the descriptor and outlives this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let _ = nix::poll::poll(&mut [PollFd::new(fd, events)], PollTimeout::from(100u16));
}

fn send_all(link: &mut TcpLink, data: &[u8]) {
    let mut off = 0;
    while off < data.len() {
        match link.try_write(&[&data[off..]]).unwrap() {
            0 => wait_ready(link, PollFlags::POLLOUT),
            n => off += n,
        }
    }
}

fn recv_exact(link: &mut TcpLink, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut off = 0;
    while off < len {
        match link.try_read(&mut buf[off..]).unwrap() {
            0 => wait_ready(link, PollFlags::POLLIN),
            n => off += n,
        }
    }
    buf
}

/// A message naming both ends, with a length that differs per pair.
fn message(from: usize, to: usize) -> Vec<u8> {
    let mut m = format!("hello from {from} to {to}:").into_bytes();
    m.extend((0..(from * 7 + to * 13) % 50).map(|i| i as u8));
    m
}

#[test]
fn meshes_of_1_2_3_5_exchange_between_every_pair() {
    for world in [1usize, 2, 3, 5] {
        let store = MemStore::new();
        let ranks: Vec<usize> = (0..world).collect();
        let prefix = format!("mesh{world}");
        run_ranks(
            &store,
            &ranks,
            |r| opts(r, world, &prefix),
            |rank, mesh| {
                let mut links = mesh.unwrap();
                assert_eq!(links.len(), world);
                for (j, l) in links.iter().enumerate() {
                    assert_eq!(l.is_none(), j == rank, "rank {rank} slot {j}");
                    if let Some(l) = l {
                        assert_eq!((l.peer(), l.kind()), (j, TransportKind::Tcp));
                        assert!(l.peer_addr().ip().is_loopback());
                    }
                }
                // Small messages fit the socket buffers: write all, then read all.
                for (j, l) in links.iter_mut().enumerate() {
                    if let Some(l) = l {
                        let m = message(rank, j);
                        send_all(l, &(m.len() as u32).to_le_bytes());
                        send_all(l, &m);
                    }
                }
                for (j, l) in links.iter_mut().enumerate() {
                    if let Some(l) = l {
                        let len = u32::from_le_bytes(recv_exact(l, 4).try_into().unwrap()) as usize;
                        assert_eq!(recv_exact(l, len), message(j, rank), "rank {rank} from {j}");
                    }
                }
            },
        );
    }
}

#[test]
fn peers_mask_links_only_the_marked_pairs() {
    // World 4 where 0-1 and 2-3 share hosts (served by shm): tcp links only across.
    let store = MemStore::new();
    let across = |a: usize, b: usize| a != b && (a < 2) != (b < 2);
    let ranks: Vec<usize> = (0..4).collect();
    run_ranks(
        &store,
        &ranks,
        |r| {
            let mut o = opts(r, 4, "masked");
            o.peers = Some((0..4).map(|p| across(r, p)).collect());
            o
        },
        |rank, mesh| {
            let mut links = mesh.unwrap();
            for (j, l) in links.iter_mut().enumerate() {
                assert_eq!(l.is_some(), across(rank, j), "rank {rank} slot {j}");
                if let Some(l) = l {
                    send_all(l, &message(rank, j));
                }
            }
            for (j, l) in links.iter_mut().enumerate() {
                if let Some(l) = l {
                    assert_eq!(recv_exact(l, message(j, rank).len()), message(j, rank));
                }
            }
        },
    );
    // A rank with nobody to link with returns at once, without waiting for anyone.
    let mut o = opts(1, 3, "alone");
    o.peers = Some(vec![false, false, false]);
    assert!(connect_mesh(&o, &store).unwrap().iter().all(Option::is_none));
    o.peers = Some(vec![true]);
    assert!(matches!(connect_mesh(&o, &store), Err(Error::InvalidArgument(_))));
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn bidirectional_32_mib_without_deadlock() {
    const LEN: usize = 32 << 20;
    let store = MemStore::new();
    let out = run_ranks(
        &store,
        &[0, 1],
        |r| opts(r, 2, "bidi"),
        |rank, mesh| {
            let mut links = mesh.unwrap();
            let link = links[1 - rank].as_mut().unwrap();
            let data = pattern(rank as u64 + 1, LEN);
            let mut got = vec![0u8; LEN];
            let (mut sent, mut recvd) = (0, 0);
            let start = Instant::now();
            // Both sides write before reading: only a loop that interleaves the two
            // directions without blocking can finish.
            while sent < LEN || recvd < LEN {
                let mut moved = false;
                if sent < LEN {
                    // Two slices, as the executor sends header + payload.
                    let end = (sent + (1 << 20)).min(LEN);
                    let mid = (sent + 16).min(end);
                    let n = link.try_write(&[&data[sent..mid], &data[mid..end]]).unwrap();
                    sent += n;
                    moved |= n > 0;
                }
                if recvd < LEN {
                    let n = link.try_read(&mut got[recvd..]).unwrap();
                    recvd += n;
                    moved |= n > 0;
                }
                if !moved {
                    let mut ev = PollFlags::empty();
                    if sent < LEN {
                        ev |= PollFlags::POLLOUT;
                    }
                    if recvd < LEN {
                        ev |= PollFlags::POLLIN;
                    }
                    wait_ready(link, ev);
                }
            }
            let secs = start.elapsed().as_secs_f64();
            assert!(got == pattern(2 - rank as u64, LEN), "rank {rank} received corrupted bytes");
            secs
        },
    );
    let secs = out.iter().cloned().fold(0.0, f64::max);
    println!("32 MiB each way over loopback: {:.1} ms, {:.2} GB/s per direction", secs * 1e3, LEN as f64 / secs / 1e9);
}

#[test]
fn read_after_peer_closes_or_drops_is_unexpected_eof() {
    let store = MemStore::new();
    run_ranks(
        &store,
        &[0, 1, 2],
        |r| opts(r, 3, "eof"),
        |rank, mesh| {
            let mut links = mesh.unwrap();
            match rank {
                // Rank 1 writes, then closes: rank 0 reads the bytes, then EOF.
                1 => {
                    let l = links[0].as_mut().unwrap();
                    send_all(l, b"bye");
                    l.close();
                    drop(links.remove(2)); // and drops its link to rank 2 outright
                }
                2 => drop(links.remove(0)),
                _ => {
                    let l = links[1].as_mut().unwrap();
                    assert_eq!(recv_exact(l, 3), b"bye");
                    let deadline = Instant::now() + Duration::from_secs(10);
                    let err = loop {
                        match l.try_read(&mut [0u8; 16]) {
                            Ok(0) if Instant::now() < deadline => wait_ready(l, PollFlags::POLLIN),
                            Ok(n) => panic!("read {n} bytes after close"),
                            Err(e) => break e,
                        }
                    };
                    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
                    assert!(err.to_string().contains("rank 1"), "{err}");
                }
            }
            // Rank 2's link to rank 0 was dropped (fully closed); the other end of
            // rank 1 <-> 2 sees EOF too.
            if rank == 2 {
                let l = links[0].as_mut().unwrap(); // after remove(0), index 0 is rank 1
                assert_eq!(l.peer(), 1);
                let err = loop {
                    match l.try_read(&mut [0u8; 16]) {
                        Ok(0) => wait_ready(l, PollFlags::POLLIN),
                        Ok(n) => panic!("read {n} bytes from a dropped link"),
                        Err(e) => break e,
                    }
                };
                assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
            }
        },
    );
}

#[test]
fn write_to_a_dropped_peer_is_an_error_not_sigpipe() {
    let store = MemStore::new();
    let mut links = run_ranks(&store, &[0, 1], |r| opts(r, 2, "pipe"), |_, m| m.unwrap());
    let mut l1 = links.pop().unwrap().remove(0).unwrap();
    drop(links); // rank 0 goes away entirely
    let chunk = vec![7u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        assert!(Instant::now() < deadline, "writes to a closed peer kept succeeding");
        match l1.try_write(&[&chunk]) {
            Ok(0) => wait_ready(&l1, PollFlags::POLLOUT),
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    assert!(matches!(err.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset), "{err}");
}

/// A blocking client that connects to `addr` and sends `bytes`.
fn stranger(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(bytes).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Whether the server closed `s` without sending a byte (a read timeout is not a close).
fn closed_without_reply(mut s: TcpStream) -> bool {
    match s.read(&mut [0u8; 64]) {
        Ok(n) => n == 0,
        Err(e) => !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
    }
}

fn hello(comm_id: u64, from: u32, to: u32) -> [u8; HELLO_LEN] {
    encode_hello(comm_id, from as usize, to as usize, &crate::auth::challenge())
}

const KEY: &str = "tcp-test-job-key";

/// Test options with the job key `KEY`.
fn keyed(rank: usize, world: usize, prefix: &str) -> MeshOptions {
    let mut o = opts(rank, world, prefix);
    o.key = JobKey::from_text(KEY);
    o
}

/// The listening address rank `rank` publishes under `prefix`.
fn published(store: &MemStore, prefix: &str, rank: usize) -> SocketAddr {
    let raw = store.wait_get(&address_key(prefix, rank), Duration::from_secs(10)).unwrap();
    String::from_utf8(raw).unwrap().parse().unwrap()
}

/// Play the connector `from` by hand against the acceptor `to` at `addr`, proving
/// `key`: hello, ack (verified when `check_ack`), proof. Returns the stream and
/// whether the acceptor's ack proved the same key.
fn connect_as(addr: SocketAddr, key: &JobKey, comm: u64, from: usize, to: usize) -> (TcpStream, bool) {
    let ours = crate::auth::challenge();
    let mut s = stranger(addr, &encode_hello(comm, from, to, &ours));
    let mut ack = [0u8; ACK_LEN];
    s.read_exact(&mut ack).unwrap();
    let verified = decode_ack(&ack, key, comm, from, to, &ours);
    // Without the key there is no way to check the ack: answer anyway, as an impostor would.
    let theirs: Challenge = ack[HEADER_LEN..HEADER_LEN + CHALLENGE_LEN].try_into().unwrap();
    s.write_all(&encode_proof(key, comm, from, to, &ours, &theirs)).unwrap();
    (s, verified.is_ok())
}

#[test]
fn strangers_are_dropped_and_the_mesh_still_forms() {
    let store = MemStore::new();
    let o = |r| keyed(r, 2, "strangers");
    std::thread::scope(|s| {
        let r0 = s.spawn(|| connect_mesh(&o(0), &store));
        let addr = published(&store, "strangers", 0);
        let comm = o(0).comm_id;
        // One that connects and says nothing must not hold up the others.
        let _silent = TcpStream::connect(addr).unwrap();
        let bad = [
            stranger(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            stranger(addr, &hello(comm + 1, 1, 0)), // another communicator
            stranger(addr, &hello(comm, 5, 0)),     // rank out of range
            stranger(addr, &hello(comm, 1, 1)),     // addressed to another rank
            stranger(addr, &[0u8; HELLO_LEN - 1]),  // short garbage, then silence
        ];
        // A version-1 peer (the 32-byte hello of the unauthenticated protocol) is
        // refused as soon as its header is in, though its hello is short.
        let mut v1 = hello(comm, 1, 0);
        v1[8] = 1;
        let old_version = stranger(addr, &v1[..HEADER_LEN]);
        assert!(closed_without_reply(old_version), "a version-1 hello was not dropped at once");
        let r1 = s.spawn(|| connect_mesh(&o(1), &store));
        let (m0, m1) = (r0.join().unwrap().unwrap(), r1.join().unwrap().unwrap());
        assert_eq!(m0[1].as_ref().unwrap().peer(), 1);
        assert_eq!(m1[0].as_ref().unwrap().peer(), 0);
        for (i, b) in bad.into_iter().enumerate() {
            assert!(closed_without_reply(b), "stranger {i} was not dropped");
        }
    });
}

#[test]
fn random_bytes_during_setup_are_dropped_and_the_mesh_forms() {
    let store = MemStore::new();
    let o = |r| keyed(r, 3, "noise");
    std::thread::scope(|s| {
        let r0 = s.spawn(|| connect_mesh(&o(0), &store));
        let addr = published(&store, "noise", 0);
        let mut noise = Vec::new();
        for i in 0..24u64 {
            let mut bytes = pattern(i + 100, 1 + (i as usize * 37) % 300);
            if i % 2 == 0 {
                // Past the magic check, so the header and the proof checks are what refuse it.
                bytes.splice(0..0, MAGIC);
            }
            noise.push(stranger(addr, &bytes));
        }
        let r1 = s.spawn(|| connect_mesh(&o(1), &store));
        let r2 = s.spawn(|| connect_mesh(&o(2), &store));
        let meshes = [r0, r1, r2].map(|h| h.join().unwrap().unwrap());
        for (rank, m) in meshes.iter().enumerate() {
            for (j, l) in m.iter().enumerate() {
                assert_eq!(l.as_ref().map(|l| l.peer()), (j != rank).then_some(j), "rank {rank} slot {j}");
            }
        }
        // The links are the real ranks: bytes cross between every pair.
        let [mut m0, mut m1, _] = meshes;
        send_all(m1[0].as_mut().unwrap(), b"from 1");
        assert_eq!(recv_exact(m0[1].as_mut().unwrap(), 6), b"from 1");
        for (i, n) in noise.into_iter().enumerate() {
            assert!(closed_without_reply(n), "noise connection {i} got a reply or stayed open");
        }
    });
}

#[test]
fn an_impostor_without_the_key_cannot_take_a_ranks_place() {
    // A real rank 0 of 3; ranks 1 and 2 played by hand.
    let store = MemStore::new();
    let o = keyed(0, 3, "dup");
    let key = o.key.clone();
    std::thread::scope(|s| {
        let r0 = s.spawn(|| connect_mesh(&o, &store));
        let addr = published(&store, "dup", 0);
        // Impostors claim rank 1 first: one answers with a proof under a guessed
        // key, one under no key, one stops after its hello.
        let (guessed, ack_ok) = connect_as(addr, &JobKey::from_text("guess"), o.comm_id, 1, 0);
        assert!(!ack_ok, "an ack verified under the wrong key");
        let (keyless, _) = connect_as(addr, &JobKey::none(), o.comm_id, 1, 0);
        let mut silent = stranger(addr, &hello(o.comm_id, 1, 0));
        silent.read_exact(&mut [0u8; ACK_LEN]).unwrap();
        // They were refused, and the rank stayed free for its real owner.
        assert!(closed_without_reply(guessed), "an impostor with a guessed key was kept");
        assert!(closed_without_reply(keyless), "an impostor without a key was kept");
        let (mut real1, ack_ok) = connect_as(addr, &key, o.comm_id, 1, 0);
        assert!(ack_ok, "rank 0's ack did not prove the job key");
        // A second proven claim of rank 1 is a duplicate: refused before any ack.
        assert!(closed_without_reply(stranger(addr, &hello(o.comm_id, 1, 0))), "duplicate rank 1 accepted");
        let (_real2, ack_ok) = connect_as(addr, &key, o.comm_id, 2, 0);
        assert!(ack_ok);
        let links = r0.join().unwrap().unwrap();
        assert!(links[1].is_some() && links[2].is_some());
        // The link of rank 1 is the real one: its bytes arrive there.
        real1.write_all(b"ping").unwrap();
        let mut l1 = links.into_iter().nth(1).unwrap().unwrap();
        assert_eq!(recv_exact(&mut l1, 4), b"ping");
        send_all(&mut l1, b"pong");
        let mut back = [0u8; 4];
        real1.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"pong");
        // The silent impostor got nothing more and is closed with the setup.
        assert!(closed_without_reply(silent));
    });
}

#[test]
fn a_flood_past_max_pending_does_not_push_out_a_real_ranks_handshake() {
    // A real rank 0 with room for 4 unproven connections; rank 1 played by hand.
    let store = MemStore::new();
    let mut o = keyed(0, 2, "flood");
    o.max_pending = 4;
    o.timeout = Duration::from_secs(10);
    let (comm, key) = (o.comm_id, o.key.clone());
    std::thread::scope(|s| {
        let r0 = s.spawn(|| connect_mesh(&o, &store));
        let addr = published(&store, "flood", 0);
        // The real rank 1 is half way: its hello sent, rank 0's ack in, its proof not yet sent.
        let ours = crate::auth::challenge();
        let mut real = stranger(addr, &encode_hello(comm, 1, 0, &ours));
        let mut ack = [0u8; ACK_LEN];
        real.read_exact(&mut ack).unwrap();
        let theirs = decode_ack(&ack, &key, comm, 1, 0, &ours).unwrap();
        // Three times the cap of strangers that never speak, then the cap of
        // strangers that claim rank 1 in a valid hello and stop there.
        let _silent: Vec<TcpStream> = (0..12).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let claimants: Vec<TcpStream> = (0..4).map(|_| stranger(addr, &hello(comm, 1, 0))).collect();
        // Each claimant is answered or dropped: rank 0 has taken in the whole flood.
        for mut c in claimants {
            let _ = c.read_exact(&mut [0u8; ACK_LEN]);
        }
        // The real rank's proof still lands, and its link is the one made.
        let proof = real.write_all(&encode_proof(&key, comm, 1, 0, &ours, &theirs));
        let links = r0.join().unwrap();
        proof.unwrap();
        let mut l1 = links.unwrap().into_iter().nth(1).unwrap().unwrap();
        real.write_all(b"real").unwrap();
        assert_eq!(recv_exact(&mut l1, 4), b"real");
    });
}

#[test]
fn ranks_with_different_keys_fail_naming_the_key_and_the_peer() {
    for (k0, k1) in [(JobKey::from_text("key-a"), JobKey::from_text("key-b")), (JobKey::from_text("k"), JobKey::none())]
    {
        let store = MemStore::new();
        let errs = run_ranks(
            &store,
            &[0, 1],
            |r| {
                let mut o = opts(r, 2, "wrongkey");
                o.timeout = Duration::from_millis(1500);
                o.key = if r == 0 { k0.clone() } else { k1.clone() };
                o
            },
            |_, mesh| mesh.unwrap_err(),
        );
        for (rank, e) in errs.iter().enumerate() {
            match e {
                Error::Protocol { ctx, peer, detail } => {
                    assert_eq!((ctx.rank, *peer), (rank, 1 - rank), "{e}");
                    assert!(detail.contains("job key") && detail.contains("BRAID_JOB_KEY"), "rank {rank}: {e}");
                }
                other => panic!("rank {rank}: expected a job-key error, got {other}"),
            }
        }
    }
}

#[test]
fn connect_retries_past_a_stale_address() {
    // A previous run left rank 0's key pointing at a port where nobody listens:
    // rank 1 is refused, retries, reads the key again and meets the real rank 0.
    let store = MemStore::new();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    store.set("stale/tcp/0", dead.to_string().as_bytes()).unwrap();
    std::thread::scope(|s| {
        let r1 = s.spawn(|| connect_mesh(&opts(1, 2, "stale"), &store));
        std::thread::sleep(Duration::from_millis(100));
        let m0 = connect_mesh(&opts(0, 2, "stale"), &store).unwrap();
        let m1 = r1.join().unwrap().unwrap();
        let (mut a, mut b) = (m0.into_iter().nth(1).unwrap().unwrap(), m1.into_iter().next().unwrap().unwrap());
        assert_eq!(a.peer_addr(), b.local_addr().unwrap());
        send_all(&mut b, b"late");
        assert_eq!(recv_exact(&mut a, 4), b"late");
    });
}

#[test]
fn a_rank_that_never_comes_times_out_naming_it() {
    for (present, missing) in [(vec![0usize, 1], 2usize), (vec![0, 2], 1)] {
        let store = MemStore::new();
        let prefix = format!("absent{missing}");
        let start = Instant::now();
        let errs = run_ranks(
            &store,
            &present,
            |r| {
                let mut o = opts(r, 3, &prefix);
                o.timeout = Duration::from_millis(300);
                o
            },
            |_, mesh| mesh.unwrap_err(),
        );
        assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
        for (rank, e) in present.iter().zip(errs) {
            match &e {
                Error::Timeout { ctx, waiting_on, timeout, .. } => {
                    assert_eq!(ctx.rank, *rank);
                    assert_eq!(*timeout, Duration::from_millis(300));
                    assert_eq!(waiting_on, &vec![missing], "rank {rank}: {e}");
                }
                other => panic!("rank {rank}: expected a timeout, got {other}"),
            }
            assert!(e.to_string().contains(&format!("[{missing}]")), "{e}");
        }
    }
}

#[test]
fn ipv6_loopback_mesh() {
    let has_v6 = ifaces::list_interfaces().unwrap().iter().any(|i| i.loopback && i.up && i.addr.is_ipv6());
    if !has_v6 || Socket::new(Domain::IPV6, Type::STREAM, None).is_err() {
        println!("skipping ipv6_loopback_mesh: no IPv6 loopback address on this machine");
        return;
    }
    let store = MemStore::new();
    run_ranks(
        &store,
        &[0, 1, 2],
        |r| {
            let mut o = opts(r, 3, "v6");
            o.family = Some(AddrFamily::V6);
            o
        },
        |rank, mesh| {
            let mut links = mesh.unwrap();
            for (j, l) in links.iter_mut().enumerate() {
                if let Some(l) = l {
                    assert_eq!(l.peer_addr().ip(), "::1".parse::<std::net::IpAddr>().unwrap());
                    send_all(l, &message(rank, j));
                }
            }
            for (j, l) in links.iter_mut().enumerate() {
                if let Some(l) = l {
                    assert_eq!(recv_exact(l, message(j, rank).len()), message(j, rank));
                }
            }
        },
    );
    assert_eq!(String::from_utf8(store.get("v6/tcp/0").unwrap().unwrap()).unwrap().chars().next(), Some('['));
}

#[test]
fn default_interface_mesh() {
    // No spec: the default policy (eth0 here, loopback on a machine without a network).
    let store = MemStore::new();
    run_ranks(
        &store,
        &[0, 1],
        |r| {
            let mut o = opts(r, 2, "default");
            o.ifname = None;
            o
        },
        |rank, mesh| {
            let mut links = mesh.unwrap();
            let l = links[1 - rank].as_mut().unwrap();
            send_all(l, &[rank as u8; 5]);
            assert_eq!(recv_exact(l, 5), vec![1 - rank as u8; 5]);
        },
    );
}

#[test]
fn bad_interface_spec_is_a_config_error() {
    let mut o = opts(0, 2, "badif");
    o.ifname = Some("=no-such-if0".into());
    let err = connect_mesh(&o, &MemStore::new()).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(err.to_string().contains("no-such-if0") && err.to_string().contains("lo ("), "{err}");
    assert!(matches!(connect_mesh(&opts(2, 2, "x"), &MemStore::new()), Err(Error::InvalidArgument(_))));
}

#[test]
fn handshake_checks_every_field() {
    let good = hello(9, 3, 1);
    let (from, ch) = decode_hello(&good, 9, 1).unwrap();
    assert_eq!((from, &ch[..]), (3, &good[HEADER_LEN..]));
    assert_eq!(
        Header::decode(&good, KIND_HELLO, 9, 1).unwrap(),
        Header { version: PROTOCOL_VERSION, kind: KIND_HELLO, comm_id: 9, from: 3, to: 1 }
    );
    let mut bad_magic = good;
    bad_magic[0] ^= 1;
    assert!(decode_hello(&bad_magic, 9, 1).unwrap_err().contains("magic"));
    assert!(Header::decode(&good, KIND_ACK, 9, 1).unwrap_err().contains("kind"));
    assert!(decode_hello(&good, 8, 1).unwrap_err().contains("communicator"));
    assert!(decode_hello(&good, 9, 2).unwrap_err().contains("addressed to rank 1"));
    assert!(decode_hello(&good[..HELLO_LEN - 1], 9, 1).unwrap_err().contains("bytes"));
    let mut v = good;
    v[8..12].copy_from_slice(&7u32.to_le_bytes());
    assert!(decode_hello(&v, 9, 1).unwrap_err().contains("version 7"));
}

#[test]
fn ack_and_proof_verify_only_under_the_key_and_for_their_link() {
    let key = JobKey::from_text("k");
    let (c, a) = (crate::auth::challenge(), crate::auth::challenge());
    // Rank 2 connects to rank 0 of communicator 5.
    let ack = encode_ack(&key, 5, 0, 2, &a, &c);
    assert_eq!(decode_ack(&ack, &key, 5, 2, 0, &c).unwrap(), a);
    let proof = encode_proof(&key, 5, 2, 0, &c, &a);
    decode_proof(&proof, &key, 5, 2, 0, &a, &c).unwrap();
    let wrong = JobKey::from_text("j");
    assert!(decode_ack(&ack, &wrong, 5, 2, 0, &c).unwrap_err().contains(KEY_NOT_PROVEN));
    assert!(decode_proof(&proof, &wrong, 5, 2, 0, &a, &c).unwrap_err().contains(KEY_NOT_PROVEN));
    // Another challenge (a replay), or the ack's proof passed off as the connector's.
    assert!(decode_ack(&ack, &key, 5, 2, 0, &crate::auth::challenge()).is_err());
    let mut reflected = proof;
    reflected[HEADER_LEN..].copy_from_slice(&ack[HEADER_LEN + CHALLENGE_LEN..]);
    assert!(decode_proof(&reflected, &key, 5, 2, 0, &a, &c).is_err());
    // A proof made for the link 1 -> 0 does not open the link 2 -> 0.
    let for_rank1 = encode_proof(&key, 5, 1, 0, &c, &a);
    let mut relabelled = for_rank1;
    relabelled[24..28].copy_from_slice(&2u32.to_le_bytes());
    assert!(decode_proof(&relabelled, &key, 5, 2, 0, &a, &c).unwrap_err().contains(KEY_NOT_PROVEN));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, ..Default::default() })]

    /// Arbitrary bytes never panic a decoder and never pass as an ack or a proof;
    /// neither does a valid message with any one byte changed.
    #[test]
    fn handshake_decoders_reject_arbitrary_bytes(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        with_header in proptest::prelude::any::<bool>(),
        flip_at in 0usize..ACK_LEN,
        flip in 1u8..=255,
    ) {
        let key = JobKey::from_text("k");
        let (c, a) = (crate::auth::challenge(), crate::auth::challenge());
        let mut bytes = bytes;
        if with_header && bytes.len() >= HEADER_LEN {
            // A well-formed header in front, so the proof check is what must refuse it.
            let kind = if bytes.len() % 2 == 0 { KIND_ACK } else { KIND_PROOF };
            Header::new(kind, 5, 0, 2).put(&mut bytes[..HEADER_LEN]);
        }
        let _ = Header::decode(&bytes, KIND_HELLO, 5, 0);
        let _ = decode_hello(&bytes, 5, 0);
        proptest::prop_assert!(decode_ack(&bytes, &key, 5, 2, 0, &c).is_err());
        proptest::prop_assert!(decode_proof(&bytes, &key, 5, 2, 0, &a, &c).is_err());
        let mut ack = encode_ack(&key, 5, 0, 2, &a, &c);
        ack[flip_at] ^= flip;
        proptest::prop_assert!(decode_ack(&ack, &key, 5, 2, 0, &c).is_err());
        let mut proof = encode_proof(&key, 5, 2, 0, &c, &a);
        proof[flip_at % PROOF_MSG_LEN] ^= flip;
        proptest::prop_assert!(decode_proof(&proof, &key, 5, 2, 0, &a, &c).is_err());
    }
}
