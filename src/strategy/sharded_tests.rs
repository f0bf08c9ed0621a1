use std::time::Duration;

use super::tests::{example_grads, init, one_device_run, sgd_step, EXAMPLES};
use super::*;
use crate::comm::Communicator;
use crate::config::Config;

/// Run `f` on a sharded replica per rank of an in-process group of `world`.
fn on_replicas<R: Send>(
    world: usize,
    make: impl Fn(Communicator) -> Sharded + Sync,
    f: impl Fn(&mut Sharded) -> R + Sync,
) -> Vec<R> {
    let mut cfg = Config::new(0, world);
    cfg.timeout = Duration::from_secs(20);
    let comms = Communicator::in_process_with(cfg).unwrap();
    std::thread::scope(|s| {
        let (make, f) = (&make, &f);
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(&mut make(c)))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn train(s: &mut dyn Strategy, epochs: usize, batch: usize) -> Vec<f64> {
    let mut losses = Vec::new();
    for _ in 0..epochs {
        for start in (0..EXAMPLES).step_by(batch) {
            let n = batch.min(EXAMPLES - start);
            losses.push(s.step(n, &example_grads(start), &sgd_step).unwrap());
        }
    }
    losses
}

fn max_diff(a: &Tensors, b: &Tensors) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Plain SGD through `apply` on each shard: the one-device run, at 1 to 5 replicas
/// (5: one replica has an empty shard of the 4 variables), uneven batches included.
#[test]
fn sharded_sgd_steps_as_one_device() {
    let (want, want_losses) = one_device_run(6, 7);
    for world in 1..=5 {
        let seen = on_replicas(
            world,
            |c| Sharded::new(c, init()).unwrap(),
            |s| (train(s, 6, 7), s.variables().clone(), s.shard()),
        );
        let mut covered = 0;
        for (rank, (losses, vars, shard)) in seen.into_iter().enumerate() {
            assert!(max_diff(&vars, &want) <= 1e-5, "{world} replicas, rank {rank}: {vars:?} vs {want:?}");
            for (a, b) in losses.iter().zip(&want_losses) {
                assert!((a - b).abs() <= 1e-5, "{world} replicas: loss {a} vs {b}");
            }
            assert_eq!(shard.start, covered, "shards tile the variables in rank order");
            covered = shard.end;
        }
        assert_eq!(covered, 4);
    }
}

/// Momentum with its state sharded: the same weights as one device keeping the
/// whole state, and each replica holds only its shard of that state.
#[test]
fn sharded_momentum_keeps_a_shard_of_the_state_and_steps_as_one_device() {
    let opt = Momentum { lr: 0.05, momentum: 0.9 };
    // One device: the whole state, updated with the mean gradient of each batch.
    let mut vars = init();
    let mut velocity = vec![0.0f32; 4];
    for _ in 0..6 {
        for start in (0..EXAMPLES).step_by(7) {
            let n = 7.min(EXAMPLES - start);
            let g = example_grads(start)(&Replica { id: 0, replicas: 1, batch: 0..n, vars: &vars });
            let mut flat: Vec<f32> = g.grads.iter().flatten().map(|x| x / n as f32).collect();
            let mut p: Vec<f32> = vars.iter().flatten().copied().collect();
            opt.update(&mut p, &flat, &mut velocity);
            flat.clear();
            vars = vec![p[..3].to_vec(), p[3..].to_vec()];
        }
    }
    for world in [1, 2, 3, 4] {
        let seen = on_replicas(
            world,
            |c| Sharded::with_optimizer(c, init(), Box::new(opt)).unwrap(),
            |s| {
                train(s, 6, 7);
                (s.variables().clone(), s.optimizer_state_len(), s.shard().len())
            },
        );
        let mut total_state = 0;
        for (rank, (got, state, shard)) in seen.into_iter().enumerate() {
            assert!(max_diff(&got, &vars) <= 1e-5, "{world} replicas, rank {rank}: {got:?} vs {vars:?}");
            assert_eq!(state, shard, "one momentum value per element of the shard");
            assert!(state <= 4usize.div_ceil(world));
            total_state += state;
        }
        assert_eq!(total_state, 4, "the shards of the state add up to one device's");
    }
}

/// A replica whose gradients have other shapes fails, and its peers fail too
/// instead of waiting.
#[test]
fn wrong_gradient_shapes_fail_every_replica() {
    let seen = on_replicas(
        3,
        |c| Sharded::new(c, init()).unwrap(),
        |s| {
            let bad = s.communicator().rank() == 1;
            let step = move |r: &Replica<'_>| {
                let mut g = example_grads(0)(r);
                if bad {
                    g.grads[0].push(1.0);
                }
                g
            };
            s.step(6, &step, &sgd_step).map_err(|e| e.to_string())
        },
    );
    assert!(seen[1].as_ref().unwrap_err().contains("shapes"), "{seen:?}");
    assert!(seen.iter().all(Result::is_err), "every replica fails: {seen:?}");
}

/// A checkpoint keeps the sharded momentum: 3 epochs, save, a fresh strategy
/// restores and trains 3 more, ending where 6 uninterrupted epochs end.
#[test]
fn a_checkpoint_keeps_the_shards_of_the_state() {
    let opt = Momentum { lr: 0.05, momentum: 0.9 };
    let dir = std::env::temp_dir().join(format!("braid-sharded-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.ckpt");
    let whole = on_replicas(
        2,
        |c| Sharded::with_optimizer(c, init(), Box::new(opt)).unwrap(),
        |s| {
            train(s, 6, 7);
            s.variables().clone()
        },
    );
    let p = &path;
    on_replicas(
        2,
        |c| Sharded::with_optimizer(c, init(), Box::new(opt)).unwrap(),
        |s| {
            train(s, 3, 7);
            s.save(p, 3).unwrap();
        },
    );
    let resumed = on_replicas(
        2,
        |c| Sharded::with_optimizer(c, init(), Box::new(opt)).unwrap(),
        |s| {
            assert_eq!(s.restore(p).unwrap(), 3);
            train(s, 3, 7);
            s.variables().clone()
        },
    );
    for (a, b) in whole.iter().zip(&resumed) {
        assert!(max_diff(a, b) <= 1e-6, "{a:?} vs {b:?}");
    }
    // Without the state shards, the same restore is refused, not silently reset.
    std::fs::remove_file(dir.join("model.ckpt.state1of2")).unwrap();
    let refused =
        on_replicas(2, |c| Sharded::with_optimizer(c, init(), Box::new(opt)).unwrap(), |s| s.restore(p).is_err());
    assert_eq!(refused, vec![false, true]);
    let _ = std::fs::remove_dir_all(&dir);
}
