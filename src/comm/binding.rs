//! Binding a communicator to a device, as NCCL binds each communicator to one GPU:
//! which peers this rank reaches with single-copy device transfers, decided once,
//! when the communicator is built.
//!
//! Every rank of a communicator built over a store publishes its device's
//! [`Device::peer_domain`] (or that it has none) under the communicator's prefix
//! at `device_domain/{rank}`; a rank bound to a device reads every peer's and marks
//! the peers whose domain equals its own. Equality is symmetric, so both ends of a
//! pair decide alike without a further exchange. In-process communicators compare
//! their devices' domains directly. Calls on buffers of the bound device then use
//! [`PeerCopyChannel`](crate::executor::peer_copy::PeerCopyChannel) with the
//! marked peers and staging with the rest.
//!
//! Each marked peer also carries where it runs ([`PeerProcess`]): only a peer of
//! this process may name device addresses of it. In-process communicators are
//! threads of one process by construction. Over a store, a rank proves it: it
//! draws a random claim, records it in a table of this process under the
//! communicator's prefix and its rank, and publishes it with its domain; a peer
//! is of this process only if its published claim is in this process's table
//! under its own rank. A rank of another process cannot write that table, and
//! repeating another rank's claim names the wrong rank; a pid would prove nothing
//! (pid namespaces repeat them, and a peer writes whatever it likes).

use std::sync::Arc;
use std::time::Duration;

use super::device_binding::{
    decode_domain, domain_key, encode_domain, process_of, DeviceBinding, LocalClaim, CLAIM_LEN,
};
use super::engine::Engine;
use super::origin::Origin;
use super::Communicator;
use crate::bootstrap::{PrefixStore, Store};
use crate::device::{Device, PeerProcess};
use crate::error::{Error, Result};

/// After a store-built communicator has connected: publish this rank's domain
/// (every rank, bound or not, so a bound peer never waits for it) and, with a
/// device, agree with the peers and bind the communicator to it.
pub(super) fn bind_built(comm: &Communicator, device: Option<Arc<dyn Device>>) -> Result<()> {
    let Origin::Store(origin) = &comm.origin else { return Ok(()) };
    let scoped = PrefixStore::new(origin.prefix.clone(), origin.store.clone());
    let (rank, world) = (comm.rank(), comm.world_size());
    let mine = device.as_ref().and_then(|d| d.peer_domain());
    // Recorded before it is published, so a rank of this process that reads it
    // finds it.
    let claim = mine.as_ref().map(|_| LocalClaim::new(&origin.prefix, rank));
    let published = encode_domain(mine.as_deref(), claim.as_ref().map_or(&[0; CLAIM_LEN], |c| &c.0))?;
    scoped.set(&domain_key(rank), &published)?;
    let Some(device) = device else { return Ok(()) };
    let peers = match &mine {
        None => vec![None; world],
        Some(mine) => read_peers(&scoped, &origin.prefix, rank, world, mine, origin.cfg.timeout)?,
    };
    tracing::debug!(rank, device = device.describe(), ?peers, "device bound; single-copy peers marked");
    comm.core.shared.lock_engine().binding = Some(DeviceBinding { device, peers: peers.into(), _claim: claim });
    Ok(())
}

fn read_peers(
    scoped: &PrefixStore,
    prefix: &str,
    rank: usize,
    world: usize,
    mine: &str,
    timeout: Duration,
) -> Result<Vec<Option<PeerProcess>>> {
    (0..world)
        .map(|p| {
            if p == rank {
                return Ok(None);
            }
            let raw = scoped.wait_get(&domain_key(p), timeout)?;
            let theirs = decode_domain(&raw).map_err(|why| {
                Error::Store(format!("rank {rank}: {}/{} holds {why}", scoped.prefix(), domain_key(p)))
            })?;
            Ok(theirs.filter(|(d, _)| d == mine).map(|(_, claim)| process_of(prefix, p, &claim)))
        })
        .collect()
}

/// Bind in-process communicators (rank `r` to `devices[r]`), comparing domains directly.
pub(super) fn bind_in_process(comms: &[Communicator], devices: Vec<Arc<dyn Device>>) -> Result<()> {
    let domains: Vec<Option<String>> = devices.iter().map(|d| d.peer_domain()).collect();
    for d in domains.iter().flatten() {
        encode_domain(Some(d), &[0; CLAIM_LEN])?;
    }
    for ((r, comm), device) in comms.iter().enumerate().zip(devices) {
        // Threads of this process by construction.
        let peers: Vec<Option<PeerProcess>> = (0..comms.len())
            .map(|p| (p != r && domains[r].is_some() && domains[p] == domains[r]).then_some(PeerProcess::This))
            .collect();
        comm.core.shared.lock_engine().binding = Some(DeviceBinding { device, peers: peers.into(), _claim: None });
    }
    Ok(())
}

impl Engine {
    /// Which peers a call on buffers of `device` (None: host buffers) reaches
    /// single-copy. A call on another device than the bound one is staged with
    /// every peer, which the peers can only match if none of them copies
    /// single-copy with this rank: otherwise it is refused.
    pub(super) fn peer_copy_for(&self, device: Option<&Arc<dyn Device>>) -> Result<Option<Arc<[Option<PeerProcess>]>>> {
        let (Some(b), Some(d)) = (&self.binding, device) else { return Ok(None) };
        if Arc::ptr_eq(&b.device, d) {
            return Ok(Some(b.peers.clone()));
        }
        let marked: Vec<usize> = (0..b.peers.len()).filter(|&p| b.peers[p].is_some()).collect();
        if marked.is_empty() {
            return Ok(None);
        }
        Err(Error::InvalidArgument(format!(
            "rank {}: a call on buffers of {}, but the communicator is bound to {}, whose memory ranks {marked:?} \
             read directly: run device calls on the bound device",
            self.rank,
            d.describe(),
            b.device.describe()
        )))
    }
}

impl Communicator {
    /// `devices.len()` communicators whose ranks are threads of this process, rank
    /// `r` bound to `devices[r]` (several ranks may share one device): calls on
    /// buffers of a rank's device between ranks whose devices map each other's
    /// memory copy straight from device to device.
    pub fn in_process_on(devices: Vec<Arc<dyn Device>>) -> Result<Vec<Communicator>> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument("in_process_on needs a device per rank, and got none".into()));
        }
        let comms = Communicator::in_process(devices.len())?;
        bind_in_process(&comms, devices)?;
        Ok(comms)
    }

    /// Like [`Communicator::in_process_on`], with the settings of `cfg` (its world
    /// size must be the number of devices).
    pub fn in_process_on_with(devices: Vec<Arc<dyn Device>>, cfg: crate::config::Config) -> Result<Vec<Communicator>> {
        if cfg.world_size != devices.len() {
            return Err(Error::InvalidArgument(format!(
                "{} devices for a world of {} ranks",
                devices.len(),
                cfg.world_size
            )));
        }
        let comms = Communicator::in_process_with(cfg)?;
        bind_in_process(&comms, devices)?;
        Ok(comms)
    }

    /// The device this communicator is bound to, if any.
    pub fn device(&self) -> Option<Arc<dyn Device>> {
        self.core.shared.lock_engine().binding.as_ref().map(|b| b.device.clone())
    }

    /// The peers whose devices map this rank's device memory: calls on the bound
    /// device reach them single-copy.
    pub fn single_copy_peers(&self) -> Vec<usize> {
        let e = self.core.shared.lock_engine();
        e.binding.as_ref().map(|b| (0..b.peers.len()).filter(|&p| b.peers[p].is_some()).collect()).unwrap_or_default()
    }
}
