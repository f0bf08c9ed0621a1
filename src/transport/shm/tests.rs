//! Tests of shared-memory links. Threads as ranks (a `MemStore`) where one process
//! is enough; real child processes (this test binary run again with a role in
//! the environment, meeting the parent in a `FileStore`) where a second address
//! space or a dying process is the point. Every test uses its own store, so
//! segment names and keys never collide between tests running in parallel.

use super::*;
use crate::bootstrap::{FileStore, MemStore, Store};
use crate::error::{Error, Result};
use segment::MAX_RING_BYTES;
use setup::{attach, attach_published, create, Attached};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const ROLE_ENV: &str = "BRAID_SHM_TEST_ROLE";
const STORE_ENV: &str = "BRAID_SHM_TEST_STORE";
const CHILD_TEST: &str = "transport::shm::tests::child_role";
const BIG: usize = 64 << 20;

fn opts(rank: usize, world: usize) -> ShmOptions {
    let mut o = ShmOptions::new(rank, world, "t");
    o.timeout = Duration::from_secs(30);
    // As with BRAID_CMA=1, so the single-copy paths are exercised.
    o.cma = true;
    o
}

/// Byte `i` of the stream rank `from` sends: not periodic in any ring size.
fn pattern(from: usize, i: usize) -> u8 {
    ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (from as u8) ^ (i >> 20) as u8
}

fn stream(from: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(from, i)).collect()
}

/// Send all of `out` while receiving `expect_len` bytes, on one thread (both
/// directions at once, so two ranks doing this cannot deadlock on full rings).
fn exchange(link: &mut ShmLink, out: &[u8], expect_len: usize) -> Vec<u8> {
    let mut got = vec![0u8; expect_len];
    let (mut sent, mut recvd) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while sent < out.len() || recvd < expect_len {
        let mut moved = 0;
        if sent < out.len() {
            let n = link.try_write(&[&out[sent..(sent + (1 << 20)).min(out.len())]]).unwrap();
            sent += n;
            moved += n;
        }
        if recvd < expect_len {
            let n = link.try_read(&mut got[recvd..]).unwrap();
            recvd += n;
            moved += n;
        }
        if moved == 0 {
            assert!(Instant::now() < deadline, "exchange stalled at sent {sent}, received {recvd}");
            std::thread::yield_now();
        }
    }
    got
}

/// Read until the link reports an error; returns the bytes and the error.
fn read_to_error(link: &mut ShmLink, within: Duration) -> (Vec<u8>, io::Error) {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match link.try_read(&mut buf) {
            Ok(0) => {
                assert!(Instant::now() < deadline, "no error within {within:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return (got, e),
        }
    }
}

fn wait_key(store: &dyn Store, key: &str) -> Vec<u8> {
    store.wait_get(key, Duration::from_secs(30)).unwrap()
}

/// A child process running `child_role` as rank 1 of 2, killed and reaped on drop.
struct ChildRank {
    child: Child,
    dir: PathBuf,
    store: FileStore,
}

impl ChildRank {
    fn spawn(role: &str) -> ChildRank {
        let dir = std::env::temp_dir().join(format!("braid-shm-test-{}-{:016x}", std::process::id(), random_u64()));
        let store = FileStore::open(&dir).unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", CHILD_TEST, "--ignored", "--nocapture", "--test-threads=1", "-q"])
            .env(ROLE_ENV, role)
            .env(STORE_ENV, &dir)
            // The harness's chatter is noise; a failing child still reports on stderr.
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        ChildRank { child, dir, store }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Rank 0's side of the mesh, plus the name the segment had.
    fn connect(&self) -> (ShmLink, PathBuf) {
        let mut links = connect_shm(&opts(0, 2), &self.store).unwrap();
        let name = self.store.get(&segment_key("t", 0, 1)).unwrap().unwrap();
        (links[1].take().unwrap(), PathBuf::from(String::from_utf8(name).unwrap()))
    }

    fn expect_success(mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "child rank failed: {status}");
    }
}

impl Drop for ChildRank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The child side of the multi-process tests; does nothing unless spawned by one.
#[test]
#[ignore = "child role of the multi-process shm tests; they run it themselves"]
fn child_role() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    let store = FileStore::open(std::env::var(STORE_ENV).unwrap()).unwrap();
    let mut links = connect_shm(&opts(1, 2), &store).unwrap();
    let mut link = links[0].take().unwrap();
    assert_eq!(link.peer_pid() as u32, std::os::unix::process::parent_id());
    match role.as_str() {
        "exchange" => {
            let out = stream(1, BIG);
            // SAFETY: `out` outlives the link, whose drop revokes the exposure.
            unsafe { link.expose(out.as_ptr() as usize, out.len()) };
            store.set("child/buf", format!("{}", out.as_ptr() as usize).as_bytes()).unwrap();
            let got = exchange(&mut link, &out, BIG);
            assert!(got == stream(0, BIG), "child received wrong bytes");
            // Single copy: read the parent's send buffer straight out of its memory.
            if link.reads_peer_addresses() {
                let addr: usize = String::from_utf8(wait_key(&store, "parent/buf")).unwrap().parse().unwrap();
                let mut dst = vec![0u8; BIG];
                link.read_peer(addr, &mut dst).unwrap();
                assert!(dst == stream(0, BIG), "read_peer returned wrong bytes");
            }
            store.set("child/done", b"1").unwrap();
            wait_key(&store, "parent/done");
            link.close();
        }
        "revoke" => {
            let mut buf = stream(1, 1 << 20);
            // SAFETY: revoked below, before `buf` is rewritten or freed.
            unsafe { link.expose(buf.as_ptr() as usize, buf.len()) };
            store.set("child/buf", format!("{}", buf.as_ptr() as usize).as_bytes()).unwrap();
            wait_key(&store, "parent/read");
            // The call ends early: withdraw, then reuse the memory as a caller would.
            link.revoke_exposed();
            buf.fill(0xEE);
            store.set("child/revoked", b"1").unwrap();
            wait_key(&store, "parent/done");
            drop(buf);
        }
        "sleep" => std::thread::sleep(Duration::from_secs(60)),
        "close" => {
            let mut off = 0;
            let out = stream(1, 3 << 20);
            while off < out.len() {
                off += link.try_write(&[&out[off..]]).unwrap();
            }
            link.close();
            // Stay alive: the parent must see end-of-stream from the flag, not from our death.
            wait_key(&store, "parent/done");
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn two_processes_exchange_64_mib_both_ways_and_read_peer_memory() {
    let child = ChildRank::spawn("exchange");
    let (mut link, name) = child.connect();
    // Another process opened the memfd through /proc: nothing was ever named in /dev/shm.
    assert!(segment::parse_memfd_handle(name.as_os_str().as_encoded_bytes()).is_some(), "{}", name.display());
    assert_eq!(link.peer(), 1);
    assert_eq!(link.kind(), TransportKind::Shm);
    assert_eq!(link.peer_pid(), child.pid());
    assert!(link.poll_fd().is_none());

    let out = stream(0, BIG);
    // SAFETY: `out` outlives the link, whose drop revokes the exposure.
    unsafe { link.expose(out.as_ptr() as usize, out.len()) };
    child.store.set("parent/buf", format!("{}", out.as_ptr() as usize).as_bytes()).unwrap();
    let got = exchange(&mut link, &out, BIG);
    assert!(got == stream(1, BIG), "parent received wrong bytes");

    // The probe must tell the truth: compare with a raw CMA read of the child.
    let addr: usize = String::from_utf8(wait_key(&child.store, "child/buf")).unwrap().parse().unwrap();
    let mut raw = vec![0u8; 1 << 20];
    let direct = vm_read(child.pid(), addr, &mut raw);
    assert_eq!(link.reads_peer_addresses(), direct.is_ok(), "probe disagrees with a direct read: {direct:?}");
    assert!(link.reads_peer_addresses(), "CMA unavailable here (running as root, so expected): {direct:?}");
    let mut part = vec![0u8; (1 << 20) + 123];
    link.read_peer(addr + 77, &mut part).unwrap();
    assert!(part.iter().enumerate().all(|(i, &b)| b == pattern(1, i + 77)));
    // A bad address is an error, not a panic.
    assert!(link.read_peer(8, &mut part).is_err());

    wait_key(&child.store, "child/done");
    child.store.set("parent/done", b"1").unwrap();
    let (rest, e) = read_to_error(&mut link, Duration::from_secs(30));
    assert!(rest.is_empty());
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    child.expect_success();
}

#[test]
fn a_peer_process_that_revoked_and_reused_its_buffer_is_not_read() {
    let child = ChildRank::spawn("revoke");
    let (mut link, _) = child.connect();
    assert!(link.reads_peer_addresses(), "CMA unavailable here");
    let addr: usize = String::from_utf8(wait_key(&child.store, "child/buf")).unwrap().parse().unwrap();
    let mut dst = vec![0u8; 1 << 20];
    link.read_peer(addr, &mut dst).unwrap();
    assert!(dst == stream(1, 1 << 20), "the exposed buffer read wrong");
    child.store.set("parent/read", b"1").unwrap();
    wait_key(&child.store, "child/revoked");
    dst.fill(0);
    let r = link.read_peer(addr, &mut dst);
    let fresh = dst.iter().filter(|&&b| b == 0xEE).count();
    let e = r.expect_err(&format!("read the revoked buffer ({fresh} bytes of its new contents)"));
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("rank 1"), "{e}");
    child.store.set("parent/done", b"1").unwrap();
    child.expect_success();
}

#[test]
fn a_pull_racing_with_a_revocation_returns_the_exposed_bytes_or_an_error() {
    let store = MemStore::new();
    let meshes = thread_ranks(&store, &[0, 1], |r| opts(r, 2));
    let mut meshes: Vec<Vec<Option<ShmLink>>> = meshes.into_iter().map(|m| m.unwrap()).collect();
    let mut reader = meshes[0][1].take().unwrap();
    let mut owner = meshes[1][0].take().unwrap();
    let mut buf = vec![7u8; 8 << 20];
    let addr = buf.as_ptr() as usize;
    // SAFETY: revoked below before `buf` is rewritten.
    unsafe { owner.expose(addr, buf.len()) };
    let (first_tx, first_rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut dst = vec![0u8; 8 << 20];
        let mut ok = 0;
        while reader.read_peer(addr, &mut dst).is_ok() {
            assert!(dst.iter().all(|&x| x == 7), "a read that succeeded returned rewritten bytes");
            ok += 1;
            if ok == 1 {
                first_tx.send(()).unwrap();
            }
        }
        ok
    });
    first_rx.recv().unwrap();
    owner.revoke_exposed();
    // Rewritten while the reader may still be copying: its copy must fail.
    buf.fill(9);
    assert!(t.join().unwrap() >= 1);
}

#[test]
fn killed_peer_process_is_eof_within_a_second() {
    let mut child = ChildRank::spawn("sleep");
    let (mut link, _) = child.connect();
    assert_eq!(link.try_read(&mut [0u8; 16]).unwrap(), 0);
    child.child.kill().unwrap();
    let killed = Instant::now();
    let (got, e) = read_to_error(&mut link, Duration::from_secs(5));
    assert!(got.is_empty());
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    assert!(killed.elapsed() < Duration::from_secs(1), "took {:?}", killed.elapsed());
    assert!(e.to_string().contains("rank 1"), "{e}");

    // Writing: the ring fills (nobody reads), then the liveness check fails the write.
    let chunk = vec![7u8; 1 << 20];
    let deadline = Instant::now() + Duration::from_secs(5);
    let e = loop {
        match link.try_write(&[&chunk]) {
            Ok(_) => assert!(Instant::now() < deadline, "writes to a dead peer never failed"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
}

#[test]
fn orderly_close_is_eof_after_the_data() {
    let child = ChildRank::spawn("close");
    let (mut link, _) = child.connect();
    let (got, e) = read_to_error(&mut link, Duration::from_secs(30));
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    assert!(e.to_string().contains("closed"), "EOF must come from the close flag, not a death: {e}");
    assert!(got == stream(1, 3 << 20), "wrong bytes before EOF ({} bytes)", got.len());
    child.store.set("parent/done", b"1").unwrap();
    child.expect_success();
}

/// Run `connect_shm` for every rank in `ranks` on its own thread over one `MemStore`.
fn thread_ranks(
    store: &MemStore,
    ranks: &[usize],
    make: impl Fn(usize) -> ShmOptions + Sync,
) -> Vec<Result<Vec<Option<ShmLink>>>> {
    std::thread::scope(|s| {
        let make = &make;
        let hs: Vec<_> = ranks.iter().map(|&r| s.spawn(move || connect_shm(&make(r), store as &dyn Store))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn thread_ranks_link_only_the_marked_pairs() {
    let store = MemStore::new();
    // World 4: pairs 0-2, 1-3 and 2-3; rank 1 and 0 never meet.
    let pairs = [(0, 2), (1, 3), (2, 3)];
    let linked = |a: usize, b: usize| pairs.contains(&(a.min(b), a.max(b)));
    let meshes = thread_ranks(&store, &[0, 1, 2, 3], |r| {
        let mut o = opts(r, 4);
        o.peers = (0..4).map(|p| linked(r, p)).collect();
        o.ring_bytes = 1000;
        o
    });
    let mut meshes: Vec<Vec<Option<ShmLink>>> = meshes.into_iter().map(|m| m.unwrap()).collect();
    for (r, mesh) in meshes.iter().enumerate() {
        for (p, l) in mesh.iter().enumerate() {
            assert_eq!(l.is_some(), r != p && linked(r, p), "rank {r} peer {p}");
        }
    }
    for &(a, b) in &pairs {
        let name = store.get(&segment_key("t", a, b)).unwrap().unwrap();
        assert!(!Path::new(&String::from_utf8(name).unwrap()).exists());
    }
    // 0 -> 2 across a 1000-byte ring (wraps many times), checked byte for byte.
    let mut l02 = meshes[0][2].take().unwrap();
    let mut l20 = meshes[2][0].take().unwrap();
    assert!(l02.reads_peer_addresses() && l20.reads_peer_addresses(), "same-process CMA must work");
    let data = stream(0, 100_000);
    let got = std::thread::scope(|s| {
        s.spawn(|| {
            let mut off = 0;
            while off < data.len() {
                off += l02.try_write(&[&data[off..(off + 777).min(data.len())]]).unwrap();
            }
            l02.close();
        });
        read_to_error(&mut l20, Duration::from_secs(30))
    });
    assert_eq!(got.1.kind(), io::ErrorKind::UnexpectedEof);
    assert!(got.0 == data);
    // Dropping an end tells the other: writes fail with BrokenPipe.
    let mut l32 = meshes[3][2].take().unwrap();
    drop(meshes[2][3].take());
    assert_eq!(l32.try_write(&[b"x"]).unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    let mut dst = [0u8; 16];
    assert!(l32.read_peer(usize::MAX - 4, &mut dst).is_err());
}

#[test]
fn creator_removes_its_segment_when_the_peer_never_comes() {
    let store = MemStore::new();
    let mut o = opts(0, 2);
    o.timeout = Duration::from_millis(200);
    let err = connect_shm(&o, &store).err().expect("rank 1 never attaches");
    match err {
        Error::Timeout { waiting_on, ctx, .. } => {
            assert_eq!(waiting_on, vec![1]);
            assert_eq!(ctx.rank, 0);
        }
        other => panic!("expected a timeout, got {other}"),
    }
    let name = String::from_utf8(store.get(&segment_key("t", 0, 1)).unwrap().unwrap()).unwrap();
    assert!(segment::parse_memfd_handle(name.as_bytes()).is_some(), "{name}");
    // Nothing named, so nothing can be left behind; and no fallback file either.
    assert!(store.get(&setup::file_key("t", 0, 1)).unwrap().is_none());
}

#[test]
fn a_rank_that_cannot_open_the_memfd_gets_a_named_segment_that_is_removed_after_setup() {
    let store = MemStore::new();
    let meshes = thread_ranks(&store, &[0, 1], |r| {
        setup::tests_hook::REFUSE_MEMFD.set(r == 1);
        let mut o = opts(r, 2);
        o.ring_bytes = 1000;
        o
    });
    let mut meshes: Vec<Vec<Option<ShmLink>>> = meshes.into_iter().map(|m| m.unwrap()).collect();
    assert!(store.get(&setup::need_file_key("t", 0, 1)).unwrap().is_some());
    let name = String::from_utf8(store.get(&setup::file_key("t", 0, 1)).unwrap().unwrap()).unwrap();
    assert!(name.starts_with("/dev/shm/braid-") && !Path::new(&name).exists(), "{name}");
    let mut l01 = meshes[0][1].take().unwrap();
    let mut l10 = meshes[1][0].take().unwrap();
    let data = stream(0, 5000);
    let got = std::thread::scope(|s| {
        s.spawn(|| exchange(&mut l01, &data, 0));
        exchange(&mut l10, &[], data.len())
    });
    assert!(got == data);
}

#[test]
fn a_sealed_segment_cannot_be_truncated_by_the_peer() {
    let store = MemStore::new();
    let creator = create(&opts(0, 2), 1, &store).unwrap();
    let published = store.get(&segment_key("t", 0, 1)).unwrap().unwrap();
    let (pid, fd, _) = segment::parse_memfd_handle(&published).expect("a memfd segment here");
    let Attached::Done(attacher) = attach_published(&opts(1, 2), 0, &published, &store).unwrap() else {
        panic!("this process's own memfd must open");
    };
    // The peer, holding the same memory object read-write, tries to shrink and grow it.
    let peer_view = segment::open_memfd(pid, fd).unwrap();
    let len = peer_view.metadata().unwrap().len();
    for to in [0, 4096, len + 4096] {
        let e = peer_view.set_len(to).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "set_len({to}): {e}");
    }
    // SAFETY: plain system call on our descriptor.
    let r = unsafe { libc::fallocate(peer_view.as_raw_fd(), 0, 0, (len + 4096) as libc::off_t) };
    assert_eq!(r, -1, "growing past the seal");
    assert_eq!(peer_view.metadata().unwrap().len(), len);
    let (mut l0, mut l1) = (creator.into_link().unwrap(), attacher.into_link().unwrap());
    assert_eq!(l0.try_write(&[b"still here"]).unwrap(), 10);
    let mut buf = [0u8; 10];
    assert_eq!(l1.try_read(&mut buf).unwrap(), 10);
    assert_eq!(&buf, b"still here");
}

#[test]
fn attacher_times_out_naming_the_missing_lower_rank() {
    let store = MemStore::new();
    let mut o = opts(2, 3);
    o.peers = vec![true, false, true];
    o.timeout = Duration::from_millis(100);
    match connect_shm(&o, &store).err().expect("rank 0 never publishes") {
        Error::Timeout { waiting_on, .. } => assert_eq!(waiting_on, vec![0]),
        other => panic!("expected a timeout, got {other}"),
    }
}

#[test]
fn bad_segment_names_and_options_are_refused() {
    let store = MemStore::new();
    store.set(&segment_key("t", 0, 1), b"/etc/passwd").unwrap();
    let err = connect_shm(&opts(1, 2), &store).err().unwrap().to_string();
    assert!(err.contains("rank 0") && err.contains("/dev/shm"), "{err}");
    store.set(&segment_key("t", 0, 1), b"/dev/shm/../etc/passwd").unwrap();
    assert!(matches!(connect_shm(&opts(1, 2), &store), Err(Error::Protocol { peer: 0, .. })));
    // A handle naming a descriptor that is no sealed memfd (pid 1's stdin): never
    // mapped; a named segment is asked for instead, which never comes.
    store.set(&segment_key("t", 0, 1), b"memfd:1:0:0").unwrap();
    let mut o = opts(1, 2);
    o.timeout = Duration::from_millis(300);
    assert!(matches!(connect_shm(&o, &store), Err(Error::Timeout { .. })));
    assert!(store.get(&setup::need_file_key("t", 0, 1)).unwrap().is_some());
    let mut o = opts(0, 2);
    o.peers = vec![true];
    assert!(matches!(connect_shm(&o, &store), Err(Error::InvalidArgument(_))));
    assert!(matches!(connect_shm(&opts(2, 2), &store), Err(Error::InvalidArgument(_))));
    // Nobody to link with: nothing to wait for.
    let links = connect_shm(&opts(0, 1), &store).unwrap();
    assert!(links.len() == 1 && links[0].is_none());
}

#[test]
fn a_peer_rewriting_the_ring_capacity_after_validation_is_refused() {
    for bad in [1u64 << 40, u64::MAX - 10] {
        let store = MemStore::new();
        let creator = create(&opts(0, 2), 1, &store).unwrap();
        let name = store.get(&segment_key("t", 0, 1)).unwrap().unwrap();
        let Attached::Done(attacher) = attach_published(&opts(1, 2), 0, &name, &store).unwrap() else { panic!() };
        // The creator, playing a bad peer, rewrites the capacity the attacher validated.
        creator.map.header().ring_capacity.store(bad, Ordering::Relaxed);
        let link = attacher.into_link().map(|_| ());
        assert!(link.is_ok(), "the attacher keeps the capacity it validated: {:?}", link.err());
        // And the attacher, playing a bad peer, does the same to the creator.
        let link = creator.into_link().map(|_| ());
        assert!(link.is_ok(), "the creator keeps its own capacity: {:?}", link.err());
    }
}

/// Both ends of one pair, set up by hand (no auth or probe wait), plus the
/// creator's mapping, through which a test plays a peer writing into the segment.
fn hand_made_pair(ring_bytes: usize) -> (ShmLink, ShmLink, Arc<segment::Mapping>) {
    let store = MemStore::new();
    let mut o0 = opts(0, 2);
    o0.ring_bytes = ring_bytes;
    let creator = create(&o0, 1, &store).unwrap();
    let name = store.get(&segment_key("t", 0, 1)).unwrap().unwrap();
    let Attached::Done(attacher) = attach_published(&opts(1, 2), 0, &name, &store).unwrap() else { panic!() };
    let map = creator.map.clone();
    (creator.into_link().unwrap(), attacher.into_link().unwrap(), map)
}

/// The shared `head` (first word) or `tail` (second block) of ring `i` in `map`.
fn ring_counter(map: &segment::Mapping, i: usize, tail: bool) -> &std::sync::atomic::AtomicU64 {
    let (at, _) = map.ring(i).unwrap();
    // SAFETY: a ring region starts with its header: head at offset 0, tail at 128,
    // both 8-aligned u64 atomics inside the mapping `map` keeps alive.
    unsafe { &*(at.as_ptr().add(if tail { 128 } else { 0 }) as *const std::sync::atomic::AtomicU64) }
}

#[test]
fn garbage_ring_counters_in_a_live_segment_are_invalid_data_naming_the_peer() {
    let (mut l0, mut l1, map) = hand_made_pair(4096);
    assert_eq!(l0.try_write(&[b"hello"]).unwrap(), 5);
    // The sender's head jumps far past the capacity: the receiver refuses it.
    ring_counter(&map, 0, false).store(1 << 40, Ordering::Release);
    let mut buf = [0u8; 64];
    let e = l1.try_read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("rank 0"), "{e}");
    assert_eq!(l1.peek(64).unwrap_err().kind(), io::ErrorKind::InvalidData);
    // The receiver's tail runs ahead of everything written: the sender refuses it
    // as soon as it needs more room than it knows to be free (4091 bytes).
    ring_counter(&map, 0, true).store(1 << 40, Ordering::Release);
    let e = l0.try_write(&[&[0u8; 4096]]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("rank 1"), "{e}");
    // A rewritten capacity in the segment or ring header changes nothing.
    map.header().ring_capacity.store(u64::MAX, Ordering::Relaxed);
    ring_counter(&map, 0, false).store(5, Ordering::Release);
    assert_eq!(l1.try_read(&mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
}

#[test]
fn ring_sizes_beyond_the_limit_are_refused_before_anything_is_made() {
    let store = MemStore::new();
    for bad in [0, MAX_RING_BYTES + 1, usize::MAX] {
        let mut o = opts(0, 2);
        o.ring_bytes = bad;
        assert!(matches!(connect_shm(&o, &store), Err(Error::InvalidArgument(_))), "{bad}");
        assert!(matches!(create(&o, 1, &store), Err(Error::InvalidArgument(_))), "{bad}");
    }
    assert!(store.get(&segment_key("t", 0, 1)).unwrap().is_none());
}

/// Connect ranks 0 and 1 as threads with the given keys; both results.
fn connect_pair_with_keys(k0: &str, k1: &str) -> Vec<Result<Vec<Option<ShmLink>>>> {
    let store = MemStore::new();
    thread_ranks(&store, &[0, 1], |r| {
        let mut o = opts(r, 2);
        o.key = crate::auth::JobKey::from_text(if r == 0 { k0 } else { k1 });
        o.timeout = Duration::from_secs(10);
        o
    })
}

#[test]
fn ranks_with_the_same_job_key_link_and_different_keys_fail_on_both_sides() {
    for (k0, k1) in [("secret", "secret"), ("", "")] {
        for r in connect_pair_with_keys(k0, k1) {
            assert!(r.is_ok(), "keys {k0:?}/{k1:?}: {:?}", r.err());
        }
    }
    for (k0, k1) in [("secret", "other"), ("secret", ""), ("", "secret")] {
        let started = Instant::now();
        let rs = connect_pair_with_keys(k0, k1);
        assert!(started.elapsed() < Duration::from_secs(5), "a failed proof must not wait for the timeout");
        for (rank, r) in rs.into_iter().enumerate() {
            match r {
                Err(Error::Protocol { peer, ctx, detail }) => {
                    assert_eq!((ctx.rank, peer), (rank, 1 - rank));
                    assert!(detail.contains("job key"), "{detail}");
                }
                Err(other) => panic!("rank {rank}, keys {k0:?}/{k1:?}: expected a protocol error, got {other}"),
                Ok(_) => panic!("rank {rank}, keys {k0:?}/{k1:?}: linked without the same key"),
            }
        }
    }
}

#[test]
fn a_forged_creator_proof_is_refused_by_the_attacher() {
    let store = MemStore::new();
    let mut o0 = opts(0, 2);
    o0.key = crate::auth::JobKey::from_text("k");
    let mut o1 = opts(1, 2);
    o1.key = o0.key.clone();
    let mut creator = create(&o0, 1, &store).unwrap();
    let name = store.get(&segment_key("t", 0, 1)).unwrap().unwrap();
    let Attached::Done(mut attacher) = attach_published(&o1, 0, &name, &store).unwrap() else { panic!() };
    assert!(creator.advance_auth().unwrap());
    // A stranger rewrites the creator's answer after the verdict.
    segment::store_words(&creator.map.header().proof[0], &[7u8; 32]);
    let e = attacher.advance_auth().expect_err("forged proof accepted").to_string();
    assert!(e.contains("rank 0") && e.contains("job key"), "{e}");
}

#[test]
fn without_cma_registered_single_copy_stays_allowed_and_address_reads_fail_cleanly() {
    let store = MemStore::new();
    let meshes = thread_ranks(&store, &[0, 1], |r| {
        let mut o = opts(r, 2);
        o.cma = false;
        o
    });
    let mut meshes: Vec<Vec<Option<ShmLink>>> = meshes.into_iter().map(|m| m.unwrap()).collect();
    let mut l01 = meshes[0][1].take().unwrap();
    let l10 = meshes[1][0].take().unwrap();
    for l in [&l01, &l10] {
        assert!(l.can_read_peer(), "registered segments are mappable by any rank sharing /dev/shm");
        assert!(!l.reads_peer_addresses(), "CMA was not asked for");
    }
    let src = [5u8; 64];
    let mut dst = [0u8; 64];
    let e = l01.read_peer(src.as_ptr() as usize, &mut dst).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Unsupported);
    assert!(e.to_string().contains("rank 1"), "{e}");
    assert_eq!(dst, [0u8; 64]);
}

#[test]
fn a_fifo_or_symlink_under_a_segment_name_is_refused_without_waiting() {
    let dir = format!("/dev/shm/braid-test-fifo-{}-{:016x}", std::process::id(), random_u64());
    let fifo = std::ffi::CString::new(dir.clone()).unwrap();
    // SAFETY: a NUL-terminated path; creates a FIFO.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let link = format!("{dir}-link");
    std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
    for name in [&dir, &link] {
        let started = Instant::now();
        let r = attach(&opts(1, 2), 0, name.as_bytes());
        assert!(r.is_err(), "{name} accepted");
        assert!(started.elapsed() < Duration::from_secs(2), "{name}: took {:?}", started.elapsed());
    }
    let _ = std::fs::remove_file(&dir);
    let _ = std::fs::remove_file(&link);
}

#[test]
fn ring_sizes_follow_cores_and_shrink_with_many_ranks() {
    // A core per rank (counted over the host's ranks, not one bound rank's CPU).
    assert_eq!(default_ring_bytes(2, 2), SHM_RING_BYTES);
    assert_eq!(default_ring_bytes(8, 8), SHM_RING_BYTES);
    // More ranks than CPUs: the larger ring.
    assert_eq!(default_ring_bytes(4, 2), SHM_RING_BYTES_OVERSUBSCRIBED);
    // Many ranks: 16 MiB per rank in all, rounded to pages, never below the floor.
    assert_eq!(default_ring_bytes(17, 64), SHM_RING_BUDGET / 16);
    assert_eq!(default_ring_bytes(12, 64), (SHM_RING_BUDGET / 11) / 4096 * 4096);
    assert_eq!(default_ring_bytes(1000, 2000), SHM_RING_BYTES_MIN);
    for n in 1..200 {
        assert_eq!(default_ring_bytes(n, 0) % 4096, 0, "{n} ranks");
    }
}
