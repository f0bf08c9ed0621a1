//! The `*v` collectives (all-gather-v, reduce-scatter-v, all-to-all-v): blocks
//! whose sizes differ by rank, given as counts (and, inside, displacements) in
//! elements. Their schedules depend on the counts, so they are planned per call
//! (not cached by count as the other collectives are).
//!
//! All ranks must pass the same counts to all-gather-v and reduce-scatter-v; the
//! signature carries their sum, and every block travels as its own frame (an
//! empty one for an empty block) whose length the receiver checks against its own
//! counts, so ranks that disagree fail naming the peer and both sizes.

use super::calls::Core;
use super::engine::Engine;
use super::Communicator;
use crate::algorithm::{self, PlanRequest, VBlocks};
use crate::error::{Error, Result};
use crate::executor::{Buffers, MemKind};
use crate::tuner::Call;
use crate::types::{CallSig, Element, OpKind, ReduceOp};

/// Displacements of blocks packed one after the other (exclusive prefix sums).
pub(super) fn packed(counts: &[usize]) -> Vec<usize> {
    counts.iter().scan(0usize, |at, &c| Some(std::mem::replace(at, at.saturating_add(c)))).collect()
}

/// A `*v` call's counts and displacements, owned: for a call that runs later on
/// the worker, when the caller's arrays may be gone.
#[derive(Default)]
pub(super) struct OwnedBlocks {
    pub(super) send_counts: Vec<usize>,
    pub(super) send_displs: Vec<usize>,
    pub(super) recv_counts: Vec<usize>,
    pub(super) recv_displs: Vec<usize>,
}

impl OwnedBlocks {
    pub(super) fn copy(v: VBlocks<'_>) -> Self {
        OwnedBlocks {
            send_counts: v.send_counts.to_vec(),
            send_displs: v.send_displs.to_vec(),
            recv_counts: v.recv_counts.to_vec(),
            recv_displs: v.recv_displs.to_vec(),
        }
    }

    pub(super) fn view(&self) -> VBlocks<'_> {
        VBlocks {
            send_counts: &self.send_counts,
            send_displs: &self.send_displs,
            recv_counts: &self.recv_counts,
            recv_displs: &self.recv_displs,
        }
    }
}

/// One `*v` call's blocks and buffers, before the engine runs it.
pub(super) struct VCall<'a> {
    pub(super) sig: CallSig,
    pub(super) blocks: VBlocks<'a>,
    /// Input bytes, or `None` in place (the Input is then a block of `output`).
    pub(super) input: Option<&'a [u8]>,
    pub(super) output: &'a mut [u8],
}

/// The signature of an all-gather-v or reduce-scatter-v: the sum of the counts,
/// which every rank passing the same counts shares.
pub(super) fn sig_v<T: Element>(op: OpKind, counts: &[usize], rop: ReduceOp) -> CallSig {
    let total = counts.iter().fold(0u64, |s, &c| s.saturating_add(c as u64));
    CallSig::new(op, T::DTYPE, total, 0, rop)
}

/// Where a call's Input and Output are: start and length in bytes.
type Layout = ((*const u8, usize), (*mut u8, usize));

impl Core {
    /// Check a `*v` call's counts and buffers and work out its layout.
    fn prepare_v(&self, call: &mut VCall<'_>) -> Result<Layout> {
        let (op, es, v) = (call.sig.op, call.sig.dtype.size(), call.blocks);
        let req = PlanRequest {
            op,
            rank: self.rank,
            world: self.world,
            count: call.sig.count as usize,
            elem_size: es,
            root: 0,
            algorithm: None,
            hosts: &[],
            blocks: Some(v),
        };
        if let Some(why) = algorithm::vblocks_invalid(&req) {
            return Err(self.arg(why));
        }
        let (in_bytes, out_bytes) = (req.input_bytes(), req.output_bytes());
        let base = call.output.as_mut_ptr();
        let out_len = call.output.len();
        if let Some(input) = call.input {
            // The side that holds every block may be longer than its furthest block
            // (MPI's displacements leave gaps anywhere); the one-block side is exact.
            let exact_in = op == OpKind::AllGatherV;
            let exact_out = op == OpKind::ReduceScatterV;
            let bad = |len: usize, need: usize, exact: bool| if exact { len != need } else { len < need };
            if bad(input.len(), in_bytes, exact_in) {
                return Err(self.arg(format!(
                    "{}: input has {} bytes, the counts need {in_bytes}",
                    call.sig,
                    input.len()
                )));
            }
            if bad(out_len, out_bytes, exact_out) {
                return Err(self.arg(format!("{}: output has {out_len} bytes, the counts need {out_bytes}", call.sig)));
            }
            return Ok(((input.as_ptr(), input.len()), (base, out_len)));
        }
        // In place: all-gather-v's Input is block `rank` of the buffer (MPI_IN_PLACE);
        // reduce-scatter-v leaves its result at block `rank`.
        let need = in_bytes.max(out_bytes);
        if out_len < need {
            return Err(self.arg(format!("{}: in-place buffer has {out_len} bytes, the counts need {need}", call.sig)));
        }
        let r = self.rank;
        Ok(match op {
            OpKind::AllGatherV => {
                let own = (base.wrapping_add(v.recv_displs[r] * es) as *const u8, v.recv_counts[r] * es);
                (own, (base, out_len))
            }
            OpKind::ReduceScatterV => {
                ((base as *const u8, out_len), (base.wrapping_add(v.send_displs[r] * es), v.send_counts[r] * es))
            }
            _ => return Err(self.arg(format!("{op} has no in-place form: pass separate buffers"))),
        })
    }

    /// Run a `*v` collective at `ticket`.
    pub(super) fn collective_v_at(&self, ticket: u64, mut call: VCall<'_>) -> Result<()> {
        let sig = call.sig;
        self.shared.in_turn(ticket, Some(sig), |e| {
            let (input, output) = self.prepare_v(&mut call)?;
            e.collective_v(sig, call.blocks, input, output).map_err(|err| name_counts(err, &call, self.rank))
        })
    }
}

/// A received block whose length is not what this rank's counts say: say which
/// counts disagree (the executor names only the bytes).
fn name_counts(err: Error, call: &VCall<'_>, rank: usize) -> Error {
    let Error::Protocol { ctx, peer, detail } = err else { return err };
    if !detail.starts_with("frame of ") {
        return Error::Protocol { ctx, peer, detail };
    }
    let sig = call.sig;
    let v = call.blocks;
    let hint = match sig.op {
        OpKind::AllToAllV => format!(
            "{sig}: rank {peer}'s send_counts[{rank}] differs from this rank's recv_counts[{peer}] = {} \
             (each rank's recv_counts[j] must equal rank j's send_counts[its rank])",
            v.recv_counts.get(peer).copied().unwrap_or(0)
        ),
        OpKind::AllGatherV => format!(
            "{sig}: rank {peer} and rank {rank} passed different counts (this rank's: {:?}); every rank must pass the same",
            v.recv_counts
        ),
        _ => format!(
            "{sig}: rank {peer} and rank {rank} passed different counts (this rank's: {:?}); every rank must pass the same",
            v.send_counts
        ),
    };
    Error::Protocol { ctx, peer, detail: format!("{detail} ({} bytes per element): {hint}", sig.dtype.size()) }
}

impl Engine {
    /// Run a `*v` collective on host buffers: pick the algorithm (priced as the
    /// fixed-size op with the mean block) and plan it for these counts.
    pub(super) fn collective_v(
        &mut self,
        sig: CallSig,
        blocks: VBlocks<'_>,
        (input, input_len): (*const u8, usize),
        (output, output_len): (*mut u8, usize),
    ) -> Result<()> {
        let seq = self.coll_seq;
        self.coll_seq += 1;
        let (count, elem_size) = (sig.count as usize, sig.dtype.size());
        let call = Call { op: sig.op, count, elem_size, root: 0, hosts: &self.hosts, busy: &self.busy_hosts };
        let algo = self.tuner.pick(&call).map_err(|e| Error::InvalidArgument(format!("choosing for {sig}: {e}")))?;
        let req = PlanRequest {
            op: sig.op,
            rank: self.rank,
            world: self.world,
            count,
            elem_size,
            root: 0,
            algorithm: Some(algo),
            hosts: &self.hosts,
            blocks: Some(blocks),
        };
        let schedule = algorithm::plan_with(&req, &self.tuner.params)
            .map_err(|e| Error::InvalidArgument(format!("rank {}: planning {sig}: {e}", self.rank)))?;
        let sig = sig.with_algorithm(schedule.algorithm).reproducible(self.tuner.params.deterministic);
        let mut bufs = Buffers {
            input,
            input_len,
            output,
            output_len,
            scratch: std::mem::take(&mut self.scratch),
            scratch_offset: 0,
            kind: MemKind::Host,
            device: None,
            device_scratch: None,
            peer_copy: None,
            segments: None,
        };
        let r = self.run(sig, &schedule, &mut bufs, (seq, seq));
        self.scratch = std::mem::take(&mut bufs.scratch);
        r
    }
}

impl Communicator {
    fn run_v<T: Element>(
        &self,
        sig: CallSig,
        blocks: VBlocks<'_>,
        input: Option<&[T]>,
        output: &mut [T],
    ) -> Result<()> {
        let call =
            VCall { sig, blocks, input: input.map(bytemuck::cast_slice), output: bytemuck::cast_slice_mut(output) };
        self.core.collective_v_at(self.core.shared.take_ticket(), call)
    }

    /// Gather every rank's `input` into `output`, rank `j`'s block (`counts[j]`
    /// elements, `counts[rank] == input.len()`) after those of ranks `0..j`
    /// (MPI_Allgatherv with packed displacements; torch's all_gather of uneven
    /// tensors into one). Every rank passes the same `counts`.
    pub fn all_gather_v<T: Element>(&self, input: &[T], output: &mut [T], counts: &[usize]) -> Result<()> {
        let displs = packed(counts);
        let blocks = VBlocks { recv_counts: counts, recv_displs: &displs, ..VBlocks::default() };
        self.run_v(sig_v::<T>(OpKind::AllGatherV, counts, ReduceOp::Sum), blocks, Some(input), output)
    }

    /// All-gather-v in place: this rank's block is already in its place in `buf`.
    pub fn all_gather_v_in_place<T: Element>(&self, buf: &mut [T], counts: &[usize]) -> Result<()> {
        let displs = packed(counts);
        let blocks = VBlocks { recv_counts: counts, recv_displs: &displs, ..VBlocks::default() };
        self.run_v(sig_v::<T>(OpKind::AllGatherV, counts, ReduceOp::Sum), blocks, None, buf)
    }

    /// Reduce `input` (blocks of `counts[j]` elements, packed in rank order) across
    /// ranks, leaving block `rank` in `output` (`counts[rank]` elements)
    /// (MPI_Reduce_scatter). Every rank passes the same `counts`.
    pub fn reduce_scatter_v<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        let displs = packed(counts);
        let blocks = VBlocks { send_counts: counts, send_displs: &displs, ..VBlocks::default() };
        self.run_v(sig_v::<T>(OpKind::ReduceScatterV, counts, op), blocks, Some(input), output)
    }

    /// Reduce-scatter-v in place: the result lands at block `rank` of `buf`; the
    /// other blocks are left as they were.
    pub fn reduce_scatter_v_in_place<T: Element>(&self, buf: &mut [T], counts: &[usize], op: ReduceOp) -> Result<()> {
        let displs = packed(counts);
        let blocks = VBlocks { send_counts: counts, send_displs: &displs, ..VBlocks::default() };
        self.run_v(sig_v::<T>(OpKind::ReduceScatterV, counts, op), blocks, None, buf)
    }

    /// Send `send_counts[j]` elements from `input[send_displs[j]..]` to rank `j`
    /// and receive rank `j`'s into `output[recv_displs[j]..]` (`recv_counts[j]`
    /// elements), MPI_Alltoallv / torch's all_to_all_single with split sizes.
    /// `recv_counts[j]` must equal rank `j`'s `send_counts[rank]`; a rank that
    /// receives another size fails naming both ranks.
    pub fn all_to_all_v<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let blocks = VBlocks { send_counts, send_displs, recv_counts, recv_displs };
        let sig = CallSig::new(OpKind::AllToAllV, T::DTYPE, 0, 0, ReduceOp::Sum);
        self.run_v(sig, blocks, Some(input), output)
    }
}

#[cfg(test)]
mod tests {
    use super::packed;

    #[test]
    fn packed_displacements_are_exclusive_prefix_sums() {
        assert_eq!(packed(&[3, 0, 5, 1]), vec![0, 3, 3, 8]);
        assert_eq!(packed(&[]), Vec::<usize>::new());
    }
}
