//! Gradient buckets as views (issue 39): a model's gradient tensors live inside
//! flat bucket storage from the start, so a fused all-reduce runs in place on the
//! buckets, with nothing packed before the call and nothing unpacked after it.
//! PyTorch DDP's `gradient_as_bucket_view` has the idea; here the borrow checker
//! keeps it safe: a tensor is a slice of its bucket, lent out by `&mut self`, and
//! a bucket on the wire is lent to its call until the call ends.
//!
//! Buckets follow registration order ([`plan::buckets`], as the [`Fuser`] cuts
//! them), so register tensors in the order their gradients become ready (a
//! backward pass: last layer first). Ranks check once per communicator that they
//! laid out the same tensors ([`plan::fingerprint`]); a different layout is an
//! error, never a silent mix.
//!
//! [`Fuser`]: super::Fuser

use std::ops::Range;

use super::plan::{self, Entry};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::types::{Element, ReduceOp};

/// Where [`GradientBuffer::all_reduce_as_ready`] runs a ready bucket's all-reduce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overlap {
    /// On the communicator's worker while the compute goes on, when this host has
    /// a spare core for each rank's communication beside its compute; otherwise
    /// inline. (Two threads a rank on one core each are slower than one: the
    /// collective waits for peers whose turn on the core has not come.)
    #[default]
    Auto,
    /// Always on the worker: right where the compute leaves the core free (an
    /// accelerator computes while this thread waits for it).
    Worker,
    /// On this thread, right after the bucket's last gradient: no overlap, but no
    /// waiting at the end either.
    Inline,
}

/// Where a tensor lives: its bucket and its elements there.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    bucket: usize,
    elements: Range<usize>,
}

/// Gradient tensors laid out in flat buckets, all-reduced in place (see the module
/// docs).
///
/// ```
/// use braid::fusion::GradientBuffer;
/// use braid::{Communicator, ReduceOp};
/// # fn main() -> braid::Result<()> {
/// let comm = Communicator::in_process(1)?.pop().unwrap();
/// // Three tensors of 3, 5 and 2 floats, in buckets of at most 32 bytes.
/// let mut grads = GradientBuffer::<f32>::new(&[3, 5, 2], 32);
/// assert_eq!(grads.bucket_count(), 2);
/// grads.tensor_mut(1).fill(0.5);
/// grads.all_reduce(&comm, ReduceOp::Sum)?;
/// assert_eq!(grads.tensor(1), &[0.5; 5]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct GradientBuffer<T: Element> {
    buckets: Vec<Vec<T>>,
    places: Vec<Place>,
    /// The tensors of each bucket.
    members: Vec<Range<usize>>,
    fingerprint: i64,
    /// Ids of the communicators whose ranks agreed to this layout.
    agreed: Vec<u32>,
    overlap: Overlap,
}

impl<T: Element> GradientBuffer<T> {
    /// Zeroed tensors of `lens` elements, in registration order, in buckets of at
    /// most `bucket_bytes` (a larger tensor has a bucket of its own; 0 gives every
    /// tensor its own bucket).
    pub fn new(lens: &[usize], bucket_bytes: usize) -> GradientBuffer<T> {
        let entries = Self::entries(lens);
        let members = plan::buckets(&entries, bucket_bytes);
        Self::laid_out(lens, &entries, members)
    }

    /// As [`GradientBuffer::new`], but the first bucket holds at most
    /// `first_bucket_bytes` (PyTorch DDP's small first bucket). In a backward pass
    /// the first bucket's all-reduce cannot start before its last gradient is
    /// written, and everything after it waits its turn: with 8 equal buckets and
    /// compute as long as communication, that start alone costs 1/8 of a step.
    pub fn with_first_bucket(lens: &[usize], first_bucket_bytes: usize, bucket_bytes: usize) -> GradientBuffer<T> {
        let entries = Self::entries(lens);
        let first = plan::buckets(&entries, first_bucket_bytes).first().map_or(0, |r| r.end);
        let rest = plan::buckets(&entries[first..], bucket_bytes).into_iter().map(|r| r.start + first..r.end + first);
        let members: Vec<Range<usize>> = std::iter::once(0..first).chain(rest).filter(|r| !r.is_empty()).collect();
        Self::laid_out(lens, &entries, members)
    }

    fn entries(lens: &[usize]) -> Vec<Entry> {
        let size = T::DTYPE.size();
        lens.iter().map(|&n| Entry { dtype: T::DTYPE, op: ReduceOp::Sum, bytes: n.saturating_mul(size) }).collect()
    }

    /// Tensors of `lens` (described by `entries`) in the buckets `members`.
    fn laid_out(lens: &[usize], entries: &[Entry], members: Vec<Range<usize>>) -> GradientBuffer<T> {
        let mut places = Vec::with_capacity(lens.len());
        let mut buckets = Vec::with_capacity(members.len());
        for (b, range) in members.iter().enumerate() {
            let mut at = 0;
            for &n in &lens[range.clone()] {
                places.push(Place { bucket: b, elements: at..at + n });
                at += n;
            }
            buckets.push(vec![T::zeroed(); at]);
        }
        // The bucket cuts count as much as the tensors: a bucket end is marked in
        // the fingerprinted list (as an entry of a length no tensor has).
        let mut marked = Vec::with_capacity(entries.len() + members.len());
        for range in &members {
            marked.extend_from_slice(&entries[range.clone()]);
            marked.push(Entry { dtype: T::DTYPE, op: ReduceOp::Max, bytes: usize::MAX });
        }
        GradientBuffer {
            buckets,
            places,
            members,
            fingerprint: plan::fingerprint(&marked),
            agreed: Vec::new(),
            overlap: Overlap::Auto,
        }
    }

    /// Where [`GradientBuffer::all_reduce_as_ready`] runs its all-reduces (default
    /// [`Overlap::Auto`]).
    pub fn set_overlap(&mut self, overlap: Overlap) {
        self.overlap = overlap;
    }

    /// How many tensors.
    pub fn len(&self) -> usize {
        self.places.len()
    }

    /// Whether it holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// How many buckets (collectives per all-reduce).
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// The bucket tensor `i` lives in.
    pub fn bucket_of(&self, i: usize) -> usize {
        self.places[i].bucket
    }

    /// Tensor `i` (panics past [`GradientBuffer::len`], as slice indexing does).
    pub fn tensor(&self, i: usize) -> &[T] {
        let p = &self.places[i];
        &self.buckets[p.bucket][p.elements.clone()]
    }

    /// Tensor `i`, to write.
    pub fn tensor_mut(&mut self, i: usize) -> &mut [T] {
        let p = &self.places[i];
        &mut self.buckets[p.bucket][p.elements.clone()]
    }

    /// Every tensor at once, in registration order (disjoint slices).
    pub fn tensors_mut(&mut self) -> Vec<&mut [T]> {
        let mut out = Vec::with_capacity(self.places.len());
        for (bucket, members) in self.buckets.iter_mut().zip(&self.members) {
            let mut rest: &mut [T] = bucket;
            for p in &self.places[members.clone()] {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(p.elements.len());
                out.push(head);
                rest = tail;
            }
        }
        out
    }

    /// The buckets themselves (each tensor's elements, in registration order).
    pub fn buckets(&self) -> &[Vec<T>] {
        &self.buckets
    }

    /// All-reduce every tensor in place: one collective per bucket, no copies.
    /// Collective: every rank calls it with the same layout and `op`.
    pub fn all_reduce(&mut self, comm: &Communicator, op: ReduceOp) -> Result<()> {
        self.agree(comm)?;
        for bucket in &mut self.buckets {
            comm.all_reduce_in_place(bucket, op)?;
        }
        Ok(())
    }

    /// A backward pass with its communication behind it: `compute(i, tensor)`
    /// writes the gradient of each tensor in registration order, on this thread;
    /// as soon as a bucket's last tensor is written, its all-reduce starts on the
    /// communicator's worker while `compute` goes on with the next bucket's
    /// tensors (or runs inline, see [`Overlap`]). Returns when every bucket is
    /// reduced. Collective, as [`GradientBuffer::all_reduce`].
    pub fn all_reduce_as_ready(
        &mut self,
        comm: &Communicator,
        op: ReduceOp,
        mut compute: impl FnMut(usize, &mut [T]),
    ) -> Result<()> {
        self.agree(comm)?;
        let on_worker = match self.overlap {
            Overlap::Worker => true,
            Overlap::Inline => false,
            Overlap::Auto => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                2 * comm.local_ranks() <= cores
            }
        };
        let GradientBuffer { buckets, places, members, .. } = self;
        if !on_worker {
            for (bucket, members) in buckets.iter_mut().zip(members.iter()) {
                for i in members.clone() {
                    compute(i, &mut bucket[places[i].elements.clone()]);
                }
                comm.all_reduce_in_place(bucket, op)?;
            }
            return Ok(());
        }
        comm.scope(|s| {
            let mut works = Vec::with_capacity(buckets.len());
            for (bucket, members) in buckets.iter_mut().zip(members.iter()) {
                for i in members.clone() {
                    compute(i, &mut bucket[places[i].elements.clone()]);
                }
                works.push(s.all_reduce_in_place(bucket, op));
            }
            // Every call is waited on, so each error is seen; the first is returned.
            let mut first = Ok(());
            for w in works {
                if let (Err(e), Ok(())) = (w.wait(), &first) {
                    first = Err(e);
                }
            }
            first
        })
    }

    /// Check once per communicator that every rank laid out the same tensors.
    fn agree(&mut self, comm: &Communicator) -> Result<()> {
        if self.agreed.contains(&comm.id()) {
            return Ok(());
        }
        let fp = self.fingerprint;
        let mut seen = [fp, -fp];
        comm.all_reduce_in_place(&mut seen, ReduceOp::Min)?;
        if seen[0] != -seen[1] {
            return Err(Error::InvalidArgument(format!(
                "rank {}: gradient buckets of {} {:?} tensors: this rank's layout (tensor lengths in registration \
                 order and bucket size; fingerprint {fp:#x}) differs from another rank's: every rank must register \
                 the same tensors in the same order",
                comm.rank(),
                self.places.len(),
                T::DTYPE
            )));
        }
        self.agreed.push(comm.id());
        Ok(())
    }
}

#[cfg(test)]
#[path = "buckets_tests.rs"]
mod tests;
