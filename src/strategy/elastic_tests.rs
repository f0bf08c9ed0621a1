use super::super::tests::{example_grads, init, one_device_run, sgd_step, EXAMPLES};
use super::*;
use crate::comm::Communicator;
use crate::strategy::Tensors;

/// Four workers as threads; `leave[r]` is the step before which worker r's
/// replica is dropped (its links end, as a killed process's do). The rest run
/// every step of 5 epochs in global batches of 8: 15 steps.
/// A surviving worker's weights, per-step losses and recoveries.
type Survived = Option<(Tensors, Vec<f64>, Vec<Recovery>)>;

fn run_with_losses(leave: [Option<usize>; 4], min: usize) -> Vec<Survived> {
    let comms = Communicator::in_process(4).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rank = c.rank();
                let mut s = MultiWorkerMirrored::new(c, init()).unwrap().elastic(min);
                let mut losses = Vec::new();
                for step in 0..15 {
                    if leave[rank] == Some(step) {
                        return None;
                    }
                    let start = (step % 3) * 8;
                    let n = 8.min(EXAMPLES - start);
                    losses.push(s.step(n, &example_grads(start), &sgd_step).expect("elastic step"));
                }
                Some((s.variables().clone(), losses, s.recoveries().to_vec()))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("worker thread")).collect()
}

#[test]
fn survivors_lose_no_step_and_match_one_device() {
    let (want, want_losses) = one_device_run(5, 8);
    assert_eq!(want_losses.len(), 15);
    // Worker 3 goes before step 4, worker 1 before step 10.
    let out = run_with_losses([None, Some(10), None, Some(4)], 2);
    for (rank, got) in out.into_iter().enumerate() {
        let Some((vars, losses, recoveries)) = got else {
            assert!(rank == 1 || rank == 3);
            continue;
        };
        let diff = max_diff(&vars, &want);
        assert!(diff <= 1e-5, "worker {rank}: weights differ from one device by {diff}");
        assert_eq!(losses.len(), 15, "worker {rank}: every step has its loss");
        for (i, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "worker {rank} step {i}: loss {a} not {b}");
        }
        let shrinks: Vec<(u64, (usize, usize))> = recoveries.iter().map(|r| (r.step, r.replicas)).collect();
        assert_eq!(shrinks, vec![(4, (4, 3)), (10, (3, 2))], "worker {rank}");
    }
}

#[test]
fn fewer_survivors_than_the_minimum_end_with_an_error() {
    let comms = Communicator::in_process(3).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rank = c.rank();
                let mut s = MultiWorkerMirrored::new(c, init()).unwrap().elastic(3);
                s.step(8, &example_grads(0), &sgd_step).unwrap();
                if rank == 2 {
                    return None;
                }
                Some(s.step(8, &example_grads(8), &sgd_step).map(drop))
            })
        })
        .collect();
    for t in threads {
        if let Some(r) = t.join().unwrap() {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("fewer than the minimum of 3"), "{e}");
        }
    }
}

/// Two workers over a store; a third process (a thread here) joins while they
/// train. Everyone ends with the one-device weights, and the joiner ran exactly
/// the steps after the one it was taken in at.
#[test]
fn a_joiner_is_taken_in_and_ends_with_everyone() {
    use crate::bootstrap::{MemStore, Store};
    use std::sync::Arc;
    let (want, _) = one_device_run(5, 8);
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let mut cfg = crate::config::Config::new(0, 2);
    cfg.timeout = Duration::from_secs(20);
    cfg.tuner_probe = false;
    let train_from = |s: &mut MultiWorkerMirrored| {
        let mut ran = 0;
        for step in s.steps_done() as usize..15 {
            // Slow enough that rank 0 looks for joiners before the end.
            std::thread::sleep(Duration::from_millis(40));
            let start = (step % 3) * 8;
            s.step(8.min(EXAMPLES - start), &example_grads(start), &sgd_step).expect("step");
            ran += 1;
        }
        ran
    };
    let joiner = {
        let (store, cfg) = (store.clone(), cfg.clone());
        std::thread::spawn(move || {
            let comm = Communicator::join(store, "digits", cfg, Duration::from_secs(20)).unwrap();
            let mut s = MultiWorkerMirrored::join(comm, init()).unwrap().elastic(1).joinable("digits");
            let from = s.steps_done();
            let ran = train_from(&mut s);
            (s.variables().clone(), from, ran, s.num_replicas_in_sync())
        })
    };
    let members: Vec<_> = (0..2)
        .map(|rank| {
            let (store, mut cfg) = (store.clone(), cfg.clone());
            cfg.rank = rank;
            std::thread::spawn(move || {
                let comm = crate::CommunicatorBuilder::from_config(cfg).store(store).build().unwrap();
                let mut s = MultiWorkerMirrored::new(comm, init()).unwrap().elastic(1).joinable("digits");
                assert_eq!(train_from(&mut s), 15);
                (s.variables().clone(), s.growths().to_vec())
            })
        })
        .collect();
    let mut grown_at = Vec::new();
    for m in members {
        let (vars, growths) = m.join().unwrap();
        assert!(max_diff(&vars, &want) <= 1e-5, "member");
        assert_eq!(growths.len(), 1, "{growths:?}");
        assert_eq!((growths[0].1, growths[0].2), (2, 3));
        grown_at.push(growths[0].0);
    }
    let (vars, from, ran, world) = joiner.join().unwrap();
    assert!(max_diff(&vars, &want) <= 1e-5, "joiner");
    assert_eq!(world, 3);
    assert!(from > 0 && from < 15, "joined at step {from}");
    assert_eq!((from, from as usize + ran), (grown_at[0], 15));
}

/// A launcher restarts a lost worker, slowly: with `await_replacements` the
/// survivors take the replacement in at the step after the loss (without it they
/// would finish first and the replacement find the job closed), and everyone
/// ends with one device's weights.
#[test]
fn survivors_await_a_replacement_and_take_it_in_after_the_loss() {
    use crate::bootstrap::{MemStore, Store};
    use std::sync::{mpsc, Arc};
    let (want, _) = one_device_run(5, 8);
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let mut cfg = crate::config::Config::new(0, 3);
    cfg.timeout = Duration::from_secs(20);
    cfg.tuner_probe = false;
    let (lost_tx, lost_rx) = mpsc::channel::<()>();
    let train = |s: &mut MultiWorkerMirrored, leave: Option<u64>| {
        for step in s.steps_done()..15 {
            if leave == Some(step) {
                return false;
            }
            let start = (step as usize % 3) * 8;
            s.step(8.min(EXAMPLES - start), &example_grads(start), &sgd_step).expect("step");
        }
        s.close_joining().unwrap();
        true
    };
    let members: Vec<_> = (0..3)
        .map(|rank| {
            let (store, mut cfg, lost_tx) = (store.clone(), cfg.clone(), lost_tx.clone());
            cfg.rank = rank;
            std::thread::spawn(move || {
                let comm = crate::CommunicatorBuilder::from_config(cfg).store(store).build().unwrap();
                let mut s = MultiWorkerMirrored::new(comm, init())
                    .unwrap()
                    .elastic(1)
                    .joinable("digits")
                    .await_replacements(Duration::from_secs(10));
                if !train(&mut s, (rank == 2).then_some(4)) {
                    drop(s);
                    lost_tx.send(()).unwrap();
                    return None;
                }
                Some((s.variables().clone(), s.growths().to_vec(), s.recoveries().len()))
            })
        })
        .collect();
    // The launcher sees the loss and starts a replacement, which takes a while.
    lost_rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let comm = Communicator::join(store, "digits", cfg, Duration::from_secs(20)).expect("taken in");
    let mut s = MultiWorkerMirrored::join(comm, init()).unwrap().elastic(1).joinable("digits");
    let from = s.steps_done();
    assert!(train(&mut s, None));
    assert!(max_diff(s.variables(), &want) <= 1e-5, "joiner");
    assert_eq!((from, s.num_replicas_in_sync()), (6, 3));
    let survivors: Vec<_> = members.into_iter().filter_map(|m| m.join().unwrap()).collect();
    assert_eq!(survivors.len(), 2);
    for (vars, growths, recoveries) in survivors {
        assert!(max_diff(&vars, &want) <= 1e-5, "member");
        assert_eq!((growths, recoveries), (vec![(6, 2, 3)], 1));
    }
}

fn max_diff(a: &Tensors, b: &Tensors) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
