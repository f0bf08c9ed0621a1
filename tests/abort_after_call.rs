//! A rank that aborts right after finishing a call must not fail its peers' same
//! call, which can still complete: everything it sent before the abort frame is
//! consumed first, and the abort fails only what still needs that rank (issue 31,
//! defect 1). Every collective and send/recv, over in-process, shared-memory and
//! TCP links, 2 to 8 ranks, with one rank aborting and then with every rank
//! aborting as soon as its own call returns. A later call that needs the aborted
//! rank must fail, with an error that leads back to it.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use braid::{Communicator, Error, ReduceOp};
use common::{comms, on_ranks, Call, Net, CALLS_ALL};

/// Elements per rank block: odd, and past one small frame.
const COUNT: usize = 4099;

/// Who aborts once its call has returned.
#[derive(Clone, Copy, Debug)]
enum Aborters {
    /// The last rank (the root of the rooted calls): the one that usually finishes first.
    Last,
    /// Every rank.
    All,
}

/// The i-th element rank `r` contributes to block `b`.
fn value(r: usize, b: usize, i: usize) -> i32 {
    (r * 1_000_000 + b * 10_000 + i) as i32
}

/// Sum over every rank of `value(_, b, i)`.
fn summed(world: usize, b: usize, i: usize) -> i32 {
    (0..world).map(|r| value(r, b, i)).sum()
}

/// Run `op` on this rank and check its result exactly; Err carries the call's error.
fn run_and_check(c: &Communicator, op: Call) -> Result<(), String> {
    let (rank, world) = (c.rank(), c.world_size());
    let root = world - 1;
    let block = |b: usize| (0..COUNT).map(move |i| value(rank, b, i));
    let fail = |e: Error| format!("rank {rank}: {op:?}: {e}");
    let check = |got: &[i32], want: &dyn Fn(usize) -> i32| -> Result<(), String> {
        match (0..got.len()).find(|&i| got[i] != want(i)) {
            None => Ok(()),
            Some(i) => Err(format!("rank {rank}: {op:?}: element {i} is {} not {}", got[i], want(i))),
        }
    };
    match op {
        Call::AllReduce => {
            let mut buf: Vec<i32> = block(0).collect();
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum).map_err(fail)?;
            check(&buf, &|i| summed(world, 0, i))
        }
        Call::Broadcast => {
            let mut buf: Vec<i32> = if rank == root { block(0).collect() } else { vec![-1; COUNT] };
            c.broadcast(&mut buf, root).map_err(fail)?;
            check(&buf, &|i| value(root, 0, i))
        }
        Call::AllGather => {
            let input: Vec<i32> = block(0).collect();
            let mut out = vec![-1; COUNT * world];
            c.all_gather(&input, &mut out).map_err(fail)?;
            check(&out, &|j| value(j / COUNT, 0, j % COUNT))
        }
        Call::ReduceScatter => {
            let input: Vec<i32> = (0..world).flat_map(block).collect();
            let mut out = vec![-1; COUNT];
            c.reduce_scatter(&input, &mut out, ReduceOp::Sum).map_err(fail)?;
            check(&out, &|i| summed(world, rank, i))
        }
        Call::Reduce => {
            let input: Vec<i32> = block(0).collect();
            let mut out = vec![-1; COUNT];
            c.reduce(&input, &mut out, ReduceOp::Sum, root).map_err(fail)?;
            if rank == root {
                check(&out, &|i| summed(world, 0, i))
            } else {
                Ok(())
            }
        }
        Call::Barrier => c.barrier().map_err(fail),
        Call::AllToAll => {
            let input: Vec<i32> = (0..world).flat_map(block).collect();
            let mut out = vec![-1; COUNT * world];
            c.all_to_all(&input, &mut out).map_err(fail)?;
            check(&out, &|j| value(j / COUNT, rank, j % COUNT))
        }
        Call::SendRecv => {
            // A ring: even ranks send first, odd ranks receive first.
            let (to, from) = ((rank + 1) % world, (rank + world - 1) % world);
            let input: Vec<i32> = block(to).collect();
            let mut out = vec![-1; COUNT];
            if rank % 2 == 0 {
                c.send(&input, to).map_err(fail)?;
                c.recv(&mut out, from).map_err(fail)?;
            } else {
                c.recv(&mut out, from).map_err(fail)?;
                c.send(&input, to).map_err(fail)?;
            }
            check(&out, &|i| value(from, rank, i))
        }
    }
}

/// Follow the peers named by the errors of a failed later call from `rank` until
/// they reach an aborted rank; panic if they do not.
fn leads_to_aborted(errors: &[Option<Error>], aborted: &[bool], rank: usize, case: &str) {
    let mut at = rank;
    for _ in 0..errors.len() {
        if aborted[at] {
            return;
        }
        at = match &errors[at] {
            Some(Error::PeerAborted { peer, .. } | Error::PeerLost { peer, .. }) => *peer,
            other => panic!("{case}: rank {at}'s later call was not failed by a peer: {other:?}"),
        };
    }
    panic!("{case}: rank {rank}'s error does not lead back to an aborted rank: {:?}", errors[rank]);
}

fn abort_after(net: Net, world: usize, op: Call, who: Aborters) {
    let case = format!("{net:?}, {world} ranks, {op:?}, {who:?} abort");
    let aborts = move |r: usize| matches!(who, Aborters::All) || r == world - 1;
    let all_done = Arc::new(Barrier::new(world));
    let out = on_ranks(comms(net, world, Duration::from_secs(10)), move |c| {
        let first = run_and_check(c, op);
        if aborts(c.rank()) {
            c.abort();
        }
        // Every rank's first call has returned before any later call starts, and
        // every buffer stays alive until then.
        all_done.wait();
        let later = c.barrier().err();
        (first, later)
    });
    for (rank, (first, _)) in out.iter().enumerate() {
        if let Err(e) = first {
            panic!("{case}: rank {rank}'s call failed though every message it needed was sent: {e}");
        }
    }
    let aborted: Vec<bool> = (0..world).map(aborts).collect();
    let later: Vec<Option<Error>> = out.into_iter().map(|(_, l)| l).collect();
    for rank in 0..world {
        match &later[rank] {
            Some(Error::Aborted { rank: r, .. }) if aborted[rank] && *r == rank => {}
            _ if aborted[rank] => panic!("{case}: aborted rank {rank}'s later call: {:?}", later[rank]),
            _ => leads_to_aborted(&later, &aborted, rank, &case),
        }
    }
}

fn grid(net: Net) {
    for world in 2..=8 {
        for op in CALLS_ALL {
            for who in [Aborters::Last, Aborters::All] {
                abort_after(net, world, op, who);
            }
        }
    }
}

#[test]
fn abort_after_each_call_fails_no_peer_call_inproc() {
    grid(Net::InProc);
}

#[test]
fn abort_after_each_call_fails_no_peer_call_shm() {
    grid(Net::Shm);
}

#[test]
fn abort_after_each_call_fails_no_peer_call_tcp() {
    grid(Net::Tcp);
}
