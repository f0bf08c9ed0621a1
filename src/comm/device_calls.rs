//! Collectives on device buffers ([`DeviceBuffer`], or raw device ranges).
//!
//! The schedules are the host ones; the executor stages device regions through
//! the device's host buffers over whatever links connect the ranks and reduces on
//! the device (see [`crate::executor::staged`]). Several ranks may use one device.
//! A call returns when its result is final on the device; work enqueued on the
//! device's stream before the call is seen by it.

use std::sync::Arc;

use super::Communicator;
use crate::device::{Device, DeviceBuffer, DevicePtr};
use crate::error::{Error, Result};
use crate::types::{CallSig, DType, OpKind, ReduceOp};

impl Communicator {
    /// The byte form of every collective on device memory: as
    /// [`Communicator::collective_bytes`], with `(device address, length in bytes)`
    /// ranges of `device`.
    ///
    /// # Safety
    /// The ranges must be memory of `device`, valid for the whole call, and not
    /// used by anything else meanwhile (input and output may alias only as the
    /// in-place layouts say).
    pub unsafe fn collective_device_raw(
        &self,
        device: &Arc<dyn Device>,
        sig: CallSig,
        input: Option<(DevicePtr, usize)>,
        output: (DevicePtr, usize),
    ) -> Result<()> {
        let t = self.core.shared.take_ticket();
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.core.collective_device_at(t, sig, device, input, output) }
    }

    /// The byte form of every collective on [`DeviceBuffer`]s of one device:
    /// `input` None is in place (the data is in `output`).
    pub fn collective_device(
        &self,
        sig: CallSig,
        input: Option<&DeviceBuffer>,
        output: &mut DeviceBuffer,
    ) -> Result<()> {
        let device = output.device().clone();
        if let Some(i) = input {
            if !Arc::ptr_eq(i.device(), &device) {
                return Err(Error::InvalidArgument(format!(
                    "rank {}: {sig}: input on {} and output on {}: one call runs on one device",
                    self.rank(),
                    i.device().describe(),
                    device.describe()
                )));
            }
        }
        // SAFETY: both buffers are allocations of `device` owned by their
        // `DeviceBuffer`s, borrowed (output mutably) for the whole call.
        unsafe {
            self.collective_device_raw(&device, sig, input.map(|i| (i.ptr(), i.len())), (output.ptr(), output.len()))
        }
    }

    fn elements(&self, bytes: usize, dtype: DType, what: &str) -> Result<u64> {
        if !bytes.is_multiple_of(dtype.size()) {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {what}: a device buffer of {bytes} bytes is not a whole number of {dtype}",
                self.rank()
            )));
        }
        Ok((bytes / dtype.size()) as u64)
    }

    /// Reduce `input` across ranks into `output` on every rank.
    pub fn all_reduce_device(
        &self,
        input: &DeviceBuffer,
        output: &mut DeviceBuffer,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.elements(input.len(), dtype, "all-reduce")?;
        self.collective_device(CallSig::new(OpKind::AllReduce, dtype, n, 0, op), Some(input), output)
    }

    /// Reduce `buf` across ranks in place.
    pub fn all_reduce_device_in_place(&self, buf: &mut DeviceBuffer, dtype: DType, op: ReduceOp) -> Result<()> {
        let n = self.elements(buf.len(), dtype, "all-reduce")?;
        self.collective_device(CallSig::new(OpKind::AllReduce, dtype, n, 0, op), None, buf)
    }

    /// Broadcast `buf` from `root` to every rank, in place.
    pub fn broadcast_device(&self, buf: &mut DeviceBuffer, dtype: DType, root: usize) -> Result<()> {
        let n = self.elements(buf.len(), dtype, "broadcast")?;
        self.collective_device(CallSig::new(OpKind::Broadcast, dtype, n, root as u32, ReduceOp::Sum), None, buf)
    }

    /// Gather every rank's `input` into `output` (`world_size` times as long), in rank order.
    pub fn all_gather_device(&self, input: &DeviceBuffer, output: &mut DeviceBuffer, dtype: DType) -> Result<()> {
        let n = self.elements(input.len(), dtype, "all-gather")?;
        self.collective_device(CallSig::new(OpKind::AllGather, dtype, n, 0, ReduceOp::Sum), Some(input), output)
    }

    /// Reduce `input` (`world_size` times as long as `output`) and leave block `rank` in `output`.
    pub fn reduce_scatter_device(
        &self,
        input: &DeviceBuffer,
        output: &mut DeviceBuffer,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.elements(output.len(), dtype, "reduce-scatter")?;
        self.collective_device(CallSig::new(OpKind::ReduceScatter, dtype, n, 0, op), Some(input), output)
    }

    /// Reduce `input` across ranks into `output` at `root` (other ranks may pass an empty output).
    pub fn reduce_device(
        &self,
        input: &DeviceBuffer,
        output: &mut DeviceBuffer,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let n = self.elements(input.len(), dtype, "reduce")?;
        self.collective_device(CallSig::new(OpKind::Reduce, dtype, n, root as u32, op), Some(input), output)
    }

    /// Gather every rank's `input` into `output` (`world_size` blocks in rank order)
    /// at `root`; other ranks pass None (or an empty buffer).
    pub fn gather_device(
        &self,
        input: &DeviceBuffer,
        output: Option<&mut DeviceBuffer>,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        let n = self.elements(input.len(), dtype, "gather")?;
        let sig = CallSig::new(OpKind::Gather, dtype, n, root as u32, ReduceOp::Sum);
        match output {
            Some(out) => self.collective_device(sig, Some(input), out),
            // SAFETY: `input` is an allocation of its device borrowed for the call;
            // the output range is empty, so nothing is written.
            None => unsafe {
                self.collective_device_raw(input.device(), sig, Some((input.ptr(), input.len())), (input.ptr(), 0))
            },
        }
    }

    /// Gather in place: at `root`, `buf` holds `world_size` blocks with the root's
    /// own already at block `root`; elsewhere `buf` is the rank's block.
    pub fn gather_device_in_place(&self, buf: &mut DeviceBuffer, dtype: DType, root: usize) -> Result<()> {
        let n = self.rooted_count(buf.len(), dtype, "gather", root)?;
        self.collective_device(CallSig::new(OpKind::Gather, dtype, n, root as u32, ReduceOp::Sum), None, buf)
    }

    /// Scatter `root`'s `input` (`world_size` blocks): rank `j`'s `output` receives
    /// block `j`. Other ranks pass None (or an empty buffer).
    pub fn scatter_device(
        &self,
        input: Option<&DeviceBuffer>,
        output: &mut DeviceBuffer,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        let n = self.elements(output.len(), dtype, "scatter")?;
        let sig = CallSig::new(OpKind::Scatter, dtype, n, root as u32, ReduceOp::Sum);
        match input {
            Some(i) => self.collective_device(sig, Some(i), output),
            // SAFETY: `output` is an allocation of its device borrowed mutably for
            // the call; the input range is empty, so nothing is read.
            None => unsafe {
                let out = (output.ptr(), output.len());
                self.collective_device_raw(&output.device().clone(), sig, Some((output.ptr(), 0)), out)
            },
        }
    }

    /// Scatter in place: at `root`, `buf` holds `world_size` blocks and keeps its
    /// own at block `root`; elsewhere `buf` receives the rank's block.
    pub fn scatter_device_in_place(&self, buf: &mut DeviceBuffer, dtype: DType, root: usize) -> Result<()> {
        let n = self.rooted_count(buf.len(), dtype, "scatter", root)?;
        self.collective_device(CallSig::new(OpKind::Scatter, dtype, n, root as u32, ReduceOp::Sum), None, buf)
    }

    /// Elements of one block of an in-place gather or scatter: the root's buffer
    /// holds `world_size` of them, another rank's one.
    fn rooted_count(&self, bytes: usize, dtype: DType, what: &str, root: usize) -> Result<u64> {
        let n = self.elements(bytes, dtype, what)?;
        if root != self.rank() {
            return Ok(n);
        }
        let world = self.world_size() as u64;
        if !n.is_multiple_of(world) {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {what} at root {root}: the root's buffer of {n} {dtype} does not split into {world} equal blocks",
                self.rank()
            )));
        }
        Ok(n / world)
    }

    /// Send block `j` of `input` to rank `j`; receive rank `j`'s block `rank` into block `j` of `output`.
    pub fn all_to_all_device(&self, input: &DeviceBuffer, output: &mut DeviceBuffer, dtype: DType) -> Result<()> {
        let c = self.core.block(self.elements(input.len(), dtype, "all-to-all")? as usize)?;
        self.collective_device(CallSig::new(OpKind::AllToAll, dtype, c as u64, 0, ReduceOp::Sum), Some(input), output)
    }

    /// Send `buf` (elements of `dtype`) to `peer`; matched by that peer's `recv_device` or `recv`.
    pub fn send_device(&self, buf: &DeviceBuffer, dtype: DType, peer: usize) -> Result<()> {
        let t = self.core.shared.take_ticket();
        let ptr = buf.ptr() as usize as *mut u8;
        self.core.p2p_at(t, OpKind::Send, (ptr, buf.len()), dtype, peer, Some(buf.device()))
    }

    /// Receive into `buf` (elements of `dtype`) from `peer`.
    pub fn recv_device(&self, buf: &mut DeviceBuffer, dtype: DType, peer: usize) -> Result<()> {
        let t = self.core.shared.take_ticket();
        let ptr = buf.ptr() as usize as *mut u8;
        self.core.p2p_at(t, OpKind::Recv, (ptr, buf.len()), dtype, peer, Some(buf.device()))
    }
}
