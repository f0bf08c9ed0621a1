use std::time::Duration;

use super::*;
use crate::comm::Communicator;
use crate::config::Config;

/// Tensor lengths with a zero-length one, odd ones and one past the bucket size.
const LENS: [usize; 7] = [3, 0, 17, 1, 40, 9, 2];

fn group(world: usize) -> Vec<Communicator> {
    let mut cfg = Config::new(0, world);
    cfg.timeout = Duration::from_secs(20);
    Communicator::in_process_with(cfg).unwrap()
}

/// Run `f` on every rank of an in-process group of `world`; results in rank order.
fn on_ranks<R: Send>(world: usize, f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    let comms = group(world);
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The value rank `r` gives element `j` of tensor `i`.
fn value(r: usize, i: usize, j: usize) -> i64 {
    (r * 100 + i * 10 + j) as i64
}

#[test]
fn layout_follows_registration_order_and_the_bucket_size() {
    let g = GradientBuffer::<i64>::new(&LENS, 64);
    // 8-byte elements, 64-byte buckets: [3, 0] (24 B, 17 would pass), [17] alone, [1],
    // [40] alone, [9] (72 B alone), [2].
    let buckets: Vec<usize> = (0..LENS.len()).map(|i| g.bucket_of(i)).collect();
    assert_eq!(buckets, vec![0, 0, 1, 2, 3, 4, 5]);
    assert_eq!(g.bucket_count(), 6);
    assert_eq!(g.buckets().iter().map(Vec::len).sum::<usize>(), LENS.iter().sum::<usize>());
    for (i, &n) in LENS.iter().enumerate() {
        assert_eq!(g.tensor(i).len(), n);
    }
    let one = GradientBuffer::<i64>::new(&LENS, 1 << 20);
    assert_eq!(one.bucket_count(), 1);
    assert_eq!(GradientBuffer::<i64>::new(&LENS, 0).bucket_count(), LENS.len());
    assert!(GradientBuffer::<f32>::new(&[], 64).is_empty());
}

#[test]
fn tensors_mut_hands_out_every_tensor_once() {
    let mut g = GradientBuffer::<i32>::new(&LENS, 48);
    for (i, t) in g.tensors_mut().into_iter().enumerate() {
        assert_eq!(t.len(), LENS[i]);
        t.fill(i as i32 + 1);
    }
    for (i, &n) in LENS.iter().enumerate() {
        assert_eq!(g.tensor(i), vec![i as i32 + 1; n].as_slice());
    }
}

/// World sizes x bucket sizes x both entry points: every element is the closed-form
/// sum over ranks, in place.
#[test]
fn all_reduce_sums_every_tensor_in_place() {
    for world in [1, 2, 3, 4] {
        for bucket_bytes in [0, 64, 1 << 20] {
            for as_ready in [None, Some(Overlap::Worker), Some(Overlap::Inline), Some(Overlap::Auto)] {
                let seen = on_ranks(world, |comm| {
                    let r = comm.rank();
                    let mut g = GradientBuffer::<i64>::new(&LENS, bucket_bytes);
                    let fill =
                        |i: usize, t: &mut [i64]| t.iter_mut().enumerate().for_each(|(j, x)| *x = value(r, i, j));
                    if let Some(overlap) = as_ready {
                        g.set_overlap(overlap);
                        let mut order = Vec::new();
                        g.all_reduce_as_ready(comm, ReduceOp::Sum, |i, t| {
                            order.push(i);
                            fill(i, t);
                        })
                        .unwrap();
                        assert_eq!(order, (0..LENS.len()).collect::<Vec<_>>());
                    } else {
                        for (i, t) in g.tensors_mut().into_iter().enumerate() {
                            fill(i, t);
                        }
                        g.all_reduce(comm, ReduceOp::Sum).unwrap();
                    }
                    (0..LENS.len()).map(|i| g.tensor(i).to_vec()).collect::<Vec<_>>()
                });
                for tensors in seen {
                    for (i, t) in tensors.iter().enumerate() {
                        let want: Vec<i64> = (0..LENS[i]).map(|j| (0..world).map(|r| value(r, i, j)).sum()).collect();
                        assert_eq!(
                            t, &want,
                            "world {world}, buckets of {bucket_bytes} B, as ready {as_ready:?}, tensor {i}"
                        );
                    }
                }
            }
        }
    }
}

/// Another layout on one rank, or another bucket size, is an error on every rank.
#[test]
fn a_different_layout_is_refused_on_every_rank() {
    for (other_lens, other_bucket) in [(&[3usize, 0, 17, 1, 40, 9, 3][..], 64), (&LENS[..], 128)] {
        let seen = on_ranks(3, |comm| {
            let (lens, bucket) = if comm.rank() == 1 { (other_lens, other_bucket) } else { (&LENS[..], 64) };
            let mut g = GradientBuffer::<f32>::new(lens, bucket);
            g.all_reduce(comm, ReduceOp::Sum).map_err(|e| e.to_string())
        });
        for (rank, r) in seen.into_iter().enumerate() {
            let e = r.unwrap_err();
            assert!(e.contains(&format!("rank {rank}")) && e.contains("layout"), "{e}");
        }
    }
}

#[test]
fn a_small_first_bucket_is_cut_first_and_the_rest_as_before() {
    // 8-byte elements: the first bucket takes [3, 0] (24 B; 17 would pass 32 B),
    // then 64-byte buckets from tensor 2 on, as `new` cuts them: [17], [1], [40], [9], [2].
    let g = GradientBuffer::<i64>::with_first_bucket(&LENS, 32, 64);
    let buckets: Vec<usize> = (0..LENS.len()).map(|i| g.bucket_of(i)).collect();
    assert_eq!(buckets, vec![0, 0, 1, 2, 3, 4, 5]);
    // A first bucket smaller than the first tensor holds that tensor alone; the
    // rest fill 1 MiB buckets.
    let g = GradientBuffer::<i64>::with_first_bucket(&LENS, 8, 1 << 20);
    let buckets: Vec<usize> = (0..LENS.len()).map(|i| g.bucket_of(i)).collect();
    assert_eq!(buckets, vec![0, 1, 1, 1, 1, 1, 1]);
    assert!(GradientBuffer::<f32>::with_first_bucket(&[], 8, 64).is_empty());
    // Every rank sums in place with the small first bucket, as ready.
    let seen = on_ranks(3, |comm| {
        let r = comm.rank();
        let mut g = GradientBuffer::<i64>::with_first_bucket(&LENS, 8, 1 << 20);
        g.set_overlap(Overlap::Worker);
        g.all_reduce_as_ready(comm, ReduceOp::Sum, |i, t| {
            t.iter_mut().enumerate().for_each(|(j, x)| *x = value(r, i, j))
        })
        .unwrap();
        (0..LENS.len()).map(|i| g.tensor(i).to_vec()).collect::<Vec<_>>()
    });
    for tensors in seen {
        for (i, t) in tensors.iter().enumerate() {
            let want: Vec<i64> = (0..LENS[i]).map(|j| (0..3).map(|r| value(r, i, j)).sum()).collect();
            assert_eq!(t, &want, "tensor {i}");
        }
    }
    // A rank with another first bucket is refused, not mixed.
    let seen = on_ranks(2, |comm| {
        let first = if comm.rank() == 1 { 8 } else { 32 };
        let mut g = GradientBuffer::<f32>::with_first_bucket(&LENS, first, 1 << 20);
        g.all_reduce(comm, ReduceOp::Sum).map_err(|e| e.to_string())
    });
    for (rank, r) in seen.into_iter().enumerate() {
        let e = r.unwrap_err();
        assert!(e.contains(&format!("rank {rank}")) && e.contains("layout"), "{e}");
    }
}
