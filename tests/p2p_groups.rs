//! Grouped point-to-point (`batch_p2p`) and tags, over in-process rings, shared
//! memory and TCP: every rank exchanging with every other in one group (uneven
//! sizes, zeros and large messages, posted in an order that would deadlock one at a
//! time), several messages to one peer keeping their order, tags checked on both
//! ranks, and bad groups refused before anything of them runs.

mod common;

use std::time::Duration;

use braid::{Communicator, DType, Error, P2p, ReduceOp};
use common::{comms, on_ranks, Net};

const T: Duration = Duration::from_secs(30);
const WORLDS: [usize; 6] = [1, 2, 3, 4, 7, 8];

/// Elements `from` sends `to` in the big message: 0, 1, odd, large and uneven,
/// different in each direction of a pair.
fn count(from: usize, to: usize) -> usize {
    match (from * 7 + to * 3) % 6 {
        0 => 0,
        1 => 1,
        2 => 33,
        3 => 300_001,
        4 => 4096 + from,
        _ => 70_000 + 13 * to,
    }
}

fn value(from: usize, to: usize, i: usize) -> i32 {
    (from as i32 * 1_000_003) ^ (to as i32 * 10_007) ^ (i as i32).wrapping_mul(31)
}

/// The `k`-th small message `from` sends `to` (several to one peer in one group).
fn small(from: usize, to: usize, k: usize) -> [i64; 3] {
    [from as i64, to as i64, 100 + k as i64]
}

const SMALL_PER_PEER: usize = 3;

/// Every rank, in one group, sends every other rank a big message and three small
/// tagged ones and receives the same from each; the receives are posted first and
/// peers taken in descending order, so a rank that waited on each message in turn
/// would deadlock on the large ones. Every byte is checked.
fn exchange_with_everyone(net: Net, world: usize) {
    let results = on_ranks(comms(net, world, T), move |c| {
        let (r, n) = (c.rank(), c.world_size());
        let peers: Vec<usize> = (0..n).rev().filter(|&p| p != r).collect();
        let big_out: Vec<Vec<i32>> = (0..n).map(|p| (0..count(r, p)).map(|i| value(r, p, i)).collect()).collect();
        let mut big_in: Vec<Vec<i32>> = (0..n).map(|p| vec![-1; count(p, r)]).collect();
        let small_out: Vec<Vec<[i64; 3]>> =
            (0..n).map(|p| (0..SMALL_PER_PEER).map(|k| small(r, p, k)).collect()).collect();
        let mut small_in = vec![vec![[0i64; 3]; SMALL_PER_PEER]; n];
        let mut ops = Vec::new();
        for ((p, b), s) in big_in.iter_mut().enumerate().zip(small_in.iter_mut()) {
            if p == r {
                continue;
            }
            ops.push(P2p::recv(b, p));
            for (k, m) in s.iter_mut().enumerate() {
                ops.push(P2p::recv(m, p).tag(k as u32 + 1));
            }
        }
        // Then the sends, peers in descending order.
        for &p in &peers {
            ops.push(P2p::send(&big_out[p], p));
            for (k, m) in small_out[p].iter().enumerate() {
                ops.push(P2p::send(m, p).tag(k as u32 + 1));
            }
        }
        c.batch_p2p(&mut ops).map_err(|e| format!("rank {r}: {e}"))?;
        drop(ops);
        for p in peers {
            let want: Vec<i32> = (0..count(p, r)).map(|i| value(p, r, i)).collect();
            if big_in[p] != want {
                return Err(format!("rank {r}: the big message from rank {p} ({} elements) is wrong", want.len()));
            }
            let want: Vec<[i64; 3]> = (0..SMALL_PER_PEER).map(|k| small(p, r, k)).collect();
            if small_in[p] != want {
                return Err(format!("rank {r}: small messages from rank {p}: {:?}, want {want:?}", small_in[p]));
            }
        }
        // The communicator is still in step afterwards.
        let mut x = [1i64];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(|e| e.to_string())?;
        if x[0] != n as i64 {
            return Err(format!("rank {r}: all-reduce after the group gave {}", x[0]));
        }
        Ok(())
    });
    for (r, res) in results.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("{net:?}, world {world}, rank {r}: {e}"));
    }
}

fn grid(net: Net) {
    for world in WORLDS {
        exchange_with_everyone(net, world);
    }
}

#[test]
fn every_rank_exchanges_with_every_other_in_one_group_inproc() {
    grid(Net::InProc);
}

#[test]
fn every_rank_exchanges_with_every_other_in_one_group_shm() {
    grid(Net::Shm);
}

#[test]
fn every_rank_exchanges_with_every_other_in_one_group_tcp() {
    grid(Net::Tcp);
}

/// A group's messages pair with the peer's sends and receives in posting order
/// whether those are grouped or not: rank 0 sends four messages to rank 1 in one
/// group; rank 1 takes them with single tagged receives, an untagged one and a
/// group of one, then both do it the other way round (single sends, one group of
/// receives).
fn grouped_and_single_calls_pair_in_order(net: Net) {
    let got = on_ranks(comms(net, 2, T), |c| {
        let msgs: Vec<Vec<u8>> = (0..4).map(|k| vec![k as u8 + 10; 1 + k * 70_000]).collect();
        let mut got: Vec<Vec<u8>> = (0..4).map(|k| vec![0; 1 + k * 70_000]).collect();
        if c.rank() == 0 {
            let mut ops: Vec<P2p> = msgs.iter().enumerate().map(|(k, m)| P2p::send(m, 1).tag(k as u32)).collect();
            ops[1] = P2p::send(&msgs[1], 1); // tag 0, received untagged
            c.batch_p2p(&mut ops).unwrap();
            let mut ops: Vec<P2p> = got.iter_mut().map(|g| P2p::recv(g, 1)).collect();
            c.batch_p2p(&mut ops).unwrap();
        } else {
            let [g0, g1, g2, g3] = &mut got[..] else { unreachable!() };
            c.recv_tagged(g0, 0, 0).unwrap();
            c.recv(g1, 0).unwrap();
            c.recv_tagged(g2, 0, 2).unwrap();
            c.batch_p2p(&mut [P2p::recv(g3, 0).tag(3)]).unwrap();
            for m in &msgs {
                c.send(m, 0).unwrap();
            }
        }
        got == msgs
    });
    assert_eq!(got, [true, true], "{net:?}: messages arrive whole and in posting order on both ranks");
}

#[test]
fn grouped_and_single_calls_pair_in_order_inproc() {
    grouped_and_single_calls_pair_in_order(Net::InProc);
}

#[test]
fn grouped_and_single_calls_pair_in_order_shm() {
    grouped_and_single_calls_pair_in_order(Net::Shm);
}

#[test]
fn grouped_and_single_calls_pair_in_order_tcp() {
    grouped_and_single_calls_pair_in_order(Net::Tcp);
}

/// A receive tagged 5 meets a send tagged 3: the receiver fails in the call, and
/// the sender in its send or (when the send had already left) its next call, each
/// error naming both ranks and both tags; neither waits for the deadline.
fn tag_mismatch_names_both_tags(net: Net, len: usize) {
    let errs = on_ranks(comms(net, 2, T), move |c| {
        if c.rank() == 0 {
            let data = vec![7i32; len];
            let first = c.send_tagged(&data, 1, 3).err().or_else(|| c.barrier().err());
            first.map(|e| e.to_string())
        } else {
            let mut buf = vec![0i32; len];
            c.recv_tagged(&mut buf, 0, 5).err().map(|e| e.to_string())
        }
    });
    for (r, e) in errs.iter().enumerate() {
        let e = e.as_deref().unwrap_or_else(|| panic!("{net:?}: rank {r} did not fail"));
        eprintln!("{net:?}, {len} elements, rank {r}: {e}");
        for want in ["tag=3", "tag=5", "rank 1"] {
            assert!(e.contains(want), "{net:?}, {len} elements: rank {r}'s error lacks `{want}`: {e}");
        }
        assert!(!e.contains("timed out"), "{net:?}: rank {r} waited for the deadline: {e}");
    }
    assert!(errs[1].as_deref().unwrap().contains("rank 0"), "the receiver names the sender: {errs:?}");
}

#[test]
fn tag_mismatch_fails_on_both_ranks_naming_both_tags_inproc() {
    tag_mismatch_names_both_tags(Net::InProc, 4);
    tag_mismatch_names_both_tags(Net::InProc, 1 << 20);
}

#[test]
fn tag_mismatch_fails_on_both_ranks_naming_both_tags_shm() {
    tag_mismatch_names_both_tags(Net::Shm, 4);
    tag_mismatch_names_both_tags(Net::Shm, 1 << 20);
}

#[test]
fn tag_mismatch_fails_on_both_ranks_naming_both_tags_tcp() {
    tag_mismatch_names_both_tags(Net::Tcp, 4);
    tag_mismatch_names_both_tags(Net::Tcp, 1 << 20);
}

/// The refusal of a bad group on rank 0, which must say `want`; every group also
/// holds a valid send to rank 1 that must not go out.
fn refused(c: &Communicator, bad: &mut [P2p<'_>], want: &str) {
    match c.batch_p2p(bad) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(want) && m.contains("rank 0"), "{want}: {m}"),
        other => panic!("a group with {want} was not refused: {other:?}"),
    }
}

/// Groups with a peer out of range, a message to this rank, or a receive whose
/// buffer overlaps another message's are refused before anything runs: the valid
/// send each also holds never leaves (rank 1's next receive gets the message sent
/// after them), and the communicator goes on working.
#[test]
fn bad_groups_are_refused_before_anything_runs() {
    let out = on_ranks(comms(Net::InProc, 3, T), |c| {
        let mut got = [0i32; 4];
        match c.rank() {
            0 => {
                let stray = [666i32; 4];
                refused(c, &mut [P2p::send(&stray, 1), P2p::send(&stray, 3)], "peer 3 is not a rank");
                let mut mine = [0i32; 4];
                refused(c, &mut [P2p::send(&stray, 1), P2p::recv(&mut mine, 0)], "recv to itself");
                let mut buf = [0i32; 8];
                let p = buf.as_mut_ptr() as *mut u8;
                // SAFETY: both messages lie in `buf`, alive past the (refused) call.
                let (send, recv) = unsafe {
                    (P2p::send_raw(p, 8, DType::I32, 1).unwrap(), P2p::recv_raw(p.add(16), 2, DType::I32, 2).unwrap())
                };
                refused(c, &mut [P2p::send(&stray, 1), send, recv], "overlaps message");
                // Two receives into one buffer, the second starting inside the first.
                let (a, b) = unsafe {
                    (P2p::recv_raw(p, 4, DType::I32, 1).unwrap(), P2p::recv_raw(p.add(12), 1, DType::I32, 2).unwrap())
                };
                refused(c, &mut [P2p::send(&stray, 1), a, b], "overlaps message");
                // Two sends of one buffer are fine (both only read it).
                let twice = [5i32; 4];
                c.batch_p2p(&mut [P2p::send(&twice, 1), P2p::send(&twice, 1)]).unwrap();
            }
            1 => {
                let mut twice = [[0i32; 4]; 2];
                let [x, y] = &mut twice;
                c.batch_p2p(&mut [P2p::recv(x, 0), P2p::recv(y, 0)]).unwrap();
                got = twice[0];
                assert_eq!(twice[1], got);
            }
            _ => {}
        }
        let mut x = [1i32];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        (got, x[0])
    });
    assert_eq!(out[1].0, [5; 4], "rank 1 received a message of a refused group");
    assert!(out.iter().all(|o| o.1 == 3), "the communicator works after the refusals: {out:?}");
}

/// The scope form: each rank posts a ring exchange of a large message as one
/// group, computes while it runs, and finds the left neighbour's data after the
/// wait; then a second group in the same scope.
#[test]
fn scoped_groups_run_a_ring_while_the_caller_computes() {
    for net in [Net::InProc, Net::Tcp] {
        let ok = on_ranks(comms(net, 4, T), |c| {
            let (r, n) = (c.rank(), c.world_size());
            let (left, right) = ((r + n - 1) % n, (r + 1) % n);
            let mine = vec![r as f64; 1 << 19];
            let (mut from_left, mut again, tagged) = (vec![0f64; 1 << 19], [0u8; 3], [r as u8; 3]);
            let rest: f64 = c
                .scope(|s| -> braid::Result<f64> {
                    let g = s.batch_p2p(vec![P2p::recv(&mut from_left, left), P2p::send(&mine, right)]);
                    let busy: f64 = (0..10_000).map(|i| i as f64).sum();
                    g.wait()?;
                    let g = s.batch_p2p(vec![P2p::send(&tagged, left).tag(9), P2p::recv(&mut again, right).tag(9)]);
                    g.wait()?;
                    Ok(busy)
                })
                .unwrap();
            rest > 0.0 && from_left.iter().all(|v| *v == left as f64) && again == [right as u8; 3]
        });
        assert!(ok.iter().all(|o| *o), "{net:?}: {ok:?}");
    }
}
