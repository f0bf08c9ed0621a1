//! What the communicator hands a transport when it asks for links: the peers, the
//! store and the configuration. Transports read it; [`super::connect`] passes it on.

use crate::bootstrap::Store;
use crate::config::Config;

use super::stream_copy;

/// What a transport needs to link this rank with some of its peers.
pub struct ConnectRequest<'a> {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// The peers to link with this transport (`world` entries; false at `rank`).
    pub peers: Vec<bool>,
    /// The communicator's store namespace, where endpoints are exchanged.
    pub store: &'a dyn Store,
    /// The communicator id (TCP handshakes carry it).
    pub comm_id: u32,
    /// How many ranks of the communicator share this host.
    pub local_ranks: usize,
    /// CPUs those ranks may use between them (0: unknown; see `Topology::local_cpus`).
    pub local_cpus: usize,
    /// The switch the communicator's tuner sets for its shared-memory ring writers.
    pub stream_switch: stream_copy::TunerSwitch,
    /// The switch it sets for exchanges of plain buffers: single-copy or through
    /// the ring (`BRAID_CMA=auto`).
    pub exchange_switch: stream_copy::TunerSwitch,
    /// Timeout, job key, interface filter, ring sizes.
    pub config: &'a Config,
}
