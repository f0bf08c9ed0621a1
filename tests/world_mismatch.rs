//! Ranks given different world sizes fail while they meet, at once and on every
//! rank, naming both sizes, instead of waiting for ranks that will never come.

use std::sync::Arc;
use std::time::Duration;

use braid::bootstrap::{MemStore, Store};
use braid::{Communicator, Error};

/// Build one communicator per entry of `worlds` (rank i is told world `worlds[i]`)
/// on one store; returns each rank's error.
fn build_all(worlds: &[usize]) -> Vec<Error> {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let handles: Vec<_> = worlds
        .iter()
        .enumerate()
        .map(|(rank, &world)| {
            let store = store.clone();
            std::thread::spawn(move || {
                // A deadline far past the failure: the error is the disagreement, not a timeout.
                let built = Communicator::builder(rank, world)
                    .store(store)
                    .socket_ifname("lo")
                    .timeout(Duration::from_secs(30))
                    .build();
                match built {
                    Ok(_) => panic!("rank {rank} (world {world}) connected although the sizes differ"),
                    Err(e) => e,
                }
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

fn check(worlds: &[usize], sizes: (usize, usize)) {
    for (rank, e) in build_all(worlds).iter().enumerate() {
        let msg = e.to_string();
        assert!(!matches!(e, Error::Timeout { .. }), "rank {rank}: {msg}");
        assert!(msg.contains("world size"), "rank {rank}: {msg}");
        for n in [sizes.0, sizes.1] {
            assert!(msg.contains(&format!("world size {n}")), "rank {rank} must name {n}: {msg}");
        }
    }
}

#[test]
fn a_rank_told_a_larger_world_fails_with_rank_0_naming_both() {
    check(&[2, 3], (2, 3));
}

#[test]
fn rank_0_told_a_larger_world_fails_with_the_others_naming_both() {
    check(&[4, 3, 3], (3, 4));
}

#[test]
fn one_rank_of_three_told_a_smaller_world_fails_with_all_naming_both() {
    check(&[3, 2, 3], (2, 3));
}
