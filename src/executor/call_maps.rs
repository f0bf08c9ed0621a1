//! The peer allocations one single-copy channel opened during one call: found per
//! piece without taking the device's lock, bounded per call, and given back to the
//! device when the call ends (after its work on them completed).
//!
//! A peer's sends come from its call's buffers (input, output, scratch) and the
//! few staging buffers it may add for memory it cannot export, so a handful of
//! allocations per call is all an honest peer names; one naming a new allocation
//! in every piece is refused past [`MAX_PEER_ALLOCATIONS_PER_CALL`] instead of
//! growing the device's mappings without bound.

use crate::device::{Device, DevicePtr};
use crate::error::Error;

/// Distinct allocations a peer may name in one call.
pub const MAX_PEER_ALLOCATIONS_PER_CALL: usize = 16;

/// Why a descriptor's handle gave no mapping.
#[derive(Debug)]
pub(super) enum Refusal {
    /// A new allocation past [`MAX_PEER_ALLOCATIONS_PER_CALL`].
    TooMany,
    /// The device could not open it.
    Open(Error),
}

/// The mappings a channel holds for its call: handle, base and size.
#[derive(Default)]
pub(super) struct CallMaps {
    held: Vec<(Vec<u8>, DevicePtr, usize)>,
}

impl CallMaps {
    /// The mapping of `handle`, opened with `open` (one hold on the device) the
    /// first time this call names it.
    pub(super) fn get_or_open(
        &mut self,
        handle: &[u8],
        open: impl FnOnce(&[u8]) -> crate::error::Result<(DevicePtr, usize)>,
    ) -> Result<(DevicePtr, usize), Refusal> {
        if let Some(&(_, base, size)) = self.held.iter().find(|(h, _, _)| h == handle) {
            return Ok((base, size));
        }
        if self.held.len() >= MAX_PEER_ALLOCATIONS_PER_CALL {
            return Err(Refusal::TooMany);
        }
        let (base, size) = open(handle).map_err(Refusal::Open)?;
        self.held.push((handle.to_vec(), base, size));
        Ok((base, size))
    }

    /// Give every hold back to `device`; its work reading them has completed.
    pub(super) fn release_all(&mut self, device: &dyn Device) {
        for (h, _, _) in self.held.drain(..) {
            device.close_export(&h);
        }
    }

    /// Allocations held now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{PeerProcess, SimDevice};

    #[test]
    fn one_open_per_allocation_per_call_bounded_and_given_back() {
        let (owner, reader) = (SimDevice::new("owner"), SimDevice::new("reader"));
        let mut maps = CallMaps::default();
        let mut handles = Vec::new();
        for _ in 0..=MAX_PEER_ALLOCATIONS_PER_CALL {
            let p = owner.alloc_device(8).unwrap();
            handles.push(owner.export(p, 8).unwrap().handle);
        }
        let open = |h: &[u8]| reader.open_export(h, PeerProcess::This);
        let first = maps.get_or_open(&handles[0], open).unwrap();
        assert_eq!(maps.get_or_open(&handles[0], |_| unreachable!()).unwrap(), first, "found, not reopened");
        for h in &handles[1..MAX_PEER_ALLOCATIONS_PER_CALL] {
            maps.get_or_open(h, open).unwrap();
        }
        let last = &handles[MAX_PEER_ALLOCATIONS_PER_CALL];
        assert!(matches!(maps.get_or_open(last, open), Err(Refusal::TooMany)));
        assert!(matches!(maps.get_or_open(b"junk", |_| unreachable!()), Err(Refusal::TooMany)));
        assert_eq!(
            (maps.len(), reader.mapped_allocations()),
            (MAX_PEER_ALLOCATIONS_PER_CALL, MAX_PEER_ALLOCATIONS_PER_CALL)
        );
        maps.release_all(&reader);
        assert_eq!((maps.len(), reader.mapped_allocations()), (0, 0));
    }
}
