//! Ranks that pass different roots to the same rooted call fail in that call, on
//! every rank, naming both roots: the root is part of the signature every rank
//! checks, and a root that only sends still hears of the disagreement. The check is
//! on by default: these communicators are built with the defaults.

mod common;

use std::time::Duration;

use braid::{Error, ReduceOp};
use std::time::Instant;

use common::{comms, on_ranks, Call, Net};

/// Rank 1 passes root 1, every other rank root 0; returns each rank's error and
/// how long its call took to fail.
fn disagree(net: Net, world: usize, call: Call) -> Vec<(Error, Duration)> {
    // A deadline far past the failure: an error here is the mismatch, not a timeout.
    on_ranks(comms(net, world, Duration::from_secs(30)), move |c| {
        let root = usize::from(c.rank() == 1);
        let mut buf = vec![c.rank() as i32; 100];
        let start = Instant::now();
        let first = match call {
            Call::Broadcast => c.broadcast(&mut buf, root),
            Call::Reduce => c.reduce(&[1i32; 100], &mut buf, ReduceOp::Sum, root),
            other => unreachable!("{other:?} takes no root"),
        };
        match first {
            Ok(()) => panic!("rank {} (root {root}) finished {call:?} with roots that differ", c.rank()),
            Err(e) => (e, start.elapsed()),
        }
    })
}

fn grid(net: Net) {
    for call in [Call::Broadcast, Call::Reduce] {
        for world in [2, 3, 4, 7, 8] {
            let failed = disagree(net, world, call);
            let slowest = failed.iter().map(|(_, t)| *t).max().unwrap_or_default();
            eprintln!("{net:?} world {world} {call:?}: every rank failed, the last after {slowest:?}");
            let errors: Vec<Error> = failed.into_iter().map(|(e, _)| e).collect();
            for (rank, e) in errors.iter().enumerate() {
                let msg = e.to_string();
                let what = format!("{net:?} world {world} {call:?} rank {rank}: {msg}");
                assert!(matches!(e, Error::Mismatch { .. } | Error::PeerAborted { .. }), "{what}");
                assert!(msg.contains("root=0") && msg.contains("root=1"), "both roots must be named: {what}");
            }
            // At least one rank saw the other root itself (the others were told).
            assert!(errors.iter().any(|e| matches!(e, Error::Mismatch { .. })), "{errors:?}");
        }
    }
}

#[test]
fn ranks_with_different_roots_all_fail_naming_both_inproc() {
    grid(Net::InProc);
}

#[test]
fn ranks_with_different_roots_all_fail_naming_both_shm() {
    grid(Net::Shm);
}

#[test]
fn ranks_with_different_roots_all_fail_naming_both_tcp() {
    grid(Net::Tcp);
}
