//! The collective grid: transport x world size x element count x dtype x reduce op
//! x in place / out of place, on small-integer data whose results are exact in
//! every dtype, checked element by element against closed-form expectations.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use braid::{Communicator, DType, Element, ReduceOp};
use common::{comms, on_ranks, Net};
use half::{bf16, f16};

/// Element types the grid runs over, with exact conversions from small integers.
trait TestElem: Element + PartialEq + std::fmt::Debug {
    /// The value `v` (wrapping for 8-bit integers).
    fn from_i64(v: i64) -> Self;
    /// `sum / world` as braid's Avg computes it.
    fn avg(sum: i64, world: usize) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(impl TestElem for $t {
        fn from_i64(v: i64) -> Self { v as $t }
        fn avg(sum: i64, world: usize) -> Self { (sum as $t).wrapping_div(world as $t) }
    })*};
}
int_elem!(i8, u8, i32, i64);
impl TestElem for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn avg(sum: i64, world: usize) -> Self {
        sum as f32 / world as f32
    }
}
impl TestElem for f64 {
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    fn avg(sum: i64, world: usize) -> Self {
        sum as f64 / world as f64
    }
}
impl TestElem for f16 {
    fn from_i64(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
    fn avg(sum: i64, world: usize) -> Self {
        f16::from_f32(f16::from_f32(sum as f32).to_f32() / world as f32)
    }
}
impl TestElem for bf16 {
    fn from_i64(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
    fn avg(sum: i64, world: usize) -> Self {
        bf16::from_f32(bf16::from_f32(sum as f32).to_f32() / world as f32)
    }
}

const PERIOD: usize = 5;

/// Rank `r`'s value at element `i` (small, so sums and products stay exact).
fn value(op: ReduceOp, r: usize, i: usize) -> i64 {
    match op {
        // Products of 1s and 2s: at most 2^8, exact in every float type.
        ReduceOp::Prod => 1 + ((i % PERIOD + r) % 2) as i64,
        _ => ((i % PERIOD) + r + 1) as i64,
    }
}

/// Expected reduction of element `i` over `world` ranks, as i64 before conversion.
fn expected<T: TestElem>(op: ReduceOp, world: usize, i: usize) -> T {
    let vals = (0..world).map(|r| value(op, r, i));
    match op {
        ReduceOp::Sum => T::from_i64(vals.sum()),
        ReduceOp::Prod => T::from_i64(vals.product()),
        ReduceOp::Min => T::from_i64(vals.min().unwrap()),
        ReduceOp::Max => T::from_i64(vals.max().unwrap()),
        ReduceOp::Avg => T::avg(vals.sum(), world),
    }
}

fn input<T: TestElem>(op: ReduceOp, r: usize, n: usize, offset: usize) -> Vec<T> {
    (0..n).map(|i| T::from_i64(value(op, r, offset + i))).collect()
}

fn poison<T: TestElem>(n: usize) -> Vec<T> {
    vec![T::from_i64(99); n]
}

/// Compare `got` to `want(i)` for every i, using a per-residue table so the check is O(n).
fn check_with<T: TestElem>(what: &str, got: &[T], want: impl Fn(usize) -> T) {
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        assert!(*g == w, "{what}: element {i} is {g:?}, expected {w:?}");
    }
}

fn reduced_table<T: TestElem>(op: ReduceOp, world: usize) -> Vec<T> {
    (0..PERIOD).map(|i| expected::<T>(op, world, i)).collect()
}

fn run_grid<T: TestElem>(c: &Communicator, counts: &[usize], arrivals: &AtomicUsize) {
    let (r, n) = (c.rank(), c.world_size());
    let dt = T::DTYPE;
    for (case, &count) in counts.iter().enumerate() {
        let root = (case + count) % n;
        for in_place in [false, true] {
            let tag = |op: &str| format!("{op} {dt} count={count} world={n} rank={r} root={root} in_place={in_place}");
            for rop in ReduceOp::ALL {
                let table = reduced_table::<T>(rop, n);
                let inp = input::<T>(rop, r, count, 0);
                // all-reduce
                let out = if in_place {
                    let mut b = inp.clone();
                    c.all_reduce_in_place(&mut b, rop).unwrap();
                    b
                } else {
                    let mut o = poison(count);
                    c.all_reduce(&inp, &mut o, rop).unwrap();
                    o
                };
                check_with(&tag(&format!("all-reduce {rop}")), &out, |i| table[i % PERIOD]);
                // reduce
                let mut buf = inp.clone();
                if in_place {
                    c.reduce_in_place(&mut buf, rop, root).unwrap();
                } else {
                    let mut o = if r == root { poison(count) } else { Vec::new() };
                    c.reduce(&inp, &mut o, rop, root).unwrap();
                    if r == root {
                        buf = o;
                    }
                }
                if r == root {
                    check_with(&tag(&format!("reduce {rop}")), &buf, |i| table[i % PERIOD]);
                } else {
                    check_with(&tag(&format!("reduce {rop} (non-root input untouched)")), &buf, |i| inp[i]);
                }
                // reduce-scatter: input n*count, this rank keeps block r
                let full = input::<T>(rop, r, n * count, 0);
                let block = if in_place {
                    let mut b = full.clone();
                    c.reduce_scatter_in_place(&mut b, rop).unwrap();
                    b[r * count..(r + 1) * count].to_vec()
                } else {
                    let mut o = poison(count);
                    c.reduce_scatter(&full, &mut o, rop).unwrap();
                    check_with(&tag("reduce-scatter input untouched"), &full, |i| T::from_i64(value(rop, r, i)));
                    o
                };
                check_with(&tag(&format!("reduce-scatter {rop}")), &block, |i| table[(r * count + i) % PERIOD]);
            }
            let op = ReduceOp::Sum;
            // broadcast
            let data = input::<T>(op, root, count, 0);
            let got = if in_place {
                let mut b = if r == root { data.clone() } else { poison(count) };
                c.broadcast(&mut b, root).unwrap();
                b
            } else {
                let src = if r == root { data.clone() } else { Vec::new() };
                let mut o = poison(count);
                c.broadcast_out_of_place(&src, &mut o, root).unwrap();
                o
            };
            check_with(&tag("broadcast"), &got, |i| data[i]);
            // all-gather
            let mine = input::<T>(op, r, count, 0);
            let got = if in_place {
                let mut b = poison(n * count);
                b[r * count..(r + 1) * count].copy_from_slice(&mine);
                c.all_gather_in_place(&mut b).unwrap();
                b
            } else {
                let mut o = poison(n * count);
                c.all_gather(&mine, &mut o).unwrap();
                o
            };
            check_with(&tag("all-gather"), &got, |k| T::from_i64(value(op, k / count.max(1), k % count.max(1))));
            // all-to-all: block j of rank r's input is meant for rank j
            let a2a = |from: usize, to: usize, i: usize| T::from_i64(((from * 7 + to * 3 + i) % 11) as i64);
            let send: Vec<T> = (0..n * count).map(|k| a2a(r, k / count.max(1), k % count.max(1))).collect();
            let got = if in_place {
                let mut b = send.clone();
                c.all_to_all_in_place(&mut b).unwrap();
                b
            } else {
                let mut o = poison(n * count);
                c.all_to_all(&send, &mut o).unwrap();
                o
            };
            check_with(&tag("all-to-all"), &got, |k| a2a(k / count.max(1), r, k % count.max(1)));
            // barrier: nobody leaves before everybody arrived
            let before = arrivals.fetch_add(1, Ordering::SeqCst);
            let round = before / n;
            c.barrier().unwrap();
            assert!(arrivals.load(Ordering::SeqCst) >= (round + 1) * n, "{}: left the barrier early", tag("barrier"));
            // send/recv around the ring (even ranks send first so large messages cannot deadlock)
            if n > 1 {
                let (to, from) = ((r + 1) % n, (r + n - 1) % n);
                let msg = input::<T>(op, r, count, 3);
                let mut got = poison(count);
                if r % 2 == 0 {
                    c.send(&msg, to).unwrap();
                    c.recv(&mut got, from).unwrap();
                } else {
                    c.recv(&mut got, from).unwrap();
                    c.send(&msg, to).unwrap();
                }
                check_with(&tag("send/recv"), &got, |i| T::from_i64(value(op, from, i + 3)));
            }
        }
    }
}

/// Counts: 0, 1, a prime, and one just over 1 MiB of this dtype.
fn counts(dt: DType, big: bool) -> Vec<usize> {
    if big {
        vec![(1 << 20) / dt.size() + 13]
    } else {
        vec![0, 1, 97]
    }
}

fn grid(net: Net, world: usize, big: bool) {
    let comms = comms(net, world, Duration::from_secs(60));
    let arrivals = Arc::new(AtomicUsize::new(0));
    on_ranks(comms, move |c| {
        run_grid::<f32>(c, &counts(DType::F32, big), &arrivals);
        run_grid::<f64>(c, &counts(DType::F64, big), &arrivals);
        run_grid::<f16>(c, &counts(DType::F16, big), &arrivals);
        run_grid::<bf16>(c, &counts(DType::BF16, big), &arrivals);
        run_grid::<i8>(c, &counts(DType::I8, big), &arrivals);
        run_grid::<u8>(c, &counts(DType::U8, big), &arrivals);
        run_grid::<i32>(c, &counts(DType::I32, big), &arrivals);
        run_grid::<i64>(c, &counts(DType::I64, big), &arrivals);
    });
}

macro_rules! grid_tests {
    ($($name:ident: $net:expr, $world:expr, $big:expr;)*) => {$(
        #[test]
        fn $name() { grid($net, $world, $big); }
    )*};
}

grid_tests! {
    inproc_w1_small: Net::InProc, 1, false;
    inproc_w2_small: Net::InProc, 2, false;
    inproc_w3_small: Net::InProc, 3, false;
    inproc_w4_small: Net::InProc, 4, false;
    inproc_w7_small: Net::InProc, 7, false;
    inproc_w8_small: Net::InProc, 8, false;
    inproc_w1_large: Net::InProc, 1, true;
    inproc_w2_large: Net::InProc, 2, true;
    inproc_w3_large: Net::InProc, 3, true;
    inproc_w4_large: Net::InProc, 4, true;
    inproc_w7_large: Net::InProc, 7, true;
    inproc_w8_large: Net::InProc, 8, true;
    tcp_w1_small: Net::Tcp, 1, false;
    tcp_w2_small: Net::Tcp, 2, false;
    tcp_w3_small: Net::Tcp, 3, false;
    tcp_w4_small: Net::Tcp, 4, false;
    tcp_w7_small: Net::Tcp, 7, false;
    tcp_w8_small: Net::Tcp, 8, false;
    tcp_w1_large: Net::Tcp, 1, true;
    tcp_w2_large: Net::Tcp, 2, true;
    tcp_w3_large: Net::Tcp, 3, true;
    tcp_w4_large: Net::Tcp, 4, true;
    tcp_w7_large: Net::Tcp, 7, true;
    tcp_w8_large: Net::Tcp, 8, true;
    shm_w1_small: Net::Shm, 1, false;
    shm_w2_small: Net::Shm, 2, false;
    shm_w3_small: Net::Shm, 3, false;
    shm_w4_small: Net::Shm, 4, false;
    shm_w7_small: Net::Shm, 7, false;
    shm_w8_small: Net::Shm, 8, false;
    shm_w2_large: Net::Shm, 2, true;
    shm_w3_large: Net::Shm, 3, true;
    shm_w4_large: Net::Shm, 4, true;
    shm_w7_large: Net::Shm, 7, true;
    shm_w8_large: Net::Shm, 8, true;
}

/// The grid on sub-communicators: a [`Communicator::dup`] of the world, then a
/// [`Communicator::new_group`] of every other rank listed from the last one down
/// (renumbered in list order), while the ranks outside it go straight to the
/// parent's barrier. Each sub-communicator runs every collective with exact checks.
fn sub_grid(net: Net, world: usize) {
    let comms = comms(net, world, Duration::from_secs(60));
    let (dup_arrivals, group_arrivals) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    on_ranks(comms, move |c| {
        let r = c.rank();
        let d = c.dup().unwrap();
        assert_eq!((d.rank(), d.world_size()), (r, world));
        run_grid::<i32>(&d, &counts(DType::I32, false), &dup_arrivals);
        run_grid::<f32>(&d, &counts(DType::F32, true), &dup_arrivals);
        let list: Vec<usize> = (0..world).rev().step_by(2).collect();
        if let Some(pos) = list.iter().position(|&x| x == r) {
            let g = c.new_group(&list).unwrap();
            assert_eq!((g.rank(), g.world_size()), (pos, list.len()), "rank {r} in group {list:?}");
            run_grid::<i64>(&g, &counts(DType::I64, false), &group_arrivals);
            run_grid::<bf16>(&g, &counts(DType::BF16, true), &group_arrivals);
            g.destroy().unwrap();
        }
        c.barrier().unwrap();
        d.destroy().unwrap();
    });
}

macro_rules! sub_grid_tests {
    ($($name:ident: $net:expr, $world:expr;)*) => {$(
        #[test]
        fn $name() { sub_grid($net, $world); }
    )*};
}

sub_grid_tests! {
    groups_inproc_w1: Net::InProc, 1;
    groups_inproc_w2: Net::InProc, 2;
    groups_inproc_w3: Net::InProc, 3;
    groups_inproc_w4: Net::InProc, 4;
    groups_inproc_w7: Net::InProc, 7;
    groups_inproc_w8: Net::InProc, 8;
    groups_tcp_w1: Net::Tcp, 1;
    groups_tcp_w2: Net::Tcp, 2;
    groups_tcp_w3: Net::Tcp, 3;
    groups_tcp_w4: Net::Tcp, 4;
    groups_tcp_w7: Net::Tcp, 7;
    groups_tcp_w8: Net::Tcp, 8;
    groups_shm_w1: Net::Shm, 1;
    groups_shm_w2: Net::Shm, 2;
    groups_shm_w3: Net::Shm, 3;
    groups_shm_w4: Net::Shm, 4;
    groups_shm_w7: Net::Shm, 7;
    groups_shm_w8: Net::Shm, 8;
}
