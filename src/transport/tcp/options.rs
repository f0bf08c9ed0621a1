//! How one communicator's TCP mesh is built: the options both the mesh and its
//! handshakes read.

use std::net::IpAddr;
use std::time::Duration;

use super::super::ifaces::AddrFamily;
use crate::auth::JobKey;

/// Most accepted connections that may sit unproven at once (the default of
/// [`super::MeshOptions::max_pending`]). Past it the oldest that has not sent a
/// valid hello is dropped, else the newest: a flood of silent strangers costs
/// them their own sockets, not this rank its descriptors, and never pushes out
/// a real rank's handshake once its hello is in (a real rank sends it as soon
/// as it connects; one whose attempt is dropped retries).
pub const MAX_PENDING: usize = 256;

/// How to build a TCP mesh for one communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshOptions {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Store namespace of this communicator (e.g. `comm/0`); addresses go under `{key_prefix}/tcp/{rank}`.
    pub key_prefix: String,
    /// Interface spec in NCCL syntax (`BRAID_SOCKET_IFNAME`); None for the default policy.
    pub ifname: Option<String>,
    /// Restrict the listening address to one family (`BRAID_SOCKET_FAMILY`); None prefers IPv4.
    pub family: Option<AddrFamily>,
    /// This rank's source address on its route to the store ([`Store::route_source`]);
    /// without an interface spec, links listen there. None when unknown.
    pub store_route: Option<IpAddr>,
    /// Whether the communicator spans hosts: a route to the store that starts on
    /// loopback is then not listened on (default true).
    pub spans_hosts: bool,
    /// Deadline for the whole setup: store waits, connects, accepts and handshakes.
    pub timeout: Duration,
    /// Communicator id; a hello carrying another id is refused, so two jobs cannot cross-connect.
    pub comm_id: u64,
    /// Set SO_SNDBUF and SO_RCVBUF to this many bytes. None (the default) keeps
    /// kernel autotuning, which setting them disables.
    pub socket_buffer: Option<usize>,
    /// Link only with the ranks marked true (`world` entries; e.g. the peers on
    /// other hosts when shared memory serves the local ones). None links with all.
    pub peers: Option<Vec<bool>>,
    /// The job key both ends of every link prove in the handshake (default: none,
    /// which proves nothing). Never sent.
    pub key: JobKey,
    /// Accepted connections that may sit unproven at once (default [`MAX_PENDING`]);
    /// past it strangers that never sent a valid hello are dropped first.
    pub max_pending: usize,
}

impl MeshOptions {
    /// Options for `rank` of `world` under `key_prefix`, every other knob at its default
    /// (default interface policy, 60 s timeout, communicator id 0, no job key).
    pub fn new(rank: usize, world: usize, key_prefix: impl Into<String>) -> MeshOptions {
        MeshOptions {
            rank,
            world,
            key_prefix: key_prefix.into(),
            ifname: None,
            family: None,
            store_route: None,
            spans_hosts: true,
            timeout: crate::config::DEFAULT_TIMEOUT,
            comm_id: 0,
            socket_buffer: None,
            peers: None,
            key: JobKey::none(),
            max_pending: MAX_PENDING,
        }
    }

    /// Whether this rank links with `peer` over TCP (per [`MeshOptions::peers`]).
    pub fn links_to(&self, peer: usize) -> bool {
        peer != self.rank && self.peers.as_ref().map_or(peer < self.world, |p| p.get(peer).copied().unwrap_or(false))
    }
}
