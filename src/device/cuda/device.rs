//! [`CudaDevice`]: the [`Device`] trait on one CUDA stream.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys::CUresult::{
    CUDA_ERROR_NO_DEVICE as NO_DEVICE, CUDA_ERROR_STUB_LIBRARY as STUB_LIBRARY,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH as SYSTEM_DRIVER_MISMATCH,
};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::ipc::{self, OpenPeers};
use super::kernels::{self, COMBINERS};
use super::nvrtc;
use super::pinned::{self, PinnedPool};
use crate::device::{Device, DevicePtr, Export, PeerProcess, Ticket, MAX_EXPORT_HANDLE};
use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};

/// Threads per block of every kernel launch.
const BLOCK: u32 = 256;
/// Blocks per launch at most; the kernels' grid-stride loops cover the rest.
const MAX_BLOCKS: u64 = 4096;
/// Recorded tickets kept before `record` retires the completed ones itself.
const MAX_PENDING: usize = 256;
/// An overlapping device copy is split into at most this many ordered pieces;
/// beyond that it goes through a scratch buffer.
const MAX_MEMMOVE_PIECES: usize = 16;

/// A CUDA device, one stream of it: the executor's [`Device`] for collectives on
/// CUDA memory.
///
/// Copies and kernels are enqueued on the stream in call order; tickets are
/// events recorded on it. Built with [`CudaDevice::new`] (a stream of its own) or
/// [`CudaDevice::on_stream`] (the caller's stream, so collectives run after the
/// caller's earlier work on it and before its later work).
pub struct CudaDevice {
    name: String,
    stream: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    tickets: Mutex<Tickets>,
    pool: Mutex<PinnedPool>,
    /// Freed device buffers by size class: the executor allocates the same few
    /// sizes every call, and cuMemAlloc/cuMemFree cost a device-wide synchronization.
    device_pool: Mutex<PinnedPool>,
    /// Which devices may copy from this one's memory (see [`ipc::domain`]).
    domain: Option<String>,
    /// Peers' allocations mapped here, held by the calls reading them.
    peers: Mutex<OpenPeers>,
}

/// The reduction kernels loaded into one context.
struct Kernels {
    _module: Arc<CudaModule>,
    /// Indexed by `dtype as usize * 4 + combiner index`.
    reduce: Vec<CudaFunction>,
    /// Indexed by `dtype as usize`.
    finalize: Vec<CudaFunction>,
}

/// Tickets handed out (numbered from 1) and the events marking them.
#[derive(Default)]
struct Tickets {
    issued: u64,
    completed: u64,
    /// `(ticket, event)` for every ticket in `completed + 1 ..= issued`, in order.
    pending: VecDeque<(u64, CudaEvent)>,
    /// Events from retired tickets, recorded again by later ones.
    spare: Vec<CudaEvent>,
}

impl Tickets {
    /// Every ticket up to `t` has completed (the stream runs in order).
    fn retire_through(&mut self, t: u64) {
        while self.pending.front().is_some_and(|(id, _)| *id <= t) {
            let (_, ev) = self.pending.pop_front().expect("non-empty");
            self.spare.push(ev);
        }
        self.completed = self.completed.max(t);
    }
}

impl CudaDevice {
    /// Device `ordinal` with a new stream of its own. With no driver or no such
    /// device (or no NVRTC when `BRAID_NVRTC=1` asks for it): [`Error::Unsupported`]
    /// naming the cause.
    pub fn new(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let tag = format!("cuda:{ordinal}");
        // SAFETY: only tries to load the driver library; calls nothing in it.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Unsupported(format!(
                "{tag}: no CUDA driver on this machine (libcuda.so could not be loaded)"
            )));
        }
        if nvrtc::requested() {
            nvrtc::nvrtc_available().map_err(|why| Error::Unsupported(format!("{tag}: {why}")))?;
        }
        let count = match catch_unwind(CudaContext::device_count) {
            Ok(Ok(n)) => n,
            // No usable device, the toolkit's stub library, or a driver that does not
            // match its kernel module: the machine lacks CUDA, rather than CUDA failing.
            Ok(Err(e)) if matches!(e.0, NO_DEVICE | STUB_LIBRARY | SYSTEM_DRIVER_MISMATCH) => {
                return Err(Error::Unsupported(format!("{tag}: the CUDA driver sees no usable device ({e})")));
            }
            Ok(Err(e)) => return Err(Error::Device(format!("{tag}: counting devices: {e}"))),
            Err(_) => return Err(incompatible(&tag, "counting devices")),
        };
        if ordinal >= count.max(0) as usize {
            return Err(Error::Unsupported(format!("{tag}: the CUDA driver sees {count} device(s)")));
        }
        let ctx = guarded(&tag, "creating the context", || CudaContext::new(ordinal))?;
        let stream = guarded(&tag, "creating a stream", || ctx.new_stream())?;
        Self::build(stream)
    }

    /// A device working on `stream` (shared with the caller, who keeps using it).
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<Arc<CudaDevice>> {
        let tag = format!("cuda:{}", stream.context().ordinal());
        if nvrtc::requested() {
            nvrtc::nvrtc_available().map_err(|why| Error::Unsupported(format!("{tag}: {why}")))?;
        }
        Self::build(stream)
    }

    fn build(stream: Arc<CudaStream>) -> Result<Arc<CudaDevice>> {
        let ctx = stream.context().clone();
        let tag = format!("cuda:{}", ctx.ordinal());
        let model = guarded(&tag, "reading the device name", || ctx.name())?;
        let name = format!("{tag} ({model})");
        let kernels = kernels_for(&ctx, &name)?;
        let domain = ipc::domain(ctx.cu_device());
        tracing::debug!(device = %name, ?domain, "CUDA device ready");
        Ok(Arc::new(CudaDevice {
            name,
            stream,
            kernels,
            tickets: Mutex::new(Tickets::default()),
            pool: Mutex::new(PinnedPool::default()),
            device_pool: Mutex::new(PinnedPool::default()),
            domain,
            peers: Mutex::new(OpenPeers::default()),
        }))
    }

    /// The stream this device enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Bytes of freed pinned memory kept for reuse.
    pub fn pooled_host_bytes(&self) -> usize {
        lock(&self.pool).pooled_bytes()
    }

    fn err(&self, what: &str, e: DriverError) -> Error {
        Error::Device(format!("{}: {what}: {e}", self.name))
    }

    /// Make this device's context current on the calling thread (raw driver calls
    /// act on the current context).
    fn bind(&self, what: &str) -> Result<()> {
        self.stream.context().bind_to_thread().map_err(|e| self.err(what, e))
    }

    fn check_elements(&self, what: &str, ptrs: &[DevicePtr], len: usize, dtype: DType) -> Result<u64> {
        let size = dtype.size();
        if !len.is_multiple_of(size) {
            return Err(Error::InvalidArgument(format!(
                "{}: {what} of {len} bytes is not a whole number of {dtype} elements",
                self.name
            )));
        }
        // A misaligned element access is a sticky fault that ends the context.
        if let Some(p) = ptrs.iter().find(|&&p| p % size as u64 != 0) {
            return Err(Error::InvalidArgument(format!(
                "{}: {what} at {p:#x} is not aligned to the {dtype} element size {size}",
                self.name
            )));
        }
        Ok((len / size) as u64)
    }

    fn launch_config(n: u64) -> LaunchConfig {
        let blocks = n.div_ceil(u64::from(BLOCK)).clamp(1, MAX_BLOCKS) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
    }

    /// Copy between overlapping device ranges (`dst != src`) without a hazard.
    ///
    /// # Safety
    /// As [`Device::copy_on_device`].
    unsafe fn memmove(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()> {
        let cs = self.stream.cu_stream();
        let gap = dst.abs_diff(src) as usize;
        if len.div_ceil(gap) <= MAX_MEMMOVE_PIECES {
            // Pieces of `gap` bytes never overlap their own destination; taken from
            // the end nearest the destination first, each reads bytes that no
            // earlier piece (earlier on the stream) has overwritten.
            let starts: Vec<usize> = (0..len).step_by(gap).collect();
            let order: Box<dyn Iterator<Item = &usize>> =
                if dst < src { Box::new(starts.iter()) } else { Box::new(starts.iter().rev()) };
            for &off in order {
                let n = gap.min(len - off);
                // SAFETY: both pieces lie inside the caller's ranges; they do not overlap.
                unsafe { result::memcpy_dtod_async(dst + off as u64, src + off as u64, n, cs) }
                    .map_err(|e| self.err("device copy", e))?;
            }
            return Ok(());
        }
        // Many short pieces would cost more than a detour through scratch memory.
        if !self.stream.context().has_async_alloc() {
            // No stream-ordered allocator: a synchronous detour.
            let tmp = self.alloc_device(len)?;
            // SAFETY: `tmp` holds `len` bytes distinct from both ranges; the copies
            // run in stream order, and `free_device` waits for them.
            unsafe {
                let r = result::memcpy_dtod_async(tmp, src, len, cs)
                    .and_then(|()| result::memcpy_dtod_async(dst, tmp, len, cs))
                    .map_err(|e| self.err("device copy", e));
                self.free_device(tmp, len);
                return r;
            }
        }
        // SAFETY: a stream-ordered allocation on our stream, freed on it below after
        // the two copies that use it.
        let tmp = unsafe { result::malloc_async(cs, len) }.map_err(|e| self.err("scratch allocation", e))?;
        // SAFETY: `tmp` holds `len` bytes and is distinct from both ranges; the
        // copies run in stream order, so the second reads what the first wrote, and
        // the stream-ordered free runs after both.
        unsafe {
            let r = result::memcpy_dtod_async(tmp, src, len, cs)
                .and_then(|()| result::memcpy_dtod_async(dst, tmp, len, cs))
                .map_err(|e| self.err("device copy", e));
            result::free_async(tmp, cs).map_err(|e| self.err("scratch free", e))?;
            r
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.bind("closing peers' memory").is_ok() && self.synchronize().is_ok() {
            for p in lock(&self.peers).drain() {
                // SAFETY: opened by OpenPeers, drained (so closed) once, and the
                // stream is idle (synchronized above).
                unsafe { ipc::close(&self.name, p) };
            }
        }
        let device_pooled = lock(&self.device_pool).drain();
        if !device_pooled.is_empty() && self.bind("freeing pooled device memory").is_ok() {
            for p in device_pooled {
                // SAFETY: pooled device buffers came from malloc_sync in alloc_device,
                // were returned after a synchronize, and are released once here.
                if let Err(e) = unsafe { result::free_sync(p as usize as DevicePtr) } {
                    tracing::warn!(device = %self.name, error = %e, "cuMemFree failed");
                }
            }
        }
        let pooled = lock(&self.pool).drain();
        if pooled.is_empty() {
            return;
        }
        if let Err(e) = self.bind("freeing pinned memory") {
            tracing::warn!(error = %e, "leaking pooled pinned memory");
            return;
        }
        for p in pooled {
            // SAFETY: pooled buffers came from `pinned::pin`, were freed into the
            // pool after a synchronize, and are released exactly once here.
            if let Err(e) = unsafe { pinned::unpin(p) } {
                tracing::warn!(device = %self.name, error = %e, "cuMemFreeHost failed");
            }
        }
    }
}

impl Device for CudaDevice {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn peer_domain(&self) -> Option<String> {
        self.domain.clone()
    }

    fn export(&self, ptr: DevicePtr, len: usize) -> Result<Export> {
        self.bind("exporting memory")?;
        ipc::export(&self.name, ptr, len)
    }

    fn open_export(&self, handle: &[u8], peer: PeerProcess) -> Result<(DevicePtr, usize)> {
        if handle.len() > MAX_EXPORT_HANDLE {
            return Err(Error::InvalidArgument(format!("{}: an export handle of {} bytes", self.name, handle.len())));
        }
        self.bind("opening a peer's memory")?;
        lock(&self.peers).open(&self.name, handle, peer)
    }

    fn close_export(&self, handle: &[u8]) {
        let Some(p) = lock(&self.peers).release(handle) else { return };
        // The executor gives a call's mappings back after synchronizing at its end,
        // so this wait finds an idle stream; it stays so that no copy still queued
        // (of this rank or another on this stream) reads a closed mapping.
        match self.bind("closing a peer's memory").and_then(|()| self.synchronize()) {
            // SAFETY: the last hold was just given back (closed once), the stream is
            // idle, and the context is current (bound above).
            Ok(()) => unsafe { ipc::close(&self.name, p) },
            Err(e) => tracing::warn!(device = %self.name, error = %e, "leaving a peer's mapping open"),
        }
    }

    fn alloc_device(&self, len: usize) -> Result<DevicePtr> {
        // Size classes as for pinned memory (powers of two of at least a page), so
        // a freed buffer serves the next call of about the same size.
        let class = pinned::class_of(len)
            .ok_or_else(|| Error::InvalidArgument(format!("{}: {len} bytes of device memory", self.name)))?;
        if let Some(p) = lock(&self.device_pool).take(class) {
            return Ok(p as usize as DevicePtr);
        }
        self.bind("device allocation")?;
        // SAFETY: a plain allocation call; the memory is uninitialised raw bytes.
        unsafe { result::malloc_sync(class) }.map_err(|e| self.err(&format!("allocating {len} device bytes"), e))
    }

    unsafe fn free_device(&self, ptr: DevicePtr, len: usize) {
        if let Err(e) = self.synchronize() {
            tracing::warn!(error = %e, "synchronize before a device free failed");
        }
        let Some(class) = pinned::class_of(len) else { return };
        let Some(back) = lock(&self.device_pool).give(ptr as usize as *mut u8, class) else { return };
        if self.bind("device free").is_ok() {
            // SAFETY: the caller passes an allocation of ours, once; the work that
            // used it has completed (synchronize above).
            if let Err(e) = unsafe { result::free_sync(back as usize as DevicePtr) } {
                tracing::warn!(device = %self.name, len, error = %e, "cuMemFree failed");
            }
        }
    }

    fn alloc_host(&self, len: usize) -> Result<*mut u8> {
        let class = pinned::class_of(len)
            .ok_or_else(|| Error::InvalidArgument(format!("{}: {len} bytes of pinned memory", self.name)))?;
        if let Some(p) = lock(&self.pool).take(class) {
            return Ok(p);
        }
        self.bind("pinned allocation")?;
        pinned::pin(class).map_err(|e| self.err(&format!("pinning {class} host bytes"), e))
    }

    unsafe fn free_host(&self, ptr: *mut u8, len: usize) {
        if let Err(e) = self.synchronize() {
            tracing::warn!(error = %e, "synchronize before a pinned free failed");
        }
        let Some(class) = pinned::class_of(len) else { return };
        let Some(back) = lock(&self.pool).give(ptr, class) else { return };
        if self.bind("pinned free").is_ok() {
            // SAFETY: the caller passes an allocation of ours (from `pin`), once;
            // the work that used it has completed (synchronize above).
            if let Err(e) = unsafe { pinned::unpin(back) } {
                tracing::warn!(device = %self.name, len, error = %e, "cuMemFreeHost failed");
            }
        }
    }

    unsafe fn copy_to_host(&self, dst: *mut u8, src: DevicePtr, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.bind("device-to-host copy")?;
        // SAFETY: the caller keeps `dst` valid and unaliased for `len` bytes until a
        // later ticket completes, and `src` is device memory it may use.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, self.stream.cu_stream()) }
            .result()
            .map_err(|e| self.err(&format!("copying {len} bytes to the host"), e))
    }

    unsafe fn copy_to_device(&self, dst: DevicePtr, src: *const u8, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.bind("host-to-device copy")?;
        // SAFETY: the caller keeps `src` valid and unchanged for `len` bytes until a
        // later ticket completes, and `dst` is device memory it may use.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, self.stream.cu_stream()) }
            .result()
            .map_err(|e| self.err(&format!("copying {len} bytes to the device"), e))
    }

    unsafe fn copy_on_device(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()> {
        if len == 0 || dst == src {
            return Ok(());
        }
        self.bind("device copy")?;
        if dst.abs_diff(src) < len as u64 {
            // SAFETY: forwarded from the caller's contract.
            return unsafe { self.memmove(dst, src, len) };
        }
        // SAFETY: disjoint ranges of device memory the caller may use.
        unsafe { result::memcpy_dtod_async(dst, src, len, self.stream.cu_stream()) }
            .map_err(|e| self.err(&format!("copying {len} bytes on the device"), e))
    }

    unsafe fn reduce(
        &self,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        len: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.check_elements("reduction", &[dst, a, b], len, dtype)?;
        if n == 0 {
            return Ok(());
        }
        let f = &self.kernels.reduce[reduce_index(dtype, op)];
        // SAFETY: the kernel's parameters are (T*, const T*, const T*, unsigned long
        // long): three device addresses (u64) and the count, passed in that order.
        // The ranges hold n aligned elements of device memory the caller may use
        // until the kernel completes; dst equal to a or b is supported.
        unsafe { self.stream.launch_builder(f).arg(&dst).arg(&a).arg(&b).arg(&n).launch(Self::launch_config(n)) }
            .map(|_| ())
            .map_err(|e| self.err(&format!("launching {}", kernels::reduce_kernel_name(dtype, op)), e))
    }

    unsafe fn finalize(&self, buf: DevicePtr, len: usize, dtype: DType, op: ReduceOp, world: usize) -> Result<()> {
        if op != ReduceOp::Avg {
            return self.check_elements("finalisation", &[], len, dtype).map(|_| ());
        }
        let n = self.check_elements("finalisation", &[buf], len, dtype)?;
        let world = i64::try_from(world)
            .ok()
            .filter(|&w| w > 0)
            .ok_or_else(|| Error::InvalidArgument(format!("{}: cannot average over a world of {world}", self.name)))?;
        if n == 0 {
            return Ok(());
        }
        let f = &self.kernels.finalize[dtype as usize];
        // SAFETY: the kernel's parameters are (T*, unsigned long long, long long);
        // the range holds n aligned elements of device memory the caller may use.
        unsafe { self.stream.launch_builder(f).arg(&buf).arg(&n).arg(&world).launch(Self::launch_config(n)) }
            .map(|_| ())
            .map_err(|e| self.err(&format!("launching {}", kernels::finalize_kernel_name(dtype)), e))
    }

    fn record(&self) -> Result<Ticket> {
        self.bind("recording an event")?;
        let mut t = lock(&self.tickets);
        if t.pending.len() >= MAX_PENDING {
            // Tickets nobody polls: retire the completed ones so events are reused.
            let mut done = None;
            for (id, ev) in &t.pending {
                match ev.try_is_complete() {
                    Ok(true) => done = Some(*id),
                    _ => break,
                }
            }
            if let Some(id) = done {
                t.retire_through(id);
            }
        }
        let ev = match t.spare.pop() {
            Some(ev) => ev,
            None => self.stream.context().new_event(None).map_err(|e| self.err("creating an event", e))?,
        };
        ev.record(&self.stream).map_err(|e| self.err("recording an event", e))?;
        t.issued += 1;
        let id = t.issued;
        t.pending.push_back((id, ev));
        Ok(Ticket(id))
    }

    fn is_complete(&self, ticket: Ticket) -> Result<bool> {
        self.bind("polling an event")?;
        let mut t = lock(&self.tickets);
        if ticket.0 <= t.completed {
            return Ok(true);
        }
        if ticket.0 > t.issued {
            return Err(Error::InvalidArgument(format!("{}: ticket {} was never recorded", self.name, ticket.0)));
        }
        let ev = &t.pending[(ticket.0 - t.completed - 1) as usize].1;
        let done = ev.try_is_complete().map_err(|e| self.err("polling an event", e))?;
        if done {
            t.retire_through(ticket.0);
        }
        Ok(done)
    }

    fn synchronize(&self) -> Result<()> {
        // Every ticket issued before the wait starts was recorded on the stream
        // before it, so it is complete when the wait returns. The lock is not held
        // while waiting, so other threads' polls never block on it.
        let issued = lock(&self.tickets).issued;
        self.bind("synchronize")?;
        self.stream.synchronize().map_err(|e| self.err("synchronize", e))?;
        lock(&self.tickets).retire_through(issued);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded state is consistent between statements; a panic elsewhere leaves it usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn reduce_index(dtype: DType, op: ReduceOp) -> usize {
    let o = COMBINERS.iter().position(|&c| c == op.combiner()).expect("every combiner has kernels");
    dtype as usize * COMBINERS.len() + o
}

/// Run a cudarc call that may panic (it does when the driver lacks a symbol),
/// turning both its error and a panic into an error naming the device and step.
fn guarded<T>(tag: &str, what: &str, f: impl FnOnce() -> std::result::Result<T, DriverError>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::Device(format!("{tag}: {what}: {e}"))),
        Err(_) => Err(incompatible(tag, what)),
    }
}

fn incompatible(tag: &str, what: &str) -> Error {
    Error::Unsupported(format!(
        "{tag}: {what}: the CUDA driver library is incompatible with this build (cudarc panicked)"
    ))
}

/// The kernels loaded into `ctx`: the embedded PTX (JIT-compiled by the driver), or
/// with `BRAID_NVRTC=1` compiled by NVRTC once per architecture; loaded once per
/// context. The cache holds the module (and so the context) for the process.
fn kernels_for(ctx: &Arc<CudaContext>, name: &str) -> Result<Arc<Kernels>> {
    static LOADED: OnceLock<Mutex<HashMap<usize, Arc<Kernels>>>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| Mutex::new(HashMap::new()));
    let key = ctx.cu_ctx() as usize;
    let mut map = lock(loaded);
    if let Some(k) = map.get(&key) {
        return Ok(k.clone());
    }
    // PTX is as new as the NVRTC that wrote it; the driver must be too.
    let (ptx, too_new) = if nvrtc::requested() {
        (nvrtc_ptx(ctx, name)?, "use an NVRTC no newer than the driver")
    } else {
        let hint = "update the driver to CUDA 12.9 or later, or set BRAID_NVRTC=1 with an NVRTC no newer than it";
        (nvrtc::EMBEDDED_PTX.to_string(), hint)
    };
    let module = guarded(name, "loading the reduction kernels", || ctx.load_module(Ptx::from_src(ptx))).map_err(
        |e| match e {
            Error::Device(m) if m.contains("UNSUPPORTED_PTX_VERSION") => {
                Error::Unsupported(format!("{m} (the PTX is newer than the CUDA driver: {too_new})"))
            }
            other => other,
        },
    )?;
    let function = |kname: String| guarded(name, &format!("finding {kname}"), || module.load_function(&kname));
    let mut reduce = Vec::with_capacity(DType::ALL.len() * COMBINERS.len());
    let mut finalize = Vec::with_capacity(DType::ALL.len());
    for dtype in DType::ALL {
        debug_assert_eq!(reduce.len(), reduce_index(dtype, ReduceOp::Sum));
        for op in COMBINERS {
            reduce.push(function(kernels::reduce_kernel_name(dtype, op))?);
        }
        finalize.push(function(kernels::finalize_kernel_name(dtype))?);
    }
    let k = Arc::new(Kernels { _module: module, reduce, finalize });
    map.insert(key, k.clone());
    Ok(k)
}

/// The kernels compiled by NVRTC for the device's own virtual architecture; an
/// NVRTC older than the device falls back to its oldest supported target, which
/// newer devices run as well.
fn nvrtc_ptx(ctx: &Arc<CudaContext>, name: &str) -> Result<String> {
    let (major, minor) = guarded(name, "reading the compute capability", || ctx.compute_capability())?;
    match nvrtc::ptx_for(&format!("compute_{major}{minor}")) {
        Err(Error::Device(why)) => {
            tracing::debug!(device = name, %why, "NVRTC does not know this architecture; using compute_70");
            nvrtc::ptx_for(nvrtc::EMBEDDED_ARCH)
        }
        other => other,
    }
}
