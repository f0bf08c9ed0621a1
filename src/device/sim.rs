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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use super::{Device, DevicePtr, Ticket};
use crate::error::{Error, Result};
use crate::reduce;
use crate::types::{DType, ReduceOp};

/// Where the simulated device memory starts (far from anything mapped in a test).
const BASE: DevicePtr = 0x5e00_0000_0000;
/// Unmapped gap after every allocation, so an overrun is never another allocation.
const GUARD: u64 = 1 << 16;

/// A device made of host memory (see the module docs).
pub struct SimDevice {
    name: String,
    state: Mutex<State>,
}

/// What the simulated stream has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Device-to-host copies run.
    pub to_host: u64,
    /// Host-to-device copies run.
    pub to_device: u64,
    /// Device-to-device copies run.
    pub on_device: u64,
    /// Reductions run.
    pub reductions: u64,
    /// Finalisations (averages) run.
    pub finalizations: u64,
}

#[derive(Default)]
struct State {
    allocs: BTreeMap<DevicePtr, Box<[u8]>>,
    next: DevicePtr,
    hosts: HashMap<usize, usize>,
    queue: VecDeque<Op>,
    enqueued: u64,
    done: u64,
    stats: SimStats,
}

enum Op {
    ToHost { dst: usize, src: DevicePtr, len: usize },
    ToDevice { dst: DevicePtr, src: usize, len: usize },
    OnDevice { dst: DevicePtr, src: DevicePtr, len: usize },
    Reduce { dst: DevicePtr, a: DevicePtr, b: DevicePtr, len: usize, dtype: DType, op: ReduceOp },
    Finalize { buf: DevicePtr, len: usize, dtype: DType, op: ReduceOp, world: usize },
}

impl SimDevice {
    /// A new simulated device named `name` (as in `describe`).
    pub fn new(name: &str) -> SimDevice {
        SimDevice { name: format!("sim:{name}"), state: Mutex::new(State { next: BASE, ..State::default() }) }
    }

    /// Copy `data` to device address `dst`, after everything enqueued so far.
    pub fn upload(&self, dst: DevicePtr, data: &[u8]) -> Result<()> {
        let mut st = self.lock();
        st.drain();
        let (start, off) = st.resolve(&self.name, dst, data.len())?;
        st.allocs.get_mut(&start).expect("resolved")[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// Copy `out.len()` bytes from device address `src`, after everything enqueued so far.
    pub fn download(&self, src: DevicePtr, out: &mut [u8]) -> Result<()> {
        let mut st = self.lock();
        st.drain();
        out.copy_from_slice(&st.read(&self.name, src, out.len())?);
        Ok(())
    }

    /// Counts of the operations run so far.
    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// Device allocations currently live.
    pub fn live_allocations(&self) -> usize {
        self.lock().allocs.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves plain data behind: usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enqueue(&self, check: &[(DevicePtr, usize)], op: Op) -> Result<()> {
        let mut st = self.lock();
        for &(p, len) in check {
            st.resolve(&self.name, p, len)?;
        }
        st.queue.push_back(op);
        st.enqueued += 1;
        Ok(())
    }
}

impl State {
    /// The allocation holding `[p, p + len)` and the offset of `p` in it.
    fn resolve(&self, name: &str, p: DevicePtr, len: usize) -> Result<(DevicePtr, usize)> {
        let found = self.allocs.range(..=p).next_back();
        match found {
            Some((&start, mem)) if p - start <= mem.len() as u64 && (p - start) as usize + len <= mem.len() => {
                Ok((start, (p - start) as usize))
            }
            _ => Err(Error::Device(format!("{name}: [{p:#x}, +{len}) is not inside any allocation of this device"))),
        }
    }

    fn read(&self, name: &str, p: DevicePtr, len: usize) -> Result<Vec<u8>> {
        let (start, off) = self.resolve(name, p, len)?;
        Ok(self.allocs[&start][off..off + len].to_vec())
    }

    fn write(&mut self, name: &str, p: DevicePtr, data: &[u8]) -> Result<()> {
        let (start, off) = self.resolve(name, p, data.len())?;
        self.allocs.get_mut(&start).expect("resolved")[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// Run the oldest enqueued operation. Ranges were checked when it was enqueued
    /// and frees drain the queue first, so they still resolve.
    fn step(&mut self) -> bool {
        let Some(op) = self.queue.pop_front() else { return false };
        let name = "sim";
        let r = match op {
            Op::ToHost { dst, src, len } => self.read(name, src, len).map(|data| {
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
                self.write(name, dst, &data)
            }
            Op::OnDevice { dst, src, len } => {
                self.stats.on_device += 1;
                self.read(name, src, len).and_then(|data| self.write(name, dst, &data))
            }
            Op::Reduce { dst, a, b, len, dtype, op } => {
                self.stats.reductions += 1;
                let (x, y) = match (self.read(name, a, len), self.read(name, b, len)) {
                    (Ok(x), Ok(y)) => (x, y),
                    (Err(e), _) | (_, Err(e)) => return self.fail(e),
                };
                let mut out = vec![0u8; len];
                reduce::reduce_into(dtype, op, &mut out, &x, &y).and_then(|()| self.write(name, dst, &out))
            }
            Op::Finalize { buf, len, dtype, op, world } => {
                self.stats.finalizations += 1;
                self.read(name, buf, len).and_then(|mut data| {
                    reduce::finalize(dtype, op, &mut data, world)?;
                    self.write(name, buf, &data)
                })
            }
        };
        if let Err(e) = r {
            return self.fail(e);
        }
        self.done += 1;
        true
    }

    fn fail(&mut self, e: Error) -> bool {
        // Enqueue-time checks make this unreachable; a simulator that silently
        // skipped an operation would hide the very bugs it exists to find.
        panic!("simulated device operation failed after its checks passed: {e}");
    }

    fn drain(&mut self) {
        while self.step() {}
    }
}

impl Device for SimDevice {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn alloc_device(&self, len: usize) -> Result<DevicePtr> {
        let mut st = self.lock();
        let p = st.next;
        let span = (len as u64).div_ceil(GUARD).max(1) * GUARD + GUARD;
        st.next = p.checked_add(span).ok_or_else(|| Error::Device(format!("{}: out of addresses", self.name)))?;
        st.allocs.insert(p, vec![0u8; len].into_boxed_slice());
        Ok(p)
    }

    unsafe fn free_device(&self, ptr: DevicePtr, len: usize) {
        let mut st = self.lock();
        st.drain();
        let freed = st.allocs.remove(&ptr);
        assert!(freed.is_some_and(|m| m.len() == len), "{}: free of {ptr:#x} (+{len}) not allocated", self.name);
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
        st.drain();
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
        if len % dtype.size() != 0 {
            return Err(Error::InvalidArgument(format!("{}: reduce of {len} bytes of {dtype}", self.name)));
        }
        self.enqueue(&[(dst, len), (a, len), (b, len)], Op::Reduce { dst, a, b, len, dtype, op })
    }

    unsafe fn finalize(&self, buf: DevicePtr, len: usize, dtype: DType, op: ReduceOp, world: usize) -> Result<()> {
        if len % dtype.size() != 0 || world == 0 {
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
        Ok(st.done >= ticket.0)
    }

    fn synchronize(&self) -> Result<()> {
        self.lock().drain();
        Ok(())
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
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
