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
pub mod peer_maps;
pub mod sim;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};

pub use sim::SimDevice;

/// An address in a device's memory (a `CUdeviceptr` for CUDA).
pub type DevicePtr = u64;

/// Marks the work enqueued on a device's stream up to some point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

/// One stream of work on one accelerator.
///
/// Operations are enqueued and run in the order they were enqueued; an operation
/// may still be running (or not yet started) when the call that enqueued it
/// returns. Zero-length operations are allowed and do nothing.
///
/// Every method is callable from several threads (several ranks may share one
/// device, each with its own stream or all on one).
pub trait Device: Send + Sync {
    /// One line naming the device, for errors and logs (e.g. `cuda:0 (H100)`).
    fn describe(&self) -> String;

    /// Allocate `len` bytes of device memory (for the executor's scratch).
    fn alloc_device(&self, len: usize) -> Result<DevicePtr>;

    /// Free memory from [`Device::alloc_device`], after any enqueued work that
    /// uses it has completed (implementations wait for it).
    ///
    /// # Safety
    /// `ptr` and `len` come from one `alloc_device` of this device, freed once.
    unsafe fn free_device(&self, ptr: DevicePtr, len: usize);

    /// Allocate `len` bytes of host memory the device copies to and from quickly
    /// (page-locked for CUDA), for staging.
    fn alloc_host(&self, len: usize) -> Result<*mut u8>;

    /// Free memory from [`Device::alloc_host`], after any enqueued work that uses
    /// it has completed (implementations wait for it).
    ///
    /// # Safety
    /// `ptr` and `len` come from one `alloc_host` of this device, freed once.
    unsafe fn free_host(&self, ptr: *mut u8, len: usize);

    /// Enqueue a copy of `len` bytes from device address `src` to host memory `dst`.
    ///
    /// # Safety
    /// `dst` must stay valid for writes of `len` bytes, and nothing else may access
    /// it, until a ticket recorded after this call completes.
    unsafe fn copy_to_host(&self, dst: *mut u8, src: DevicePtr, len: usize) -> Result<()>;

    /// Enqueue a copy of `len` bytes from host memory `src` to device address `dst`.
    ///
    /// # Safety
    /// `src` must stay valid for reads of `len` bytes, unchanged, until a ticket
    /// recorded after this call completes.
    unsafe fn copy_to_device(&self, dst: DevicePtr, src: *const u8, len: usize) -> Result<()>;

    /// Enqueue a copy of `len` bytes within device memory (the ranges may overlap).
    ///
    /// # Safety
    /// Both ranges must be device memory the caller may use until the copy completes.
    unsafe fn copy_on_device(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()>;

    /// Enqueue `dst = a ⊕ b` over `len` bytes of `dtype` elements, with
    /// `op.combiner()` semantics (`Avg` reduces as `Sum`; see
    /// [`crate::reduce::reduce_into`] for the host's results, which this matches).
    /// `dst` may equal `a` or `b`; otherwise the ranges do not overlap.
    ///
    /// # Safety
    /// The three ranges must be device memory the caller may use until the
    /// reduction completes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn reduce(
        &self,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        len: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()>;

    /// Enqueue the end of a reduction over `world` ranks: for `Avg`, divide every
    /// element by `world` as [`crate::reduce::finalize`] does; other ops do nothing.
    ///
    /// # Safety
    /// The range must be device memory the caller may use until the work completes.
    unsafe fn finalize(&self, buf: DevicePtr, len: usize, dtype: DType, op: ReduceOp, world: usize) -> Result<()>;

    /// A ticket for everything enqueued so far.
    fn record(&self) -> Result<Ticket>;

    /// Whether the work up to `ticket` has completed. Never blocks.
    fn is_complete(&self, ticket: Ticket) -> Result<bool>;

    /// Wait until everything enqueued so far has completed.
    fn synchronize(&self) -> Result<()>;

    /// Which devices can map this device's exported memory: two devices can open
    /// each other's [`Device::export`]s iff both return `Some` of equal strings
    /// (CUDA: GPUs of one host reachable through IPC handles or peer access; the
    /// simulated device: devices of one process). None (the default): no device can.
    fn peer_domain(&self) -> Option<String> {
        None
    }

    /// Describe the allocation holding `[ptr, ptr + len)` for a device of the same
    /// [`Device::peer_domain`]: an opaque handle (at most [`MAX_EXPORT_HANDLE`]
    /// bytes, equal for every range of one allocation) and the offset of `ptr` in
    /// the allocation. The allocation must stay allocated while a peer reads it.
    fn export(&self, ptr: DevicePtr, len: usize) -> Result<Export> {
        let _ = (ptr, len);
        Err(Error::Unsupported(format!("{}: exporting device memory to peers", self.describe())))
    }

    /// Map the allocation a peer exported and return its base address on this
    /// device and its size; every call must be paired with one
    /// [`Device::close_export`] of the same handle once the work reading it has
    /// completed (opening one handle again while it is open returns the same
    /// mapping). `handle` comes from a peer and is untrusted: implementations
    /// validate all of it, and callers check every offset and length against the
    /// returned size before they use the mapping. `peer` is where the
    /// communicator established that the peer runs: only a peer of this process
    /// may name an address of it; a handle's own claim decides nothing.
    fn open_export(&self, handle: &[u8], peer: PeerProcess) -> Result<(DevicePtr, usize)> {
        let _ = (handle, peer);
        Err(Error::Unsupported(format!("{}: opening a peer's device memory", self.describe())))
    }

    /// Give back one [`Device::open_export`] of `handle`; the mapping closes when
    /// no open of it remains. The caller's work reading it has completed (the
    /// executor synchronizes first). A handle this device does not hold open is
    /// ignored.
    fn close_export(&self, handle: &[u8]) {
        let _ = handle;
    }
}

/// Where a peer that reads device memory runs, as the communicator established
/// it when it was bound (never as the peer's own bytes claim).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerProcess {
    /// A thread of this process: its device addresses are addresses here too.
    This,
    /// Another process, or one not proven to be this one: its memory is reached
    /// only through the driver's import of its handle.
    Other,
}

/// Longest handle [`Device::export`] may produce (a CUDA IPC handle is 64 bytes).
pub const MAX_EXPORT_HANDLE: usize = 128;

/// A range of device memory described for a peer (see [`Device::export`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// Names the allocation holding the range (opaque; at most [`MAX_EXPORT_HANDLE`] bytes).
    pub handle: Vec<u8>,
    /// Where the range starts inside that allocation.
    pub offset: usize,
}

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
