//! `all_reduce_parts`: one in-place all-reduce over separately allocated parts,
//! on the parts where the algorithm allows it and packed otherwise.

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::comm::Communicator;
use crate::config::Config;
use crate::error::Error;
use crate::types::{DType, ReduceOp};

fn on_ranks<R: Send>(world: usize, f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    on_ranks_within(world, Duration::from_secs(20), f)
}

fn on_ranks_within<R: Send>(world: usize, timeout: Duration, f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    let mut cfg = Config::new(0, world);
    cfg.timeout = timeout;
    let comms = Communicator::in_process_with(cfg).unwrap();
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Element `i` of the whole buffer on rank `r`.
fn value(r: usize, i: usize) -> i64 {
    (r as i64 + 1) * 1000 + (i as i64 % 997) - 400
}

/// Part lengths (elements): empty parts, single elements, odd lengths, and with
/// `many` a few hundred parts of up to 9,000 elements (several pieces of the
/// pipelines and rings).
fn layout(many: bool) -> Vec<usize> {
    if many {
        (0..300).map(|k| (k * 7919) % 9000 + k % 3).collect()
    } else {
        vec![3, 0, 1, 17, 0, 40, 9, 2, 1]
    }
}

/// Split `whole` into parts of `lens` elements, as byte slices.
fn parts<'a>(mut whole: &'a mut [i64], lens: &[usize]) -> Vec<&'a mut [u8]> {
    lens.iter()
        .map(|&n| {
            let (p, rest) = std::mem::take(&mut whole).split_at_mut(n);
            whole = rest;
            bytemuck::cast_slice_mut(p)
        })
        .collect()
}

#[test]
fn parts_all_reduce_like_one_buffer_for_every_algorithm_and_world() {
    // Ring, tree and halving-doubling run on the parts (the tree at 2 ranks);
    // direct and doubling receive into scratch and pack.
    let algorithms =
        [Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling, Algorithm::Direct, Algorithm::Doubling];
    for world in [1, 2, 3, 4, 7, 8] {
        for many in [false, true] {
            if many && world > 3 {
                continue;
            }
            let lens = layout(many);
            let n: usize = lens.iter().sum();
            for algorithm in algorithms {
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let got = on_ranks(world, |c| {
                        c.set_algorithm(Some(algorithm));
                        let mut whole: Vec<i64> = (0..n).map(|i| value(c.rank(), i)).collect();
                        // Twice: the second call reuses the engine's state.
                        for round in 0..2 {
                            if round == 1 {
                                whole = (0..n).map(|i| value(c.rank(), i)).collect();
                            }
                            c.all_reduce_parts(&mut parts(&mut whole, &lens), DType::I64, op)?;
                        }
                        Ok::<_, Error>(whole)
                    });
                    for (r, g) in got.into_iter().enumerate() {
                        let g = g.unwrap_or_else(|e| panic!("{algorithm:?} {world} ranks {op:?}: rank {r}: {e}"));
                        for (i, &x) in g.iter().enumerate() {
                            let want = match op {
                                ReduceOp::Sum => (0..world).map(|q| value(q, i)).sum(),
                                _ => value(world - 1, i),
                            };
                            assert_eq!(
                                x,
                                want,
                                "{algorithm:?} {world} ranks {op:?} ({} parts): element {i}",
                                lens.len()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn an_average_over_parts_is_divided_once() {
    let lens = [5usize, 0, 300_000, 7];
    let n: usize = lens.iter().sum();
    for world in [2, 4] {
        let got = on_ranks(world, |c| {
            c.set_algorithm(Some(Algorithm::Ring));
            let mut whole: Vec<f64> = (0..n).map(|i| (c.rank() * 8 + i % 5) as f64).collect();
            let mut ps: Vec<&mut [u8]> = Vec::new();
            let mut rest = whole.as_mut_slice();
            for &k in &lens {
                let (p, r) = std::mem::take(&mut rest).split_at_mut(k);
                ps.push(bytemuck::cast_slice_mut(p));
                rest = r;
            }
            c.all_reduce_parts(&mut ps, DType::F64, ReduceOp::Avg)?;
            // No parts at all: an empty all-reduce, as on an empty buffer.
            c.all_reduce_parts(&mut [], DType::F64, ReduceOp::Avg)?;
            Ok::<_, Error>(whole)
        });
        for g in got {
            let g = g.unwrap();
            for (i, &x) in g.iter().enumerate() {
                // Mean of 8r over r < world, plus i % 5: exact in f64.
                assert_eq!(x, 4.0 * (world - 1) as f64 + (i % 5) as f64, "{world} ranks, element {i}");
            }
        }
    }
}

#[test]
fn bad_parts_are_errors_not_hangs() {
    // A part that is not a whole number of elements is refused on the rank that
    // passes it; the other rank's call then fails on its timeout, naming the peer.
    let got = on_ranks_within(2, Duration::from_secs(1), |c| {
        let mut a = [0u8; 12];
        let (x, y) = a.split_at_mut(if c.rank() == 0 { 5 } else { 8 });
        c.all_reduce_parts(&mut [x, y], DType::I32, ReduceOp::Sum)
    });
    let e = got[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("part 0 of 2 has 5 bytes"), "{e}");
    let e = got[1].as_ref().expect_err("the peer of a refused call must not succeed").to_string();
    assert!(e.contains("timed out") && e.contains("rank(s) [0]"), "{e}");
    // The same total cut differently on the two ranks: the frames disagree, and
    // both ranks say so rather than mixing elements.
    let got = on_ranks(2, |c| {
        c.set_algorithm(Some(Algorithm::Ring));
        let mut a = vec![1i64; 64];
        let lens: &[usize] = if c.rank() == 0 { &[32, 32] } else { &[8, 56] };
        c.all_reduce_parts(&mut parts(&mut a, lens), DType::I64, ReduceOp::Sum)
    });
    for (r, g) in got.iter().enumerate() {
        let e = g.as_ref().expect_err("mismatched parts must fail").to_string();
        assert!(e.contains("frame of 256 bytes where this rank expects 64"), "rank {r}: {e}");
    }
}
