//! Peers' allocations a device has mapped, and whether a peer may name an address
//! of this process: the decisions the CUDA device and [`SimDevice`](super::SimDevice)
//! share, in plain code, so they run and are tested without a GPU.
//!
//! - **Holders, not eviction.** Each call that opens a peer's allocation holds its
//!   mapping until the call ends; the mapping closes when its last holder gives it
//!   back, which the executor does only after the device finished the call's work
//!   (a queued copy never reads a closed mapping). Nothing is evicted while held:
//!   the executor bounds how many allocations one call may open per peer, and this
//!   table refuses (never evicts) past [`MAX_MAPPINGS`] held at once.
//! - **Same process by proof, not by claim.** A handle carries this process's
//!   [random token](process_token), not a pid (ranks in other pid namespaces share
//!   pids, and a peer writes whatever it likes). Whether its address may be used as
//!   is decided from [`PeerProcess`], which the communicator established when it
//!   was bound; the token only has to agree with it ([`check_claim`]).

use std::collections::HashMap;
use std::sync::OnceLock;

use super::interface::{DevicePtr, PeerProcess};
use crate::error::{Error, Result};

/// Bytes of [`process_token`].
pub const TOKEN_LEN: usize = 16;

/// Peer allocations one device holds mapped at once, over every call; beyond it
/// a new one is refused (never is a held one closed to make room).
pub const MAX_MAPPINGS: usize = 1024;

/// This process's random id: drawn from the kernel once, written into every
/// handle it exports. Unlike a pid it does not repeat across pid namespaces.
pub fn process_token() -> [u8; TOKEN_LEN] {
    static TOKEN: OnceLock<[u8; TOKEN_LEN]> = OnceLock::new();
    *TOKEN.get_or_init(crate::auth::random_bytes)
}

/// Whether a handle claiming to come from the process with token `claimed` may
/// come from `peer`, for a device of the process with token `mine`. A peer of
/// another process whose handle claims this process is forging (or colliding):
/// refused, so its base address is never used here.
pub fn check_claim(peer: PeerProcess, claimed: &[u8], mine: &[u8; TOKEN_LEN]) -> std::result::Result<(), String> {
    let ours = claimed == mine;
    match peer {
        PeerProcess::This if !ours => Err("a handle of another process from a peer of this process".into()),
        PeerProcess::Other if ours => {
            Err("a handle claiming this process from a peer of another process (refused: its addresses are not ours)"
                .into())
        }
        _ => Ok(()),
    }
}

/// One mapping and how many opens of it are outstanding.
struct Held<M> {
    base: DevicePtr,
    size: usize,
    holders: usize,
    mapping: M,
}

/// Peer allocations a device has open, by handle bytes; `M` is what the device
/// needs to close one (the mapped address for CUDA).
pub struct Mappings<M> {
    open: HashMap<Vec<u8>, Held<M>>,
}

impl<M> Default for Mappings<M> {
    fn default() -> Self {
        Mappings { open: HashMap::new() }
    }
}

impl<M> Mappings<M> {
    /// One more hold on the mapping of `handle`, mapping it with `map` (base,
    /// size, closing token) if it is not open. `tag` names the device in errors.
    pub fn acquire(
        &mut self,
        tag: &str,
        handle: &[u8],
        map: impl FnOnce() -> Result<(DevicePtr, usize, M)>,
    ) -> Result<(DevicePtr, usize)> {
        if let Some(h) = self.open.get_mut(handle) {
            h.holders += 1;
            return Ok((h.base, h.size));
        }
        if self.open.len() >= MAX_MAPPINGS {
            return Err(Error::Device(format!(
                "{tag}: {MAX_MAPPINGS} peer allocations are mapped already (every one held by a running call)"
            )));
        }
        let (base, size, mapping) = map()?;
        self.open.insert(handle.to_vec(), Held { base, size, holders: 1, mapping });
        Ok((base, size))
    }

    /// Give back one hold on `handle`: the mapping to close when it was the last
    /// (the caller closes it, its work on it done), else None. Unknown handles: None.
    pub fn release(&mut self, handle: &[u8]) -> Option<M> {
        let h = self.open.get_mut(handle)?;
        h.holders -= 1;
        if h.holders > 0 {
            return None;
        }
        self.open.remove(handle).map(|h| h.mapping)
    }

    /// Every mapping, held or not (the device is going away).
    pub fn drain(&mut self) -> Vec<M> {
        self.open.drain().map(|(_, h)| h.mapping).collect()
    }

    /// Mappings open now.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_closes_only_when_its_last_holder_gives_it_back() {
        let mut m: Mappings<u32> = Mappings::default();
        let mut maps = 0;
        let mut open = |m: &mut Mappings<u32>, h: &[u8], id: u32| {
            m.acquire("t", h, || {
                maps += 1;
                Ok((0x1000 * id as u64, 64, id))
            })
            .unwrap()
        };
        assert_eq!(open(&mut m, b"a", 1), (0x1000, 64));
        assert_eq!(open(&mut m, b"a", 9), (0x1000, 64), "held again, not mapped again");
        open(&mut m, b"b", 2);
        assert_eq!(maps, 2);
        assert_eq!(m.release(b"a"), None, "another call still holds it");
        assert_eq!(m.release(b"a"), Some(1));
        assert_eq!(m.release(b"a"), None, "closed once");
        assert_eq!(m.release(b"zz"), None);
        assert_eq!(m.drain(), vec![2]);
        assert!(m.is_empty());
    }

    #[test]
    fn past_the_cap_new_mappings_are_refused_and_held_ones_stay() {
        let mut m: Mappings<u64> = Mappings::default();
        for i in 0..MAX_MAPPINGS as u64 {
            m.acquire("t", &i.to_le_bytes(), || Ok((i + 1, 8, i))).unwrap();
        }
        let e = m.acquire("dev", b"new", || Ok((1, 1, 0))).unwrap_err().to_string();
        assert!(e.contains("dev") && e.contains("mapped already"), "{e}");
        assert_eq!(m.len(), MAX_MAPPINGS, "nothing was closed to make room");
        assert_eq!(m.acquire("t", &0u64.to_le_bytes(), || unreachable!()).unwrap(), (1, 8), "held ones still open");
    }

    #[test]
    fn only_a_peer_of_this_process_may_claim_it() {
        let mine = process_token();
        assert_eq!(process_token(), mine, "drawn once");
        let other = [mine[0] ^ 1; TOKEN_LEN];
        assert!(check_claim(PeerProcess::This, &mine, &mine).is_ok());
        assert!(check_claim(PeerProcess::Other, &other, &mine).is_ok());
        assert!(check_claim(PeerProcess::Other, &mine, &mine).unwrap_err().contains("another process"));
        assert!(check_claim(PeerProcess::This, &other, &mine).is_err());
    }
}
