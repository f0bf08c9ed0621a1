//! What one end of a shared-memory link lets its peer read, published in the
//! segment header so the peer's pulls can tell a withdrawn exposure.
//!
//! Between processes a pull never dereferences the exposer's memory itself: CMA
//! goes through the kernel, and a registered segment is mapped by the puller. So a
//! late pull cannot fault; what it must not do is hand out bytes the exposer has
//! since freed or reused. Each side therefore publishes, in its own header words:
//! the hull `[start, end)` of what it exposed in the current exposure epoch, and
//! the epoch, bumped by every revocation before the exposer returns (and so before
//! it frees or rewrites anything). A pull checks that its range lies in the hull,
//! copies, then checks that the epoch did not move. Seqlock reasoning: a copy that
//! saw any write made after a revocation sees that revocation's epoch afterwards,
//! so such a copy is discarded as an error, never returned. A revocation does not
//! wait for the peer (a stuck peer must not hold this rank); the peer's racing
//! copy fails instead.
//!
//! The hull over-approximates the exposed ranges, which is enough: the exposer
//! writes both the descriptors and the hull, and only its revocation is to be
//! honoured. A new exposure after a revocation is told from the old one only by
//! its range; the executor never exposes again on a link whose call ended early
//! (the communicator is broken then), and a call that ends normally has had every
//! pull acknowledged first.
//!
//! Cost: a few atomic loads of one cache line per pull (a rendezvous frame of up
//! to 1 MiB, or a `process_vm_readv` chunk), stores only when the hull grows (once
//! per transfer: adjacent frames extend it) and one store per revocation.

use std::io;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// The header words of one side's exposure. Only that side writes them; the peer
/// only reads them, so a lying writer misleads only pulls of its own memory.
#[repr(C)]
#[derive(Default)]
pub(super) struct ExposureWords {
    /// Bumped by each revocation of a non-empty exposure.
    epoch: AtomicU64,
    /// `[start, end)`: the hull of what is exposed in the current epoch; empty
    /// (`start >= end`) when nothing is.
    start: AtomicU64,
    end: AtomicU64,
}

/// The exposing side's private record of its words (never read back from the
/// segment, which the peer can write).
#[derive(Default)]
pub(super) struct Exposer {
    epoch: u64,
    hull: Option<(u64, u64)>,
}

impl Exposer {
    /// Add `[addr, addr + len)` to what the peer may read. Published before the
    /// frame naming it is written to the ring, whose release orders the two.
    pub(super) fn expose(&mut self, words: &ExposureWords, addr: usize, len: usize) {
        let Some(end) = (addr as u64).checked_add(len as u64).filter(|_| len > 0) else { return };
        let (start, end) = match self.hull {
            Some((s, e)) if s <= addr as u64 && end <= e => return,
            Some((s, e)) => (s.min(addr as u64), e.max(end)),
            None => (addr as u64, end),
        };
        self.hull = Some((start, end));
        words.start.store(start, Ordering::Release);
        words.end.store(end, Ordering::Release);
    }

    /// Withdraw everything exposed: the epoch moves first (a pull racing with
    /// this fails its final check), then the hull empties (later pulls fail at once).
    pub(super) fn revoke(&mut self, words: &ExposureWords) {
        if self.hull.take().is_none() {
            return;
        }
        self.epoch = self.epoch.wrapping_add(1);
        words.epoch.store(self.epoch, Ordering::Relaxed);
        // Orders the new epoch before every later write of this process to the
        // memory that was exposed (the pull's acquire fence pairs with it).
        fence(Ordering::Release);
        words.start.store(0, Ordering::Release);
        words.end.store(0, Ordering::Release);
    }
}

/// Run `copy`, which reads `[addr, addr + len)` of rank `peer`'s memory, only
/// while `words` (the peer's) expose that range: refused before copying when they
/// do not, and the copy discarded as an error when the peer revoked while it ran.
pub(super) fn while_exposed<R>(
    words: &ExposureWords,
    peer: usize,
    addr: usize,
    len: usize,
    copy: impl FnOnce() -> io::Result<R>,
) -> io::Result<R> {
    if len == 0 {
        return copy();
    }
    let range_end = (addr as u64).checked_add(len as u64);
    let epoch = words.epoch.load(Ordering::Acquire);
    let (start, end) = (words.start.load(Ordering::Acquire), words.end.load(Ordering::Acquire));
    let inside = range_end.is_some_and(|e| start < end && start <= addr as u64 && e <= end);
    if !inside {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("rank {peer} does not expose [{addr:#x}, +{len}) (its call has ended, or the address is wrong)"),
        ));
    }
    let out = copy()?;
    fence(Ordering::Acquire);
    if words.epoch.load(Ordering::Relaxed) != epoch {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("rank {peer} withdrew [{addr:#x}, +{len}) while it was read (its call has ended)"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pull(words: &ExposureWords, addr: usize, len: usize) -> io::Result<()> {
        while_exposed(words, 1, addr, len, || Ok(()))
    }

    #[test]
    fn only_the_hull_of_this_epoch_is_readable() {
        let (words, mut me) = (ExposureWords::default(), Exposer::default());
        assert!(pull(&words, 0x1000, 8).is_err(), "nothing exposed yet");
        me.expose(&words, 0x1000, 0x1000);
        me.expose(&words, 0x2000, 0x1000);
        pull(&words, 0x1000, 0x2000).unwrap();
        assert!(pull(&words, 0x2ff8, 16).is_err(), "past the end");
        assert!(pull(&words, 0xff8, 16).is_err(), "before the start");
        assert!(pull(&words, usize::MAX - 3, 8).is_err(), "wrapping");
        me.revoke(&words);
        let e = pull(&words, 0x1000, 8).unwrap_err();
        assert!(e.to_string().contains("rank 1") && e.kind() == io::ErrorKind::PermissionDenied, "{e}");
        me.expose(&words, 0x8000, 16);
        pull(&words, 0x8000, 16).unwrap();
    }

    #[test]
    fn a_copy_overtaken_by_a_revocation_is_discarded() {
        let (words, mut me) = (ExposureWords::default(), Exposer::default());
        me.expose(&words, 0x1000, 64);
        let r = while_exposed(&words, 1, 0x1000, 64, || {
            me.revoke(&words);
            Ok(42)
        });
        let e = r.unwrap_err();
        assert!(e.to_string().contains("withdrew"), "{e}");
    }
}
