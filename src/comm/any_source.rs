//! [`Communicator::recv_any`]: a receive from whichever rank sends first (MPI's
//! `MPI_ANY_SOURCE`, torch's `recv(tensor, src=None)`).
//!
//! The engine waits until some peer's next frame is a send to this rank with the
//! receive's tag ([`executor::any_source::first_sender`]), then receives it from
//! that peer exactly as [`Communicator::recv_tagged`] would: the receive takes that
//! link's next sequence number, so later receives from every peer still pair with
//! the right sends.

use super::calls::Core;
use super::engine::Engine;
use super::Communicator;
use crate::error::{OpContext, Result};
use crate::executor::{self, CallInfo};
use crate::types::{CallSig, DType, Element, OpKind, ReduceOp, ANY_SOURCE};

impl Engine {
    /// Wait for a send tagged as `sig` says from any peer, receive it into the `len`
    /// bytes at `buf`, and return the sender.
    fn recv_any(&mut self, sig: CallSig, (buf, len): (*mut u8, usize)) -> Result<usize> {
        self.refuse_if_stopped(sig)?;
        let info = CallInfo {
            ctx: OpContext { rank: self.rank, call: Some(sig), seq: 0 },
            sig,
            send_seq: 0,
            recv_seq: 0,
            comm_id: self.comm_id,
            epoch: self.epoch,
            dtype: sig.dtype,
            reduce_op: ReduceOp::Sum,
            timeout: self.timeout,
            wait: self.wait,
            flags: self.aborted.clone(),
        };
        let peer = match executor::any_source::first_sender(&mut self.channels, &info) {
            Ok(peer) => peer,
            Err(e) => {
                // As any failed call: the peers are told and later calls refused.
                self.fail(e.to_string());
                return Err(e);
            }
        };
        self.point_to_point(CallSig { root: peer as u32, ..sig }, peer, (buf, len), None)?;
        Ok(peer)
    }
}

impl Core {
    /// Receive `len` bytes of `dtype` at `ptr` from any peer, at `ticket`.
    fn recv_any_at(&self, ticket: u64, (ptr, len): (*mut u8, usize), dtype: DType, tag: u32) -> Result<usize> {
        let checked = if self.world < 2 {
            Err(self.arg("recv_any on a 1-rank communicator: there is no other rank to receive from".into()))
        } else if !len.is_multiple_of(dtype.size()) {
            Err(self.arg(format!("recv_any: {len} bytes is not a whole number of {dtype}")))
        } else {
            let count = (len / dtype.size()) as u64;
            Ok(CallSig::new(OpKind::Recv, dtype, count, ANY_SOURCE, ReduceOp::Sum).with_tag(tag))
        };
        let sig = checked.as_ref().ok().copied();
        self.shared.in_turn(ticket, sig, |e| e.recv_any(checked?, (ptr, len)))
    }
}

impl Communicator {
    /// Receive `buf.len()` elements from whichever rank sends first with `tag` and
    /// return that rank (MPI's `MPI_ANY_SOURCE`, torch's `recv(src=None)`).
    ///
    /// Each peer's sends are still taken in the order it made them: a peer whose
    /// next send to this rank carries another tag (or that is ahead in a
    /// collective) is passed over, and its frame stays for the call it belongs to.
    /// When no peer is left that could send a match (each passed over or closed),
    /// the call fails at once naming one of them; when none sends within the
    /// communicator's timeout, it fails with [`crate::Error::Timeout`] naming the silent
    /// ranks. A send of another length fails as [`Communicator::recv`] would.
    /// Host buffers; links of every host transport (in-process, shared memory, TCP).
    ///
    /// ```
    /// use braid::Communicator;
    /// let comms = Communicator::in_process(3)?;
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || -> braid::Result<()> {
    ///             if c.rank() == 0 {
    ///                 let mut got = Vec::new();
    ///                 for _ in 0..2 {
    ///                     let mut buf = [0i32; 2];
    ///                     let from = c.recv_any(&mut buf, 5)?;
    ///                     assert_eq!(buf, [from as i32; 2]);
    ///                     got.push(from);
    ///                 }
    ///                 got.sort();
    ///                 assert_eq!(got, [1, 2]);
    ///             } else {
    ///                 c.send_tagged(&[c.rank() as i32; 2], 0, 5)?;
    ///             }
    ///             Ok(())
    ///         });
    ///     }
    /// });
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn recv_any<T: Element>(&self, buf: &mut [T], tag: u32) -> Result<usize> {
        self.recv_any_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, tag)
    }

    /// [`Communicator::recv_any`] into `count` elements of `dtype` at `buf` (the C
    /// ABI's form); NULL only for none.
    ///
    /// # Safety
    /// `buf` is valid for writing `count` elements, used by nothing else until the
    /// call returns.
    pub unsafe fn recv_any_raw(&self, buf: *mut u8, count: usize, dtype: DType, tag: u32) -> Result<usize> {
        let bytes = super::p2p_group::raw_bytes(buf, count, dtype)?;
        self.core.recv_any_at(self.core.shared.take_ticket(), bytes, dtype, tag)
    }

    /// [`Communicator::recv_any`] into bytes of `dtype`.
    pub fn recv_any_bytes(&self, buf: &mut [u8], dtype: DType, tag: u32) -> Result<usize> {
        let t = self.core.shared.take_ticket();
        self.core.recv_any_at(t, (buf.as_mut_ptr(), buf.len()), dtype, tag)
    }
}
