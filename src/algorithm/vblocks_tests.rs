//! The `*v` planners run by a simulator (every rank's schedule, round by round,
//! on bytes) for worlds 1..=16, pseudo-random uneven counts with zeros, one host
//! and hosts interleaved, every algorithm: exact results, and every transfer
//! matched by a receive of the same length in the same round.

// Ranks index several per-rank tables at once (plans, memory, mail).
#![allow(clippy::needless_range_loop)]

use std::collections::{HashMap, VecDeque};

use super::super::{algorithms_for, plan, Algorithm, BufId, PlanRequest, Region, Step, VBlocks};
use crate::types::OpKind;

/// One rank's buffers.
struct Mem {
    input: Vec<u8>,
    output: Vec<u8>,
    scratch: Vec<u8>,
}

impl Mem {
    fn buf(&mut self, r: Region) -> &mut [u8] {
        let b = match r.buf {
            BufId::Input => &mut self.input,
            BufId::Output => &mut self.output,
            BufId::Scratch => &mut self.scratch,
        };
        &mut b[r.offset..r.offset + r.len]
    }
}

/// Run every rank's schedule of `req` (one byte per element, `+` wrapping as the
/// reduction) on `inputs`; the outputs.
fn simulate(req: &PlanRequest, inputs: Vec<Vec<u8>>, out_len: &[usize]) -> Vec<Vec<u8>> {
    let n = req.world;
    let plans: Vec<_> = (0..n).map(|rank| plan(&PlanRequest { rank, ..*req }).unwrap()).collect();
    let mut mem: Vec<Mem> = inputs
        .into_iter()
        .zip(&plans)
        .zip(out_len)
        .map(|((input, p), &o)| Mem { input, output: vec![0xEE; o], scratch: vec![0xDD; p.scratch_bytes] })
        .collect();
    let rounds = plans.iter().map(|p| p.rounds.len()).max().unwrap_or(0);
    for t in 0..rounds {
        let steps = |r: usize| plans[r].rounds.get(t).map_or(&[][..], |x| &x.steps[..]);
        let mut mail: HashMap<(usize, usize), VecDeque<Vec<u8>>> = HashMap::new();
        for r in 0..n {
            for s in steps(r) {
                match *s {
                    Step::Copy { src, dst } => {
                        let v = mem[r].buf(src).to_vec();
                        mem[r].buf(dst).copy_from_slice(&v);
                    }
                    Step::Reduce { src, dst } => {
                        let v = mem[r].buf(src).to_vec();
                        mem[r].buf(dst).iter_mut().zip(v).for_each(|(d, s)| *d = d.wrapping_add(s));
                    }
                    _ => {}
                }
            }
        }
        for r in 0..n {
            for s in steps(r) {
                if let Step::Send { peer, src } = *s {
                    let v = mem[r].buf(src).to_vec();
                    mail.entry((r, peer)).or_default().push_back(v);
                }
            }
        }
        for r in 0..n {
            for s in steps(r) {
                let (peer, src, dst) = match *s {
                    Step::Recv { peer, dst } => (peer, None, dst),
                    Step::RecvReduce { peer, src, dst } => (peer, Some(src), dst),
                    Step::Send { .. } | Step::Copy { .. } | Step::Reduce { .. } => continue,
                    ref other => panic!("{} rank {r} round {t}: unexpected step {other:?}", req.op),
                };
                let got = mail.get_mut(&(peer, r)).and_then(|q| q.pop_front());
                let got = got.unwrap_or_else(|| panic!("{} rank {r} round {t}: nothing from {peer}", req.op));
                assert_eq!(got.len(), dst.len, "{} rank {r} round {t}: frame length from {peer}", req.op);
                let base = src.map(|s| mem[r].buf(s).to_vec()).unwrap_or_else(|| vec![0; got.len()]);
                let v: Vec<u8> = base.iter().zip(&got).map(|(a, b)| a.wrapping_add(*b)).collect();
                mem[r].buf(dst).copy_from_slice(&v);
            }
        }
        let left: usize = mail.values().map(VecDeque::len).sum();
        assert_eq!(left, 0, "{} round {t}: {left} sends nobody received", req.op);
    }
    mem.into_iter().map(|m| m.output).collect()
}

/// A small deterministic generator (xorshift).
struct Gen(u64);

impl Gen {
    fn next(&mut self, below: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % below as u64) as usize
    }
    /// Counts 0..=5, zero about a third of the time.
    fn counts(&mut self, n: usize) -> Vec<usize> {
        (0..n).map(|_| if self.next(3) == 0 { 0 } else { self.next(6) }).collect()
    }
}

fn packed(counts: &[usize]) -> Vec<usize> {
    counts.iter().scan(0, |a, &c| Some(std::mem::replace(a, *a + c))).collect()
}

fn val(a: usize, b: usize, i: usize) -> u8 {
    (a * 37 + b * 101 + i * 11 + 1) as u8
}

fn request<'a>(op: OpKind, n: usize, alg: Algorithm, hosts: &'a [usize], blocks: VBlocks<'a>) -> PlanRequest<'a> {
    PlanRequest {
        op,
        rank: 0,
        world: n,
        count: 0,
        elem_size: 1,
        root: 0,
        algorithm: Some(alg),
        hosts,
        blocks: Some(blocks),
    }
}

fn layouts(n: usize) -> [Vec<usize>; 2] {
    [Vec::new(), (0..n).map(|r| r % 2).collect()]
}

#[test]
fn all_gather_v_every_world_counts_and_algorithm() {
    let mut g = Gen(0x5eed);
    for n in 1..=16 {
        for _ in 0..6 {
            let counts = g.counts(n);
            let displs = packed(&counts);
            let total: usize = counts.iter().sum();
            for hosts in layouts(n) {
                for &alg in algorithms_for(OpKind::AllGatherV) {
                    let blocks = VBlocks { recv_counts: &counts, recv_displs: &displs, ..VBlocks::default() };
                    let req = request(OpKind::AllGatherV, n, alg, &hosts, blocks);
                    let inputs = (0..n).map(|r| (0..counts[r]).map(|i| val(r, 0, i)).collect()).collect();
                    let outs = simulate(&req, inputs, &vec![total; n]);
                    let want: Vec<u8> = (0..n).flat_map(|j| (0..counts[j]).map(move |i| val(j, 0, i))).collect();
                    for (r, o) in outs.iter().enumerate() {
                        assert_eq!(o, &want, "{alg} n={n} counts={counts:?} hosts={hosts:?} rank {r}");
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_v_every_world_counts_and_algorithm() {
    let mut g = Gen(0xfeed);
    for n in 1..=16 {
        for _ in 0..6 {
            let counts = g.counts(n);
            let displs = packed(&counts);
            let total: usize = counts.iter().sum();
            for hosts in layouts(n) {
                for &alg in algorithms_for(OpKind::ReduceScatterV) {
                    let blocks = VBlocks { send_counts: &counts, send_displs: &displs, ..VBlocks::default() };
                    let req = request(OpKind::ReduceScatterV, n, alg, &hosts, blocks);
                    let inputs = (0..n).map(|q| (0..total).map(|k| val(q, 1, k)).collect()).collect();
                    let outs = simulate(&req, inputs, &counts);
                    for (r, o) in outs.iter().enumerate() {
                        let want: Vec<u8> = (0..counts[r])
                            .map(|i| (0..n).fold(0u8, |s, q| s.wrapping_add(val(q, 1, displs[r] + i))))
                            .collect();
                        assert_eq!(o, &want, "{alg} n={n} counts={counts:?} hosts={hosts:?} rank {r}");
                    }
                }
            }
        }
    }
}

#[test]
fn all_to_all_v_every_world_and_counts() {
    let mut g = Gen(0xa11);
    for n in 1..=16 {
        for _ in 0..6 {
            // matrix[from][to]
            let matrix: Vec<Vec<usize>> = (0..n).map(|_| g.counts(n)).collect();
            let recv: Vec<Vec<usize>> = (0..n).map(|r| (0..n).map(|j| matrix[j][r]).collect()).collect();
            // Send blocks in reverse order with a one-byte gap; receive blocks packed.
            let send_displs: Vec<Vec<usize>> = matrix
                .iter()
                .map(|row| {
                    let mut d = vec![0; n];
                    let mut at = 0;
                    for j in (0..n).rev() {
                        d[j] = at;
                        at += row[j] + 1;
                    }
                    d
                })
                .collect();
            let recv_displs: Vec<Vec<usize>> = recv.iter().map(|c| packed(c)).collect();
            let plans: Vec<_> = (0..n)
                .map(|r| {
                    let blocks = VBlocks {
                        send_counts: &matrix[r],
                        send_displs: &send_displs[r],
                        recv_counts: &recv[r],
                        recv_displs: &recv_displs[r],
                    };
                    plan(&PlanRequest { rank: r, ..request(OpKind::AllToAllV, n, Algorithm::Pairwise, &[], blocks) })
                        .unwrap()
                })
                .collect();
            // Each rank plans with its own counts, so the plans are run directly.
            let outs = simulate_plans(&plans, n, &matrix, &send_displs, &recv);
            for r in 0..n {
                let want: Vec<u8> = (0..n).flat_map(|j| (0..recv[r][j]).map(move |i| val(j, r, i))).collect();
                assert_eq!(outs[r], want, "n={n} matrix={matrix:?} rank {r}");
            }
        }
    }
}

/// [`simulate`] for plans made from per-rank requests (all-to-all-v).
fn simulate_plans(
    plans: &[super::super::Schedule],
    n: usize,
    matrix: &[Vec<usize>],
    send_displs: &[Vec<usize>],
    recv: &[Vec<usize>],
) -> Vec<Vec<u8>> {
    let mut mem: Vec<Mem> = (0..n)
        .map(|r| {
            let len = (0..n).map(|j| send_displs[r][j] + matrix[r][j]).max().unwrap_or(0);
            let mut input = vec![0xCC; len];
            for j in 0..n {
                for i in 0..matrix[r][j] {
                    input[send_displs[r][j] + i] = val(r, j, i);
                }
            }
            Mem { input, output: vec![0xEE; recv[r].iter().sum()], scratch: Vec::new() }
        })
        .collect();
    let rounds = plans.iter().map(|p| p.rounds.len()).max().unwrap_or(0);
    for t in 0..rounds {
        let steps = |r: usize| plans[r].rounds.get(t).map_or(&[][..], |x| &x.steps[..]);
        let mut mail: HashMap<(usize, usize), Vec<u8>> = HashMap::new();
        for r in 0..n {
            for s in steps(r) {
                match *s {
                    Step::Copy { src, dst } => {
                        let v = mem[r].buf(src).to_vec();
                        mem[r].buf(dst).copy_from_slice(&v);
                    }
                    Step::Send { peer, src } => assert!(mail.insert((r, peer), mem[r].buf(src).to_vec()).is_none()),
                    _ => {}
                }
            }
        }
        for r in 0..n {
            for s in steps(r) {
                if let Step::Recv { peer, dst } = *s {
                    let got =
                        mail.remove(&(peer, r)).unwrap_or_else(|| panic!("rank {r} round {t}: nothing from {peer}"));
                    assert_eq!(got.len(), dst.len, "rank {r} round {t}: frame length from {peer}");
                    mem[r].buf(dst).copy_from_slice(&got);
                }
            }
        }
        assert!(mail.is_empty(), "round {t}: sends nobody received: {:?}", mail.keys());
    }
    mem.into_iter().map(|m| m.output).collect()
}

/// A request whose lists do not have one entry per rank, or whose all-to-all-v
/// sends this rank another size than it expects from itself, is refused.
#[test]
fn malformed_blocks_are_refused() {
    let c = [1, 2];
    let d = [0, 1];
    let blocks = VBlocks { recv_counts: &c, recv_displs: &d, ..VBlocks::default() };
    let e = plan(&request(OpKind::AllGatherV, 3, Algorithm::Ring, &[], blocks)).unwrap_err();
    assert!(e.contains("2 recv counts and 2 displacements for a world of 3"), "{e}");
    let e = plan(&PlanRequest { blocks: None, ..request(OpKind::AllGatherV, 2, Algorithm::Ring, &[], blocks) });
    assert!(e.unwrap_err().contains("needs its per-rank counts"));
    let (s, r) = ([3, 1], [2, 1]);
    let blocks = VBlocks { send_counts: &s, send_displs: &d, recv_counts: &r, recv_displs: &d };
    let e = plan(&request(OpKind::AllToAllV, 2, Algorithm::Pairwise, &[], blocks)).unwrap_err();
    assert!(e.contains("rank 0 sends itself 3 elements but expects 2"), "{e}");
}
