//! Receive from any source (`Communicator::recv_any`) over in-process rings, shared
//! memory and TCP: every sender is received exactly once with its own data, the
//! per-peer order of later receives stays intact, a peer whose next send carries
//! another tag is passed over (and its send kept for the receive it belongs to), and
//! a receive that no peer can satisfy fails naming the call instead of hanging.

mod common;

use std::time::Duration;

use braid::{Communicator, ReduceOp};
use common::{comms, on_ranks, Net};

const T: Duration = Duration::from_secs(30);
const NETS: [Net; 3] = [Net::InProc, Net::Shm, Net::Tcp];
/// Elements of the large message: several frames, and single-copy on shared memory.
const BIG: usize = 300_001;

fn value(from: usize, round: usize, i: usize) -> i32 {
    (from as i32 * 1_000_003) ^ (round as i32 * 7_919) ^ (i as i32).wrapping_mul(31)
}

fn message(from: usize, round: usize, len: usize) -> Vec<i32> {
    (0..len).map(|i| value(from, round, i)).collect()
}

/// Every rank but 0 sends rank 0 a small message tagged 5 and a large one tagged 6
/// (a sender fast enough to have its large one next is passed over by the
/// receives tagged 5), then one tagged 9 and one untagged. Rank 0 takes the first
/// two rounds with `recv_any` (each sender exactly once per round, with its own
/// data), then the others from each peer by name: they pair only if `recv_any`
/// took each link's sequence number.
fn each_sender_once_then_named_receives_still_pair(net: Net, world: usize) {
    let results = on_ranks(comms(net, world, T), move |c| -> Result<(), String> {
        let (r, n) = (c.rank(), c.world_size());
        let fail = |e: braid::Error| format!("rank {r}: {e}");
        if r != 0 {
            for (round, len) in [(0, 3), (1, BIG)] {
                c.send_tagged(&message(r, round, len), 0, 5 + round as u32).map_err(fail)?;
            }
            c.send_tagged(&message(r, 2, 4), 0, 9).map_err(fail)?;
            c.send(&message(r, 3, 2), 0).map_err(fail)?;
        } else {
            for (round, len) in [(0, 3), (1, BIG)] {
                let mut seen = vec![0usize; n];
                for _ in 1..n {
                    let mut buf = vec![-1i32; len];
                    let from = c.recv_any(&mut buf, 5 + round as u32).map_err(fail)?;
                    if from == 0 || from >= n {
                        return Err(format!("round {round}: recv_any returned rank {from}"));
                    }
                    seen[from] += 1;
                    if buf != message(from, round, len) {
                        return Err(format!("round {round}: the data from rank {from} is wrong"));
                    }
                }
                if seen[1..].iter().any(|&k| k != 1) {
                    return Err(format!("round {round}: senders taken {seen:?} times (each once expected)"));
                }
            }
            for p in 1..n {
                let (mut tagged, mut plain) = ([0i32; 4], [0i32; 2]);
                c.recv_tagged(&mut tagged, p, 9).map_err(fail)?;
                c.recv(&mut plain, p).map_err(fail)?;
                if tagged[..] != message(p, 2, 4)[..] || plain[..] != message(p, 3, 2)[..] {
                    return Err(format!("named receives from rank {p} after recv_any got {tagged:?} {plain:?}"));
                }
            }
        }
        // Still in step with every rank.
        let mut x = [1i64];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(fail)?;
        (x[0] == n as i64).then_some(()).ok_or_else(|| format!("rank {r}: all-reduce gave {}", x[0]))
    });
    for (r, res) in results.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("{net:?}, world {world}, rank {r}: {e}"));
    }
}

#[test]
fn each_sender_is_received_once_and_later_receives_pair() {
    for net in NETS {
        for world in [2, 3, 4] {
            each_sender_once_then_named_receives_still_pair(net, world);
        }
    }
}

/// Rank 1's next send is tagged 7, rank 2's 5: `recv_any` with tag 5 takes rank
/// 2's (rank 1 is passed over whatever arrives first), with tag 7 then rank 1's,
/// and with tag 5 again rank 1's second send.
fn another_tag_is_passed_over(net: Net) {
    let results = on_ranks(comms(net, 3, T), |c| -> Result<Vec<(usize, Vec<i64>)>, String> {
        let r = c.rank();
        let fail = |e: braid::Error| format!("rank {r}: {e}");
        let mut got = Vec::new();
        match r {
            1 => {
                c.send_tagged(&[17i64; 6], 0, 7).map_err(fail)?;
                c.send_tagged(&[15i64; 6], 0, 5).map_err(fail)?;
            }
            2 => c.send_tagged(&[25i64; 6], 0, 5).map_err(fail)?,
            _ => {
                for tag in [5, 7, 5] {
                    let mut buf = vec![0i64; 6];
                    let from = c.recv_any(&mut buf, tag).map_err(fail)?;
                    got.push((from, buf));
                }
            }
        }
        c.barrier().map_err(fail)?;
        Ok(got)
    });
    let got = results.into_iter().map(|r| r.unwrap_or_else(|e| panic!("{net:?}: {e}"))).next().unwrap();
    let want = vec![(2, vec![25i64; 6]), (1, vec![17; 6]), (1, vec![15; 6])];
    assert_eq!(got, want, "{net:?}: (sender, data) of recv_any with tags 5, 7, 5");
}

#[test]
fn a_send_with_another_tag_is_passed_over_and_kept() {
    for net in NETS {
        another_tag_is_passed_over(net);
    }
}

/// The error of rank 0's `recv_any(tag 5)` into 4 elements, rank 1 running `peer`;
/// rank 1's own result is ignored (it fails once rank 0 tells it why it stopped).
fn rank0_error(net: Net, timeout: Duration, peer: fn(&Communicator)) -> String {
    let results = on_ranks(comms(net, 2, timeout), move |c| {
        if c.rank() == 1 {
            peer(c);
            return None;
        }
        let mut buf = [0i32; 4];
        Some(c.recv_any(&mut buf, 5).map_or_else(|e| e.to_string(), |p| format!("received from rank {p}: {buf:?}")))
    });
    results.into_iter().flatten().next().expect("rank 0's result")
}

fn assert_names(net: Net, case: &str, e: &str, want: &[&str]) {
    eprintln!("{net:?}, {case}: {e}");
    for w in want {
        assert!(e.contains(w), "{net:?}, {case}: rank 0's error lacks `{w}`: {e}");
    }
}

/// The only peer's next send carries another tag: nothing can match, so the
/// receive fails at once (not at the deadline) naming both calls.
#[test]
fn only_another_tag_fails_at_once_naming_both_tags() {
    for net in NETS {
        let e = rank0_error(net, T, |c| {
            let _ = c.send_tagged(&[1i32; 4], 0, 7);
            let _ = c.barrier();
        });
        assert_names(net, "other tag", &e, &["rank 0", "peer=any", "tag=5", "tag=7", "rank 1"]);
        assert!(!e.contains("timed out"), "{net:?}: waited for the deadline: {e}");
    }
}

/// A send of another length fails the receive as a named receive's would.
#[test]
fn another_length_fails_as_recv_does() {
    for net in NETS {
        let e = rank0_error(net, T, |c| {
            let _ = c.send_tagged(&[1i32; 5], 0, 5);
            let _ = c.barrier();
        });
        assert_names(net, "length", &e, &["mismatched", "count=4", "count=5", "rank 1"]);
    }
}

/// No peer sends: the receive times out naming the call and the silent rank.
#[test]
fn no_sender_times_out_naming_the_call() {
    for net in NETS {
        // Silent, not ahead in another call: its frame would fail the receive at once.
        let e = rank0_error(net, Duration::from_millis(700), |_| std::thread::sleep(Duration::from_millis(1500)));
        assert_names(net, "silent peer", &e, &["rank 0", "recv(", "peer=any", "tag=5", "timed out", "[1]"]);
    }
}

/// The only peer closed its communicator, or aborted it: the receive fails at once
/// (not at the deadline) naming the call and the peer.
#[test]
fn a_peer_that_is_gone_fails_the_receive() {
    for net in NETS {
        let e = rank0_error(net, T, |_| {});
        assert_names(net, "closed", &e, &["rank 0", "peer=any", "rank 1", "closed its communicator"]);
        let e = rank0_error(net, T, |c| c.abort());
        assert_names(net, "aborted", &e, &["rank 0", "peer=any", "rank 1"]);
        assert!(!e.contains("timed out"), "{net:?}: waited for the deadline: {e}");
    }
}

/// A 1-rank communicator has nobody to receive from.
#[test]
fn a_single_rank_is_refused() {
    let c = Communicator::in_process(1).unwrap().pop().unwrap();
    let e = c.recv_any(&mut [0u8; 1], 0).unwrap_err();
    let msg = e.to_string();
    // Refused as an argument error before any receive is tried.
    assert!(matches!(e, braid::Error::InvalidArgument(_)), "{msg}");
    assert!(msg.contains("1-rank communicator") && msg.contains("no other rank"), "{msg}");
}
