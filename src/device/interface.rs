//! The device interface itself: [`Device`] and the values it passes around
//! (addresses, tickets, exports). Kept apart from `mod.rs`, which re-exports it,
//! so that the implementations ([`SimDevice`](super::SimDevice), the CUDA device)
//! and [`peer_maps`](super::peer_maps) depend on this file and `mod.rs` may name
//! them without a circle.

use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};

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
