//! [`SimDevice`]: a device made of host memory, for running and testing device
//! collectives on machines without an accelerator.
//!
//! Its addresses are not host pointers: allocations sit in a separate, sparse
//! address range, and every operation is checked against them, so a device
//! address used as a host pointer (or a range past an allocation) is an error
//! instead of a silent host access. Its stream is lazy: enqueued work runs one
//! operation per [`Device::is_complete`] poll (all of it on
//! [`Device::synchronize`] or a free), so code that reads a result before its
//! ticket completes sees stale bytes, as it would on a real device.
//!
//! Devices of one process share a [`Device::peer_domain`], so one can
//! [`open_export`](Device::open_export) what another [exported](Device::export):
//! a process-wide registry resolves the handle, and the peer's allocation gets an
//! address of the opening device (as an IPC mapping does), usable by it only from
//! then on. When the owner frees an allocation a peer has mapped, the peer's later
//! use of it is an error: refused when enqueued, or reported by the next poll when
//! the free came between enqueueing and running (a real device's illegal access).
//! A mapping is held per [`Device::open_export`] and removed when the last hold is
//! given back ([`Device::close_export`]): work still queued on it then fails, so a
//! caller that closes too early is caught. An owner that frees an allocation
//! while a peer still holds it open breaks the IPC contract (CUDA leaves it
//! undefined): the owner records it ([`SimDevice::freed_while_mapped`]), so a
//! caller that lets memory go too early is caught as well. Each device belongs to a simulated
//! process (this one's [token](super::peer_maps::process_token) unless made with
//! [`SimDevice::in_process`]), and its handles say so, as a CUDA device's do.
//! [`SimDevice::alloc_unexportable`] makes memory that cannot be exported, as
//! `cudaMallocAsync` and `cuMemCreate` memory cannot be shared through IPC handles.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use super::interface::{Device, DevicePtr, Export, PeerProcess, Ticket};
use super::peer_maps::{check_claim, process_token, Mappings, TOKEN_LEN};
use crate::error::{Error, Result};
use crate::reduce;
use crate::types::{DType, ReduceOp};

/// Where the simulated device memory starts (far from anything mapped in a test).
const BASE: DevicePtr = 0x5e00_0000_0000;
/// Each device's addresses are a range of this size of its own, so an address of
/// one device is never valid on another (they must open each other's exports).
const RANGE_BITS: u32 = 40;
/// Unmapped gap after every allocation, so an overrun is never another allocation.
const GUARD: u64 = 1 << 16;
/// Export handles start with this.
const HANDLE_MAGIC: &[u8; 4] = b"bsim";
/// magic, process token, owner device id, allocation id, allocation length (u64 each).
const HANDLE_LEN: usize = 4 + TOKEN_LEN + 24;

static NEXT_DEVICE: AtomicU64 = AtomicU64::new(1);
static NEXT_ALLOC: AtomicU64 = AtomicU64::new(1);

/// Every exported, not yet freed allocation of the simulated devices of this
/// process, by allocation id: how one device resolves another's handle.
fn exports() -> MutexGuard<'static, HashMap<u64, Weak<Alloc>>> {
    static EXPORTS: OnceLock<Mutex<HashMap<u64, Weak<Alloc>>>> = OnceLock::new();
    EXPORTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// A device made of host memory (see the module docs).
pub struct SimDevice {
    id: u64,
    name: String,
    /// The simulated process this device belongs to.
    process: [u8; TOKEN_LEN],
    state: Mutex<State>,
}

/// What the simulated stream has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Device-to-host copies run.
    pub to_host: u64,
    /// Host-to-device copies run.
    pub to_device: u64,
    /// Device-to-device copies run (from this device's memory or a peer's).
    pub on_device: u64,
    /// Reductions run.
    pub reductions: u64,
    /// Finalisations (averages) run.
    pub finalizations: u64,
    /// Peer allocations mapped by [`Device::open_export`] (cache misses).
    pub peer_maps: u64,
}

/// One allocation. Its bytes live until the owner frees it; a peer that still has
/// it mapped then finds `None` and gets an error instead of freed memory.
struct Alloc {
    id: u64,
    owner: u64,
    /// The owner's address of the first byte.
    base: DevicePtr,
    len: usize,
    /// False for memory no peer can map (see [`SimDevice::alloc_unexportable`]).
    exportable: bool,
    /// Devices holding it mapped now (opened and not yet closed).
    importers: AtomicUsize,
    mem: Mutex<Option<Box<[u8]>>>,
}

impl Alloc {
    fn mem(&self) -> MutexGuard<'_, Option<Box<[u8]>>> {
        self.mem.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self) -> bool {
        self.mem().is_some()
    }

    /// Mark freed (its owner freed it or went away) and withdraw its export.
    fn release(&self) {
        *self.mem() = None;
        exports().remove(&self.id);
    }
}

struct State {
    name: String,
    /// This device's allocations, by address.
    allocs: BTreeMap<DevicePtr, Arc<Alloc>>,
    /// Peers' allocations opened here, by the address they got on this device.
    mapped: BTreeMap<DevicePtr, Arc<Alloc>>,
    /// Open peer allocations by handle, and their holders: the value is the
    /// address in `mapped` to remove when the last hold goes.
    maps: Mappings<DevicePtr>,
    next: DevicePtr,
    /// End of this device's address range.
    end: DevicePtr,
    hosts: HashMap<usize, usize>,
    queue: VecDeque<Op>,
    enqueued: u64,
    done: u64,
    stats: SimStats,
    /// The first operation that failed while running (a peer freed memory this
    /// device had queued work on), reported by the next poll or synchronize.
    fault: Option<Error>,
    /// Frees of this device's allocations that a peer still held open.
    freed_while_mapped: Vec<String>,
}

enum Op {
    ToHost { dst: usize, src: DevicePtr, len: usize },
    ToDevice { dst: DevicePtr, src: usize, len: usize },
    OnDevice { dst: DevicePtr, src: DevicePtr, len: usize },
    Reduce { dst: DevicePtr, a: DevicePtr, b: DevicePtr, len: usize, dtype: DType, op: ReduceOp },
    Finalize { buf: DevicePtr, len: usize, dtype: DType, op: ReduceOp, world: usize },
}

impl SimDevice {
    /// A new simulated device named `name` (as in `describe`), of this process.
    pub fn new(name: &str) -> SimDevice {
        SimDevice::in_process(name, process_token())
    }

    /// A device of the simulated process with token `process`: its handles claim
    /// that process, as those of a device of another process would.
    pub fn in_process(name: &str, process: [u8; TOKEN_LEN]) -> SimDevice {
        let name = format!("sim:{name}");
        let state = State {
            name: name.clone(),
            allocs: BTreeMap::new(),
            mapped: BTreeMap::new(),
            maps: Mappings::default(),
            next: 0,
            end: 0,
            hosts: HashMap::new(),
            queue: VecDeque::new(),
            enqueued: 0,
            done: 0,
            stats: SimStats::default(),
            fault: None,
            freed_while_mapped: Vec::new(),
        };
        let id = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
        let start = BASE + ((id % (1 << 20)) << RANGE_BITS);
        let state = State { next: start, end: start + (1 << RANGE_BITS), ..state };
        SimDevice { id, name, process, state: Mutex::new(state) }
    }

    /// Allocate `len` bytes that [`Device::export`] refuses as unsupported, as
    /// CUDA refuses IPC handles for stream-ordered (`cudaMallocAsync`) and
    /// virtual (`cuMemCreate`) memory, PyTorch's expandable segments among them.
    pub fn alloc_unexportable(&self, len: usize) -> Result<DevicePtr> {
        self.allocate(len, false)
    }

    fn allocate(&self, len: usize, exportable: bool) -> Result<DevicePtr> {
        let mut st = self.lock();
        let p = SimDevice::reserve(&mut st, len)?;
        let id = NEXT_ALLOC.fetch_add(1, Ordering::Relaxed);
        let mem = Mutex::new(Some(vec![0u8; len].into_boxed_slice()));
        let importers = AtomicUsize::new(0);
        st.allocs.insert(p, Arc::new(Alloc { id, owner: self.id, base: p, len, exportable, importers, mem }));
        Ok(p)
    }

    /// Copy `data` to device address `dst`, after everything enqueued so far.
    pub fn upload(&self, dst: DevicePtr, data: &[u8]) -> Result<()> {
        let mut st = self.lock();
        st.drain()?;
        st.write(dst, data)
    }

    /// Copy `out.len()` bytes from device address `src`, after everything enqueued so far.
    pub fn download(&self, src: DevicePtr, out: &mut [u8]) -> Result<()> {
        let mut st = self.lock();
        st.drain()?;
        out.copy_from_slice(&st.read(src, out.len())?);
        Ok(())
    }

    /// Counts of the operations run so far.
    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// Device allocations of this device currently live.
    pub fn live_allocations(&self) -> usize {
        self.lock().allocs.len()
    }

    /// This device's allocations freed while a peer still held them open, one
    /// line each: none where every importer closed before the owner let go.
    pub fn freed_while_mapped(&self) -> Vec<String> {
        self.lock().freed_while_mapped.clone()
    }

    /// Peer allocations this device has mapped whose owners have not freed them.
    pub fn mapped_allocations(&self) -> usize {
        self.lock().mapped.values().filter(|a| a.live()).count()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves plain data behind: usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enqueue(&self, check: &[(DevicePtr, usize)], op: Op) -> Result<()> {
        let mut st = self.lock();
        for &(p, len) in check {
            st.resolve(p, len)?;
        }
        st.queue.push_back(op);
        st.enqueued += 1;
        Ok(())
    }

    fn reserve(st: &mut State, len: usize) -> Result<DevicePtr> {
        reserve_in(&mut st.next, st.end, &st.name, len)
    }
}

/// `len` bytes of addresses from `*next` on (below `end`), and a guard gap.
fn reserve_in(next: &mut DevicePtr, end: DevicePtr, name: &str, len: usize) -> Result<DevicePtr> {
    let p = *next;
    let span = (len as u64).div_ceil(GUARD).max(1) * GUARD + GUARD;
    *next =
        p.checked_add(span).filter(|&n| n <= end).ok_or_else(|| Error::Device(format!("{name}: out of addresses")))?;
    Ok(p)
}

/// The handle naming allocation `a` of device `owner` of the simulated process `process`.
fn encode_handle(process: &[u8; TOKEN_LEN], owner: u64, a: &Alloc) -> Vec<u8> {
    let mut h = Vec::with_capacity(HANDLE_LEN);
    h.extend_from_slice(HANDLE_MAGIC);
    h.extend_from_slice(process);
    h.extend_from_slice(&owner.to_le_bytes());
    h.extend_from_slice(&a.id.to_le_bytes());
    h.extend_from_slice(&(a.len as u64).to_le_bytes());
    h
}

/// A decoded handle; every field came from a peer.
struct SimHandle<'h> {
    process: &'h [u8],
    owner: u64,
    id: u64,
    len: u64,
}

/// Decode an untrusted handle (its process is checked by the caller).
fn decode_handle(h: &[u8]) -> std::result::Result<SimHandle<'_>, String> {
    if h.len() != HANDLE_LEN || &h[..4] != HANDLE_MAGIC {
        return Err(format!("{} bytes that are not a simulated device's export handle", h.len()));
    }
    let t = 4 + TOKEN_LEN;
    let word = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("eight bytes"));
    Ok(SimHandle { process: &h[4..t], owner: word(t), id: word(t + 8), len: word(t + 16) })
}

impl State {
    /// The allocation (own or mapped) holding `[p, p + len)` and the offset of `p` in it.
    fn resolve(&self, p: DevicePtr, len: usize) -> Result<(&Arc<Alloc>, usize)> {
        for map in [&self.allocs, &self.mapped] {
            let Some((&start, a)) = map.range(..=p).next_back() else { continue };
            let off = p - start;
            if off <= a.len as u64 && (off as usize).checked_add(len).is_some_and(|end| end <= a.len) {
                if !a.live() {
                    return Err(Error::Device(format!(
                        "{}: [{p:#x}, +{len}) is in a peer's allocation that its owner has freed",
                        self.name
                    )));
                }
                return Ok((a, off as usize));
            }
        }
        Err(Error::Device(format!("{}: [{p:#x}, +{len}) is not inside any allocation of this device", self.name)))
    }

    fn read(&self, p: DevicePtr, len: usize) -> Result<Vec<u8>> {
        let (a, off) = self.resolve(p, len)?;
        let mem = a.mem();
        let bytes = mem.as_ref().ok_or_else(|| Error::Device(format!("{}: read of freed memory", self.name)))?;
        Ok(bytes[off..off + len].to_vec())
    }

    fn write(&self, p: DevicePtr, data: &[u8]) -> Result<()> {
        let (a, off) = self.resolve(p, data.len())?;
        let mut mem = a.mem();
        let bytes = mem.as_mut().ok_or_else(|| Error::Device(format!("{}: write of freed memory", self.name)))?;
        bytes[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// Run the oldest enqueued operation. Ranges were checked when it was enqueued
    /// and frees of this device's memory drain the queue first, so only a peer's
    /// memory, freed by its owner meanwhile, can fail here: that is recorded as the
    /// device's fault (as a real device reports an illegal access), not skipped.
    fn step(&mut self) -> bool {
        let Some(op) = self.queue.pop_front() else { return false };
        let r = match op {
            Op::ToHost { dst, src, len } => self.read(src, len).map(|data| {
                // SAFETY: the caller of copy_to_host keeps dst valid for `len`
                // bytes until this operation's ticket completes, which is after now.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, len) };
                self.stats.to_host += 1;
            }),
            Op::ToDevice { dst, src, len } => {
                // SAFETY: the caller of copy_to_device keeps src valid and unchanged
                // for `len` bytes until this operation's ticket completes.
                let data = unsafe { std::slice::from_raw_parts(src as *const u8, len) }.to_vec();
                self.stats.to_device += 1;
                self.write(dst, &data)
            }
            Op::OnDevice { dst, src, len } => {
                self.stats.on_device += 1;
                self.read(src, len).and_then(|data| self.write(dst, &data))
            }
            Op::Reduce { dst, a, b, len, dtype, op } => {
                self.stats.reductions += 1;
                self.read(a, len).and_then(|x| {
                    let y = self.read(b, len)?;
                    let mut out = vec![0u8; len];
                    reduce::reduce_into(dtype, op, &mut out, &x, &y)?;
                    self.write(dst, &out)
                })
            }
            Op::Finalize { buf, len, dtype, op, world } => {
                self.stats.finalizations += 1;
                self.read(buf, len).and_then(|mut data| {
                    reduce::finalize(dtype, op, &mut data, world)?;
                    self.write(buf, &data)
                })
            }
        };
        if let Err(e) = r {
            tracing::error!("{}: a device operation failed: {e}", self.name);
            self.fault.get_or_insert(e);
        }
        self.done += 1;
        true
    }

    /// The recorded fault, once.
    fn take_fault(&mut self) -> Result<()> {
        match self.fault.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn drain(&mut self) -> Result<()> {
        while self.step() {}
        self.take_fault()
    }
}

impl Device for SimDevice {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn alloc_device(&self, len: usize) -> Result<DevicePtr> {
        self.allocate(len, true)
    }

    unsafe fn free_device(&self, ptr: DevicePtr, len: usize) {
        let mut st = self.lock();
        // A fault stays recorded for the next poll: a free has no caller to tell.
        while st.step() {}
        let freed = st.allocs.remove(&ptr);
        assert!(freed.as_ref().is_some_and(|a| a.len == len), "{}: free of {ptr:#x} (+{len}) not allocated", self.name);
        if let Some(a) = freed {
            let importers = a.importers.load(Ordering::SeqCst);
            if importers > 0 {
                let what = format!(
                    "{}: allocation {} ({ptr:#x}, +{len}) freed while {importers} peer device(s) held it open",
                    self.name, a.id
                );
                tracing::error!("{what}");
                st.freed_while_mapped.push(what);
            }
            a.release();
        }
    }

    fn alloc_host(&self, len: usize) -> Result<*mut u8> {
        // At least one byte, so every allocation has its own address (empty boxes
        // all share one dangling pointer).
        let p = Box::into_raw(vec![0u8; len.max(1)].into_boxed_slice()) as *mut u8;
        self.lock().hosts.insert(p as usize, len);
        Ok(p)
    }

    unsafe fn free_host(&self, ptr: *mut u8, len: usize) {
        let mut st = self.lock();
        while st.step() {}
        assert_eq!(st.hosts.remove(&(ptr as usize)), Some(len), "{}: free of host buffer not allocated", self.name);
        // SAFETY: ptr came from Box::into_raw of a boxed slice of `len.max(1)` bytes
        // in alloc_host, and the map entry just removed proves it is freed only once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len.max(1))) });
    }

    unsafe fn copy_to_host(&self, dst: *mut u8, src: DevicePtr, len: usize) -> Result<()> {
        self.enqueue(&[(src, len)], Op::ToHost { dst: dst as usize, src, len })
    }

    unsafe fn copy_to_device(&self, dst: DevicePtr, src: *const u8, len: usize) -> Result<()> {
        self.enqueue(&[(dst, len)], Op::ToDevice { dst, src: src as usize, len })
    }

    unsafe fn copy_on_device(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()> {
        self.enqueue(&[(dst, len), (src, len)], Op::OnDevice { dst, src, len })
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
        if !len.is_multiple_of(dtype.size()) {
            return Err(Error::InvalidArgument(format!("{}: reduce of {len} bytes of {dtype}", self.name)));
        }
        self.enqueue(&[(dst, len), (a, len), (b, len)], Op::Reduce { dst, a, b, len, dtype, op })
    }

    unsafe fn finalize(&self, buf: DevicePtr, len: usize, dtype: DType, op: ReduceOp, world: usize) -> Result<()> {
        if !len.is_multiple_of(dtype.size()) || world == 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: finalize of {len} bytes of {dtype} over {world}",
                self.name
            )));
        }
        self.enqueue(&[(buf, len)], Op::Finalize { buf, len, dtype, op, world })
    }

    fn record(&self) -> Result<Ticket> {
        Ok(Ticket(self.lock().enqueued))
    }

    fn is_complete(&self, ticket: Ticket) -> Result<bool> {
        let mut st = self.lock();
        if st.done < ticket.0 {
            st.step();
        }
        st.take_fault()?;
        Ok(st.done >= ticket.0)
    }

    fn synchronize(&self) -> Result<()> {
        self.lock().drain()
    }

    fn peer_domain(&self) -> Option<String> {
        Some(format!("sim-process:{}", std::process::id()))
    }

    fn export(&self, ptr: DevicePtr, len: usize) -> Result<Export> {
        let st = self.lock();
        // Only this device's own memory: a peer's mapping is not re-exported.
        let own = st.allocs.range(..=ptr).next_back().filter(|(&start, a)| {
            let off = ptr - start;
            off <= a.len as u64 && (off as usize).checked_add(len).is_some_and(|end| end <= a.len)
        });
        let Some((&start, a)) = own else {
            return Err(Error::InvalidArgument(format!(
                "{}: export of [{ptr:#x}, +{len}), which is not inside an allocation of this device",
                self.name
            )));
        };
        if !a.exportable {
            return Err(Error::Unsupported(format!(
                "{}: [{ptr:#x}, +{len}) is in memory that cannot be shared with peers (allocated unexportable)",
                self.name
            )));
        }
        exports().entry(a.id).or_insert_with(|| Arc::downgrade(a));
        Ok(Export { handle: encode_handle(&self.process, self.id, a), offset: (ptr - start) as usize })
    }

    fn open_export(&self, handle: &[u8], peer: PeerProcess) -> Result<(DevicePtr, usize)> {
        let refuse = |why: String| Error::Device(format!("{}: cannot open a peer's export: {why}", self.name));
        let h = decode_handle(handle).map_err(refuse)?;
        check_claim(peer, h.process, &self.process).map_err(refuse)?;
        let (owner, id, len) = (h.owner, h.id, h.len);
        // Looked up before this device's lock is taken: frees take a device's lock,
        // then the registry's, never the other way round.
        let alloc = exports().get(&id).and_then(Weak::upgrade);
        let alloc = alloc.ok_or_else(|| refuse(format!("allocation {id} is not exported by a live allocation")))?;
        if alloc.owner != owner || alloc.len as u64 != len {
            return Err(refuse(format!("allocation {id} is not the one of device {owner} and {len} bytes it names")));
        }
        if !alloc.live() {
            return Err(refuse(format!("allocation {id} was freed by its owner")));
        }
        if owner == self.id {
            // This device's own memory, by its own address: only a rank of this
            // process can name it (IPC cannot open a process's own handles), and
            // the allocation was checked live just above, on every open.
            if peer == PeerProcess::Other {
                return Err(refuse(format!(
                    "allocation {id} is this device's own, named by a peer of another process"
                )));
            }
            return Ok((alloc.base, alloc.len));
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        let (next, end, name, mapped, stats) = (&mut st.next, st.end, &st.name, &mut st.mapped, &mut st.stats);
        st.maps.acquire(name, handle, || {
            let p = reserve_in(next, end, name, alloc.len)?;
            mapped.insert(p, alloc.clone());
            alloc.importers.fetch_add(1, Ordering::SeqCst);
            stats.peer_maps += 1;
            Ok((p, alloc.len, p))
        })
    }

    fn close_export(&self, handle: &[u8]) {
        let mut st = self.lock();
        if let Some(a) = st.maps.release(handle).and_then(|p| st.mapped.remove(&p)) {
            a.importers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for a in st.allocs.values() {
            a.release();
        }
        for a in st.mapped.values() {
            a.importers.fetch_sub(1, Ordering::SeqCst);
        }
        for (&p, &len) in &st.hosts {
            // SAFETY: every entry is a live Box<[u8]> of `len.max(1)` bytes from
            // alloc_host that no HostBuffer frees any more (one holds the device alive).
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p as *mut u8, len.max(1))) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_lazily_in_order_and_tickets_say_when() {
        let d = SimDevice::new("t");
        let a = d.alloc_device(16).unwrap();
        d.upload(a, &[1u8; 16]).unwrap();
        let mut host = [0u8; 16];
        // SAFETY: `host` outlives the synchronize below.
        unsafe { d.copy_to_host(host.as_mut_ptr(), a, 16).unwrap() };
        let t = d.record().unwrap();
        assert_eq!(host, [0u8; 16], "nothing runs before it is polled");
        assert!(d.is_complete(t).unwrap());
        assert_eq!(host, [1u8; 16]);
        let b = d.alloc_device(16).unwrap();
        // SAFETY: device ranges of live allocations.
        unsafe {
            d.copy_on_device(b, a, 16).unwrap();
            d.reduce(b, b, a, 16, DType::I32, ReduceOp::Sum).unwrap();
        }
        let t = d.record().unwrap();
        assert!(!d.is_complete(t).unwrap(), "two operations need two polls");
        assert!(d.is_complete(t).unwrap());
        d.download(b, &mut host).unwrap();
        assert_eq!(host, [2u8; 16], "0x01010101 + 0x01010101 in every i32");
        assert_eq!(d.stats().reductions, 1);
    }

    #[test]
    fn addresses_outside_allocations_are_refused_when_enqueued() {
        let d = SimDevice::new("t");
        let a = d.alloc_device(8).unwrap();
        let mut host = [0u8; 16];
        // SAFETY: refused before anything is enqueued.
        let e = unsafe { d.copy_to_host(host.as_mut_ptr(), a, 16) }.unwrap_err().to_string();
        assert!(e.contains("not inside any allocation"), "{e}");
        let e = d.upload(host.as_ptr() as u64, &[0; 4]).unwrap_err().to_string();
        assert!(e.contains("not inside any allocation"), "{e}");
        // SAFETY: as above.
        assert!(unsafe { d.reduce(a, a, a + 4, 8, DType::I32, ReduceOp::Sum) }.is_err());
    }

    #[test]
    fn a_peer_maps_an_export_once_and_reads_and_reduces_from_it() {
        let (a, b) = (SimDevice::new("a"), SimDevice::new("b"));
        assert_eq!(a.peer_domain(), b.peer_domain());
        let pa = a.alloc_device(64).unwrap();
        a.upload(pa, &[3u8; 64]).unwrap();
        let ex = a.export(pa + 16, 32).unwrap();
        assert_eq!(ex.offset, 16);
        assert_eq!(ex.handle, a.export(pa, 64).unwrap().handle, "one handle per allocation");
        assert!(ex.handle.len() <= crate::device::MAX_EXPORT_HANDLE);
        let pb = b.alloc_device(32).unwrap();
        // SAFETY: refused before anything is enqueued: b has not opened a's memory.
        let e = unsafe { b.copy_on_device(pb, pa, 32) }.unwrap_err().to_string();
        assert!(e.contains("not inside any allocation"), "{e}");
        let (base, size) = b.open_export(&ex.handle, PeerProcess::This).unwrap();
        assert_eq!(size, 64);
        assert_eq!(b.open_export(&ex.handle, PeerProcess::This).unwrap(), (base, size), "cached");
        assert_eq!((b.stats().peer_maps, b.mapped_allocations()), (1, 1));
        assert_eq!(a.open_export(&ex.handle, PeerProcess::This).unwrap(), (pa, 64), "the owner gets its own address");
        b.upload(pb, &[1u8; 32]).unwrap();
        // SAFETY: ranges of live allocations (b's own and a's mapping).
        unsafe { b.reduce(pb, pb, base + 16, 32, DType::U8, ReduceOp::Sum).unwrap() };
        let mut out = [0u8; 32];
        b.download(pb, &mut out).unwrap();
        assert_eq!(out, [4u8; 32]);
        // SAFETY: past the mapping's size: refused when enqueued.
        assert!(unsafe { b.copy_on_device(pb, base + 48, 32) }.is_err());
    }

    #[test]
    fn untrusted_handles_are_refused() {
        let (a, b) = (SimDevice::new("a"), SimDevice::new("b"));
        let pa = a.alloc_device(8).unwrap();
        let h = a.export(pa, 8).unwrap().handle;
        for bad in [vec![], vec![0u8; 32], h[..31].to_vec()] {
            assert!(b.open_export(&bad, PeerProcess::This).is_err(), "{bad:?}");
        }
        let mut other_process = h.clone();
        other_process[4] ^= 1;
        assert!(b.open_export(&other_process, PeerProcess::This).unwrap_err().to_string().contains("another process"));
        let mut longer = h.clone();
        longer[HANDLE_LEN - 8] = 9;
        assert!(b.open_export(&longer, PeerProcess::This).unwrap_err().to_string().contains("names"));
        let mut unknown = h.clone();
        unknown[HANDLE_LEN - 16..HANDLE_LEN - 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(b.open_export(&unknown, PeerProcess::This).unwrap_err().to_string().contains("not exported"));
        // SAFETY: export refuses what is not a's own allocation.
        assert!(a.export(pa + 4, 8).is_err());
        let (mapped, _) = b.open_export(&h, PeerProcess::This).unwrap();
        assert!(b.export(mapped, 8).is_err(), "a mapping is not re-exported");
    }

    #[test]
    fn freeing_exported_memory_makes_a_peer_access_an_error_not_a_crash() {
        let (a, b) = (SimDevice::new("a"), SimDevice::new("b"));
        let pa = a.alloc_device(16).unwrap();
        let h = a.export(pa, 16).unwrap().handle;
        let (mapped, _) = b.open_export(&h, PeerProcess::This).unwrap();
        let pb = b.alloc_device(16).unwrap();
        // SAFETY: live ranges when enqueued; the free below comes before it runs.
        unsafe { b.copy_on_device(pb, mapped, 16).unwrap() };
        let t = b.record().unwrap();
        // SAFETY: pa is a's allocation of 16 bytes, freed once.
        unsafe { a.free_device(pa, 16) };
        let v = a.freed_while_mapped();
        assert!(v.len() == 1 && v[0].contains("freed while 1 peer"), "the owner records the broken contract: {v:?}");
        let e = b.is_complete(t).unwrap_err().to_string();
        assert!(e.contains("freed"), "{e}");
        assert!(b.is_complete(t).unwrap(), "reported once; the device goes on");
        // SAFETY: refused when enqueued.
        let e = unsafe { b.copy_on_device(pb, mapped, 16) }.unwrap_err().to_string();
        assert!(e.contains("freed"), "{e}");
        assert!(b.open_export(&h, PeerProcess::This).unwrap_err().to_string().contains("not exported"));
        assert_eq!(b.mapped_allocations(), 0);
        assert_eq!(a.live_allocations(), 0);
    }

    /// Mappings are held per open and removed at the last close; work still
    /// queued on a closed mapping fails (the caller closed too early), and a
    /// device's own memory is reachable by address only for a peer of its process.
    #[test]
    fn mappings_close_with_their_last_hold_and_own_memory_needs_this_process() {
        let (a, b) = (SimDevice::new("a"), SimDevice::new("b"));
        let pa = a.alloc_device(16).unwrap();
        let h = a.export(pa, 16).unwrap().handle;
        let (m1, _) = b.open_export(&h, PeerProcess::This).unwrap();
        assert_eq!(b.open_export(&h, PeerProcess::This).unwrap().0, m1, "one mapping, two holds");
        b.close_export(&h);
        assert_eq!(b.mapped_allocations(), 1, "still held");
        let pb = b.alloc_device(16).unwrap();
        // SAFETY: live ranges when enqueued; the close below comes before it runs.
        unsafe { b.copy_on_device(pb, m1, 16).unwrap() };
        let t = b.record().unwrap();
        b.close_export(&h);
        assert_eq!(b.mapped_allocations(), 0);
        assert!(b.is_complete(t).unwrap_err().to_string().contains("not inside any allocation"));
        // A device of another (simulated) process imports; a handle claiming the
        // importer's own process from it is refused.
        let far = SimDevice::in_process("far", [0x5a; TOKEN_LEN]);
        let (m2, size) = far.open_export(&h, PeerProcess::Other).unwrap();
        assert_eq!((size, far.stats().peer_maps), (16, 1));
        far.close_export(&h);
        let e = b.open_export(&h, PeerProcess::Other).unwrap_err().to_string();
        assert!(e.contains("claiming this process"), "{e}");
        let own = b.export(pb, 16).unwrap().handle;
        assert_eq!(b.open_export(&own, PeerProcess::This).unwrap(), (pb, 16), "own memory, same process");
        let mut foreign = own.clone();
        foreign[4..4 + TOKEN_LEN].copy_from_slice(&[0x5a; TOKEN_LEN]);
        let e = b.open_export(&foreign, PeerProcess::Other).unwrap_err().to_string();
        assert!(e.contains("this device's own"), "{e}");
        let _ = m2;
        // SAFETY: a's allocation of 16 bytes, freed once.
        unsafe { a.free_device(pa, 16) };
        assert!(a.freed_while_mapped().is_empty(), "every importer had closed it: {:?}", a.freed_while_mapped());
    }

    #[test]
    fn unexportable_memory_is_refused_as_unsupported() {
        let d = SimDevice::new("u");
        let p = d.alloc_unexportable(8).unwrap();
        assert!(matches!(d.export(p, 8), Err(Error::Unsupported(_))));
        d.upload(p, &[1; 8]).unwrap();
    }

    #[test]
    fn frees_wait_for_the_work_that_uses_the_memory() {
        let d = SimDevice::new("t");
        let a = d.alloc_device(4).unwrap();
        d.upload(a, &7i32.to_le_bytes()).unwrap();
        let h = d.alloc_host(4).unwrap();
        // SAFETY: h is freed only after the free below drains the queue.
        unsafe {
            d.copy_to_host(h, a, 4).unwrap();
            d.free_device(a, 4);
            assert_eq!(std::slice::from_raw_parts(h, 4), 7i32.to_le_bytes());
            d.free_host(h, 4);
        }
        assert_eq!(d.live_allocations(), 0);
    }
}
