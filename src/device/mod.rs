//! Device memory under the collectives: what the executor needs of an accelerator.
//!
//! A [`Device`] is one stream of work on one accelerator: copies between host and
//! device memory, copies within the device, and reductions, all enqueued in order
//! and completed asynchronously. [`Device::record`] hands out a [`Ticket`] for the
//! work enqueued so far, and [`Device::is_complete`] polls it, so the executor can
//! keep every peer's transfers moving while the device works (no call blocks on the
//! device except [`Device::synchronize`]).
//!
//! Collectives on device buffers run the ordinary schedules: the executor wraps each
//! peer's channel in a staged channel (inside the executor),
//! which stages device regions through host buffers of the device (pinned memory
//! for CUDA) piece by piece, completes receive-reduces with a device reduction as
//! each piece lands, and releases forwards piece by piece; local steps of the
//! schedule become device copies and reductions. Because nothing in that path
//! assumes which accelerator it is, it is tested here on [`SimDevice`], a device
//! made of host memory whose stream runs lazily (one operation per poll) and
//! which checks every device address against its allocations.
//!
//! Between ranks whose devices can map each other's memory (equal
//! [`Device::peer_domain`]s; the communicator learns them when it is bound to a
//! device) nothing is staged: the sender [exports](Device::export) its region, the
//! receiver [opens](Device::open_export) it and copies or reduces straight from
//! the peer's memory in one device operation per piece (the executor's peer-copy
//! channel). A call holds what it opened until it ends, then
//! [closes](Device::close_export) it: no mapping outlives the call that read it,
//! and none closes while that call's device work may still read it
//! ([`peer_maps`] holds the bookkeeping both devices share).
//!
//! Implementations: [`SimDevice`] (always), and the CUDA device (`cuda` feature).

pub mod cuda;
mod interface;
pub mod peer_maps;
pub mod sim;

use std::sync::Arc;

use crate::error::Result;

pub use interface::{Device, DevicePtr, Export, PeerProcess, Ticket, MAX_EXPORT_HANDLE};
pub use sim::SimDevice;

/// Device memory owned by braid, freed on drop (after the work that uses it).
pub struct DeviceBuffer {
    device: Arc<dyn Device>,
    ptr: DevicePtr,
    len: usize,
}

impl DeviceBuffer {
    /// Allocate `len` bytes on `device`.
    pub fn new(device: &Arc<dyn Device>, len: usize) -> Result<DeviceBuffer> {
        let ptr = device.alloc_device(len)?;
        Ok(DeviceBuffer { device: device.clone(), ptr, len })
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device it lives on.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Copy `data` (exactly `len()` bytes) into the buffer and wait for the copy.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.check_len(data.len(), "write")?;
        // SAFETY: the range is this buffer's, which `&mut self` holds; `data` outlives
        // the synchronize below, after which the device no longer reads it.
        unsafe { self.device.copy_to_device(self.ptr, data.as_ptr(), data.len())? };
        self.device.synchronize()
    }

    /// Copy the buffer (exactly `out.len()` bytes) out, after all enqueued work.
    pub fn read(&self, out: &mut [u8]) -> Result<()> {
        self.check_len(out.len(), "read")?;
        // SAFETY: `out` is borrowed mutably until the synchronize below, after
        // which the device no longer writes it.
        unsafe { self.device.copy_to_host(out.as_mut_ptr(), self.ptr, out.len())? };
        self.device.synchronize()
    }

    fn check_len(&self, n: usize, what: &str) -> Result<()> {
        if n != self.len {
            return Err(crate::error::Error::InvalidArgument(format!(
                "{what} of {n} bytes on a device buffer of {} bytes ({})",
                self.len,
                self.device.describe()
            )));
        }
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what alloc_device returned, freed only here.
        unsafe { self.device.free_device(self.ptr, self.len) };
    }
}

/// Staging host memory of a device, freed on drop (after the work that uses it).
pub struct HostBuffer {
    device: Arc<dyn Device>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; the device it is freed
// through is Send + Sync.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    /// Allocate `len` bytes of staging memory for `device`.
    pub fn new(device: &Arc<dyn Device>, len: usize) -> Result<HostBuffer> {
        let ptr = device.alloc_host(len)?;
        Ok(HostBuffer { device: device.clone(), ptr, len })
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what alloc_host returned, freed only here.
        unsafe { self.device.free_host(self.ptr, self.len) };
    }
}
