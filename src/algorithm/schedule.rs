//! The plan's data, below every planner: what a planner is asked ([`PlanRequest`],
//! [`PlanParams`]), what it produces ([`Schedule`] of [`Round`]s of [`Step`]s over
//! [`Region`]s), and the algorithms' names. It imports nothing else from
//! `algorithm/`, so the planners, the dispatch and the checker above it depend on
//! it one way; `algorithm/mod.rs` re-exports all of it.

use std::fmt;
use std::str::FromStr;

use crate::types::OpKind;

/// One of the operation's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufId {
    /// The caller's input (aliases `Output` for in-place calls).
    Input,
    /// The caller's output.
    Output,
    /// Executor-owned scratch of `Schedule::scratch_bytes` bytes.
    Scratch,
}

/// A byte range of one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// Which buffer.
    pub buf: BufId,
    /// Byte offset.
    pub offset: usize,
    /// Byte length.
    pub len: usize,
}

impl Region {
    /// A region of `buf` from `offset`, `len` bytes long.
    pub const fn new(buf: BufId, offset: usize, len: usize) -> Region {
        Region { buf, offset, len }
    }
    /// One past the last byte.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }
    /// Whether two regions share a byte (same buffer, overlapping ranges).
    pub fn overlaps(&self, other: &Region) -> bool {
        self.buf == other.buf && self.offset < other.end() && other.offset < self.end() && self.len > 0 && other.len > 0
    }
}

/// One step of a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send the bytes of `src` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// What to send.
        src: Region,
    },
    /// Receive `dst.len` bytes from `peer` into `dst`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the bytes land.
        dst: Region,
    },
    /// Receive `dst.len` bytes from `peer` and store `src ⊕ received` into `dst`
    /// (`src` may equal `dst`; both have the same length).
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// Local operand.
        src: Region,
        /// Result.
        dst: Region,
    },
    /// [`Step::RecvReduce`] from `peer`, and every finished byte of `dst` goes on to
    /// `to` within the same round (NCCL's recvReduceSend): the result leaves while
    /// it is still in cache, and the next hop starts before this one has finished.
    /// The receiver takes it in the same round, after this rank's earlier sends to it.
    RecvReduceSend {
        /// Source rank.
        peer: usize,
        /// Local operand.
        src: Region,
        /// Result, also what is sent.
        dst: Region,
        /// Rank the result goes to.
        to: usize,
    },
    /// `dst = dst ⊕ src` locally (same length, no overlap). Lets a planner fix the
    /// order of a reduction so every rank computes bitwise-identical results.
    Reduce {
        /// Operand.
        src: Region,
        /// Accumulator and result.
        dst: Region,
    },
    /// Copy `src` into `dst` locally (same length; the executor skips it when both
    /// name the same memory, as in-place calls do).
    Copy {
        /// From.
        src: Region,
        /// To.
        dst: Region,
    },
}

impl Step {
    /// The peer of a transfer step, None for local steps.
    pub fn peer(&self) -> Option<usize> {
        match *self {
            Step::Send { peer, .. }
            | Step::Recv { peer, .. }
            | Step::RecvReduce { peer, .. }
            | Step::RecvReduceSend { peer, .. } => Some(peer),
            Step::Copy { .. } | Step::Reduce { .. } => None,
        }
    }
}

/// Steps that run together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// The steps, local ones first.
    pub steps: Vec<Step>,
}

impl Round {
    /// Whether a send of `len` bytes to `peer` in this round is half of an exchange:
    /// the round also receives plain data (no reduction) from the same peer, at least
    /// a quarter as much (the root check's empty frames and short replies do not
    /// count). Between processes of a host such a pair goes single-copy, the receiver
    /// reading the sender's buffer, in calls that reduce nothing (the executor's
    /// choice and the cost model's price both read it here).
    pub fn exchanges_with(&self, peer: usize, len: usize) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(*s, Step::Recv { peer: p, dst } if p == peer && dst.len >= len / 4 && dst.len > 0))
    }
}

/// Which algorithm a schedule implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring (reduce-scatter then all-gather for all-reduce).
    Ring,
    /// Every rank exchanges its whole buffer with every other rank in one round
    /// (lowest latency for small messages).
    Direct,
    /// Pipelined chain (broadcast, reduce).
    Chain,
    /// Binomial tree (broadcast, reduce); for all-reduce, NCCL's double binary tree
    /// (two complementary trees, each reducing and broadcasting half the data,
    /// pipelined in segments).
    Tree,
    /// Recursive doubling: `log2 n` rounds of pairwise exchanges of everything held
    /// so far (all-reduce of small messages, all-gather).
    Doubling,
    /// Recursive halving then doubling (Rabenseifner): halving reduce-scatter, then
    /// for all-reduce a doubling all-gather; `2 log2 n` rounds, bandwidth-optimal.
    HalvingDoubling,
    /// Bruck's all-gather: `ceil(log2 n)` rounds for any `n`.
    Bruck,
    /// Inside each host, then across hosts (one rank or one slice per host), then
    /// inside each host again.
    Hierarchical,
    /// Dissemination (barrier).
    Dissemination,
    /// Pairwise exchange (all-to-all).
    Pairwise,
}

impl Algorithm {
    /// Lower-case name as accepted by `BRAID_ALGO` and `--algo`.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Direct => "direct",
            Algorithm::Chain => "chain",
            Algorithm::Tree => "tree",
            Algorithm::Doubling => "doubling",
            Algorithm::HalvingDoubling => "halving-doubling",
            Algorithm::Bruck => "bruck",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Pairwise => "pairwise",
        }
    }
    /// Non-zero wire code (the call signature's `algo` byte; 0 means none chosen).
    pub fn code(self) -> u8 {
        Algorithm::ALL.iter().position(|&a| a == self).map_or(0, |i| i as u8 + 1)
    }
    /// The algorithm of a wire code, None for 0 or an unknown code.
    pub fn from_code(code: u8) -> Option<Algorithm> {
        Algorithm::ALL.get((code as usize).checked_sub(1)?).copied()
    }
    /// All algorithms (their order gives the wire codes: append, never reorder).
    pub const ALL: [Algorithm; 10] = [
        Algorithm::Ring,
        Algorithm::Direct,
        Algorithm::Chain,
        Algorithm::Tree,
        Algorithm::Doubling,
        Algorithm::HalvingDoubling,
        Algorithm::Bruck,
        Algorithm::Hierarchical,
        Algorithm::Dissemination,
        Algorithm::Pairwise,
    ];
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.to_ascii_lowercase();
        Algorithm::ALL.iter().copied().find(|a| a.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            format!("unknown algorithm `{s}` (expected {} or auto)", names.join(", "))
        })
    }
}

/// The blocks of a `*v` collective, in elements, one entry per rank: block `j`
/// is `counts[j]` elements from element `displs[j]` of its buffer (MPI's counts
/// and displacements; the schedule reads and writes them in place, no packing).
///
/// - all-gather-v: `recv` is rank `j`'s block in Output (every rank passes the same
///   counts); this rank's Input is `recv_counts[rank]` elements; `send` is empty.
/// - reduce-scatter-v: `send` is the block reduced onto rank `j`, in Input (every
///   rank passes the same counts); Output is `send_counts[rank]`; `recv` is empty.
/// - all-to-all-v: `send` is the block for rank `j`, `recv` the block from rank
///   `j`; this rank's own, as MPI's: `recv_counts[j]` here must equal rank `j`'s
///   `send_counts[rank]` (each received frame's length is checked against it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VBlocks<'a> {
    /// Elements of each Input block.
    pub send_counts: &'a [usize],
    /// Element offset of each Input block.
    pub send_displs: &'a [usize],
    /// Elements of each Output block.
    pub recv_counts: &'a [usize],
    /// Element offset of each Output block.
    pub recv_displs: &'a [usize],
}

impl VBlocks<'_> {
    /// Elements a buffer needs to hold every block: the furthest block end.
    pub fn extent(counts: &[usize], displs: &[usize]) -> Option<usize> {
        counts.iter().zip(displs).try_fold(0usize, |m, (&c, &d)| Some(m.max(d.checked_add(c)?)))
    }
}

/// What to plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanRequest<'a> {
    /// The collective.
    pub op: OpKind,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Element count as in [`crate::types::CallSig::count`].
    pub count: usize,
    /// Bytes per element; every region boundary is a multiple of it.
    pub elem_size: usize,
    /// Root of rooted ops (broadcast, reduce, gather, scatter).
    pub root: usize,
    /// Algorithm; None picks a default by op and size.
    pub algorithm: Option<Algorithm>,
    /// Host index of every rank (`hosts[r]`, hosts numbered in the order of their
    /// lowest rank, as topology discovery numbers them), or empty when all ranks share
    /// one host. Planners that ignore it are still correct; rings and hierarchical
    /// planners use it to keep traffic inside hosts.
    pub hosts: &'a [usize],
    /// The per-rank blocks of a `*v` collective ([`OpKind::varies`]); `None` for
    /// every other op.
    pub blocks: Option<VBlocks<'a>>,
}

impl PlanRequest<'_> {
    /// Host index of `rank` (0 when every rank shares one host).
    pub fn host_of(&self, rank: usize) -> usize {
        self.hosts.get(rank).copied().unwrap_or(0)
    }
    /// Number of hosts (at least 1).
    pub fn num_hosts(&self) -> usize {
        self.hosts.iter().max().map_or(1, |m| m + 1)
    }
    /// Ranks in ring order: host by host (hosts by number), ascending within a host,
    /// so that a ring crosses between hosts as few times as it can (once per host).
    /// The identity on one host.
    pub fn ring_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.world).collect();
        order.sort_by_key(|&r| (self.host_of(r), r));
        order
    }
    /// The ranks of every host, ascending, hosts by number.
    pub fn host_members(&self) -> Vec<Vec<usize>> {
        let mut members = vec![Vec::new(); self.num_hosts()];
        for r in 0..self.world {
            members[self.host_of(r)].push(r);
        }
        members
    }
    /// Bytes of the `Input` buffer this op expects on this rank.
    pub fn input_bytes(&self) -> usize {
        let c = self.count * self.elem_size;
        let b = self.blocks.unwrap_or_default();
        match self.op {
            OpKind::AllGatherV => b.recv_counts.get(self.rank).copied().unwrap_or(0) * self.elem_size,
            OpKind::ReduceScatterV | OpKind::AllToAllV => {
                VBlocks::extent(b.send_counts, b.send_displs).unwrap_or(0) * self.elem_size
            }
            OpKind::ReduceScatter | OpKind::AllToAll => c * self.world,
            // Only the root's blocks are scattered: other ranks have no input.
            OpKind::Scatter if self.rank == self.root => c * self.world,
            OpKind::Barrier | OpKind::Scatter => 0,
            _ => c,
        }
    }
    /// Bytes of the `Output` buffer this op expects on this rank.
    pub fn output_bytes(&self) -> usize {
        let c = self.count * self.elem_size;
        let b = self.blocks.unwrap_or_default();
        match self.op {
            OpKind::ReduceScatterV => b.send_counts.get(self.rank).copied().unwrap_or(0) * self.elem_size,
            OpKind::AllGatherV | OpKind::AllToAllV => {
                VBlocks::extent(b.recv_counts, b.recv_displs).unwrap_or(0) * self.elem_size
            }
            OpKind::AllGather | OpKind::AllToAll => c * self.world,
            // Only the root gathers: other ranks have no output.
            OpKind::Gather if self.rank == self.root => c * self.world,
            OpKind::Barrier | OpKind::Gather => 0,
            _ => c,
        }
    }
}

/// A plan for one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The algorithm it implements.
    pub algorithm: Algorithm,
    /// The rounds, in order.
    pub rounds: Vec<Round>,
    /// Scratch bytes the executor must provide.
    pub scratch_bytes: usize,
    /// Output regions to finalise with the reduce op (e.g. divide by world size for
    /// `Avg`) after the last round. Empty for non-reducing ops.
    pub finalize: Vec<Region>,
}

impl Schedule {
    /// Number of transfer steps (sends plus receives) across all rounds.
    pub fn transfer_steps(&self) -> usize {
        self.rounds.iter().flat_map(|r| &r.steps).filter(|s| s.peer().is_some()).count()
    }
    /// Bytes this rank sends in total.
    pub fn bytes_sent(&self) -> usize {
        self.rounds
            .iter()
            .flat_map(|r| &r.steps)
            .map(|s| match s {
                Step::Send { src, .. } => src.len,
                Step::RecvReduceSend { dst, .. } => dst.len,
                _ => 0,
            })
            .sum()
    }
}

/// Which algorithms apply to an op, in the tuner's order of preference among
/// predictions it cannot tell apart: pipelined schedules first (all-reduce's double
/// binary tree and the rooted ops' chain), whose segments stay in cache between
/// their reduction and their forward, which the cost model does not see (2 ranks
/// over shared memory: the tree 15-25% faster than the ring at 16 and 64 MiB where
/// the model has them within 3%), then Rabenseifner's halving-doubling, which moves
/// the ring's bytes in logarithmic rounds (as fast as the ring or faster at 2 and 4
/// ranks on one host, 64 KiB to 64 MiB), then direct, whose one exchange beats the
/// ring's fused forward at small sizes by more than the model sees (2 ranks, 16 KiB:
/// 2.1 against 2.4 µs where the model has them within 3%).
pub fn algorithms_for(op: OpKind) -> &'static [Algorithm] {
    match op {
        OpKind::AllReduce => &[
            Algorithm::Tree,
            Algorithm::HalvingDoubling,
            Algorithm::Direct,
            Algorithm::Ring,
            Algorithm::Doubling,
            Algorithm::Hierarchical,
        ],
        OpKind::AllGather => {
            &[Algorithm::Ring, Algorithm::Direct, Algorithm::Doubling, Algorithm::Bruck, Algorithm::Hierarchical]
        }
        OpKind::ReduceScatter => {
            &[Algorithm::Ring, Algorithm::Direct, Algorithm::HalvingDoubling, Algorithm::Hierarchical]
        }
        OpKind::Broadcast | OpKind::Reduce => &[Algorithm::Chain, Algorithm::Tree, Algorithm::Hierarchical],
        OpKind::Barrier => &[Algorithm::Dissemination],
        OpKind::AllToAll => &[Algorithm::Pairwise],
        OpKind::Gather | OpKind::Scatter => &[Algorithm::Direct, Algorithm::Tree, Algorithm::Hierarchical],
        OpKind::AllGatherV | OpKind::ReduceScatterV => &[Algorithm::Ring, Algorithm::Direct],
        OpKind::AllToAllV => &[Algorithm::Pairwise],
        OpKind::Send | OpKind::Recv => &[],
    }
}

/// Tunables of the planners. `Default` gives the built-in values; a tuner may plan
/// with others (and the checker and tests use tiny segments to exercise pipelining).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanParams {
    /// Segment size of the pipelined chain (broadcast, reduce), rounded down to whole
    /// elements (at least one). Smaller segments fill the chain sooner; larger ones
    /// pay less per-message overhead.
    pub chain_segment_bytes: usize,
    /// Default choice: `Direct` for all-reduce, all-gather and reduce-scatter when the
    /// bytes each rank sends, `count * elem_size * (world - 1)`, are at most this...
    pub direct_max_bytes: usize,
    /// ...and the world is at most this large (Direct opens `world - 1` transfers at
    /// once and keeps `world - 1` buffers of scratch).
    pub direct_max_world: usize,
    /// Default choice: `Tree` for broadcast and reduce up to this many bytes, `Chain`
    /// above (the chain's bandwidth wins once the message is long enough to pipeline).
    pub tree_max_bytes: usize,
    /// Reproducible mode: reducing ops fold every element in rank order (see the
    /// `ordered` planners), so results do not depend on the algorithm, segment size
    /// or host layout.
    pub deterministic: bool,
}

impl Default for PlanParams {
    fn default() -> Self {
        PlanParams {
            chain_segment_bytes: 512 * 1024,
            direct_max_bytes: 64 * 1024,
            direct_max_world: 8,
            tree_max_bytes: 64 * 1024,
            deterministic: false,
        }
    }
}
