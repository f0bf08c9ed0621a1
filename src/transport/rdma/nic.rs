//! What the verbs channel needs of a network adapter, as traits. [`Nic`], one
//! queue pair: post receive work requests, post a signalled RDMA WRITE WITH
//! IMMEDIATE of a gather list, poll completions, register memory for local reads,
//! stop. [`Adapter`], the device: protection domains, and queue pairs and
//! registrations in them, for [`connect_over`](super::setup::connect_over). The
//! verbs layer (`verbs`, feature `rdma`) implements both over hardware; the tests
//! implement them in software, so [`RdmaChannel`](super::channel::RdmaChannel) and
//! its set-up run here without hardware.

use std::io;

use super::endpoint::Endpoint;
use super::protocol::RingSpec;
use crate::error::Result;

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

    /// Move the queue pair to the error state: every work request outstanding
    /// completes (flushed, [`Completion::Failed`]) without touching its memory any
    /// more, and nothing more is sent or received.
    fn halt(&mut self) -> io::Result<()>;
}

/// A network adapter: protection domains, and queue pairs and registrations in them.
pub trait Adapter {
    /// A protection domain: a registration's remote key opens it only to RDMA
    /// writes arriving on a queue pair of the same domain. Queue pairs and
    /// registrations keep their domain alive.
    type Pd;
    /// A queue pair (and its completion queue) in a protection domain.
    type Nic: Nic;

    /// A new protection domain, for the queue pair to `peer`.
    fn alloc_pd(&self, peer: usize) -> Result<Self::Pd>;

    /// A queue pair to `peer` in `pd`, not yet connected, with room for the work
    /// requests of a protocol of layout `spec`.
    fn create_qp(&self, pd: &Self::Pd, spec: &RingSpec, peer: usize) -> Result<Self::Nic>;

    /// Register `[addr, addr + len)` in `pd` for local writes and, with
    /// `remote_write`, for RDMA writes arriving on queue pairs of `pd`; returns the
    /// registration and its remote key.
    ///
    /// # Safety
    /// The range must stay allocated while the registration lives (the adapter
    /// writes it).
    unsafe fn register(
        &self,
        pd: &Self::Pd,
        addr: *mut u8,
        len: usize,
        remote_write: bool,
        peer: usize,
    ) -> Result<(<Self::Nic as Nic>::Mr, u32)>;

    /// The endpoint a peer connects `nic` to, naming the ring it may write.
    fn endpoint(&self, nic: &Self::Nic, ring_addr: u64, rkey: u32, spec: &RingSpec) -> Endpoint;

    /// Connect `nic` to the peer's endpoint `remote` (receives are posted first,
    /// so the peer's first writes find them).
    fn connect(&self, nic: &mut Self::Nic, remote: &Endpoint, peer: usize) -> Result<()>;
}
