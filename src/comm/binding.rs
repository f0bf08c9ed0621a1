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

use std::sync::Arc;
use std::time::Duration;

use super::engine::Engine;
use super::{Communicator, Origin};
use crate::bootstrap::{PrefixStore, Store};
use crate::device::Device;
use crate::error::{Error, Result};

/// Longest peer domain a rank publishes or accepts.
const MAX_DOMAIN: usize = 256;
/// The store value of a rank with no device or a device without a domain.
const NO_DOMAIN: &[u8] = b"-";
/// Prefix of the store value of a rank with a domain.
const DOMAIN_TAG: &[u8] = b"d:";

/// The device a communicator is bound to and the peers it reaches single-copy.
pub(crate) struct DeviceBinding {
    pub(super) device: Arc<dyn Device>,
    /// By rank: whether the peer's device maps this device's memory (and back).
    pub(super) peers: Arc<[bool]>,
}

fn domain_key(rank: usize) -> String {
    format!("device_domain/{rank}")
}

fn encode_domain(domain: Option<&str>) -> Result<Vec<u8>> {
    match domain {
        None => Ok(NO_DOMAIN.to_vec()),
        Some(d) if d.len() <= MAX_DOMAIN => Ok([DOMAIN_TAG, d.as_bytes()].concat()),
        Some(d) => {
            Err(Error::InvalidArgument(format!("a device peer domain of {} bytes (at most {MAX_DOMAIN})", d.len())))
        }
    }
}

/// A peer's published domain; the value is untrusted.
fn decode_domain(v: &[u8]) -> std::result::Result<Option<String>, String> {
    if v == NO_DOMAIN {
        return Ok(None);
    }
    let Some(d) = v.strip_prefix(DOMAIN_TAG) else {
        return Err(format!("{} bytes that are not a published device domain", v.len()));
    };
    if d.len() > MAX_DOMAIN {
        return Err(format!("a domain of {} bytes (at most {MAX_DOMAIN})", d.len()));
    }
    String::from_utf8(d.to_vec()).map(Some).map_err(|_| "a domain that is not UTF-8".to_string())
}

/// After a store-built communicator has connected: publish this rank's domain
/// (every rank, bound or not, so a bound peer never waits for it) and, with a
/// device, agree with the peers and bind the communicator to it.
pub(super) fn bind_built(comm: &Communicator, device: Option<Arc<dyn Device>>) -> Result<()> {
    let Origin::Store(origin) = &comm.origin else { return Ok(()) };
    let scoped = PrefixStore::new(origin.prefix.clone(), origin.store.clone());
    let (rank, world) = (comm.rank(), comm.world_size());
    let mine = device.as_ref().and_then(|d| d.peer_domain());
    scoped.set(&domain_key(rank), &encode_domain(mine.as_deref())?)?;
    let Some(device) = device else { return Ok(()) };
    let peers = match &mine {
        None => vec![false; world],
        Some(mine) => read_peers(&scoped, rank, world, mine, origin.cfg.timeout)?,
    };
    tracing::debug!(rank, device = device.describe(), ?peers, "device bound; single-copy peers marked");
    comm.core.shared.lock_engine().binding = Some(DeviceBinding { device, peers: peers.into() });
    Ok(())
}

fn read_peers(scoped: &PrefixStore, rank: usize, world: usize, mine: &str, timeout: Duration) -> Result<Vec<bool>> {
    (0..world)
        .map(|p| {
            if p == rank {
                return Ok(false);
            }
            let raw = scoped.wait_get(&domain_key(p), timeout)?;
            let theirs = decode_domain(&raw).map_err(|why| {
                Error::Store(format!("rank {rank}: {}/{} holds {why}", scoped.prefix(), domain_key(p)))
            })?;
            Ok(theirs.as_deref() == Some(mine))
        })
        .collect()
}

/// Bind in-process communicators (rank `r` to `devices[r]`), comparing domains directly.
pub(super) fn bind_in_process(comms: &[Communicator], devices: Vec<Arc<dyn Device>>) -> Result<()> {
    let domains: Vec<Option<String>> = devices.iter().map(|d| d.peer_domain()).collect();
    for d in domains.iter().flatten() {
        encode_domain(Some(d))?;
    }
    for ((r, comm), device) in comms.iter().enumerate().zip(devices) {
        let peers: Vec<bool> =
            (0..comms.len()).map(|p| p != r && domains[r].is_some() && domains[p] == domains[r]).collect();
        comm.core.shared.lock_engine().binding = Some(DeviceBinding { device, peers: peers.into() });
    }
    Ok(())
}

impl Engine {
    /// Which peers a call on buffers of `device` (None: host buffers) reaches
    /// single-copy. A call on another device than the bound one is staged with
    /// every peer, which the peers can only match if none of them copies
    /// single-copy with this rank: otherwise it is refused.
    pub(super) fn peer_copy_for(&self, device: Option<&Arc<dyn Device>>) -> Result<Option<Arc<[bool]>>> {
        let (Some(b), Some(d)) = (&self.binding, device) else { return Ok(None) };
        if Arc::ptr_eq(&b.device, d) {
            return Ok(Some(b.peers.clone()));
        }
        let marked: Vec<usize> = (0..b.peers.len()).filter(|&p| b.peers[p]).collect();
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
        e.binding.as_ref().map(|b| (0..b.peers.len()).filter(|&p| b.peers[p]).collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_domains_round_trip_and_untrusted_values_are_refused() {
        assert_eq!(decode_domain(&encode_domain(None).unwrap()), Ok(None));
        let v = encode_domain(Some("sim-process:7")).unwrap();
        assert_eq!(decode_domain(&v), Ok(Some("sim-process:7".into())));
        assert!(encode_domain(Some(&"x".repeat(MAX_DOMAIN + 1))).is_err());
        let long = [DOMAIN_TAG, "x".repeat(MAX_DOMAIN + 1).as_bytes()].concat();
        assert!(decode_domain(&long).unwrap_err().contains("at most"));
        assert!(decode_domain(b"zz").is_err());
        assert!(decode_domain(b"d:\xff").unwrap_err().contains("UTF-8"));
    }
}
