//! Memory safety under errors: what a rank exposed to its peers for single copy
//! must not be read after its call returned, and registered segments a peer mapped
//! must not outlive their owner's buffer.

use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::Duration;

use braid::registered::SharedBuffer;
use braid::{Communicator, Config, Error, ReduceOp};

/// 64 MiB of f32: above glibc's largest dynamic mmap threshold (32 MiB), so the
/// freed vector is unmapped at once and a late read of it faults instead of reading
/// stale heap.
const BIG: usize = 16 << 20;

/// Rank 0 runs `early` (which sends rendezvous frames: addresses of its buffer),
/// times out waiting for rank 1 and frees the buffer; only then does rank 1 run
/// `late` and find those frames in its ring. Before the fix rank 1 copied from the
/// freed (unmapped) memory and the process died of SIGSEGV; now the read is refused
/// and rank 1 gets an error naming rank 0. Returns rank 1's error.
fn late_reader(
    early: impl FnOnce(&Communicator, &mut Vec<f32>) -> braid::Result<()> + Send + 'static,
    late: impl FnOnce(&Communicator, &mut Vec<f32>) -> braid::Result<()> + Send + 'static,
) -> Error {
    let mut cfg = Config::new(0, 2);
    cfg.timeout = Duration::from_millis(300);
    let mut comms = Communicator::in_process_with(cfg).unwrap().into_iter();
    let (c0, c1) = (comms.next().unwrap(), comms.next().unwrap());
    let (freed_tx, freed_rx) = mpsc::channel::<()>();
    // Both allocated up front, so rank 1's buffer cannot be mapped where rank 0's was.
    let (mut buf0, mut buf1) = (vec![1.0f32; BIG], vec![2.0f32; BIG]);
    let early = std::thread::spawn(move || {
        let err = early(&c0, &mut buf0).unwrap_err();
        drop(buf0);
        freed_tx.send(()).unwrap();
        // Keep the communicator (and its links) alive while the peer reads.
        std::thread::sleep(Duration::from_millis(500));
        err
    });
    let late = std::thread::spawn(move || {
        freed_rx.recv().unwrap();
        late(&c1, &mut buf1).unwrap_err()
    });
    let early = early.join().unwrap();
    assert!(matches!(early, Error::Timeout { .. }), "rank 0: {early}");
    late.join().unwrap()
}

fn assert_refused(late: Error) {
    let msg = late.to_string();
    assert!(matches!(late, Error::PeerLost { peer: 0, .. }), "rank 1: {msg}");
    assert!(msg.contains("rank 1") && msg.contains("rank 0 does not expose"), "rank 1: {msg}");
}

#[test]
fn a_late_peer_cannot_read_an_all_reduce_buffer_freed_after_a_timeout() {
    let late = late_reader(
        |c, buf| c.all_reduce_in_place(buf, ReduceOp::Sum),
        |c, buf| c.all_reduce_in_place(buf, ReduceOp::Sum),
    );
    assert_refused(late);
}

#[test]
fn a_late_receiver_cannot_read_a_send_buffer_freed_after_a_timeout() {
    let late = late_reader(|c, buf| c.send(buf, 1), |c, buf| c.recv(buf, 0));
    assert_refused(late);
}

/// The `/proc/self/maps` lines that map one of `names`.
fn mappings_of(names: &[String]) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().filter(|l| names.iter().any(|n| l.contains(&format!("/dev/shm/{n}")))).count()
}

/// A registered buffer per step, all-reduced single-copy between in-process ranks
/// (each maps the other's segment) and then freed: the peers' cached mappings of
/// freed segments must be let go, or every step leaks its size in /dev/shm pages.
#[test]
fn mappings_of_freed_registered_buffers_do_not_pile_up() {
    const STEPS: usize = 24;
    const LEN: usize = 64 << 10; // 256 KiB of f32: above the rendezvous threshold
    let names = Arc::new(Mutex::new(Vec::<String>::new()));
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = Communicator::in_process(2)
        .unwrap()
        .into_iter()
        .map(|c| {
            let (names, barrier) = (names.clone(), barrier.clone());
            std::thread::spawn(move || {
                for step in 0..STEPS {
                    let mut buf = SharedBuffer::<f32>::new(LEN).unwrap();
                    names.lock().unwrap().push(buf.name().to_owned());
                    buf.iter_mut().enumerate().for_each(|(i, x)| *x = (i % 7 + c.rank() + step) as f32);
                    c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                    for (i, x) in buf.iter().enumerate() {
                        assert_eq!(*x, (2 * (i % 7 + step) + 1) as f32, "step {step} element {i}");
                    }
                }
                // Every buffer is freed; both communicators (and their caches) are alive.
                barrier.wait();
                let held = mappings_of(&names.lock().unwrap());
                barrier.wait();
                drop(c);
                held
            })
        })
        .collect();
    let held: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let names = names.lock().unwrap();
    assert_eq!(names.len(), 2 * STEPS);
    // Each rank may keep its peer's latest segment mapped; nothing older.
    assert!(held.iter().all(|&h| h <= 2), "{held:?} mappings of {} freed registered buffers held", names.len());
    assert_eq!(mappings_of(&names), 0, "mappings left after the communicators were dropped");
}

/// The happy path of single copy between threads (plain and registered buffers,
/// all-reduce and send/recv, 3 ranks), exact: what the memory checker watches.
#[test]
fn single_copy_between_threads_is_exact() {
    const LEN: usize = 3 << 18; // 3 MiB of f32: several rendezvous frames per peer
    let handles: Vec<_> = Communicator::in_process(3)
        .unwrap()
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let r = c.rank();
                let mut plain: Vec<f32> = (0..LEN).map(|i| (i % 11 + r) as f32).collect();
                c.all_reduce_in_place(&mut plain, ReduceOp::Sum).unwrap();
                let mut reg = SharedBuffer::<i32>::new(LEN).unwrap();
                reg.iter_mut().enumerate().for_each(|(i, x)| *x = (i % 13) as i32 * (r as i32 + 1));
                c.all_reduce_in_place(&mut reg, ReduceOp::Sum).unwrap();
                for i in 0..LEN {
                    assert_eq!(plain[i], (3 * (i % 11) + 3) as f32, "rank {r} element {i}");
                    assert_eq!(reg[i], (i % 13) as i32 * 6, "rank {r} element {i}");
                }
                // A ring of sends: rank r to r+1, from r-1.
                let out: Vec<u8> = (0..LEN).map(|i| (i * 7 + r) as u8).collect();
                let mut got = vec![0u8; LEN];
                let from = (r + 2) % 3;
                if r == 0 {
                    c.send(&out, 1).unwrap();
                    c.recv(&mut got, from).unwrap();
                } else {
                    c.recv(&mut got, from).unwrap();
                    c.send(&out, (r + 1) % 3).unwrap();
                }
                assert!(got.iter().enumerate().all(|(i, &x)| x == (i * 7 + from) as u8), "rank {r} from {from}");
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
}
