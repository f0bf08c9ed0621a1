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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::engine::Engine;
use super::{Communicator, Origin};
use crate::bootstrap::{PrefixStore, Store};
use crate::device::{Device, PeerProcess};
use crate::error::{Error, Result};

/// Longest peer domain a rank publishes or accepts.
const MAX_DOMAIN: usize = 256;
/// The store value of a rank with no device or a device without a domain.
const NO_DOMAIN: &[u8] = b"-";
/// Prefix of the store value of a rank with a domain.
const DOMAIN_TAG: &[u8] = b"d:";
/// Bytes of a rank's same-process claim.
const CLAIM_LEN: usize = 16;

type Claim = [u8; CLAIM_LEN];

/// The device a communicator is bound to and the peers it reaches single-copy.
pub(crate) struct DeviceBinding {
    pub(super) device: Arc<dyn Device>,
    /// By rank: for a peer whose device maps this device's memory (and back),
    /// where it runs; None for the others.
    pub(super) peers: Arc<[Option<PeerProcess>]>,
    /// This rank's entry in the process's claims, withdrawn with the binding.
    _claim: Option<LocalClaim>,
}

/// Claims of the ranks of this process, by claim: (communicator prefix, rank).
fn local_claims() -> std::sync::MutexGuard<'static, HashMap<Claim, (String, usize)>> {
    static CLAIMS: OnceLock<Mutex<HashMap<Claim, (String, usize)>>> = OnceLock::new();
    CLAIMS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// A claim of this process, recorded until dropped.
struct LocalClaim(Claim);

impl LocalClaim {
    fn new(prefix: &str, rank: usize) -> LocalClaim {
        let claim = crate::auth::random_bytes();
        local_claims().insert(claim, (prefix.to_string(), rank));
        LocalClaim(claim)
    }
}

impl Drop for LocalClaim {
    fn drop(&mut self) {
        local_claims().remove(&self.0);
    }
}

/// Where rank `rank` of the communicator under `prefix`, which published `claim`, runs.
fn process_of(prefix: &str, rank: usize, claim: &Claim) -> PeerProcess {
    match local_claims().get(claim) {
        Some((p, r)) if p == prefix && *r == rank => PeerProcess::This,
        _ => PeerProcess::Other,
    }
}

fn domain_key(rank: usize) -> String {
    format!("device_domain/{rank}")
}

/// The store value of a rank: its domain and its claim, or that it has no domain.
fn encode_domain(domain: Option<&str>, claim: &Claim) -> Result<Vec<u8>> {
    match domain {
        None => Ok(NO_DOMAIN.to_vec()),
        Some(d) if d.len() <= MAX_DOMAIN => Ok([DOMAIN_TAG, claim, b":", d.as_bytes()].concat()),
        Some(d) => {
            Err(Error::InvalidArgument(format!("a device peer domain of {} bytes (at most {MAX_DOMAIN})", d.len())))
        }
    }
}

/// A peer's published domain and claim; the value is untrusted.
fn decode_domain(v: &[u8]) -> std::result::Result<Option<(String, Claim)>, String> {
    if v == NO_DOMAIN {
        return Ok(None);
    }
    let not_ours = || format!("{} bytes that are not a published device domain", v.len());
    let rest = v.strip_prefix(DOMAIN_TAG).ok_or_else(not_ours)?;
    if rest.len() < CLAIM_LEN + 1 || rest[CLAIM_LEN] != b':' {
        return Err(not_ours());
    }
    let claim: Claim = rest[..CLAIM_LEN].try_into().expect("claim bytes");
    let d = &rest[CLAIM_LEN + 1..];
    if d.len() > MAX_DOMAIN {
        return Err(format!("a domain of {} bytes (at most {MAX_DOMAIN})", d.len()));
    }
    let d = String::from_utf8(d.to_vec()).map_err(|_| "a domain that is not UTF-8".to_string())?;
    Ok(Some((d, claim)))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_domains_round_trip_and_untrusted_values_are_refused() {
        let c = [7u8; CLAIM_LEN];
        assert_eq!(decode_domain(&encode_domain(None, &c).unwrap()), Ok(None));
        let v = encode_domain(Some("sim-process:7"), &c).unwrap();
        assert_eq!(decode_domain(&v), Ok(Some(("sim-process:7".into(), c))));
        assert!(encode_domain(Some(&"x".repeat(MAX_DOMAIN + 1)), &c).is_err());
        let long = [DOMAIN_TAG, &c, b":", "x".repeat(MAX_DOMAIN + 1).as_bytes()].concat();
        assert!(decode_domain(&long).unwrap_err().contains("at most"));
        assert!(decode_domain(b"zz").is_err());
        assert!(decode_domain(b"d:short").unwrap_err().contains("not a published"));
        assert!(decode_domain(&[DOMAIN_TAG, &c, b":\xff"].concat()).unwrap_err().contains("UTF-8"));
    }

    /// A rank is of this process only by a claim this process recorded for that
    /// very rank: another process repeating a published claim, or a guess, is not.
    #[test]
    fn only_a_claim_recorded_here_for_that_rank_proves_this_process() {
        let prefix = format!("binding-test-{:016x}", u64::from_le_bytes(crate::auth::random_bytes()));
        let (r0, r1) = (LocalClaim::new(&prefix, 0), LocalClaim::new(&prefix, 1));
        assert_eq!(process_of(&prefix, 1, &r1.0), PeerProcess::This);
        assert_eq!(process_of(&prefix, 1, &r0.0), PeerProcess::Other, "rank 0's claim repeated by rank 1");
        assert_eq!(process_of("another", 1, &r1.0), PeerProcess::Other, "another communicator");
        assert_eq!(process_of(&prefix, 2, &[9; CLAIM_LEN]), PeerProcess::Other, "a guess");
        let stale = r1.0;
        drop(r1);
        assert_eq!(process_of(&prefix, 1, &stale), PeerProcess::Other, "withdrawn with its binding");
    }
}
