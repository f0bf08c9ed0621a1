//! Gather and scatter on borrowed raw buffers (what the C ABI calls), in the
//! layouts of `borrowed.rs`: `count` is one rank's block, the root's buffer holds
//! `world_size` blocks, and in place (`send == recv`) the root's own block is at
//! block `root`.

use super::{Communicator, Work};
use crate::error::Result;
use crate::types::{DType, OpKind, ReduceOp};

impl Communicator {
    /// Gather every rank's `send` (`count` elements) into the root's `recv`
    /// (`world_size * count`, in rank order); `recv` may be null off the root.
    ///
    /// # Safety
    /// `send` is valid for `count` elements and, at the root, `recv` for
    /// `world_size * count`, used by nothing else until the call returns; they are
    /// equal (in place), `send` is block `root` of `recv`, or they are disjoint.
    pub unsafe fn gather_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(self.raw(OpKind::Gather, dtype, count, root, ReduceOp::Sum), send, recv) }
    }

    /// Scatter the root's `send` (`world_size * count` elements): rank `j`'s `recv`
    /// (`count`) receives block `j`; `send` may be null off the root.
    ///
    /// # Safety
    /// As [`Communicator::gather_raw`] with the roles of the buffers swapped.
    pub unsafe fn scatter_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(self.raw(OpKind::Scatter, dtype, count, root, ReduceOp::Sum), send, recv) }
    }

    /// [`Communicator::gather_raw`], asynchronously.
    ///
    /// # Safety
    /// As [`Communicator::gather_raw`], until the work completes.
    pub unsafe fn gather_async_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<Work<()>> {
        // SAFETY: the caller's promise.
        unsafe { self.spawn_raw(self.raw(OpKind::Gather, dtype, count, root, ReduceOp::Sum), send, recv) }
    }

    /// [`Communicator::scatter_raw`], asynchronously.
    ///
    /// # Safety
    /// As [`Communicator::scatter_raw`], until the work completes.
    pub unsafe fn scatter_async_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<Work<()>> {
        // SAFETY: the caller's promise.
        unsafe { self.spawn_raw(self.raw(OpKind::Scatter, dtype, count, root, ReduceOp::Sum), send, recv) }
    }
}
