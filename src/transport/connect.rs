//! The one entry point from the communicator to the transports: links of one kind
//! to some peers, each wrapped in the executor's channel. This sits above both the
//! links and the executor; neither imports it.

use crate::error::{Error, Result};
use crate::executor::{PeerChannel, StreamChannel};

use super::{fault, shm, tcp, ConnectRequest, Link, TransportKind};

/// Channels of kind `kind` to every peer marked in `req.peers` (`None` elsewhere):
/// byte-stream links wrapped in a [`StreamChannel`] (shm, tcp), or verbs channels.
///
/// One entry point per transport: the communicator asks each transport in turn for
/// the peers the topology gave it, and knows nothing of how a transport connects.
pub fn connect(kind: TransportKind, req: &ConnectRequest) -> Result<Vec<Option<Box<dyn PeerChannel>>>> {
    kind.available().map_err(Error::Unsupported)?;
    fn boxed<L: Link + 'static>(links: Vec<Option<L>>, req: &ConnectRequest) -> Vec<Option<Box<dyn PeerChannel>>> {
        let cfg = req.config;
        let channel = |l: L| {
            // Only a fault plan (a test's) wraps a link, and only the ones it acts on.
            let l = fault::wrap(cfg.fault.as_ref(), req.rank, Box::new(l));
            let mut ch = StreamChannel::with_tuning(l, cfg.tuning);
            if cfg.tuning.cma_exchanges_timed {
                ch.time_exchanges(&req.exchange_switch);
            }
            Box::new(ch) as Box<dyn PeerChannel>
        };
        links.into_iter().map(|l| l.map(channel)).collect()
    }
    let cfg = req.config;
    match kind {
        TransportKind::Shm => {
            let mut opts = shm::ShmOptions::new(req.rank, req.world, "shm");
            opts.peers = req.peers.clone();
            opts.timeout = cfg.timeout;
            opts.ring_bytes =
                cfg.shm_ring_bytes.unwrap_or_else(|| shm::default_ring_bytes(req.local_ranks, req.local_cpus));
            opts.cma = cfg.tuning.cma;
            opts.stream = cfg.tuning.nt_stores;
            opts.switch = req.stream_switch.clone();
            opts.key = cfg.job_key.clone();
            Ok(boxed(shm::connect_shm(&opts, req.store)?, req))
        }
        TransportKind::Tcp => {
            let mut opts = tcp::MeshOptions::new(req.rank, req.world, "mesh");
            opts.ifname = cfg.socket_ifname.clone();
            opts.family = cfg.socket_family;
            // Without an interface spec, links listen where this rank reaches the store.
            opts.store_route = if cfg.socket_ifname.is_none() { req.store.route_source() } else { None };
            opts.spans_hosts = req.local_ranks < req.world;
            opts.timeout = cfg.timeout;
            opts.comm_id = req.comm_id as u64;
            opts.peers = Some(req.peers.clone());
            opts.key = cfg.job_key.clone();
            Ok(boxed(tcp::connect_mesh(&opts, req.store)?, req))
        }
        TransportKind::InProcess => Err(Error::InvalidArgument(
            "in-process links join threads of one process: use Communicator::in_process".into(),
        )),
        #[cfg(feature = "rdma")]
        TransportKind::Rdma => Ok(super::rdma::verbs::connect(req)?
            .into_iter()
            .map(|c| c.map(|c| Box::new(c) as Box<dyn PeerChannel>))
            .collect()),
        #[cfg(not(feature = "rdma"))]
        TransportKind::Rdma => unreachable!("available() refused {kind}"),
        // Device memory is not a link of its own: calls on device buffers stage it
        // over the host links the communicator has (see `crate::executor::staged`).
        TransportKind::Cuda => Err(Error::InvalidArgument(
            "cuda is not a link between ranks: GPU buffers travel over shm, rdma or tcp links \
             (use the *_device calls, or `braid perf --transport cuda`)"
                .into(),
        )),
    }
}
