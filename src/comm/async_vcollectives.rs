//! The `*v` collectives (all-gather-v, reduce-scatter-v, all-to-all-v) in a
//! [`Scope`], on borrowed buffers: the same layouts and argument rules as the
//! blocking forms of `vcollectives.rs`.
//!
//! The worker runs a call after the method has returned, so the counts and
//! displacements travel with the job as owned copies (the caller's arrays may be
//! gone by then). Arguments are checked where the blocking forms check them, at the
//! call's turn: an error comes back from the handle's `wait`, after the call took
//! its turn, as the blocking form's comes back after it took its own.

use super::async_borrowed::{slice_back, Ranges, Scope, ScopedWork};
use super::vcollectives::{packed, sig_v, OwnedBlocks, VCall};
use crate::types::{CallSig, Element, OpKind, ReduceOp};

impl<'scope> Scope<'scope, '_> {
    /// Issue a `*v` call: `blocks` moves into the job, the buffers stay borrowed.
    fn issue_v<T: Element>(
        &'scope self,
        sig: CallSig,
        blocks: OwnedBlocks,
        input: Option<&'scope [T]>,
        output: &'scope mut [T],
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let lent = (output.as_mut_ptr() as *mut u8, output.len());
        let input = input.map(|i| (i.as_ptr() as *const u8, std::mem::size_of_val(i)));
        let ranges = Ranges { input, output: (lent.0, std::mem::size_of_val(output)) };
        self.issue_with(ranges, lent, slice_back::<T>, move |core, ticket, input, output| {
            core.collective_v_at(ticket, VCall { sig, blocks: blocks.view(), input, output })
        })
    }

    /// [`crate::Communicator::all_gather_v`], asynchronously; `wait` returns `output`.
    pub fn all_gather_v<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        counts: &[usize],
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let sig = sig_v::<T>(OpKind::AllGatherV, counts, ReduceOp::Sum);
        self.issue_v(sig, gathered(counts), Some(input), output)
    }

    /// [`crate::Communicator::all_gather_v_in_place`], asynchronously; `wait` returns `buf`.
    pub fn all_gather_v_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        counts: &[usize],
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let sig = sig_v::<T>(OpKind::AllGatherV, counts, ReduceOp::Sum);
        self.issue_v(sig, gathered(counts), None, buf)
    }

    /// [`crate::Communicator::reduce_scatter_v`], asynchronously; `wait` returns `output`.
    pub fn reduce_scatter_v<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let sig = sig_v::<T>(OpKind::ReduceScatterV, counts, op);
        self.issue_v(sig, scattered(counts), Some(input), output)
    }

    /// [`crate::Communicator::reduce_scatter_v_in_place`], asynchronously; `wait`
    /// returns `buf` (the result at block `rank`, the other blocks as they were).
    pub fn reduce_scatter_v_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let sig = sig_v::<T>(OpKind::ReduceScatterV, counts, op);
        self.issue_v(sig, scattered(counts), None, buf)
    }

    /// [`crate::Communicator::all_to_all_v`], asynchronously; `wait` returns `output`.
    pub fn all_to_all_v<T: Element>(
        &'scope self,
        input: &'scope [T],
        send_counts: &[usize],
        send_displs: &[usize],
        output: &'scope mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let blocks = OwnedBlocks {
            send_counts: send_counts.to_vec(),
            send_displs: send_displs.to_vec(),
            recv_counts: recv_counts.to_vec(),
            recv_displs: recv_displs.to_vec(),
        };
        let sig = CallSig::new(OpKind::AllToAllV, T::DTYPE, 0, 0, ReduceOp::Sum);
        self.issue_v(sig, blocks, Some(input), output)
    }
}

/// All-gather-v's blocks: `counts` received, packed in rank order.
fn gathered(counts: &[usize]) -> OwnedBlocks {
    OwnedBlocks { recv_counts: counts.to_vec(), recv_displs: packed(counts), ..OwnedBlocks::default() }
}

/// Reduce-scatter-v's blocks: `counts` sent, packed in rank order.
fn scattered(counts: &[usize]) -> OwnedBlocks {
    OwnedBlocks { send_counts: counts.to_vec(), send_displs: packed(counts), ..OwnedBlocks::default() }
}
