//! Page-locked host memory for staging, with a small pool of freed buffers.
//!
//! Pinning is slow (the driver maps and locks every page), and the executor
//! allocates the same few staging sizes for every collective, so freed buffers are
//! kept by size class and handed out again, up to [`POOL_MAX_BYTES`] in all.

use std::collections::HashMap;

use cudarc::driver::result;

/// At most this many bytes of freed pinned memory are kept for reuse.
pub const POOL_MAX_BYTES: usize = 256 << 20;
/// The smallest size class (one page).
const MIN_CLASS: usize = 4096;

/// The size class (bytes actually pinned) for a request of `len` bytes: the next
/// power of two, at least a page. `None` when that overflows.
pub fn class_of(len: usize) -> Option<usize> {
    len.max(MIN_CLASS).checked_next_power_of_two()
}

/// Freed pinned buffers by size class (addresses kept as integers: the pool only
/// stores them, it never dereferences them).
#[derive(Default)]
pub struct PinnedPool {
    free: HashMap<usize, Vec<usize>>,
    pooled_bytes: usize,
}

impl PinnedPool {
    /// A pooled buffer of class `class`, if one is free.
    pub fn take(&mut self, class: usize) -> Option<*mut u8> {
        let p = self.free.get_mut(&class)?.pop()?;
        self.pooled_bytes -= class;
        Some(p as *mut u8)
    }

    /// Keep `ptr` (of class `class`) for reuse; hands it back when the pool is full.
    pub fn give(&mut self, ptr: *mut u8, class: usize) -> Option<*mut u8> {
        if self.pooled_bytes + class > POOL_MAX_BYTES {
            return Some(ptr);
        }
        self.pooled_bytes += class;
        self.free.entry(class).or_default().push(ptr as usize);
        None
    }

    /// Every pooled buffer, emptying the pool.
    pub fn drain(&mut self) -> Vec<*mut u8> {
        self.pooled_bytes = 0;
        self.free.drain().flat_map(|(_, v)| v).map(|p| p as *mut u8).collect()
    }

    /// Bytes currently kept.
    pub fn pooled_bytes(&self) -> usize {
        self.pooled_bytes
    }
}

/// Pin `class` bytes, usable by every context in the process (portable).
///
/// The calling thread must have a CUDA context current.
pub fn pin(class: usize) -> Result<*mut u8, result::DriverError> {
    // SAFETY: a plain allocation call; the memory is returned uninitialised, which
    // is fine for raw bytes that the executor writes before it reads.
    let p = unsafe { result::malloc_host(class, cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE) }?;
    Ok(p as *mut u8)
}

/// Unpin and free memory from [`pin`].
///
/// # Safety
/// `ptr` came from [`pin`], is freed once, and no enqueued work still uses it.
pub unsafe fn unpin(ptr: *mut u8) -> Result<(), result::DriverError> {
    // SAFETY: forwarded from the caller's contract.
    unsafe { result::free_host(ptr as *mut std::ffi::c_void) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_powers_of_two_of_at_least_a_page() {
        assert_eq!(class_of(0), Some(4096));
        assert_eq!(class_of(4096), Some(4096));
        assert_eq!(class_of(4097), Some(8192));
        assert_eq!(class_of((1 << 20) + 1), Some(2 << 20));
        assert_eq!(class_of(usize::MAX), None);
    }

    #[test]
    fn pool_reuses_by_class_and_stops_at_its_cap() {
        let mut pool = PinnedPool::default();
        let a = 0x1000 as *mut u8;
        assert!(pool.give(a, 8192).is_none());
        assert_eq!(pool.take(4096), None);
        assert_eq!(pool.take(8192), Some(a));
        assert_eq!(pool.pooled_bytes(), 0);
        let big = POOL_MAX_BYTES / 2;
        assert!(pool.give(0x2000 as *mut u8, big).is_none());
        assert!(pool.give(0x3000 as *mut u8, big).is_none());
        assert_eq!(pool.give(0x4000 as *mut u8, 4096), Some(0x4000 as *mut u8), "over the cap: handed back");
        let mut all = pool.drain();
        all.sort();
        assert_eq!(all, vec![0x2000 as *mut u8, 0x3000 as *mut u8]);
        assert_eq!(pool.pooled_bytes(), 0);
    }
}
