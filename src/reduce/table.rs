//! The kernel table: which kernel runs for each element type and op on one
//! instruction-set level. Kept apart from `mod.rs` so that `x86.rs`, which builds
//! the AVX2 table, and `mod.rs`, which picks a table and runs it, both depend on
//! this file and not on each other.

use half::{bf16, f16};

use super::kernels::{self, Max, Min, Prod, Sum};

/// Two-operand kernel on aligned typed slices of equal length.
///
/// `unsafe` because AVX2 entries may only run on CPUs with the feature; a [`Table`]
/// only holds entries the running CPU supports.
pub(super) type K2<T> = unsafe fn(&mut [T], &[T]);
/// Three-operand kernel on aligned typed slices of equal length (same contract as [`K2`]).
pub(super) type K3<T> = unsafe fn(&mut [T], &[T], &[T]);

/// The kernels for one element type, indexed by `op_index` (in `mod.rs`).
pub(super) struct Ops<T> {
    pub(super) two: [K2<T>; 4],
    pub(super) three: [K3<T>; 4],
}

impl<T> Ops<T> {
    pub(super) fn new(two: [K2<T>; 4], three: [K3<T>; 4]) -> Self {
        Ops { two, three }
    }
}

/// Every kernel for one instruction-set level.
pub(super) struct Table {
    pub(super) name: &'static str,
    pub(super) f32: Ops<f32>,
    pub(super) f64: Ops<f64>,
    pub(super) f16: Ops<f16>,
    pub(super) bf16: Ops<bf16>,
    pub(super) i8: Ops<i8>,
    pub(super) u8: Ops<u8>,
    pub(super) i32: Ops<i32>,
    pub(super) i64: Ops<i64>,
}

/// Kernels from the generic loops built by `two`/`three` for one element type.
macro_rules! generic_ops {
    ($two:ident, $three:ident, $t:ty) => {
        Ops::new(
            [$two::<$t, Sum>, $two::<$t, Prod>, $two::<$t, Min>, $two::<$t, Max>],
            [$three::<$t, Sum>, $three::<$t, Prod>, $three::<$t, Min>, $three::<$t, Max>],
        )
    };
}
// Path-based export so `x86.rs` can use it regardless of declaration order.
pub(crate) use generic_ops;

impl Table {
    /// Baseline kernels, valid on every CPU.
    pub(super) fn portable() -> Table {
        use kernels::{f16_portable2 as f2, f16_portable3 as f3, portable2, portable3};
        Table {
            name: "portable",
            f32: generic_ops!(portable2, portable3, f32),
            f64: generic_ops!(portable2, portable3, f64),
            f16: Ops::new([f2::<Sum>, f2::<Prod>, f2::<Min>, f2::<Max>], [f3::<Sum>, f3::<Prod>, f3::<Min>, f3::<Max>]),
            bf16: generic_ops!(portable2, portable3, bf16),
            i8: generic_ops!(portable2, portable3, i8),
            u8: generic_ops!(portable2, portable3, u8),
            i32: generic_ops!(portable2, portable3, i32),
            i64: generic_ops!(portable2, portable3, i64),
        }
    }
}
