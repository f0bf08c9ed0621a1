//! Communicators over hand-made links ([`Communicator::from_links`], crate-private):
//! what a peer that misbehaves on the wire, or a link that panics, does to a call.
//! Moved here from the integration tests when the transport and executor layers
//! became crate-private; everything a user can reach is tested in `tests/`.

use std::io;
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use half::f16;

use crate::executor::WaitPolicy;
use crate::frame::{FrameKind, Header};
use crate::transport::loopback::LoopbackLink;
use crate::transport::{Link, TransportKind};
use crate::{CallSig, Communicator, Config, DType, Element, Error, OpKind, ReduceOp};

/// The bound issue 15 sets for an abort (and a broken communicator's refusal) to
/// reach every rank.
const BOUND: Duration = Duration::from_secs(1);

/// Rank 0 of two, linked to rank 1 by `link` alone.
fn rank0_of_two(link: Box<dyn Link>, comm_id: u32) -> Communicator {
    let cfg = Config::new(0, 2);
    Communicator::from_links(0, 2, vec![None, Some(link)], comm_id, &cfg, WaitPolicy::for_ranks(2))
}

/// Run `f(comm)` on every rank in its own thread; each rank's result in rank order.
pub(crate) fn on_ranks<R: Send + 'static>(
    comms: Vec<Communicator>,
    f: impl Fn(&Communicator) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let f = f.clone();
            std::thread::spawn(move || f(&c))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
}

/// Run `f` on a thread; None when it has not returned within `limit` (a hang).
fn within<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn garbage_on_a_link_is_a_protocol_error_naming_the_peer() {
    let (mine, mut theirs) = LoopbackLink::pair(0, 1, 1 << 16);
    let comm = rank0_of_two(Box::new(mine), 7);
    let junk = b"GET / HTTP/1.1\r\nHost: example\r\n\r\n\0\0\0\0\0\0\0\0";
    assert_eq!(theirs.try_write(&[junk]).unwrap(), junk.len());
    let err = comm.barrier().unwrap_err();
    assert!(matches!(err, Error::Protocol { peer: 1, .. }), "{err}");
    assert!(err.to_string().contains("rank 0") && err.to_string().contains("rank 1"), "{err}");
}

#[test]
fn a_communicator_from_links_cannot_split() {
    let cfg = Config::new(0, 1);
    let c = Communicator::from_links(0, 1, vec![None], 1, &cfg, WaitPolicy::for_ranks(1));
    assert!(matches!(c.split(Some(0), 0), Err(Error::Unsupported(_))));
}

#[test]
fn a_frame_of_another_communicator_is_an_error_naming_both_ids() {
    let (mine, mut theirs) = LoopbackLink::pair(0, 1, 1 << 16);
    let comm = rank0_of_two(Box::new(mine), 0x1111);
    let sig = CallSig::new(OpKind::Barrier, DType::U8, 0, 0, ReduceOp::Sum);
    let frame = Header { kind: FrameKind::Data, comm_id: 0x2222, epoch: 3, seq: 0, sig, len: 0 }.encode();
    assert_eq!(theirs.try_write(&[&frame]).unwrap(), frame.len());
    let err = comm.barrier().unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Protocol { peer: 1, .. }), "{text}");
    assert!(text.contains("communicator 0x2222 epoch 3") && text.contains("communicator 0x1111 epoch 0"), "{text}");
}

/// A link whose writes block until released, then panic.
struct PanickingLink {
    inner: LoopbackLink,
    entered: Arc<AtomicBool>,
    release: Arc<AtomicBool>,
}

impl Link for PanickingLink {
    fn peer(&self) -> usize {
        self.inner.peer()
    }
    fn kind(&self) -> TransportKind {
        TransportKind::InProcess
    }
    fn try_write(&mut self, _bufs: &[&[u8]]) -> io::Result<usize> {
        self.entered.store(true, Ordering::SeqCst);
        while !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("link to rank 1 exploded");
    }
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.try_read(buf)
    }
    fn poll_fd(&self) -> Option<RawFd> {
        None
    }
    fn close(&mut self) {
        self.inner.close()
    }
}

/// Rank 0 of two over a [`PanickingLink`], and the flags that drive it.
fn panicking_rank0() -> (Communicator, Arc<AtomicBool>, Arc<AtomicBool>) {
    let (mine, _theirs) = LoopbackLink::pair(0, 1, 1 << 16);
    let entered = Arc::new(AtomicBool::new(false));
    let release = Arc::new(AtomicBool::new(false));
    let link = PanickingLink { inner: mine, entered: entered.clone(), release: release.clone() };
    (rank0_of_two(Box::new(link), 9), entered, release)
}

#[test]
fn a_panic_inside_a_call_is_an_error_for_the_next_calls_not_a_hang() {
    let (comm, entered, release) = panicking_rank0();
    let comm = Arc::new(comm);
    let first = {
        let comm = comm.clone();
        std::thread::spawn(move || {
            catch_unwind(AssertUnwindSafe(|| comm.all_reduce_in_place(&mut [1.0f32; 8], ReduceOp::Sum)))
        })
    };
    while !entered.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Queued behind the call that is about to panic.
    let queued = comm.barrier_async();
    release.store(true, Ordering::SeqCst);
    let caught = first.join().unwrap();
    let payload = caught.expect_err("the first call panics");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"link to rank 1 exploded"));
    let t = Instant::now();
    let e = queued.wait().unwrap_err();
    assert!(matches!(&e, Error::Broken(why) if why.contains("link to rank 1 exploded")), "{e}");
    let e = comm.broadcast(&mut [0u8; 4], 0).unwrap_err();
    assert!(matches!(&e, Error::Broken(why) if why.contains("panicked")), "{e}");
    assert!(t.elapsed() < BOUND, "{:?}", t.elapsed());
}

#[test]
fn a_panic_inside_an_async_call_fails_it_and_the_calls_queued_behind_it() {
    let (comm, entered, release) = panicking_rank0();
    let out = within(Duration::from_secs(10), move || {
        let first = comm.all_reduce_async(vec![1.0f32; 8], ReduceOp::Sum);
        while !entered.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let second = comm.barrier_async();
        release.store(true, Ordering::SeqCst);
        let e1 = first.wait().unwrap_err().to_string();
        let e2 = second.wait().unwrap_err().to_string();
        let e3 = comm.barrier().unwrap_err().to_string();
        (e1, e2, e3)
    });
    let (e1, e2, e3) = out.expect("no call may wait for the one that panicked");
    for e in [&e1, &e2, &e3] {
        assert!(e.contains("link to rank 1 exploded"), "{e}");
    }
}

/// The element types the ring test below reduces, from small integers exactly.
trait Small: Element + PartialEq + std::fmt::Debug {
    fn from_i64(v: i64) -> Self;
}
impl Small for i64 {
    fn from_i64(v: i64) -> Self {
        v
    }
}
impl Small for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
}
impl Small for f16 {
    fn from_i64(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
}

/// Rank `r`'s value at element `i` (as in `tests/collectives.rs`: small, so sums
/// and products stay exact in every float type).
fn value(op: ReduceOp, r: usize, i: usize) -> i64 {
    match op {
        ReduceOp::Prod => 1 + ((i % 5 + r) % 2) as i64,
        _ => ((i % 5) + r + 1) as i64,
    }
}

fn input<T: Small>(op: ReduceOp, r: usize, n: usize) -> Vec<T> {
    (0..n).map(|i| T::from_i64(value(op, r, i))).collect()
}

/// Expected reduction of element `i` over `world` ranks (sum, prod and max only).
fn expected<T: Small>(op: ReduceOp, world: usize, i: usize) -> T {
    let vals = (0..world).map(|r| value(op, r, i));
    T::from_i64(match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Max => vals.max().unwrap(),
        _ => unreachable!("the ring test reduces with sum, prod and max"),
    })
}

fn check_with<T: Small>(what: &str, got: &[T], want: impl Fn(usize) -> T) {
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        assert!(*g == w, "{what}: element {i} is {g:?}, expected {w:?}");
    }
}

/// Receivers reduce straight out of the ring. With a ring whose size is not a
/// multiple of the element size, elements straddle the ring's end and must be
/// gathered before they are combined; the results must stay exact.
#[test]
fn reductions_out_of_rings_that_split_elements_stay_exact() {
    const WORLD: usize = 3;
    let mut links: Vec<Vec<Option<Box<dyn Link>>>> = (0..WORLD).map(|_| (0..WORLD).map(|_| None).collect()).collect();
    for (a, b) in (0..WORLD).flat_map(|a| (a + 1..WORLD).map(move |b| (a, b))) {
        let (x, y) = LoopbackLink::pair(a, b, 1003);
        links[a][b] = Some(Box::new(x));
        links[b][a] = Some(Box::new(y));
    }
    let comms = links
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let cfg = Config::new(r, WORLD);
            Communicator::from_links(r, WORLD, l, 11, &cfg, WaitPolicy::for_ranks(WORLD))
        })
        .collect();
    on_ranks(comms, |c| {
        let r = c.rank();
        // Uneven chunks (count % 3 != 0) of 2-, 4- and 8-byte elements, eager frames.
        let n = 6001;
        let mut a = input::<i64>(ReduceOp::Sum, r, n);
        c.all_reduce_in_place(&mut a, ReduceOp::Sum).unwrap();
        check_with("i64 sum", &a, |i| expected(ReduceOp::Sum, WORLD, i));
        let b = input::<f16>(ReduceOp::Max, r, n);
        let mut out = vec![f16::from_i64(99); n];
        c.all_reduce(&b, &mut out, ReduceOp::Max).unwrap();
        check_with("f16 max", &out, |i| expected(ReduceOp::Max, WORLD, i));
        let mut d = input::<f32>(ReduceOp::Prod, r, n);
        c.all_reduce_in_place(&mut d, ReduceOp::Prod).unwrap();
        check_with("f32 prod", &d, |i| expected(ReduceOp::Prod, WORLD, i));
    });
}
