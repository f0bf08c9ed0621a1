//! Safe async calls on borrowed buffers (`Communicator::scope`): every collective and
//! send/recv over a grid of world sizes and counts with exact integer results, the
//! overlap of a call on a slice with work on the rest of its buffer, the scope's
//! wait for forgotten handles, and errors that name the rank and the call.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use braid::{Communicator, Error, ReduceOp};
use common::{comms, on_ranks, Net};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Every buffer of one rank's grid step, filled with its inputs.
#[derive(Clone, Debug, PartialEq)]
struct Bufs {
    ar_in: Vec<i64>,
    ar_out: Vec<i64>,
    ar_ip: Vec<i64>,
    bc_ip: Vec<i64>,
    bc_in: Vec<i64>,
    bc_out: Vec<i64>,
    ag_in: Vec<i64>,
    ag_out: Vec<i64>,
    ag_ip: Vec<i64>,
    rs_in: Vec<i64>,
    rs_out: Vec<i64>,
    rs_ip: Vec<i64>,
    rd_in: Vec<i64>,
    rd_out: Vec<i64>,
    rd_ip: Vec<i64>,
    a2a_in: Vec<i64>,
    a2a_out: Vec<i64>,
    a2a_ip: Vec<i64>,
    p2p_send: Vec<i64>,
    p2p_recv: Vec<i64>,
}

/// Roots: broadcast in place from the last rank, out of place from the middle one;
/// reduce out of place to rank 0, in place to the last rank.
fn roots(w: usize) -> (usize, usize, usize, usize) {
    (w - 1, w / 2, 0, w - 1)
}

/// `Bufs` before the calls (`after == false`) or as every call must leave them.
fn bufs(rank: usize, w: usize, n: usize, after: bool) -> Bufs {
    let (r, wi, ni) = (rank as i64, w as i64, n as i64);
    let (bc_root, bco_root, rd_root, rdi_root) = roots(w);
    let s0 = wi * (wi - 1) / 2; // sum of ranks
    let s1 = wi * (wi + 1) / 2; // sum of rank + 1
    let v = |f: &dyn Fn(i64) -> i64, len: usize| (0..len as i64).map(f).collect::<Vec<i64>>();
    let mine = |p: usize| p == rank;
    // All-to-all: block p of rank q's input is (q * w + p) * n + j.
    let a2a_in = v(&|k| (r * wi + k / ni.max(1)) * ni + k % ni.max(1), w * n);
    let a2a_out = v(&|k| ((k / ni.max(1)) * wi + r) * ni + k % ni.max(1), w * n);
    let prev = ((rank + w - 1) % w) as i64;
    let gathered = v(&|k| k, w * n);
    let scattered = v(&|j| wi * (r * ni + j) + s0, n);
    let block_r = |k: i64| k / ni.max(1) == r;
    Bufs {
        ar_in: v(&|j| (r + 1) * (j + 1), n),
        ar_out: if after { v(&|j| s1 * (j + 1), n) } else { vec![-1; n] },
        ar_ip: if after { v(&|j| wi - 1 + j, n) } else { v(&|j| r + j, n) },
        bc_ip: if after || mine(bc_root) { v(&|j| 7 * j + 3, n) } else { vec![-1; n] },
        bc_in: if mine(bco_root) { v(&|j| r * 100 + j, n) } else { Vec::new() },
        bc_out: if after { v(&|j| bco_root as i64 * 100 + j, n) } else { vec![-1; n] },
        ag_in: v(&|j| r * ni + j, n),
        ag_out: if after { gathered.clone() } else { vec![-1; w * n] },
        ag_ip: if after { gathered } else { v(&|k| if block_r(k) { k } else { -1 }, w * n) },
        rs_in: v(&|k| k + r, w * n),
        rs_out: if after { scattered.clone() } else { vec![-1; n] },
        // In place, only block `rank` is specified afterwards (the rest is scratch):
        // `run_grid_step` keeps just that block.
        rs_ip: if after { scattered } else { v(&|k| k + r, w * n) },
        rd_in: v(&|j| r + j + 1, n),
        rd_out: match (mine(rd_root), after) {
            (false, _) => Vec::new(),
            (true, true) => v(&|j| s0 + wi * (j + 1), n),
            (true, false) => vec![-1; n],
        },
        rd_ip: if after && mine(rdi_root) { v(&|j| j, n) } else { v(&|j| r + j, n) },
        a2a_in: a2a_in.clone(),
        a2a_out: if after { a2a_out.clone() } else { vec![-1; w * n] },
        a2a_ip: if after { a2a_out } else { a2a_in },
        p2p_send: v(&|j| r * 7 + j, n),
        p2p_recv: if after && w > 1 { v(&|j| prev * 7 + j, n) } else { vec![-1; n] },
    }
}

/// Issue every call at once in one scope, then wait for them in reverse order.
fn run_grid_step(c: &Communicator, n: usize) -> Bufs {
    let (rank, w) = (c.rank(), c.world_size());
    let (bc_root, bco_root, rd_root, rdi_root) = roots(w);
    let mut b = bufs(rank, w, n, false);
    let Bufs {
        ar_in,
        ar_out,
        ar_ip,
        bc_ip,
        bc_in,
        bc_out,
        ag_in,
        ag_out,
        ag_ip,
        rs_in,
        rs_out,
        rs_ip,
        rd_in,
        rd_out,
        rd_ip,
        a2a_in,
        a2a_out,
        a2a_ip,
        p2p_send,
        p2p_recv,
    } = &mut b;
    c.scope(|s| {
        let out_ptr = ar_out.as_ptr();
        let mut works = vec![
            s.all_reduce(ar_in, ar_out, ReduceOp::Sum),
            s.all_reduce_in_place(ar_ip, ReduceOp::Max),
            s.broadcast(bc_ip, bc_root),
            s.broadcast_out_of_place(bc_in, bc_out, bco_root),
            s.all_gather(ag_in, ag_out),
            s.all_gather_in_place(ag_ip),
            s.reduce_scatter(rs_in, rs_out, ReduceOp::Sum),
            s.reduce_scatter_in_place(rs_ip, ReduceOp::Sum),
            s.reduce(rd_in, rd_out, ReduceOp::Sum, rd_root),
            s.reduce_in_place(rd_ip, ReduceOp::Min, rdi_root),
            s.all_to_all(a2a_in, a2a_out),
            s.all_to_all_in_place(a2a_ip),
        ];
        let barrier = s.barrier();
        // A chain that cannot deadlock however sends are buffered: rank 0 sends
        // first, every other rank receives from its predecessor first.
        let (next, prev) = ((rank + 1) % w, (rank + w - 1) % w);
        let mut p2p = Vec::new();
        if w > 1 {
            if rank == 0 {
                p2p.push(s.send(p2p_send, next));
                works.push(s.recv(p2p_recv, prev));
            } else {
                works.push(s.recv(p2p_recv, prev));
                p2p.push(s.send(p2p_send, next));
            }
        }
        for sent in p2p.into_iter().rev() {
            sent.wait().unwrap_or_else(|e| panic!("rank {rank}: send: {e}"));
        }
        barrier.wait().unwrap_or_else(|e| panic!("rank {rank}: barrier: {e}"));
        let mut k = works.len();
        while let Some(work) = works.pop() {
            k -= 1;
            let out = work.wait().unwrap_or_else(|e| panic!("rank {rank}: call {k} of the grid, count {n}: {e}"));
            if k == 0 {
                assert_eq!(out.as_ptr(), out_ptr, "wait hands back the output slice it borrowed");
            }
        }
    });
    b.rs_ip = b.rs_ip[rank * n..(rank + 1) * n].to_vec();
    b
}

/// Every borrowed async call, issued all at once per rank, over `net`.
fn borrowed_grid(net: Net) {
    for w in [1usize, 2, 3, 4, 7, 8] {
        for n in [0usize, 1, 7, 65_537] {
            let got = on_ranks(comms(net, w, TIMEOUT), move |c| run_grid_step(c, n));
            for (rank, got) in got.into_iter().enumerate() {
                let want = bufs(rank, w, n, true);
                assert!(got == want, "{net:?}, world {w}, count {n}, rank {rank}: got {got:?}\nwant {want:?}");
            }
        }
    }
}

#[test]
fn every_call_on_borrowed_buffers_gives_exact_results_over_worlds_and_counts() {
    borrowed_grid(Net::InProc);
}

#[test]
fn every_call_on_borrowed_buffers_gives_exact_results_over_shm() {
    borrowed_grid(Net::Shm);
}

#[test]
fn every_call_on_borrowed_buffers_gives_exact_results_over_tcp() {
    borrowed_grid(Net::Tcp);
}

#[test]
fn an_all_reduce_on_a_slice_overlaps_with_work_on_the_rest_of_the_buffer() {
    const HEAD: usize = 1000;
    let (go, wait_go) = mpsc::channel::<()>();
    let wait_go = std::sync::Mutex::new(wait_go);
    let got = on_ranks(comms(Net::InProc, 2, TIMEOUT), move |c| {
        let mut buf: Vec<i64> = (0..2 * HEAD as i64).collect();
        if c.rank() == 1 {
            // Rank 1 joins the all-reduce only once rank 0 has computed on the rest of
            // its buffer: until then rank 0's call cannot finish, so that computation
            // ran while the call was in flight.
            wait_go.lock().unwrap().recv_timeout(TIMEOUT).expect("rank 0's signal");
            c.all_reduce_in_place(&mut buf[..HEAD], ReduceOp::Sum).expect("rank 1's all-reduce");
            return (buf, true);
        }
        let in_flight_during_compute = c.scope(|s| {
            let (head, tail) = buf.split_at_mut(HEAD);
            let mut work = s.all_reduce_in_place(head, ReduceOp::Sum);
            tail.iter_mut().for_each(|x| *x *= 3);
            let still_running = !work.test();
            assert_eq!(work.wait_timeout(Duration::ZERO).expect("pending, not failed"), None);
            go.send(()).expect("rank 1 listens");
            let head = work.wait().expect("rank 0's all-reduce");
            head[0] += 1; // the slice is usable again once the call completed
            still_running
        });
        (buf, in_flight_during_compute)
    });
    let (buf, overlapped) = &got[0];
    assert!(overlapped, "rank 0's call finished before rank 1 joined it");
    let want: Vec<i64> =
        (0..2 * HEAD as i64).map(|k| if k < HEAD as i64 { 2 * k + (k == 0) as i64 } else { 3 * k }).collect();
    assert_eq!(buf, &want);
}

#[test]
fn a_forgotten_handle_is_waited_for_by_the_scope_before_its_buffer_is_released() {
    let (go, wait_go) = mpsc::channel::<()>();
    let (returned, wait_returned) = mpsc::channel::<()>();
    let wait = std::sync::Mutex::new((wait_go, wait_returned));
    let got = on_ranks(comms(Net::InProc, 2, TIMEOUT), move |c| {
        let mut buf = vec![c.rank() as i64 + 1; 4096];
        if c.rank() == 1 {
            let wait = wait.lock().unwrap();
            wait.0.recv_timeout(TIMEOUT).expect("rank 0's signal");
            // A scope that ended without waiting would say so now, before this rank
            // joins the call: its snapshot below then misses the result. A sound
            // scope cannot end before this rank joins, so this look times out.
            let ended_early = wait.1.recv_timeout(Duration::from_millis(300)).is_ok();
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum).expect("rank 1's all-reduce");
            return (buf, ended_early);
        }
        c.scope(|s| {
            // Skips the handle's Drop: only the scope's own wait keeps `buf` lent.
            std::mem::forget(s.all_reduce_in_place(&mut buf, ReduceOp::Sum));
            // Rank 1 joins only after this, so the call is in flight as the scope ends.
            go.send(()).expect("rank 1 listens");
        });
        // Taken before the communicator (whose Drop finishes queued work) goes.
        let snapshot = buf.clone();
        let _ = returned.send(());
        (snapshot, false)
    });
    assert!(!got[1].1, "rank 0's scope ended before rank 1 joined the call it lent a buffer to");
    assert!(got.iter().all(|(b, _)| b.iter().all(|&x| x == 3)), "a rank saw its buffer before the call ended");
}

#[test]
fn errors_come_back_from_wait_naming_the_rank_and_the_call() {
    let got = on_ranks(comms(Net::InProc, 2, TIMEOUT), |c| {
        // Refused up front, as the blocking form refuses it: 5 elements do not split
        // into 2 blocks. Nothing is issued, so the ranks stay in step.
        let mut odd = [0i32; 5];
        let refused = c.scope(|s| s.all_gather_in_place(&mut odd[..]).wait().map(|_| ()));
        if c.rank() == 1 {
            c.abort();
            return (refused, Ok(()));
        }
        let mut buf = [1i32; 16];
        let failed = c.scope(|s| s.all_reduce_in_place(&mut buf[..], ReduceOp::Sum).wait().map(|_| ()));
        (refused, failed)
    });
    for (rank, (refused, _)) in got.iter().enumerate() {
        match refused {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(&format!("rank {rank}")), "{m}"),
            other => panic!("rank {rank}: an indivisible all-gather gave {other:?}"),
        }
    }
    let e = got[0].1.as_ref().expect_err("rank 0's all-reduce with an aborted peer");
    let m = e.to_string();
    assert!(matches!(e, Error::PeerAborted { peer: 1, .. }), "{e:?}");
    assert!(m.contains("rank 0 in all-reduce") && m.contains("rank 1 aborted"), "{m}");
}

/// Every buffer of one rank's step of the rooted and `*v` grid.
#[derive(Clone, Debug, PartialEq)]
struct RootedV {
    ga_in: Vec<i64>,
    ga_out: Vec<i64>,
    ga_ip: Vec<i64>,
    sc_in: Vec<i64>,
    sc_out: Vec<i64>,
    sc_ip: Vec<i64>,
    agv_in: Vec<i64>,
    agv_out: Vec<i64>,
    agv_ip: Vec<i64>,
    rsv_in: Vec<i64>,
    rsv_out: Vec<i64>,
    rsv_ip: Vec<i64>,
    a2av_in: Vec<i64>,
    a2av_out: Vec<i64>,
}

/// Roots: gather out of place to the last rank, in place to the middle one;
/// scatter out of place from rank 0, in place from the last rank.
fn rooted_roots(w: usize) -> (usize, usize, usize, usize) {
    (w - 1, w / 2, 0, w - 1)
}

/// Rank `j`'s block of the all-gather-v and reduce-scatter-v: uneven, zero for
/// ranks 0 and 5 (and for every rank at `n == 0`).
fn v_count(j: usize, n: usize) -> usize {
    j * 3 % 5 * n
}

/// Elements rank `from` sends rank `to` in the all-to-all-v: zero for some pairs.
fn a2a_count(from: usize, to: usize, n: usize) -> usize {
    (from + 2 * to) % 4 * n
}

/// The all-to-all-v's layout on `rank`: send blocks in reverse rank order with a
/// one-element gap before each, receive blocks in rank order with a gap after each
/// (the gaps must stay untouched). (send counts, send displs, recv counts, recv displs).
fn a2av_layout(rank: usize, w: usize, n: usize) -> [Vec<usize>; 4] {
    let sc: Vec<usize> = (0..w).map(|j| a2a_count(rank, j, n)).collect();
    let rc: Vec<usize> = (0..w).map(|j| a2a_count(j, rank, n)).collect();
    let (mut sd, mut at) = (vec![0; w], 0);
    for j in (0..w).rev() {
        sd[j] = at + 1;
        at += 1 + sc[j];
    }
    let rd = rc.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c + 1))).collect();
    [sc, sd, rc, rd]
}

/// `RootedV` before the calls (`after == false`) or as every call must leave it.
fn rooted_v(rank: usize, w: usize, n: usize, after: bool) -> RootedV {
    let (r, wi, ni) = (rank as i64, w as i64, n as i64);
    let (ga_root, gai_root, sc_root, sci_root) = rooted_roots(w);
    let v = |f: &dyn Fn(i64) -> i64, len: usize| (0..len as i64).map(f).collect::<Vec<i64>>();
    let block_r = |k: i64| k / ni.max(1) == r;
    let counts: Vec<usize> = (0..w).map(|j| v_count(j, n)).collect();
    let displs: Vec<i64> = counts.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c as i64))).collect();
    let (total, mine, at) = (counts.iter().sum::<usize>(), counts[rank], displs[rank]);
    // All-gather-v: rank q's element i is q * 100_000 + i.
    let owner = |k: i64| (0..w).rfind(|&j| displs[j] <= k).unwrap_or(0) as i64;
    let gathered_v = v(&|k| owner(k) * 100_000 + k - displs[owner(k) as usize], total);
    let own_only = v(&|k| if owner(k) == r && counts[rank] > 0 { owner(k) * 100_000 + k - at } else { -1 }, total);
    // Reduce-scatter-v: rank q's element k is k * mult + q; summed, block `rank`.
    let s0 = wi * (wi - 1) / 2;
    let reduced = |mult: i64| v(&|j| wi * (at + j) * mult + s0, mine);
    let rsv_ip_after = {
        let mut b = v(&|k| 2 * k + r, total);
        b[at as usize..at as usize + mine].copy_from_slice(&reduced(2));
        b
    };
    // All-to-all-v: what `from` sends `to`, element i.
    let a2a_val = |from: usize, to: usize, i: usize| (from * 1_000_000 + to * 10_000 + i) as i64;
    let [sc, sd, rc, rd] = a2av_layout(rank, w, n);
    let mut a2av_in = vec![-1; sd.iter().zip(&sc).map(|(d, c)| d + c).max().unwrap_or(0)];
    let mut a2av_out = vec![-1; rd.iter().zip(&rc).map(|(d, c)| d + c + 1).max().unwrap_or(0)];
    for j in 0..w {
        (0..sc[j]).for_each(|i| a2av_in[sd[j] + i] = a2a_val(rank, j, i));
        if after {
            (0..rc[j]).for_each(|i| a2av_out[rd[j] + i] = a2a_val(j, rank, i));
        }
    }
    RootedV {
        ga_in: v(&|j| r * ni + j, n),
        ga_out: match (rank == ga_root, after) {
            (false, _) => Vec::new(),
            (true, true) => v(&|k| k, w * n),
            (true, false) => vec![-1; w * n],
        },
        ga_ip: match (rank == gai_root, after) {
            (false, _) => v(&|j| 2 * (r * ni + j), n),
            (true, true) => v(&|k| 2 * k, w * n),
            (true, false) => v(&|k| if block_r(k) { 2 * k } else { -1 }, w * n),
        },
        sc_in: if rank == sc_root { v(&|k| 3 * k + 1, w * n) } else { Vec::new() },
        sc_out: if after { v(&|j| 3 * (r * ni + j) + 1, n) } else { vec![-1; n] },
        sc_ip: match (rank == sci_root, after) {
            (true, _) => v(&|k| 5 * k + 2, w * n),
            (false, true) => v(&|j| 5 * (r * ni + j) + 2, n),
            (false, false) => vec![-1; n],
        },
        agv_in: v(&|i| r * 100_000 + i, mine),
        agv_out: if after { gathered_v.clone() } else { vec![-1; total] },
        agv_ip: if after { gathered_v } else { own_only },
        rsv_in: v(&|k| k + r, total),
        rsv_out: if after { reduced(1) } else { vec![-1; mine] },
        rsv_ip: if after { rsv_ip_after } else { v(&|k| 2 * k + r, total) },
        a2av_in,
        a2av_out,
    }
}

/// Every rooted and `*v` call issued at once in one scope, waited for in reverse order.
fn run_rooted_v_step(c: &Communicator, n: usize) -> RootedV {
    let (rank, w) = (c.rank(), c.world_size());
    let (ga_root, gai_root, sc_root, sci_root) = rooted_roots(w);
    let counts: Vec<usize> = (0..w).map(|j| v_count(j, n)).collect();
    let [sc, sd, rc, rd] = a2av_layout(rank, w, n);
    let mut b = rooted_v(rank, w, n, false);
    let RootedV {
        ga_in,
        ga_out,
        ga_ip,
        sc_in,
        sc_out,
        sc_ip,
        agv_in,
        agv_out,
        agv_ip,
        rsv_in,
        rsv_out,
        rsv_ip,
        a2av_in,
        a2av_out,
    } = &mut b;
    c.scope(|s| {
        let mut works = vec![
            s.gather(ga_in, ga_out, ga_root),
            s.gather_in_place(ga_ip, gai_root),
            s.scatter(sc_in, sc_out, sc_root),
            s.scatter_in_place(sc_ip, sci_root),
            s.all_gather_v(agv_in, agv_out, &counts),
            s.all_gather_v_in_place(agv_ip, &counts),
            s.reduce_scatter_v(rsv_in, rsv_out, &counts, ReduceOp::Sum),
            s.reduce_scatter_v_in_place(rsv_ip, &counts, ReduceOp::Sum),
            s.all_to_all_v(a2av_in, &sc, &sd, a2av_out, &rc, &rd),
        ];
        let mut k = works.len();
        while let Some(work) = works.pop() {
            k -= 1;
            work.wait().unwrap_or_else(|e| panic!("rank {rank}: call {k} of the rooted/v grid, n {n}: {e}"));
        }
    });
    b
}

/// Every rooted and `*v` borrowed async call, issued all at once per rank, over `net`.
fn rooted_v_grid(net: Net) {
    for w in [1usize, 2, 3, 4, 7, 8] {
        for n in [0usize, 1, 7, 1031] {
            let got = on_ranks(comms(net, w, TIMEOUT), move |c| run_rooted_v_step(c, n));
            for (rank, got) in got.into_iter().enumerate() {
                let want = rooted_v(rank, w, n, true);
                assert!(got == want, "{net:?}, world {w}, n {n}, rank {rank}: got {got:?}\nwant {want:?}");
            }
        }
    }
}

#[test]
fn gather_scatter_and_v_calls_on_borrowed_buffers_give_exact_results() {
    rooted_v_grid(Net::InProc);
}

#[test]
fn gather_scatter_and_v_calls_on_borrowed_buffers_give_exact_results_over_shm() {
    rooted_v_grid(Net::Shm);
}

#[test]
fn gather_scatter_and_v_calls_on_borrowed_buffers_give_exact_results_over_tcp() {
    rooted_v_grid(Net::Tcp);
}

#[test]
fn a_v_call_with_a_wrong_output_length_fails_from_wait_and_the_ranks_stay_in_step() {
    let got = on_ranks(comms(Net::InProc, 3, TIMEOUT), |c| {
        let (rank, counts) = (c.rank(), [2usize, 0, 3]);
        let input = vec![rank as i64 + 1; 5];
        // One element too many: reduce-scatter-v's output is exactly counts[rank].
        let mut long = vec![-1i64; counts[rank] + 1];
        // Two elements short of the 5 the counts gather.
        let mut short = vec![-1i64; 3];
        let mut ok = vec![-1i64; 5];
        c.scope(|s| {
            let bad_rs = s.reduce_scatter_v(&input, &mut long, &counts, ReduceOp::Sum).wait().map(|_| ());
            let bad_ag = s.all_gather_v(&input[..counts[rank]], &mut short, &counts).wait().map(|_| ());
            // The failed calls took their turns on every rank alike: the next one runs.
            let good = s.all_gather_v(&input[..counts[rank]], &mut ok, &counts).wait().map(|o| o.to_vec());
            (bad_rs, bad_ag, good)
        })
    });
    for (rank, (bad_rs, bad_ag, good)) in got.into_iter().enumerate() {
        for (call, r) in [("reduce-scatter-v", bad_rs), ("all-gather-v", bad_ag)] {
            match r {
                Err(Error::InvalidArgument(m)) => {
                    assert!(m.contains(&format!("rank {rank}")) && m.contains("output has"), "{call}: {m}")
                }
                other => panic!("rank {rank}: {call} with a wrong output length gave {other:?}"),
            }
        }
        assert_eq!(good.expect("the call after the refused ones"), [1, 1, 3, 3, 3], "rank {rank}");
    }
}
