//! The RDMA verbs transport: reliable-connected queue pairs per peer.
//!
//! Split quinn-style so the logic is tested without hardware:
//! - [`protocol`]: the per-peer protocol (receive rings, credits, chunks, gates,
//!   validation of everything the peer sends), no verbs, no I/O, no clock;
//! - [`endpoint`]: the endpoint record exchanged through the store, and its parser;
//! - [`regcache`]: the registration cache, over any registrar;
//! - [`nic`]: what the channel needs of an adapter (post, poll, register), and
//!   what its set-up needs (protection domains, queue pairs), as traits;
//! - [`setup`]: a rank's channels set up over any adapter, a protection domain per
//!   peer, endpoints exchanged through the store;
//! - [`channel`]: [`RdmaChannel`](channel::RdmaChannel), the [`PeerChannel`](crate::executor::PeerChannel)
//!   that drives the protocol on an adapter (tested here on a software one);
//! - `verbs` (feature `rdma`): the thin layer over `rdma-sys` — device, protection
//!   domains, completion queues, queue pairs, memory registration, posting and
//!   polling, endpoint exchange — the one part only compiled here (no hardware).

pub mod channel;
pub mod endpoint;
pub mod nic;
pub mod protocol;
pub mod regcache;
pub mod setup;
#[cfg(feature = "rdma")]
pub mod verbs;

#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod soft_nic;
#[cfg(test)]
mod soft_tests;
