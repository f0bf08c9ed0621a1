//! What a communicator bound to a device holds, and the published form of a
//! rank's binding: its device's peer domain and its same-process claim (the
//! protocol is in `binding.rs`). Apart from the procedures that bind, which
//! need the communicator, so that the engine holding a [`DeviceBinding`] does
//! not depend on them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::device::{Device, PeerProcess};
use crate::error::{Error, Result};

/// Longest peer domain a rank publishes or accepts.
const MAX_DOMAIN: usize = 256;
/// The store value of a rank with no device or a device without a domain.
const NO_DOMAIN: &[u8] = b"-";
/// Prefix of the store value of a rank with a domain.
const DOMAIN_TAG: &[u8] = b"d:";
/// Bytes of a rank's same-process claim.
pub(super) const CLAIM_LEN: usize = 16;

type Claim = [u8; CLAIM_LEN];

/// The device a communicator is bound to and the peers it reaches single-copy.
pub(crate) struct DeviceBinding {
    pub(super) device: Arc<dyn Device>,
    /// By rank: for a peer whose device maps this device's memory (and back),
    /// where it runs; None for the others.
    pub(super) peers: Arc<[Option<PeerProcess>]>,
    /// This rank's entry in the process's claims, withdrawn with the binding.
    pub(super) _claim: Option<LocalClaim>,
}

/// Claims of the ranks of this process, by claim: (communicator prefix, rank).
fn local_claims() -> std::sync::MutexGuard<'static, HashMap<Claim, (String, usize)>> {
    static CLAIMS: OnceLock<Mutex<HashMap<Claim, (String, usize)>>> = OnceLock::new();
    CLAIMS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// A claim of this process, recorded until dropped.
pub(super) struct LocalClaim(pub(super) Claim);

impl LocalClaim {
    pub(super) fn new(prefix: &str, rank: usize) -> LocalClaim {
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
pub(super) fn process_of(prefix: &str, rank: usize, claim: &Claim) -> PeerProcess {
    match local_claims().get(claim) {
        Some((p, r)) if p == prefix && *r == rank => PeerProcess::This,
        _ => PeerProcess::Other,
    }
}

pub(super) fn domain_key(rank: usize) -> String {
    format!("device_domain/{rank}")
}

/// The store value of a rank: its domain and its claim, or that it has no domain.
pub(super) fn encode_domain(domain: Option<&str>, claim: &Claim) -> Result<Vec<u8>> {
    match domain {
        None => Ok(NO_DOMAIN.to_vec()),
        Some(d) if d.len() <= MAX_DOMAIN => Ok([DOMAIN_TAG, claim, b":", d.as_bytes()].concat()),
        Some(d) => {
            Err(Error::InvalidArgument(format!("a device peer domain of {} bytes (at most {MAX_DOMAIN})", d.len())))
        }
    }
}

/// A peer's published domain and claim; the value is untrusted.
pub(super) fn decode_domain(v: &[u8]) -> std::result::Result<Option<(String, Claim)>, String> {
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
