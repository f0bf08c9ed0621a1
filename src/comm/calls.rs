//! Argument checking and buffer layout of every call, in issue order.

use std::sync::Arc;

use super::turn::Shared;
use crate::algorithm::PlanRequest;
use crate::device::{Device, DeviceBuffer, DevicePtr};
use crate::error::{Error, Result};
use crate::executor::segments::Segments;
use crate::types::{CallSig, DType, OpKind, ReduceOp};

/// What sync calls and async jobs share: identity, ticketing and the engine.
pub(super) struct Core {
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) shared: Shared,
}

/// A validated call, ready for the engine.
struct Prepared {
    sig: CallSig,
    input: *const u8,
    input_len: usize,
    output: *mut u8,
    output_len: usize,
}

impl Core {
    pub(super) fn arg(&self, msg: String) -> Error {
        Error::InvalidArgument(format!("rank {}: {msg}", self.rank))
    }

    fn check_rank(&self, what: &str, r: usize) -> Result<()> {
        if r >= self.world {
            return Err(self.arg(format!("{what} {r} is not a rank of this {}-rank communicator", self.world)));
        }
        Ok(())
    }

    pub(super) fn block(&self, len: usize) -> Result<usize> {
        if !len.is_multiple_of(self.world) {
            return Err(self.arg(format!("buffer of {len} elements does not split into {} equal blocks", self.world)));
        }
        Ok(len / self.world)
    }

    /// Check sizes and work out the buffer layout (in-place aliasing included), on
    /// `(start, length)` pairs: host slices, or device buffers.
    fn prepare(&self, sig: CallSig, input: Option<(*const u8, usize)>, output: (*mut u8, usize)) -> Result<Prepared> {
        if matches!(sig.op, OpKind::Send | OpKind::Recv) {
            return Err(self.arg("use send/recv for point-to-point calls".into()));
        }
        if sig.op.varies() {
            return Err(self.arg(format!(
                "{} takes per-rank counts: call all_gather_v, reduce_scatter_v or all_to_all_v",
                sig.op
            )));
        }
        if sig.op.rooted() {
            self.check_rank("root", sig.root as usize)?;
        }
        let count = usize::try_from(sig.count).map_err(|_| self.arg("count too large".into()))?;
        // Every byte size below (count x element x world) must fit: a wrapped size
        // would let a huge count pass for a small buffer.
        if count.checked_mul(sig.dtype.size()).and_then(|b| b.checked_mul(self.world)).is_none() {
            return Err(self.arg(format!("{sig}: {count} elements are more bytes than this machine can address")));
        }
        let req = PlanRequest {
            op: sig.op,
            rank: self.rank,
            world: self.world,
            count,
            elem_size: sig.dtype.size(),
            root: sig.root as usize,
            algorithm: None,
            hosts: &[],
            blocks: None,
        };
        let (in_bytes, out_bytes) = (req.input_bytes(), req.output_bytes());
        let is_root = sig.root as usize == self.rank;
        let (base, out_len) = output;
        match input {
            Some((in_ptr, in_len)) => {
                // Non-roots of a broadcast or scatter have no input; non-roots of a
                // reduce or gather no output.
                let has_input = !matches!(sig.op, OpKind::Broadcast | OpKind::Scatter) || is_root;
                let has_output = !matches!(sig.op, OpKind::Reduce | OpKind::Gather) || is_root;
                if has_input && in_len != in_bytes {
                    return Err(self.arg(format!("{sig}: input has {in_len} bytes, expected {in_bytes}")));
                }
                if has_output && out_len != out_bytes {
                    return Err(self.arg(format!("{sig}: output has {out_len} bytes, expected {out_bytes}")));
                }
                Ok(Prepared { sig, input: in_ptr, input_len: in_len, output: base, output_len: out_len })
            }
            None => {
                let need = in_bytes.max(out_bytes);
                if out_len != need {
                    return Err(self.arg(format!("{sig}: in-place buffer has {out_len} bytes, expected {need}")));
                }
                let block = count * sig.dtype.size();
                // Block `rank` lies inside the buffer, whose length was checked;
                // wrapping, since a device buffer's start is not a host pointer.
                Ok(match sig.op {
                    OpKind::AllGather => Prepared {
                        sig,
                        input: base.wrapping_add(self.rank * block),
                        input_len: block,
                        output: base,
                        output_len: need,
                    },
                    OpKind::ReduceScatter => Prepared {
                        sig,
                        input: base,
                        input_len: need,
                        output: base.wrapping_add(self.rank * block),
                        output_len: block,
                    },
                    // MPI_IN_PLACE at the root: its own block already sits at block
                    // `root` of the buffer (gather), or stays there (scatter).
                    OpKind::Gather if is_root => Prepared {
                        sig,
                        input: base.wrapping_add(self.rank * block),
                        input_len: block,
                        output: base,
                        output_len: need,
                    },
                    OpKind::Scatter if is_root => Prepared {
                        sig,
                        input: base,
                        input_len: need,
                        output: base.wrapping_add(self.rank * block),
                        output_len: block,
                    },
                    _ => Prepared { sig, input: base, input_len: need, output: base, output_len: need },
                })
            }
        }
    }

    /// Run a collective at `ticket` (the byte form behind every typed call).
    pub(super) fn collective_at(
        &self,
        ticket: u64,
        sig: CallSig,
        input: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<()> {
        let sig = CallSig::new(sig.op, sig.dtype, sig.count, sig.root, sig.reduce_op);
        // Checked in turn, so that whatever happens there the ticket is used.
        self.shared.in_turn(ticket, Some(sig), |e| {
            // In-place all-to-all: every block is both read and overwritten, so work
            // from a copy, in a buffer the engine keeps (not a fresh one per call).
            let copy = (sig.op == OpKind::AllToAll && input.is_none()).then(|| {
                let mut c = std::mem::take(&mut e.in_place_copy);
                c.clear();
                c.extend_from_slice(output);
                c
            });
            let input = copy.as_deref().or(input);
            let r = self
                .prepare(sig, input.map(|i| (i.as_ptr(), i.len())), (output.as_mut_ptr(), output.len()))
                .and_then(|p| e.collective(p.sig, (p.input, p.input_len), (p.output, p.output_len), None));
            if let Some(c) = copy {
                e.in_place_copy = c;
            }
            r
        })
    }

    /// An in-place all-reduce at `ticket` of `parts` taken as one buffer laid end
    /// to end (each part a whole number of `dtype`).
    pub(super) fn all_reduce_parts_at(
        &self,
        ticket: u64,
        (dtype, op): (DType, ReduceOp),
        parts: &mut [&mut [u8]],
    ) -> Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let sig = CallSig::new(OpKind::AllReduce, dtype, (total / dtype.size()) as u64, 0, op);
        let odd = parts.iter().position(|p| p.len() % dtype.size() != 0);
        self.shared.in_turn(ticket, Some(sig), |e| {
            if let Some(k) = odd {
                return Err(self.arg(format!(
                    "{sig}: part {k} of {} has {} bytes, not a whole number of {dtype}",
                    parts.len(),
                    parts[k].len()
                )));
            }
            // The same checks as a call on one buffer of the total length.
            self.prepare(sig, None, (std::ptr::null_mut(), total))?;
            e.all_reduce_segments(sig, Segments::new(parts))
        })
    }

    /// Run a collective on device buffers at `ticket`.
    ///
    /// # Safety
    /// The ranges are memory of `device`, valid and unaliased (but as the in-place
    /// layouts say) until the call returns.
    pub(super) unsafe fn collective_device_at(
        &self,
        ticket: u64,
        sig: CallSig,
        device: &Arc<dyn Device>,
        input: Option<(DevicePtr, usize)>,
        output: (DevicePtr, usize),
    ) -> Result<()> {
        let sig = CallSig::new(sig.op, sig.dtype, sig.count, sig.root, sig.reduce_op);
        if sig.op == OpKind::AllToAll && input.is_none() {
            // Every block is both read and overwritten: work from a copy.
            let copy = DeviceBuffer::new(device, output.1)?;
            // SAFETY: `copy` is ours and of the same length; the caller vouches for output.
            unsafe { device.copy_on_device(copy.ptr(), output.0, output.1)? };
            // SAFETY: as the caller's, plus `copy`, alive until this returns.
            return unsafe { self.collective_device_at(ticket, sig, device, Some((copy.ptr(), copy.len())), output) };
        }
        let as_ptr = |p: DevicePtr| p as usize as *mut u8;
        self.shared.in_turn(ticket, Some(sig), |e| {
            let p = self.prepare(sig, input.map(|(p, l)| (as_ptr(p) as *const u8, l)), (as_ptr(output.0), output.1))?;
            e.collective(p.sig, (p.input, p.input_len), (p.output, p.output_len), Some(device))
        })
    }

    /// Send or receive `len` bytes at `ptr` (a device address with `device`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn p2p_at(
        &self,
        ticket: u64,
        op: OpKind,
        (ptr, len): (*mut u8, usize),
        dtype: DType,
        peer: usize,
        device: Option<&Arc<dyn Device>>,
    ) -> Result<()> {
        let checked = self.check_rank("peer", peer).and_then(|()| {
            if peer == self.rank {
                return Err(self.arg(format!("{op} to itself")));
            }
            if len % dtype.size() != 0 {
                return Err(self.arg(format!("{op}: {len} bytes is not a whole number of {dtype}")));
            }
            Ok(CallSig::new(op, dtype, (len / dtype.size()) as u64, peer as u32, ReduceOp::Sum))
        });
        let sig = checked.as_ref().ok().copied();
        self.shared.in_turn(ticket, sig, |e| e.point_to_point(checked?, peer, (ptr, len), device))
    }
}
