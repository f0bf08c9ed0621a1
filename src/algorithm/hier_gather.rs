//! Hierarchical gather and scatter: blocks cross between hosts once, in one message
//! per host (per run of consecutive ranks on it), instead of one per rank.
//!
//! Each host has a leader: the root on the root's host, elsewhere the host's lowest
//! rank. Gather runs in two rounds: in round 0 every rank sends its block to its
//! host's leader (the root receives its host's blocks straight into Output, at their
//! ranks' places; another leader collects its host's blocks in Scratch, laid out by
//! local index), and in round 1 each other leader sends its host's blocks on to the
//! root, cut into the runs of consecutive ranks of the host so that each lands at
//! its ranks' place in the root's Output, which ends with the blocks in rank order.
//! A leader alone on its host sends its Input straight in round 1. Scatter runs the
//! same two rounds backwards: the root sends each other leader its host's blocks
//! (and its own host's ranks their blocks) in round 0; the leaders hand them on in
//! round 1.
//!
//! The root handles `l - 1` messages inside its host (`l` its host's size) and one
//! per run of every other host across: `H - 1` for hosts of consecutive ranks, up
//! to one per rank for interleaved hosts, where it is no worse than direct. On one
//! host, or one rank per host, there is one level only: the schedule is direct's,
//! labelled hierarchical.

use super::builder::Builder;
use super::gather::{gather_direct, scatter_direct};
use super::hierarchical::is_flat;
use super::{Algorithm, BufId, PlanParams, PlanRequest, Region, Schedule};

/// The host layout as one rank of a rooted call sees it.
struct Layout {
    /// Ranks of every host, ascending, hosts by number.
    members: Vec<Vec<usize>>,
    root: usize,
    root_host: usize,
    /// This rank's host.
    host: usize,
    /// Bytes of one block.
    bytes: usize,
}

impl Layout {
    fn new(req: &PlanRequest) -> Layout {
        Layout {
            members: req.host_members(),
            root: req.root,
            root_host: req.host_of(req.root),
            host: req.host_of(req.rank),
            bytes: req.count * req.elem_size,
        }
    }

    /// Host `h`'s leader: the root on its own host, elsewhere the lowest rank.
    fn leader(&self, h: usize) -> usize {
        if h == self.root_host {
            self.root
        } else {
            self.members[h][0]
        }
    }

    /// The hosts other than the root's.
    fn other_hosts(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.members.len()).filter(move |&h| h != self.root_host)
    }

    /// Host `h`'s runs of consecutive ranks: `(first local index, first rank,
    /// ranks)`, in rank order. Both ends of a leader-to-root transfer cut the
    /// host's blocks by these runs, so their messages match one to one.
    fn runs(&self, h: usize) -> Vec<(usize, usize, usize)> {
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        for (i, &q) in self.members[h].iter().enumerate() {
            match runs.last_mut() {
                Some((_, first, len)) if *first + *len == q => *len += 1,
                _ => runs.push((i, q, 1)),
            }
        }
        runs
    }

    /// `blocks` blocks of `buf` from block `at`.
    fn blocks(&self, buf: BufId, at: usize, blocks: usize) -> Region {
        Region::new(buf, at * self.bytes, blocks * self.bytes)
    }

    /// Where a leader other than the root keeps its host's blocks: Scratch by local
    /// index, or, alone on its host, its own caller buffer (`own`).
    fn host_buf(&self, own: BufId) -> BufId {
        if self.members[self.host].len() > 1 {
            BufId::Scratch
        } else {
            own
        }
    }

    /// Scratch a leader other than the root needs: its host's blocks.
    fn scratch_bytes(&self) -> usize {
        let l = self.members[self.host].len();
        if l > 1 {
            l * self.bytes
        } else {
            0
        }
    }
}

/// Hierarchical gather (see the module docs).
pub fn gather(req: &PlanRequest<'_>, _params: &PlanParams) -> Schedule {
    if is_flat(req) {
        return Schedule { algorithm: Algorithm::Hierarchical, ..gather_direct(req) };
    }
    let lay = Layout::new(req);
    let (r, root) = (req.rank, req.root);
    let mut b = Builder::new();
    let mut scratch = 0;
    if r == root {
        b.copy(0, lay.blocks(BufId::Input, 0, 1), lay.blocks(BufId::Output, root, 1));
        for &q in lay.members[lay.root_host].iter().filter(|&&q| q != root) {
            b.recv(0, q, lay.blocks(BufId::Output, q, 1));
        }
        for h in lay.other_hosts() {
            for (_, first, len) in lay.runs(h) {
                b.recv(1, lay.leader(h), lay.blocks(BufId::Output, first, len));
            }
        }
    } else if r == lay.leader(lay.host) {
        let buf = lay.host_buf(BufId::Input);
        if buf == BufId::Scratch {
            b.copy(0, lay.blocks(BufId::Input, 0, 1), lay.blocks(BufId::Scratch, 0, 1));
            for (i, &q) in lay.members[lay.host].iter().enumerate().skip(1) {
                b.recv(0, q, lay.blocks(BufId::Scratch, i, 1));
            }
        }
        for (i, _, len) in lay.runs(lay.host) {
            b.send(1, root, lay.blocks(buf, i, len));
        }
        scratch = lay.scratch_bytes();
    } else {
        b.send(0, lay.leader(lay.host), lay.blocks(BufId::Input, 0, 1));
    }
    b.finish(Algorithm::Hierarchical, scratch, Vec::new())
}

/// Hierarchical scatter: [`gather`]'s rounds run backwards.
pub fn scatter(req: &PlanRequest<'_>, _params: &PlanParams) -> Schedule {
    if is_flat(req) {
        return Schedule { algorithm: Algorithm::Hierarchical, ..scatter_direct(req) };
    }
    let lay = Layout::new(req);
    let (r, root) = (req.rank, req.root);
    let mut b = Builder::new();
    let mut scratch = 0;
    let output = lay.blocks(BufId::Output, 0, 1);
    if r == root {
        b.copy(0, lay.blocks(BufId::Input, root, 1), output);
        for &q in lay.members[lay.root_host].iter().filter(|&&q| q != root) {
            b.send(0, q, lay.blocks(BufId::Input, q, 1));
        }
        for h in lay.other_hosts() {
            for (_, first, len) in lay.runs(h) {
                b.send(0, lay.leader(h), lay.blocks(BufId::Input, first, len));
            }
        }
    } else if r == lay.leader(lay.host) {
        let buf = lay.host_buf(BufId::Output);
        for (i, _, len) in lay.runs(lay.host) {
            b.recv(0, root, lay.blocks(buf, i, len));
        }
        if buf == BufId::Scratch {
            b.copy(1, lay.blocks(BufId::Scratch, 0, 1), output);
            for (i, &q) in lay.members[lay.host].iter().enumerate().skip(1) {
                b.send(1, q, lay.blocks(BufId::Scratch, i, 1));
            }
        }
        scratch = lay.scratch_bytes();
    } else {
        let round = usize::from(lay.host != lay.root_host);
        b.recv(round, lay.leader(lay.host), output);
    }
    b.finish(Algorithm::Hierarchical, scratch, Vec::new())
}

#[cfg(test)]
#[path = "hier_gather_tests.rs"]
mod tests;
