//! Gather and scatter on device buffers (the simulated device): transport x world
//! size x count x root (first and last) x in place, every algorithm, on integers
//! checked element by element; and buffers of the wrong length refused, naming the
//! rank and the call.

mod common;

use std::sync::Arc;
use std::time::Duration;

use braid::algorithm::{algorithms_for, Algorithm};
use braid::device::{Device, DeviceBuffer, SimDevice};
use braid::{Communicator, DType, Error, OpKind};
use common::{comms, on_ranks, Net};

fn upload(dev: &Arc<dyn Device>, v: &[i32]) -> DeviceBuffer {
    let mut b = DeviceBuffer::new(dev, v.len() * 4).unwrap();
    b.write(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    b
}

fn download(b: &DeviceBuffer) -> Vec<i32> {
    let mut out = vec![0u8; b.len()];
    b.read(&mut out).unwrap();
    out.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Rank `r`'s element `i`: distinct per rank and position.
fn value(r: usize, i: usize) -> i32 {
    (i * 7 + r * 31) as i32 + 1
}

const POISON: i32 = -77;

fn gather(c: &Communicator, dev: &Arc<dyn Device>, count: usize, root: usize, in_place: bool) -> Vec<i32> {
    let (r, n) = (c.rank(), c.world_size());
    let mine: Vec<i32> = (0..count).map(|i| value(r, i)).collect();
    if in_place {
        let mut buf = if r == root {
            let mut all = vec![POISON; n * count];
            all[root * count..(root + 1) * count].copy_from_slice(&mine);
            upload(dev, &all)
        } else {
            upload(dev, &mine)
        };
        c.gather_device_in_place(&mut buf, DType::I32, root).unwrap();
        download(&buf)
    } else {
        let input = upload(dev, &mine);
        if r == root {
            let mut out = upload(dev, &vec![POISON; n * count]);
            c.gather_device(&input, Some(&mut out), DType::I32, root).unwrap();
            download(&out)
        } else {
            c.gather_device(&input, None, DType::I32, root).unwrap();
            mine
        }
    }
}

fn scatter(c: &Communicator, dev: &Arc<dyn Device>, count: usize, root: usize, in_place: bool) -> Vec<i32> {
    let (r, n) = (c.rank(), c.world_size());
    let all: Vec<i32> = (0..n * count).map(|k| value(k / count, k % count)).collect();
    if in_place {
        let mut buf = upload(dev, if r == root { &all } else { &[][..] });
        if r != root {
            buf = upload(dev, &vec![POISON; count]);
        }
        c.scatter_device_in_place(&mut buf, DType::I32, root).unwrap();
        let got = download(&buf);
        if r == root {
            assert_eq!(got, all, "rank {r}: the root's blocks must stay as they were");
            return got[root * count..(root + 1) * count].to_vec();
        }
        got
    } else {
        let mut out = upload(dev, &vec![POISON; count]);
        let input = (r == root).then(|| upload(dev, &all));
        c.scatter_device(input.as_ref(), &mut out, DType::I32, root).unwrap();
        download(&out)
    }
}

fn grid(net: Net, world: usize) {
    on_ranks(comms(net, world, Duration::from_secs(60)), move |c| {
        let (r, n) = (c.rank(), c.world_size());
        let dev: Arc<dyn Device> = Arc::new(SimDevice::new(&format!("rank{r}")));
        for op in [OpKind::Gather, OpKind::Scatter] {
            for alg in algorithms_for(op).iter().copied().map(Some).chain([None]) {
                c.set_algorithm(alg);
                for count in [0, 1, 7, 1000] {
                    for root in [0, n - 1] {
                        for in_place in [false, true] {
                            let name = alg.map_or("auto", Algorithm::name);
                            let tag = format!("{net:?} {op} via {name} world={n} rank={r} count={count} root={root} in_place={in_place}");
                            if op == OpKind::Gather {
                                let got = gather(c, &dev, count, root, in_place);
                                let want: Vec<i32> = if r == root {
                                    (0..n * count).map(|k| value(k / count, k % count)).collect()
                                } else {
                                    (0..count).map(|i| value(r, i)).collect()
                                };
                                assert_eq!(got, want, "{tag}");
                            } else {
                                let got = scatter(c, &dev, count, root, in_place);
                                let want: Vec<i32> = (0..count).map(|i| value(r, i)).collect();
                                assert_eq!(got, want, "{tag}");
                            }
                        }
                    }
                }
            }
        }
    });
}

macro_rules! grid_tests {
    ($($name:ident: $net:expr, $world:expr;)*) => {$(
        #[test]
        fn $name() { grid($net, $world); }
    )*};
}

grid_tests! {
    inproc_w1: Net::InProc, 1;
    inproc_w2: Net::InProc, 2;
    inproc_w3: Net::InProc, 3;
    inproc_w4: Net::InProc, 4;
    inproc_w7: Net::InProc, 7;
    shm_w1: Net::Shm, 1;
    shm_w2: Net::Shm, 2;
    shm_w3: Net::Shm, 3;
    shm_w4: Net::Shm, 4;
    shm_w7: Net::Shm, 7;
    tcp_w1: Net::Tcp, 1;
    tcp_w2: Net::Tcp, 2;
    tcp_w3: Net::Tcp, 3;
    tcp_w4: Net::Tcp, 4;
    tcp_w7: Net::Tcp, 7;
}

/// A root buffer that is not `world_size` blocks is refused before any data
/// moves, naming the rank and the call; so is one that is not whole elements.
#[test]
fn wrong_lengths_are_refused_naming_rank_and_call() {
    let c = comms(Net::InProc, 1, Duration::from_secs(10)).pop().unwrap();
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new("len"));
    let input = upload(&dev, &[1, 2, 3]);
    let mut short = upload(&dev, &[0, 0]);
    let msgs = [
        c.gather_device(&input, Some(&mut short), DType::I32, 0).unwrap_err(),
        c.scatter_device(Some(&short), &mut upload(&dev, &[0, 0, 0]), DType::I32, 0).unwrap_err(),
        c.gather_device(&DeviceBuffer::new(&dev, 5).unwrap(), None, DType::I32, 0).unwrap_err(),
    ];
    for (e, op) in msgs.iter().zip(["gather", "scatter", "gather"]) {
        let m = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{m}");
        assert!(m.contains("rank 0") && m.to_lowercase().contains(op), "{m}");
    }
}
