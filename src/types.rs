//! Element types and reduction operators.

use std::fmt;
use std::str::FromStr;

/// Element type of a buffer, as carried on the wire and across the C ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// 32-bit IEEE float.
    F32 = 0,
    /// 64-bit IEEE float.
    F64 = 1,
    /// 16-bit IEEE float (`half::f16`).
    F16 = 2,
    /// bfloat16 (`half::bf16`).
    BF16 = 3,
    /// Signed 8-bit integer.
    I8 = 4,
    /// Unsigned 8-bit integer.
    U8 = 5,
    /// Signed 32-bit integer.
    I32 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
}

impl DType {
    /// Every dtype, in wire-code order.
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32, DType::I64];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    /// Short lower-case name used by the CLI and in reports (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// Decode a wire code.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(code as usize).copied()
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.to_ascii_lowercase();
        let alias = match s.as_str() {
            "float" | "float32" => "f32",
            "double" | "float64" => "f64",
            "half" | "float16" => "f16",
            "bfloat16" => "bf16",
            "int8" => "i8",
            "uint8" => "u8",
            "int" | "int32" => "i32",
            "int64" => "i64",
            other => other,
        };
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == alias)
            .ok_or_else(|| format!("unknown dtype `{s}` (expected one of f32 f64 f16 bf16 i8 u8 i32 i64)"))
    }
}

/// Reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum (integers wrap on overflow).
    Sum = 0,
    /// Product (integers wrap on overflow).
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Sum divided by the world size (integers: truncating division).
    Avg = 4,
}

impl ReduceOp {
    /// Every operator, in wire-code order.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    /// Short lower-case name (`sum`, `prod`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Decode a wire code.
    pub fn from_code(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(code as usize).copied()
    }

    /// The operator applied pairwise while data moves: `Avg` accumulates as `Sum`
    /// and divides once at the end.
    pub const fn combiner(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            other => other,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.to_ascii_lowercase();
        let alias = match s.as_str() {
            "product" => "prod",
            "mean" | "average" => "avg",
            other => other,
        };
        ReduceOp::ALL
            .iter()
            .copied()
            .find(|o| o.name() == alias)
            .ok_or_else(|| format!("unknown reduce op `{s}` (expected one of sum prod min max avg)"))
    }
}

/// A Rust element type that braid can move and reduce.
///
/// Implemented for `f32 f64 half::f16 half::bf16 i8 u8 i32 i64`.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The wire dtype of this element type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16, i8 => I8, u8 => U8, i32 => I32, i64 => I64);

/// The collective (or point-to-point) operation a call performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpKind {
    /// All-reduce.
    AllReduce = 0,
    /// Broadcast from a root.
    Broadcast = 1,
    /// All-gather.
    AllGather = 2,
    /// Reduce-scatter.
    ReduceScatter = 3,
    /// Reduce to a root.
    Reduce = 4,
    /// Barrier.
    Barrier = 5,
    /// All-to-all.
    AllToAll = 6,
    /// Point-to-point send (seen from the sender).
    Send = 7,
    /// Point-to-point receive (seen from the receiver).
    Recv = 8,
    /// Gather every rank's block to a root.
    Gather = 9,
    /// Scatter a root's blocks, block `j` to rank `j`.
    Scatter = 10,
    /// All-gather of blocks whose sizes differ by rank (MPI_Allgatherv).
    AllGatherV = 11,
    /// Reduce-scatter into blocks whose sizes differ by rank (MPI_Reduce_scatter).
    ReduceScatterV = 12,
    /// All-to-all with a size per pair of ranks (MPI_Alltoallv).
    AllToAllV = 13,
}

impl OpKind {
    /// Every op kind, in wire-code order.
    pub const ALL: [OpKind; 14] = [
        OpKind::AllReduce,
        OpKind::Broadcast,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::Reduce,
        OpKind::Barrier,
        OpKind::AllToAll,
        OpKind::Send,
        OpKind::Recv,
        OpKind::Gather,
        OpKind::Scatter,
        OpKind::AllGatherV,
        OpKind::ReduceScatterV,
        OpKind::AllToAllV,
    ];

    /// Hyphenated name as used by the CLI (`all-reduce`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all-reduce",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all-gather",
            OpKind::ReduceScatter => "reduce-scatter",
            OpKind::Reduce => "reduce",
            OpKind::Barrier => "barrier",
            OpKind::AllToAll => "all-to-all",
            OpKind::Send => "send",
            OpKind::Recv => "recv",
            OpKind::Gather => "gather",
            OpKind::Scatter => "scatter",
            OpKind::AllGatherV => "all-gather-v",
            OpKind::ReduceScatterV => "reduce-scatter-v",
            OpKind::AllToAllV => "all-to-all-v",
        }
    }

    /// Decode a wire code.
    pub fn from_code(code: u8) -> Option<OpKind> {
        OpKind::ALL.get(code as usize).copied()
    }

    /// Whether the op reduces data (and so carries a reduce op in its signature).
    pub const fn reduces(self) -> bool {
        matches!(self, OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce | OpKind::ReduceScatterV)
    }

    /// Whether each rank's block has its own size (the `*v` collectives).
    pub const fn varies(self) -> bool {
        matches!(self, OpKind::AllGatherV | OpKind::ReduceScatterV | OpKind::AllToAllV)
    }

    /// Whether the op is a send or a receive (it has a peer and a tag).
    pub const fn point_to_point(self) -> bool {
        matches!(self, OpKind::Send | OpKind::Recv)
    }

    /// Whether the op has a root rank.
    pub const fn rooted(self) -> bool {
        matches!(self, OpKind::Broadcast | OpKind::Reduce | OpKind::Gather | OpKind::Scatter)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OpKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let norm: String = s.to_ascii_lowercase().chars().filter(|c| *c != '-' && *c != '_').collect();
        OpKind::ALL
            .iter()
            .copied()
            .find(|o| o.name().replace('-', "") == norm)
            .ok_or_else(|| {
                format!("unknown op `{s}` (expected all-reduce, all-gather, reduce-scatter, broadcast, reduce, gather, scatter, all-to-all, barrier, all-gather-v, reduce-scatter-v or all-to-all-v)")
            })
    }
}

/// The signature of one call: what every rank must agree on. It travels in every
/// wire frame so that ranks issuing different calls fail with an error naming both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallSig {
    /// The operation.
    pub op: OpKind,
    /// Element type.
    pub dtype: DType,
    /// Element count per rank as defined by the op (all-reduce: buffer length;
    /// all-gather: input length; reduce-scatter: output length; all-to-all: per-peer block;
    /// gather, scatter: one rank's block; all-gather-v, reduce-scatter-v: the sum of
    /// every rank's block, which all ranks share; all-to-all-v: 0, since each rank's
    /// totals are its own: each received block's length is checked instead).
    pub count: u64,
    /// Root rank for rooted ops, peer rank for send/recv, otherwise 0.
    pub root: u32,
    /// Reduce op for reducing ops, otherwise `Sum`.
    pub reduce_op: ReduceOp,
    /// The algorithm the call runs ([`crate::algorithm::Algorithm::code`]), 0 while
    /// not yet chosen, with bit 0x80 set in reproducible mode ([`CallSig::reproducible`]). On the wire,
    /// so that ranks that chose differently fail with an error naming both instead
    /// of exchanging mismatched pieces.
    pub algo: u8,
    /// The tag of a send/recv (0 unless given), otherwise 0. Checked, not matched on:
    /// a receive takes the peer's sends in posting order, and one tagged otherwise
    /// fails naming both tags.
    pub tag: u32,
}

/// The peer ([`CallSig::root`]) of a receive from any source
/// ([`crate::Communicator::recv_any`]) until it knows its sender.
pub const ANY_SOURCE: u32 = u32::MAX;

/// Bit of [`CallSig::algo`] set when the call runs in reproducible mode.
pub(crate) const REPRODUCIBLE: u8 = 0x80;

impl CallSig {
    /// A signature with the fields that do not apply to `op` normalised, so that
    /// ranks compare only what matters.
    pub fn new(op: OpKind, dtype: DType, count: u64, root: u32, reduce_op: ReduceOp) -> CallSig {
        CallSig {
            op,
            dtype,
            count,
            root: if op.rooted() || matches!(op, OpKind::Send | OpKind::Recv) { root } else { 0 },
            reduce_op: if op.reduces() { reduce_op } else { ReduceOp::Sum },
            algo: 0,
            tag: 0,
        }
    }

    /// This send/recv signature carrying `tag` (other ops carry none: unchanged).
    pub fn with_tag(self, tag: u32) -> CallSig {
        CallSig { tag: if self.op.point_to_point() { tag } else { 0 }, ..self }
    }

    /// This signature in reproducible mode (`on`, reducing ops only: the mode only
    /// changes how they reduce), so a rank in that mode and one outside it fail
    /// with an error naming both.
    pub fn reproducible(self, on: bool) -> CallSig {
        let bit = if on && self.op.reduces() { REPRODUCIBLE } else { 0 };
        CallSig { algo: (self.algo & !REPRODUCIBLE) | bit, ..self }
    }

    /// Whether a frame sent under `theirs` is what a call `self` expects. A send
    /// matches a receive with the same dtype, count and tag.
    pub fn matches(&self, theirs: &CallSig) -> bool {
        match (self.op, theirs.op) {
            (OpKind::Recv, OpKind::Send) => {
                self.dtype == theirs.dtype && self.count == theirs.count && self.tag == theirs.tag
            }
            // A send/recv's peer is not on the wire (it is the rank reading the frame).
            _ if self.op.point_to_point() => CallSig { root: 0, ..*self } == CallSig { root: 0, ..*theirs },
            _ => self == theirs,
        }
    }
}

// `CallSig::with_algorithm` and `Display for CallSig` name `crate::algorithm::Algorithm`,
// so they are in `algorithm/call_sig.rs`: this file stays below the planners that import it.
