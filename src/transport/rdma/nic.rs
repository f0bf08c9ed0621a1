//! What the verbs channel needs of a network adapter, as a trait: post receive
//! work requests, post a signalled RDMA WRITE WITH IMMEDIATE of a gather list,
//! poll completions, register memory for local reads. The verbs layer
//! (`verbs::VerbsNic`, feature `rdma`) implements it over one queue pair; the
//! tests implement it in software, so [`RdmaChannel`](super::channel::RdmaChannel)
//! runs here without hardware.

use std::io;

/// One entry of a gather list: `len` bytes at `addr`, registered under `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the registration covering it.
    pub lkey: u32,
}

/// A completion taken off the completion queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// A WRITE WITH IMMEDIATE from the peer landed: its immediate value (host
    /// order) and length.
    Recv {
        /// Immediate value.
        imm: u32,
        /// Bytes written.
        byte_len: u32,
    },
    /// A write of this rank completed.
    Sent {
        /// Its work-request id.
        wr_id: u64,
    },
    /// A work request failed (`wr_id` 0: a receive).
    Failed {
        /// Its work-request id.
        wr_id: u64,
        /// What the adapter said.
        status: String,
    },
}

/// An adapter's queue pair to one peer.
pub trait Nic: Send {
    /// A registration of local memory; dropping it deregisters.
    type Mr: Send;

    /// The local key of a registration.
    fn lkey(mr: &Self::Mr) -> u32;

    /// Register `[addr, addr + len)` for local reads by the adapter.
    ///
    /// # Safety
    /// The range must stay allocated while the registration lives.
    unsafe fn register(&mut self, addr: usize, len: usize) -> Result<Self::Mr, String>;

    /// Post `n` receive work requests (no buffers; id 0).
    fn post_recvs(&mut self, n: usize) -> io::Result<()>;

    /// Post a signalled RDMA WRITE WITH IMMEDIATE `imm` of `sges`, gathered in
    /// order, to `remote_addr` under `rkey`.
    ///
    /// # Safety
    /// Every entry must lie in a live registration of this adapter, and its memory
    /// must stay allocated and unchanged until the write completes.
    unsafe fn post_write(&mut self, wr_id: u64, sges: &[Sge], imm: u32, remote_addr: u64, rkey: u32) -> io::Result<()>;

    /// Append the completions available now to `out`.
    fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<()>;
}
