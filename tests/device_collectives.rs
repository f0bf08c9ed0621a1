//! Collectives on device buffers, on the simulated device (host memory behind a
//! checked, lazy stream): transport x world size x element count x collective x
//! in place, with one device per rank or one device shared by every rank, on
//! integer data with closed-form results. The staging, the device reductions and
//! the gates between them are the same code a CUDA device runs.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid::algorithm::Algorithm;
use braid::bootstrap::MemStore;
use braid::device::{Device, DeviceBuffer, DevicePtr, Export, PeerProcess, SimDevice, Ticket};
use braid::TransportKind;
use braid::{Communicator, Config, DType, ReduceOp};
use common::{comms, on_ranks, Net};

const T: Duration = Duration::from_secs(60);
/// Spans three staging pieces (1 MiB each) and a bit, in i32 elements.
const LARGE: usize = 3 * (1 << 18) + 5;

fn bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn upload(dev: &Arc<dyn Device>, v: &[i32]) -> DeviceBuffer {
    let mut b = DeviceBuffer::new(dev, v.len() * 4).unwrap();
    b.write(&bytes(v)).unwrap();
    b
}

fn download(b: &DeviceBuffer) -> Vec<i32> {
    let mut out = vec![0u8; b.len()];
    b.read(&mut out).unwrap();
    from_bytes(&out)
}

/// Rank `r`'s element `i`.
fn value(r: usize, i: usize) -> i32 {
    ((i % 7) + 3 * r + 1) as i32
}

fn check(what: &str, got: &[i32], want: impl Fn(usize) -> i32) {
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, want(i), "{what}: element {i}");
    }
}

/// Every collective once, on `count` elements per rank, checked against closed forms.
fn every_collective(c: &Communicator, dev: &Arc<dyn Device>, count: usize, in_place: bool) {
    let (r, n) = (c.rank(), c.world_size());
    let tag = |op: &str| format!("{op} count={count} world={n} rank={r} in_place={in_place} on {}", dev.describe());
    let mine: Vec<i32> = (0..count).map(|i| value(r, i)).collect();
    let sum = |i: usize| (0..n).map(|q| value(q, i)).sum::<i32>();
    // all-reduce: sum, max, and avg (integer average truncates)
    for (op, want) in [
        (ReduceOp::Sum, Box::new(sum) as Box<dyn Fn(usize) -> i32>),
        (ReduceOp::Max, Box::new(|i| value(n - 1, i))),
        (ReduceOp::Avg, Box::new(move |i| sum(i) / n as i32)),
    ] {
        let got = if in_place {
            let mut b = upload(dev, &mine);
            c.all_reduce_device_in_place(&mut b, DType::I32, op).unwrap();
            download(&b)
        } else {
            let input = upload(dev, &mine);
            let mut out = upload(dev, &vec![-1; count]);
            c.all_reduce_device(&input, &mut out, DType::I32, op).unwrap();
            check(&tag("all-reduce input untouched"), &download(&input), |i| mine[i]);
            download(&out)
        };
        check(&tag(&format!("all-reduce {op}")), &got, &want);
    }
    // broadcast from the last rank
    let root = n - 1;
    let mut b = upload(dev, &if r == root { mine.clone() } else { vec![-1; count] });
    c.broadcast_device(&mut b, DType::I32, root).unwrap();
    check(&tag("broadcast"), &download(&b), |i| value(root, i));
    // all-gather
    let input = upload(dev, &mine);
    let mut out = upload(dev, &vec![-1; n * count]);
    c.all_gather_device(&input, &mut out, DType::I32).unwrap();
    check(&tag("all-gather"), &download(&out), |k| value(k / count.max(1), k % count.max(1)));
    // reduce-scatter: rank r keeps block r of the sum of everyone's n*count
    let full: Vec<i32> = (0..n * count).map(|i| value(r, i)).collect();
    let input = upload(dev, &full);
    let mut out = upload(dev, &vec![-1; count]);
    c.reduce_scatter_device(&input, &mut out, DType::I32, ReduceOp::Sum).unwrap();
    check(&tag("reduce-scatter"), &download(&out), |i| sum(r * count + i));
    // reduce to rank 0
    let input = upload(dev, &mine);
    let mut out = upload(dev, &vec![-1; if r == 0 { count } else { 0 }]);
    c.reduce_device(&input, &mut out, DType::I32, ReduceOp::Sum, 0).unwrap();
    if r == 0 {
        check(&tag("reduce"), &download(&out), sum);
    }
    // all-to-all: block j of rank r's input goes to rank j
    let a2a = |from: usize, to: usize, i: usize| ((from * 7 + to * 3 + i) % 11) as i32;
    let send: Vec<i32> = (0..n * count).map(|k| a2a(r, k / count.max(1), k % count.max(1))).collect();
    let input = upload(dev, &send);
    let mut out = upload(dev, &vec![-1; n * count]);
    c.all_to_all_device(&input, &mut out, DType::I32).unwrap();
    check(&tag("all-to-all"), &download(&out), |k| a2a(k / count.max(1), r, k % count.max(1)));
    // send/recv around a ring
    if n > 1 {
        let to = (r + 1) % n;
        let from = (r + n - 1) % n;
        let mut got = upload(dev, &vec![-1; count]);
        if r % 2 == 0 {
            c.send_device(&upload(dev, &mine), DType::I32, to).unwrap();
            c.recv_device(&mut got, DType::I32, from).unwrap();
        } else {
            c.recv_device(&mut got, DType::I32, from).unwrap();
            c.send_device(&upload(dev, &mine), DType::I32, to).unwrap();
        }
        check(&tag("send/recv"), &download(&got), |i| value(from, i));
    }
}

/// Run the grid on `world` ranks over `net`, each rank with its own device or all
/// on one.
fn grid(net: Net, world: usize, counts: &[usize], shared_device: bool) {
    let one: Arc<dyn Device> = Arc::new(SimDevice::new("shared"));
    let counts = counts.to_vec();
    on_ranks(comms(net, world, T), move |c| {
        let dev: Arc<dyn Device> =
            if shared_device { one.clone() } else { Arc::new(SimDevice::new(&format!("rank{}", c.rank()))) };
        for &count in &counts {
            for in_place in [false, true] {
                every_collective(c, &dev, count, in_place);
            }
        }
    });
}

#[test]
fn device_grid_inproc_every_world_size() {
    for world in [1, 2, 3, 4, 7, 8] {
        grid(Net::InProc, world, &[0, 1, 1023], false);
    }
}

#[test]
fn device_grid_inproc_large_crosses_staging_pieces() {
    for world in [2, 3] {
        grid(Net::InProc, world, &[LARGE], false);
    }
}

#[test]
fn device_grid_ranks_sharing_one_device() {
    grid(Net::InProc, 4, &[0, 1, 1023, LARGE], true);
}

#[test]
fn device_grid_tcp() {
    grid(Net::Tcp, 3, &[1, 1023, LARGE], false);
}

#[test]
fn device_grid_shm() {
    grid(Net::Shm, 3, &[1, 1023, LARGE], false);
}

#[test]
fn every_algorithm_on_device_buffers() {
    let algos = [Algorithm::Ring, Algorithm::Direct, Algorithm::Chain, Algorithm::Tree];
    on_ranks(comms(Net::InProc, 4, T), move |c| {
        let dev: Arc<dyn Device> = Arc::new(SimDevice::new("algo"));
        for a in algos {
            c.set_algorithm(Some(a));
            // Only the collectives an algorithm plans are run with it; the rest
            // fall back, and all of them must still be right.
            every_collective(c, &dev, 2 * (1 << 18) + 3, true);
        }
    });
}

#[test]
fn reductions_run_on_the_device_and_its_memory_is_returned() {
    let sims: Vec<Arc<SimDevice>> = (0..3).map(|r| Arc::new(SimDevice::new(&format!("r{r}")))).collect();
    let for_ranks = sims.clone();
    on_ranks(comms(Net::InProc, 3, T), move |c| {
        let sim = for_ranks[c.rank()].clone();
        let dev: Arc<dyn Device> = sim.clone();
        let mut b = upload(&dev, &vec![c.rank() as i32 + 1; 4096]);
        c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
        assert!(download(&b).iter().all(|&x| x == 6));
        let s = sim.stats();
        assert!(s.reductions > 0 && s.to_host > 0 && s.to_device > 0, "{s:?}");
        drop(b);
        drop(dev);
        // Left: nothing of the user's; at most the engine's cached scratch.
        assert!(sim.live_allocations() <= 1, "{} allocations left", sim.live_allocations());
    });
    for s in &sims {
        assert_eq!(s.live_allocations(), 0, "device memory left after the communicators were dropped");
    }
}

#[test]
fn a_device_rank_and_a_host_rank_exchange_the_same_bytes() {
    on_ranks(comms(Net::Tcp, 2, T), |c| {
        let data: Vec<i32> = (0..LARGE).map(|i| value(c.rank(), i)).collect();
        let want = |i| value(0, i) + value(1, i);
        if c.rank() == 0 {
            let dev: Arc<dyn Device> = Arc::new(SimDevice::new("mixed"));
            let mut b = upload(&dev, &data);
            c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
            check("device rank", &download(&b), want);
        } else {
            let mut h = data.clone();
            c.all_reduce_in_place(&mut h, ReduceOp::Sum).unwrap();
            check("host rank", &h, want);
        }
    });
}

#[test]
fn buffers_of_two_devices_in_one_call_are_refused() {
    let c = Communicator::in_process(1).unwrap().pop().unwrap();
    let a: Arc<dyn Device> = Arc::new(SimDevice::new("a"));
    let b: Arc<dyn Device> = Arc::new(SimDevice::new("b"));
    let input = upload(&a, &[1, 2]);
    let mut out = upload(&b, &[0, 0]);
    let e = c.all_reduce_device(&input, &mut out, DType::I32, ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("sim:a") && e.contains("sim:b") && e.contains("one device"), "{e}");
    let mut short = upload(&a, &[0]);
    let e = c.all_reduce_device(&input, &mut short, DType::I32, ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("output has 4 bytes, expected 8"), "{e}");
}

// ---- Communicators bound to their devices: single-copy device transfers ----

/// `world` simulated devices: one per rank, or one shared by all.
fn sims(world: usize, shared: bool, tag: &str) -> Vec<Arc<SimDevice>> {
    let one = Arc::new(SimDevice::new(&format!("{tag}-shared")));
    (0..world).map(|r| if shared { one.clone() } else { Arc::new(SimDevice::new(&format!("{tag}{r}"))) }).collect()
}

fn as_devices(sims: &[Arc<SimDevice>]) -> Vec<Arc<dyn Device>> {
    sims.iter().map(|s| s.clone() as Arc<dyn Device>).collect()
}

/// In-process communicators, rank `r` bound to `devices[r]`.
fn bound_inproc(devices: Vec<Arc<dyn Device>>) -> Vec<Communicator> {
    let mut cfg = Config::new(0, devices.len());
    cfg.timeout = T;
    Communicator::in_process_on_with(devices, cfg).expect("bound in-process communicators")
}

/// Communicators over `kind` links between threads, built through a store, rank
/// `r` bound to `devices[r]` (None: not bound).
fn bound_over(kind: TransportKind, devices: Vec<Option<Arc<dyn Device>>>) -> Vec<Communicator> {
    let world = devices.len();
    let store: Arc<dyn braid::bootstrap::Store> = Arc::new(MemStore::new());
    let handles: Vec<_> = devices
        .into_iter()
        .enumerate()
        .map(|(rank, dev)| {
            let store = store.clone();
            std::thread::spawn(move || {
                let b = Communicator::builder(rank, world)
                    .store(store)
                    .socket_ifname("lo")
                    .transports(vec![kind])
                    .timeout(T);
                match dev {
                    Some(d) => b.device(d),
                    None => b,
                }
                .build()
                .expect("bound communicator")
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("builder thread")).collect()
}

/// The grid on communicators bound to their devices.
fn bound_grid(comms: Vec<Communicator>, counts: &[usize]) {
    let counts = counts.to_vec();
    on_ranks(comms, move |c| {
        let dev = c.device().expect("bound");
        let others: Vec<usize> = (0..c.world_size()).filter(|&p| p != c.rank()).collect();
        assert_eq!(c.single_copy_peers(), others, "simulated devices of one process map each other");
        for &count in &counts {
            for in_place in [false, true] {
                every_collective(c, &dev, count, in_place);
            }
        }
    });
}

#[test]
fn bound_grid_inproc_every_world_size() {
    for world in [1, 2, 3, 4, 7, 8] {
        bound_grid(bound_inproc(as_devices(&sims(world, false, "b"))), &[0, 1, 1023]);
    }
}

#[test]
fn bound_grid_inproc_large_crosses_pieces() {
    for world in [2, 3] {
        bound_grid(bound_inproc(as_devices(&sims(world, false, "bl"))), &[LARGE]);
    }
}

#[test]
fn bound_grid_ranks_sharing_one_device() {
    bound_grid(bound_inproc(as_devices(&sims(4, true, "bs"))), &[0, 1, 1023, LARGE]);
}

#[test]
fn bound_every_algorithm() {
    let algos = [Algorithm::Ring, Algorithm::Direct, Algorithm::Chain, Algorithm::Tree];
    let s = sims(4, false, "ba");
    on_ranks(bound_inproc(as_devices(&s)), move |c| {
        let dev = c.device().unwrap();
        for a in algos {
            c.set_algorithm(Some(a));
            every_collective(c, &dev, 2 * (1 << 18) + 3, true);
        }
    });
    // Every buffer was dropped right after its call: none while a peer had it open.
    for sim in &s {
        assert!(sim.freed_while_mapped().is_empty(), "{:?}", sim.freed_while_mapped());
    }
}

#[test]
fn bound_grid_over_tcp_and_shm_between_threads() {
    for kind in [TransportKind::Tcp, TransportKind::Shm] {
        let devs = as_devices(&sims(3, false, "bt")).into_iter().map(Some).collect();
        bound_grid(bound_over(kind, devs), &[1, 1023, LARGE]);
    }
}

/// An all-reduce of `LARGE` i32 on every rank; returns each rank's device stats
/// over the call alone.
fn all_reduce_stats(comms: Vec<Communicator>, sims: Vec<Arc<SimDevice>>) -> Vec<braid::device::sim::SimStats> {
    on_ranks(comms, move |c| {
        let sim = sims[c.rank()].clone();
        let dev: Arc<dyn Device> = sim.clone();
        let mut b = upload(&dev, &vec![c.rank() as i32 + 1; LARGE]);
        c.barrier().unwrap();
        let before = sim.stats();
        c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
        let after = sim.stats();
        c.barrier().unwrap();
        let n = c.world_size() as i32;
        check("all-reduce", &download(&b), |_| n * (n + 1) / 2);
        braid::device::sim::SimStats {
            to_host: after.to_host - before.to_host,
            to_device: after.to_device - before.to_device,
            on_device: after.on_device - before.on_device,
            reductions: after.reductions - before.reductions,
            finalizations: 0,
            peer_maps: after.peer_maps - before.peer_maps,
        }
    })
}

#[test]
fn bound_peers_take_the_single_copy_path_and_unbound_ones_stage() {
    let s = sims(3, false, "path");
    for st in all_reduce_stats(bound_inproc(as_devices(&s)), s) {
        assert_eq!((st.to_host, st.to_device), (0, 0), "no host staging between bound peers: {st:?}");
        assert!(st.reductions > 0 && st.peer_maps > 0, "{st:?}");
    }
    let s = sims(3, false, "staged");
    for st in all_reduce_stats(comms(Net::InProc, 3, T), s) {
        assert!(st.to_host > 0 && st.to_device > 0 && st.peer_maps == 0, "unbound ranks stage: {st:?}");
    }
    // Over TCP between threads of one process, bound through the store.
    let s = sims(2, false, "tcp-path");
    let devs = as_devices(&s).into_iter().map(Some).collect();
    for st in all_reduce_stats(bound_over(TransportKind::Tcp, devs), s) {
        assert_eq!((st.to_host, st.to_device), (0, 0), "{st:?}");
    }
}

#[test]
fn freed_exported_memory_leaves_no_mapping_behind() {
    let s = sims(2, false, "free");
    let for_ranks = s.clone();
    on_ranks(bound_inproc(as_devices(&s)), move |c| {
        let sim = for_ranks[c.rank()].clone();
        let dev: Arc<dyn Device> = sim.clone();
        for round in 0..3 {
            let mut b = upload(&dev, &vec![round + c.rank() as i32; 5000]);
            c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
            check("all-reduce", &download(&b), |_| 2 * round + 1);
            drop(b);
            c.barrier().unwrap();
            // Both ranks freed the buffers they exported: no mapping of them is
            // usable, and none was still open when they were freed.
            assert_eq!(sim.mapped_allocations(), 0, "round {round}");
            assert!(sim.freed_while_mapped().is_empty(), "round {round}: {:?}", sim.freed_while_mapped());
            c.barrier().unwrap();
        }
        assert_eq!(sim.stats().peer_maps, 3, "each round maps the peer's new buffer once");
        assert!(sim.live_allocations() <= 1, "{} allocations left", sim.live_allocations());
    });
    for sim in &s {
        assert_eq!((sim.live_allocations(), sim.mapped_allocations()), (0, 0));
    }
}

#[test]
fn a_call_on_another_device_than_the_bound_one_is_refused() {
    on_ranks(bound_inproc(as_devices(&sims(2, false, "bound"))), |c| {
        let other: Arc<dyn Device> = Arc::new(SimDevice::new(&format!("other{}", c.rank())));
        let mut b = upload(&other, &[1, 2, 3]);
        let e = c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap_err().to_string();
        let want = [format!("rank {}", c.rank()), format!("sim:other{}", c.rank()), format!("sim:bound{}", c.rank())];
        assert!(want.iter().all(|w| e.contains(w.as_str())), "{e}");
        // The refusal took no sequence number: the bound device still works.
        let dev = c.device().unwrap();
        let mut b = upload(&dev, &[1, 2, 3]);
        c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
        check("all-reduce", &download(&b), |i| 2 * (i as i32 + 1));
    });
    // With no peer to copy from, another device is staged as before.
    let c = bound_inproc(as_devices(&sims(1, false, "alone"))).pop().unwrap();
    let other: Arc<dyn Device> = Arc::new(SimDevice::new("elsewhere"));
    let mut b = upload(&other, &[4]);
    c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
    check("all-reduce", &download(&b), |_| 4);
}

#[test]
fn a_bound_rank_and_an_unbound_rank_stage_between_them() {
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new("half"));
    let comms = bound_over(TransportKind::Tcp, vec![Some(dev.clone()), None]);
    on_ranks(comms, move |c| {
        assert!(c.single_copy_peers().is_empty(), "the unbound peer published no domain");
        let data: Vec<i32> = (0..LARGE).map(|i| value(c.rank(), i)).collect();
        let want = |i| value(0, i) + value(1, i);
        if c.rank() == 0 {
            let mut b = upload(&dev, &data);
            c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
            check("bound device rank", &download(&b), want);
        } else {
            assert!(c.device().is_none());
            let mut h = data.clone();
            c.all_reduce_in_place(&mut h, ReduceOp::Sum).unwrap();
            check("host rank", &h, want);
        }
    });
}

/// Ranks 0 and 1 are bound to devices that map each other's memory, rank 2 runs
/// on host buffers: forwards cross between single-copy and staged channels.
#[test]
fn single_copy_and_staged_peers_in_one_call() {
    let s = sims(2, false, "mix");
    let devs = vec![Some(s[0].clone() as Arc<dyn Device>), Some(s[1].clone() as Arc<dyn Device>), None];
    on_ranks(bound_over(TransportKind::Tcp, devs), move |c| {
        let want_peers: Vec<usize> = match c.rank() {
            0 => vec![1],
            1 => vec![0],
            _ => vec![],
        };
        assert_eq!(c.single_copy_peers(), want_peers);
        let sum = |i: usize| (0..3).map(|q| value(q, i)).sum::<i32>();
        for algo in [Algorithm::Ring, Algorithm::Chain, Algorithm::Tree, Algorithm::Direct] {
            c.set_algorithm(Some(algo));
            let data: Vec<i32> = (0..LARGE).map(|i| value(c.rank(), i)).collect();
            let got = match c.device() {
                Some(dev) => {
                    let mut b = upload(&dev, &data);
                    c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
                    download(&b)
                }
                None => {
                    let mut h = data;
                    c.all_reduce_in_place(&mut h, ReduceOp::Sum).unwrap();
                    h
                }
            };
            check(&format!("{algo:?} rank {}", c.rank()), &got, sum);
        }
    });
    assert!(s.iter().all(|d| d.stats().peer_maps > 0), "ranks 0 and 1 read each other's memory");
}

/// A call gives back the peer mappings it opened when it ends: none outlives
/// it, even while the peer's buffer is still allocated (the peer may free it as
/// soon as its own call returns).
#[test]
fn a_call_closes_its_peer_mappings_when_it_ends() {
    let s = sims(3, false, "close");
    let for_ranks = s.clone();
    on_ranks(bound_inproc(as_devices(&s)), move |c| {
        let sim = for_ranks[c.rank()].clone();
        let dev: Arc<dyn Device> = sim.clone();
        let mut b = upload(&dev, &vec![c.rank() as i32 + 1; LARGE]);
        for round in 0..2 {
            c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
            check("all-reduce", &download(&b), |_| 6 * 3i32.pow(round));
            // Every rank's buffer is still allocated here.
            assert_eq!(sim.mapped_allocations(), 0, "round {round}: mappings left open after the call");
            c.barrier().unwrap();
        }
        assert!(sim.stats().peer_maps >= 2, "each call maps its peers' buffers again");
    });
}

/// Device memory that cannot be exported (as `cudaMallocAsync` or `cuMemCreate`
/// memory cannot) does not fail the call: its sends go through an exportable
/// buffer, with forwards (ring, tree) and without, and the results are exact.
#[test]
fn unexportable_buffers_fall_back_and_the_collective_is_exact() {
    let s = sims(3, false, "unexp");
    let for_ranks = s.clone();
    on_ranks(bound_inproc(as_devices(&s)), move |c| {
        let (r, n) = (c.rank(), c.world_size());
        let sim = for_ranks[r].clone();
        let dev: Arc<dyn Device> = sim.clone();
        let len = LARGE * 4;
        // Rank 0's buffer cannot be exported; the others' can.
        let p = if r == 0 { sim.alloc_unexportable(len).unwrap() } else { dev.alloc_device(len).unwrap() };
        if r == 0 {
            assert!(dev.export(p, len).is_err(), "the simulated memory refuses export");
        }
        for algo in [Algorithm::Ring, Algorithm::Tree, Algorithm::Direct, Algorithm::Chain] {
            c.set_algorithm(Some(algo));
            let mine: Vec<i32> = (0..LARGE).map(|i| value(r, i)).collect();
            sim.upload(p, &bytes(&mine)).unwrap();
            let sig = braid::CallSig::new(braid::OpKind::AllReduce, DType::I32, LARGE as u64, 0, ReduceOp::Sum);
            // SAFETY: `p` is `len` bytes of this rank's device, used by nothing else during the call.
            unsafe { c.collective_device_raw(&dev, sig, None, (p, len)) }.unwrap();
            let mut out = vec![0u8; len];
            sim.download(p, &mut out).unwrap();
            check(&format!("{algo:?} rank {r}"), &from_bytes(&out), |i| (0..n).map(|q| value(q, i)).sum());
            assert_eq!(sim.mapped_allocations(), 0);
        }
        // SAFETY: allocated above, freed once, after every call on it.
        unsafe { dev.free_device(p, len) };
    });
    assert_eq!(s[0].stats().to_host, 0, "no host staging either");
    // The exportable stand-ins went with their calls, after the peers closed them.
    for sim in &s {
        assert!(sim.freed_while_mapped().is_empty(), "{:?}", sim.freed_while_mapped());
    }
}

/// A simulated device whose next close of a peer's mapping, once armed, first
/// waits (at most a second) for the peer to say it freed its call's buffers:
/// where an importer closes only after the exporter's call may have returned,
/// the exporter then frees memory still mapped here every time, not now and then.
struct SlowToClose {
    sim: Arc<SimDevice>,
    armed: AtomicBool,
    peer_freed: AtomicBool,
}

impl Device for SlowToClose {
    fn describe(&self) -> String {
        self.sim.describe()
    }
    fn alloc_device(&self, len: usize) -> braid::Result<DevicePtr> {
        self.sim.alloc_device(len)
    }
    unsafe fn free_device(&self, ptr: DevicePtr, len: usize) {
        // SAFETY: forwarded as the caller promised it.
        unsafe { self.sim.free_device(ptr, len) }
    }
    fn alloc_host(&self, len: usize) -> braid::Result<*mut u8> {
        self.sim.alloc_host(len)
    }
    unsafe fn free_host(&self, ptr: *mut u8, len: usize) {
        // SAFETY: forwarded as the caller promised it.
        unsafe { self.sim.free_host(ptr, len) }
    }
    unsafe fn copy_to_host(&self, dst: *mut u8, src: DevicePtr, len: usize) -> braid::Result<()> {
        // SAFETY: forwarded as the caller promised it.
        unsafe { self.sim.copy_to_host(dst, src, len) }
    }
    unsafe fn copy_to_device(&self, dst: DevicePtr, src: *const u8, len: usize) -> braid::Result<()> {
        // SAFETY: forwarded as the caller promised it.
        unsafe { self.sim.copy_to_device(dst, src, len) }
    }
    unsafe fn copy_on_device(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> braid::Result<()> {
        // SAFETY: forwarded as the caller promised it.
        unsafe { self.sim.copy_on_device(dst, src, len) }
    }
    unsafe fn reduce(
        &self,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        len: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> braid::Result<()> {
        // SAFETY: forwarded as the caller promised it.
        unsafe { self.sim.reduce(dst, a, b, len, dtype, op) }
    }
    unsafe fn finalize(
        &self,
        buf: DevicePtr,
        len: usize,
        dtype: DType,
        op: ReduceOp,
        world: usize,
    ) -> braid::Result<()> {
        // SAFETY: forwarded as the caller promised it.
        unsafe { self.sim.finalize(buf, len, dtype, op, world) }
    }
    fn record(&self) -> braid::Result<Ticket> {
        self.sim.record()
    }
    fn is_complete(&self, ticket: Ticket) -> braid::Result<bool> {
        self.sim.is_complete(ticket)
    }
    fn synchronize(&self) -> braid::Result<()> {
        self.sim.synchronize()
    }
    fn peer_domain(&self) -> Option<String> {
        self.sim.peer_domain()
    }
    fn export(&self, ptr: DevicePtr, len: usize) -> braid::Result<Export> {
        self.sim.export(ptr, len)
    }
    fn open_export(&self, handle: &[u8], peer: PeerProcess) -> braid::Result<(DevicePtr, usize)> {
        self.sim.open_export(handle, peer)
    }
    fn close_export(&self, handle: &[u8]) {
        if self.armed.swap(false, Ordering::SeqCst) {
            // Bounded: where the close comes first, the peer cannot free before it.
            let until = Instant::now() + Duration::from_secs(1);
            while !self.peer_freed.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.sim.close_export(handle)
    }
}

/// An exporter's call returns only after its peer closed every mapping of the
/// call's buffers, so the user may free them at once (freeing exported memory
/// that a peer has open is undefined for CUDA): rank 0 frees its buffer as soon
/// as each call returns, and rank 1, whose closes wait for that free when they
/// can, must have closed first. All-reduce (each rank exports and imports),
/// broadcast (the root only exports) and a point-to-point send.
#[test]
fn an_exporters_call_returns_only_after_its_peer_closed_the_mappings() {
    let s = sims(2, false, "closefirst");
    let slow = Arc::new(SlowToClose { sim: s[1].clone(), armed: false.into(), peer_freed: false.into() });
    let for_ranks = (s.clone(), slow.clone());
    on_ranks(bound_inproc(vec![s[0].clone(), slow]), move |c| {
        let (sims, slow) = &for_ranks;
        let (r, dev) = (c.rank(), c.device().expect("bound"));
        for case in ["all-reduce", "broadcast", "send/recv"] {
            if r == 1 {
                slow.peer_freed.store(false, Ordering::SeqCst);
                slow.armed.store(true, Ordering::SeqCst);
            }
            c.barrier().unwrap();
            let mine: Vec<i32> = (0..5000).map(|i| value(r, i)).collect();
            let mut b = upload(&dev, &mine);
            match (case, r) {
                ("all-reduce", _) => c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap(),
                ("broadcast", _) => c.broadcast_device(&mut b, DType::I32, 0).unwrap(),
                (_, 0) => c.send_device(&b, DType::I32, 1).unwrap(),
                _ => c.recv_device(&mut b, DType::I32, 0).unwrap(),
            }
            // The user frees the exported buffer the moment the call returns.
            drop(b);
            if r == 0 {
                slow.peer_freed.store(true, Ordering::SeqCst);
            }
            c.barrier().unwrap();
            let broken = sims[r].freed_while_mapped();
            assert!(broken.is_empty(), "{case}: rank {r} freed memory its peer still had mapped: {broken:?}");
        }
    });
}

/// The algorithm of the latest call in `c`'s flight record.
fn last_algorithm(c: &Communicator) -> String {
    let v: serde_json::Value = serde_json::from_str(&c.flight_record().expect("recorder on")).unwrap();
    let calls = v["calls"].as_array().expect("calls");
    calls.last().expect("a call")["algorithm"].as_str().unwrap_or("none").to_string()
}

/// Between single-copy peers a round costs a GPU a switch of streams or of
/// contexts, whatever its bytes (25 and 301 us on an H200), so device calls are
/// priced on the device's links: a 16 MiB all-reduce takes a schedule of few
/// rounds, not the tree's 512 KiB segments, which host buffers of the same call
/// still take. The ranks agree, since both price the same way.
#[test]
fn device_calls_between_single_copy_peers_are_priced_by_their_rounds() {
    const COUNT: usize = 4 << 20;
    let s = sims(2, false, "priced");
    let for_ranks = s.clone();
    on_ranks(bound_inproc(as_devices(&s)), move |c| {
        let dev: Arc<dyn Device> = for_ranks[c.rank()].clone();
        let mut host = vec![c.rank() as i32 + 1; COUNT];
        c.all_reduce_in_place(&mut host, ReduceOp::Sum).unwrap();
        assert_eq!(last_algorithm(c), "tree", "host buffers keep the host's pick");
        let mut b = upload(&dev, &vec![c.rank() as i32 + 1; COUNT]);
        c.all_reduce_device_in_place(&mut b, DType::I32, ReduceOp::Sum).unwrap();
        check("all-reduce", &download(&b), |_| 3);
        let algo = last_algorithm(c);
        let plan = |a: &str| {
            let a: Algorithm = a.parse().unwrap();
            braid::algorithm::plan(&braid::algorithm::PlanRequest {
                op: braid::OpKind::AllReduce,
                rank: c.rank(),
                world: 2,
                count: COUNT,
                elem_size: 4,
                root: 0,
                algorithm: Some(a),
                hosts: &[0, 0],
                blocks: None,
            })
            .unwrap()
            .rounds
            .len()
        };
        assert!(plan(&algo) <= 4, "{algo}: {} rounds on device buffers", plan(&algo));
    });
}
