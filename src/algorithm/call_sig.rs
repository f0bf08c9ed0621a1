//! The parts of [`CallSig`] that name an [`Algorithm`]. They live here rather than
//! in `types.rs` because the planners import `types.rs` (for `OpKind`): `types.rs`
//! sits below `algorithm/`, so what needs both sits above both.

use std::fmt;

use super::Algorithm;
use crate::types::{CallSig, ANY_SOURCE, REPRODUCIBLE};

impl CallSig {
    /// This signature running `algorithm`.
    pub fn with_algorithm(self, algorithm: Algorithm) -> CallSig {
        CallSig { algo: algorithm.code() | (self.algo & REPRODUCIBLE), ..self }
    }
}

impl fmt::Display for CallSig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(dtype={}, count={}", self.op, self.dtype, self.count)?;
        if self.op.rooted() {
            write!(f, ", root={}", self.root)?;
        }
        if self.op.point_to_point() && self.root == ANY_SOURCE {
            write!(f, ", peer=any, tag={}", self.tag)?;
        } else if self.op.point_to_point() {
            write!(f, ", peer={}, tag={}", self.root, self.tag)?;
        }
        if self.op.reduces() {
            write!(f, ", op={}", self.reduce_op)?;
        }
        f.write_str(")")?;
        if let Some(a) = Algorithm::from_code(self.algo & !REPRODUCIBLE) {
            write!(f, " via {a}")?;
        }
        if self.algo & REPRODUCIBLE != 0 {
            f.write_str(" (reproducible)")?;
        }
        Ok(())
    }
}
