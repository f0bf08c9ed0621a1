//! The registration cache: memory regions registered with the device, keyed by
//! address range, bounded in entries and bytes, evicting the least recently used.
//!
//! A registration pins the pages it covers when it is made. Plain host memory may
//! be freed and its addresses reused by another allocation as soon as a call
//! returns, and a cached registration would then point the device at the old pages
//! (silent corruption), so registrations of plain memory live for one call: they
//! are dropped at [`RegCache::end_call`]. Memory in a braid-registered segment
//! ([`crate::registered`]) keeps its mapping while the segment lives, so those
//! registrations are kept across calls, checked on every hit against the segment
//! still being there under the same name.
//!
//! The device calls are behind [`Registrar`], so the cache logic is tested here
//! without hardware.

/// Registers and deregisters memory with a device.
pub trait Registrar {
    /// A registration (a memory-region handle).
    type Mr;
    /// Register `[addr, addr + len)` (page-aligned).
    fn register(&mut self, addr: usize, len: usize) -> Result<Self::Mr, String>;
    /// Drop a registration.
    fn deregister(&mut self, mr: Self::Mr);
}

const PAGE: usize = 4096;

struct Entry<M> {
    id: u64,
    start: usize,
    end: usize,
    mr: M,
    /// The registered segment the range lies in (kept across calls), if any.
    segment: Option<String>,
    /// Requests of the current call using it.
    pins: usize,
    last_use: u64,
    /// Must not be found again (its call ended while it was pinned).
    stale: bool,
}

/// The cache.
pub struct RegCache<M> {
    entries: Vec<Entry<M>>,
    max_entries: usize,
    max_bytes: usize,
    bytes: usize,
    clock: u64,
    next_id: u64,
}

impl<M> RegCache<M> {
    /// A cache of at most `max_entries` registrations and `max_bytes` registered
    /// bytes (exceeded only while everything is in use).
    pub fn new(max_entries: usize, max_bytes: usize) -> RegCache<M> {
        RegCache { entries: Vec::new(), max_entries, max_bytes, bytes: 0, clock: 0, next_id: 0 }
    }

    /// Registrations held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes registered.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A registration covering `[addr, addr + len)` for the current call, pinned
    /// until [`RegCache::release`]: a hit, or a new page-aligned registration.
    /// `segment` names the registered segment the range lies in (None: plain
    /// memory). Returns the entry's id and its handle.
    pub fn acquire<R: Registrar<Mr = M>>(
        &mut self,
        reg: &mut R,
        addr: usize,
        len: usize,
        segment: Option<&str>,
    ) -> Result<(u64, &M), String> {
        let end = addr.checked_add(len.max(1)).ok_or_else(|| format!("range at {addr:#x} of {len} bytes wraps"))?;
        self.clock += 1;
        let hit = self
            .entries
            .iter()
            .position(|e| !e.stale && e.start <= addr && end <= e.end && e.segment.as_deref() == segment);
        let i = match hit {
            Some(i) => i,
            None => {
                let start = addr & !(PAGE - 1);
                let stop = end.checked_next_multiple_of(PAGE).ok_or_else(|| format!("range at {addr:#x} wraps"))?;
                self.make_room(reg, stop - start);
                let mr = reg.register(start, stop - start)?;
                self.next_id += 1;
                self.bytes += stop - start;
                self.entries.push(Entry {
                    id: self.next_id,
                    start,
                    end: stop,
                    mr,
                    segment: segment.map(str::to_owned),
                    pins: 0,
                    last_use: 0,
                    stale: false,
                });
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[i];
        e.pins += 1;
        e.last_use = self.clock;
        Ok((e.id, &e.mr))
    }

    /// The pinned registration covering `[addr, addr + len)`, if any.
    pub fn find(&self, addr: usize, len: usize) -> Option<&M> {
        let end = addr.checked_add(len)?;
        self.entries.iter().find(|e| !e.stale && e.pins > 0 && e.start <= addr && end <= e.end).map(|e| &e.mr)
    }

    /// Unpin entry `id` once (a request of the current call is done with it).
    pub fn release<R: Registrar<Mr = M>>(&mut self, reg: &mut R, id: u64) {
        if let Some(i) = self.entries.iter().position(|e| e.id == id) {
            let e = &mut self.entries[i];
            e.pins = e.pins.saturating_sub(1);
            if e.pins == 0 && e.stale {
                self.drop_at(reg, i);
            }
        }
    }

    /// The call ended: registrations of plain memory go (those still pinned by a
    /// request in flight go when released), and so do those of segments that are
    /// no longer registered under the same name (`segment_of` answers for a range).
    pub fn end_call<R: Registrar<Mr = M>>(&mut self, reg: &mut R, segment_of: impl Fn(usize, usize) -> Option<String>) {
        let mut i = 0;
        while i < self.entries.len() {
            let e = &mut self.entries[i];
            let keep = e.segment.as_ref().is_some_and(|s| segment_of(e.start, e.end - e.start).as_ref() == Some(s));
            if !keep {
                e.stale = true;
                if e.pins == 0 {
                    self.drop_at(reg, i);
                    continue;
                }
            }
            i += 1;
        }
    }

    /// Drop every registration (the channel closes).
    pub fn clear<R: Registrar<Mr = M>>(&mut self, reg: &mut R) {
        while !self.entries.is_empty() {
            self.drop_at(reg, self.entries.len() - 1);
        }
    }

    fn drop_at<R: Registrar<Mr = M>>(&mut self, reg: &mut R, i: usize) {
        let e = self.entries.swap_remove(i);
        self.bytes -= e.end - e.start;
        reg.deregister(e.mr);
    }

    /// Evict unpinned entries, least recently used first, until `more` bytes and
    /// one more entry fit (or nothing unpinned is left).
    fn make_room<R: Registrar<Mr = M>>(&mut self, reg: &mut R, more: usize) {
        while self.entries.len() + 1 > self.max_entries || self.bytes + more > self.max_bytes {
            let victim = self.entries.iter().enumerate().filter(|(_, e)| e.pins == 0).min_by_key(|(_, e)| e.last_use);
            match victim {
                Some((i, _)) => self.drop_at(reg, i),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Hands out increasing handles and records which are live.
    #[derive(Default)]
    struct Fake {
        next: u32,
        live: BTreeSet<(u32, usize, usize)>,
    }

    impl Registrar for Fake {
        type Mr = (u32, usize, usize);
        fn register(&mut self, addr: usize, len: usize) -> Result<Self::Mr, String> {
            if !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
                return Err("unaligned".into());
            }
            self.next += 1;
            self.live.insert((self.next, addr, len));
            Ok((self.next, addr, len))
        }
        fn deregister(&mut self, mr: Self::Mr) {
            assert!(self.live.remove(&mr), "deregistered twice: {mr:?}");
        }
    }

    #[test]
    fn hits_reuse_a_page_aligned_registration_within_a_call() {
        let (mut f, mut c) = (Fake::default(), RegCache::new(8, 1 << 30));
        let (id, mr) = c.acquire(&mut f, 0x10010, 100, None).unwrap();
        assert_eq!(*mr, (1, 0x10000, PAGE));
        let (id2, mr2) = c.acquire(&mut f, 0x10100, 200, None).unwrap();
        assert_eq!((id2, mr2.0), (id, 1), "a range inside the pages is a hit");
        assert_eq!(c.find(0x10020, 10).map(|m| m.0), Some(1));
        assert!(c.find(0x10ff0, 0x20).is_none(), "a range past the registration is not covered");
        let (_, mr3) = c.acquire(&mut f, 0x10ff0, 0x20, None).unwrap();
        assert_eq!(*mr3, (2, 0x10000, 2 * PAGE));
        assert!(c.acquire(&mut f, usize::MAX - 3, 10, None).is_err());
    }

    #[test]
    fn plain_memory_goes_at_the_end_of_the_call_and_live_segments_stay() {
        let (mut f, mut c) = (Fake::default(), RegCache::new(8, 1 << 30));
        let (a, _) = c.acquire(&mut f, 0x20000, 10, None).unwrap();
        let (b, _) = c.acquire(&mut f, 0x40000, 10, Some("seg-1")).unwrap();
        let (p, _) = c.acquire(&mut f, 0x60000, 10, None).unwrap();
        c.release(&mut f, a);
        c.release(&mut f, b);
        // `p` is still pinned (a write in flight): it survives the call's end, unfindable.
        let live = |_: usize, _: usize| Some("seg-1".to_string());
        c.end_call(&mut f, live);
        assert_eq!(c.len(), 2);
        assert!(c.find(0x60000, 10).is_none(), "a stale entry is never found again");
        c.release(&mut f, p);
        assert_eq!(c.len(), 1);
        assert_eq!(f.live.len(), 1);
        // The segment entry is a hit in the next call while the segment lives...
        let (b2, mr) = c.acquire(&mut f, 0x40004, 4, Some("seg-1")).unwrap();
        assert_eq!((b2, mr.0), (b, 2));
        c.release(&mut f, b2);
        // ...and goes once the segment is gone (its addresses may be reused).
        c.end_call(&mut f, |_, _| None);
        assert!(c.is_empty() && f.live.is_empty() && c.bytes() == 0);
    }

    #[test]
    fn the_least_recently_used_unpinned_entry_is_evicted_at_the_bounds() {
        let (mut f, mut c) = (Fake::default(), RegCache::new(2, 1 << 30));
        let (a, _) = c.acquire(&mut f, 0x1000, 8, Some("s")).unwrap();
        let (b, _) = c.acquire(&mut f, 0x3000, 8, Some("s")).unwrap();
        c.release(&mut f, a);
        c.release(&mut f, b);
        c.acquire(&mut f, 0x1000, 8, Some("s")).unwrap(); // a used again, now pinned
        c.acquire(&mut f, 0x5000, 8, Some("s")).unwrap();
        assert_eq!(c.len(), 2);
        assert!(f.live.iter().all(|m| m.1 != 0x3000), "b (unpinned, least recent) was evicted");
        // Everything pinned: the bound gives way rather than fail.
        c.acquire(&mut f, 0x7000, 8, Some("s")).unwrap();
        assert_eq!(c.len(), 3);
        let (mut f, mut c) = (Fake::default(), RegCache::new(100, 2 * PAGE));
        let (x, _) = c.acquire(&mut f, 0x1000, 8, None).unwrap();
        c.release(&mut f, x);
        c.acquire(&mut f, 0x8000, PAGE + 1, None).unwrap();
        assert_eq!((c.len(), c.bytes()), (1, 2 * PAGE), "the byte bound evicts too");
        c.clear(&mut f);
        assert!(f.live.is_empty());
    }
}
