//! Safe asynchronous calls on borrowed buffers: [`Communicator::scope`].
//!
//! Every collective (in place and out of place, as the blocking API has them) and
//! send/recv can be issued inside a scope on slices the caller keeps (a slice of a
//! larger buffer included): the call takes its turn at once (issue order, as every
//! other call), runs on the communicator's worker thread, and returns a
//! [`ScopedWork`] — torch's `async_op=True` handle, NCCL's non-blocking call — that
//! holds the slices until it is waited on.
//!
//! Why a scope and not a handle alone: see [`Communicator::scope`].

use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use super::calls::Core;
use super::{Communicator, P2p, Work};
use crate::error::Result;
use crate::types::{CallSig, DType, Element, OpKind, ReduceOp};

/// Calls of one scope that have not finished with their buffers.
#[derive(Default)]
struct InFlight {
    count: Mutex<usize>,
    finished: Condvar,
}

/// One call's share of [`InFlight`]: released when the job ends, however it ends
/// (returned, panicked, or dropped unrun because the worker stopped) — each of which
/// means the worker no longer touches the call's buffers.
struct InFlightCall(Arc<InFlight>);

impl InFlight {
    fn enter(self: &Arc<Self>) -> InFlightCall {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        InFlightCall(self.clone())
    }

    /// Block until every call entered so far has ended.
    fn wait_all(&self) {
        let mut n = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            n = self.finished.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for InFlightCall {
    fn drop(&mut self) {
        let mut n = self.0.count.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        if *n == 0 {
            self.0.finished.notify_all();
        }
    }
}

/// A call's buffers as the worker sees them: raw ranges, so that no reference to
/// the output exists on the caller's side while the worker writes it.
#[derive(Clone, Copy)]
pub(super) struct Ranges {
    pub(super) input: Option<(*const u8, usize)>,
    pub(super) output: (*mut u8, usize),
}

// SAFETY: made only from slices borrowed for a scope that waits for the call to end
// before the borrows can end; the worker is the only user of the output meanwhile.
unsafe impl Send for Ranges {}

/// Asynchronous calls on borrowed buffers, issued inside [`Communicator::scope`].
///
/// Each call borrows its buffers for `'scope` and returns a [`ScopedWork`]; every
/// call is waited for before the scope ends. The methods mirror the blocking ones
/// of [`Communicator`] (same layouts and argument rules); an argument the blocking
/// call would refuse comes back as the handle's error.
pub struct Scope<'scope, 'env: 'scope> {
    comm: &'env Communicator,
    in_flight: Arc<InFlight>,
    /// Invariant in `'scope`: it cannot be shortened to admit shorter-lived buffers.
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

/// A call issued in a [`Scope`]: `wait`, `wait_timeout` or `test` it.
///
/// `wait` returns the buffer the call wrote (its output, for the rest of the
/// scope), `()` for calls that write none (send, barrier). Dropping the handle waits
/// for the call (a failure it did not report is logged at warn level); the end of the
/// scope waits for it too, so forgetting it cannot free memory in use.
/// Errors name the rank and the call (e.g. `rank 0 in all-reduce(...)`).
#[must_use = "the call runs either way; wait on it to see its result and to use its buffer again"]
pub struct ScopedWork<'scope, R> {
    /// None once completed.
    work: Option<Work<()>>,
    /// The output handed back on success (an empty range for `()`).
    lent: (*mut u8, usize),
    hand_back: fn(*mut u8, usize) -> R,
    /// Whether the result (or the error) was returned.
    spent: bool,
    scope: PhantomData<(&'scope mut (), R)>,
}

// SAFETY: the raw range stands for an `R` (a `&mut [T]` of `Element`s, or `()`),
// which may move between threads; the `Work` already may.
unsafe impl<R: Send> Send for ScopedWork<'_, R> {}

impl<R> ScopedWork<'_, R> {
    /// Whether the call has finished (successfully or not). Never blocks.
    pub fn test(&mut self) -> bool {
        self.work.as_mut().is_none_or(|w| w.test())
    }

    /// Block until the call finishes; on success its output buffer comes back.
    pub fn wait(mut self) -> Result<R> {
        let r = match self.work.take() {
            Some(w) => w.wait(),
            None => Ok(()),
        };
        r.and_then(|()| self.take_output())
    }

    /// Block until the call finishes or `timeout` passes: `Ok(Some(out))` finished,
    /// `Ok(None)` still running (wait again later), `Err(e)` failed. Once it has
    /// returned the result or the error the handle is spent: a later wait is
    /// [`crate::Error::InvalidArgument`].
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<R>> {
        let Some(w) = self.work.as_mut() else {
            return self.take_output().map(Some);
        };
        let r = w.wait_timeout(timeout);
        if !matches!(r, Ok(None)) {
            self.work = None;
        }
        if r.is_err() {
            self.spent = true;
        }
        match r? {
            Some(()) => self.take_output().map(Some),
            None => Ok(None),
        }
    }

    /// Hand the output back, once.
    fn take_output(&mut self) -> Result<R> {
        if std::mem::replace(&mut self.spent, true) {
            return Err(crate::Error::InvalidArgument("this work's result was already returned".into()));
        }
        Ok((self.hand_back)(self.lent.0, self.lent.1))
    }
}

impl<R> Drop for ScopedWork<'_, R> {
    fn drop(&mut self) {
        if let Some(w) = self.work.take() {
            if let Err(e) = w.wait() {
                tracing::warn!("an async call's handle was dropped without its result: {e}");
            }
        }
    }
}

/// What calls that write nothing hand back.
fn unit_back(_: *mut u8, _: usize) {}

/// Rebuild the output slice a completed call lent (`n` elements of `T` at `p`).
pub(super) fn slice_back<'scope, T: Element>(p: *mut u8, n: usize) -> &'scope mut [T] {
    // SAFETY: `p`/`n` came from a `&'scope mut [T]` moved into the handle, the one
    // reference to that memory; the call using it has completed (its result was
    // received, so its writes happened before), and the handle hands it back once.
    unsafe { std::slice::from_raw_parts_mut(p as *mut T, n) }
}

impl Communicator {
    /// Run `f` with a [`Scope`] in which asynchronous calls borrow buffers (slices
    /// of larger ones included), and wait for every call issued in it before
    /// returning.
    ///
    /// # Why a scope
    /// A handle that only borrowed the buffer and waited in `Drop` would be unsound:
    /// `std::mem::forget(handle)` skips `Drop`, ends the borrow, and safe code could then
    /// free or reuse memory the worker still writes. So the borrow is tied to a scope, as
    /// [`std::thread::scope`] ties threads to one: buffers are borrowed for the scope's
    /// lifetime `'scope` (which outlives the closure), and this call waits
    /// for every call issued in it before it returns — or unwinds, when the closure
    /// panics. The handle's `wait` hands the output slice back (for `'scope`), so the
    /// caller may use it again inside the scope after the call completed. Forgetting a
    /// handle is then harmless: its slice stays borrowed (by the forgotten handle) until
    /// the scope ends, and the scope waits for the call. The caller only ever sees a
    /// `&Scope`, so the scope itself cannot be forgotten. `'scope` is invariant, so a
    /// buffer cannot be borrowed for less than the whole scope.
    ///
    /// The wait at the end of a scope is bounded by the calls' own deadlines: every call
    /// fails by the communicator's timeout (`BRAID_TIMEOUT`) or as soon as it is aborted.
    ///
    /// ```
    /// use braid::{Communicator, ReduceOp};
    /// let comm = Communicator::in_process(1)?.pop().unwrap();
    /// let mut grads = vec![1i32; 8];
    /// comm.scope(|s| -> braid::Result<()> {
    ///    let (head, tail) = grads.split_at_mut(4);
    ///    let work = s.all_reduce_in_place(head, ReduceOp::Sum);
    ///    tail.fill(7); // the rest of the buffer is usable while the call runs
    ///    let head = work.wait()?; // the slice comes back
    ///    head[0] += 1;
    ///    Ok(())
    /// })?;
    /// assert_eq!(grads, [2, 1, 1, 1, 7, 7, 7, 7]);
    /// # Ok::<(), braid::Error>(())
    /// ```
    ///
    /// The borrow checker refuses touching a slice before its call was waited on:
    ///
    /// ```compile_fail,E0499
    /// use braid::{Communicator, ReduceOp};
    /// let comm = Communicator::in_process(1)?.pop().unwrap();
    /// let mut grads = vec![1i32; 8];
    /// comm.scope(|s| -> braid::Result<()> {
    ///    let work = s.all_reduce_in_place(&mut grads[..4], ReduceOp::Sum);
    ///    grads[0] = 5; // error: `grads` is still lent to the call in flight
    ///    work.wait()?;
    ///    Ok(())
    /// })?;
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn scope<'env, F, R>(&'env self, f: F) -> R
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
    {
        let scope = Scope { comm: self, in_flight: Arc::default(), scope: PhantomData, env: PhantomData };
        let r = catch_unwind(AssertUnwindSafe(|| f(&scope)));
        // Before any borrowed buffer can be used, freed or unwound past.
        scope.in_flight.wait_all();
        r.unwrap_or_else(|panic| resume_unwind(panic))
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Issue `sig` on `ranges` on the worker; `lent` is what the handle hands back.
    fn issue<R>(
        &'scope self,
        sig: CallSig,
        ranges: Ranges,
        lent: (*mut u8, usize),
        hand_back: fn(*mut u8, usize) -> R,
    ) -> ScopedWork<'scope, R> {
        self.issue_with(ranges, lent, hand_back, move |core, ticket, input, output| {
            if matches!(sig.op, OpKind::Send | OpKind::Recv) {
                let buf = input.map_or((output.as_mut_ptr(), output.len()), |i| (i.as_ptr() as *mut u8, i.len()));
                core.p2p_at(ticket, sig.op, buf, sig.dtype, sig.root as usize, None)
            } else {
                core.collective_at(ticket, sig, input, output)
            }
        })
    }

    /// Run `job` on the worker with the call's turn and its buffers (`ranges`, as
    /// slices again); `lent` is what the handle hands back.
    pub(super) fn issue_with<R>(
        &'scope self,
        ranges: Ranges,
        lent: (*mut u8, usize),
        hand_back: fn(*mut u8, usize) -> R,
        job: impl FnOnce(&Core, u64, Option<&[u8]>, &mut [u8]) -> Result<()> + Send + 'static,
    ) -> ScopedWork<'scope, R> {
        let call = self.in_flight.enter();
        let work = self.comm.spawn(move |core: &Core, ticket| {
            let _call = call;
            // The whole `Ranges` (which is Send), not its fields (which are not).
            let ranges = ranges;
            let Ranges { input, output } = ranges;
            // SAFETY: borrowed from the caller for `'scope`, which does not end before
            // this job has (the scope waits for `_call`); input and output come from
            // a `&[T]` and a `&mut [T]` (or the output alone), so they do not overlap.
            let (input, output) = unsafe {
                (
                    input.map(|(p, n)| std::slice::from_raw_parts(p, n)),
                    std::slice::from_raw_parts_mut(output.0, output.1),
                )
            };
            job(core, ticket, input, output)
        });
        ScopedWork { work: Some(work), lent, hand_back, spent: false, scope: PhantomData }
    }

    /// A typed collective: `count` elements per call as the blocking form counts them.
    fn typed<T: Element>(
        &'scope self,
        op: OpKind,
        count: Result<usize>,
        root: usize,
        rop: ReduceOp,
        input: Option<&'scope [T]>,
        output: &'scope mut [T],
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let out = (output.as_mut_ptr() as *mut u8, output.len());
        let count = match count {
            Ok(c) => c,
            Err(e) => return refused(e, out),
        };
        let root = u32::try_from(root).unwrap_or(u32::MAX);
        let sig = CallSig::new(op, T::DTYPE, count as u64, root, rop);
        let input = input.map(|i| (i.as_ptr() as *const u8, std::mem::size_of_val(i)));
        let ranges = Ranges { input, output: (out.0, out.1 * T::DTYPE.size()) };
        self.issue(sig, ranges, out, slice_back::<T>)
    }

    /// [`Communicator::all_reduce`], asynchronously; `wait` returns `output`.
    pub fn all_reduce<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        op: ReduceOp,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::AllReduce, Ok(input.len()), 0, op, Some(input), output)
    }
    /// [`Communicator::all_reduce_in_place`], asynchronously; `wait` returns `buf`.
    pub fn all_reduce_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: ReduceOp,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::AllReduce, Ok(buf.len()), 0, op, None, buf)
    }
    /// [`Communicator::broadcast`] (in place), asynchronously.
    pub fn broadcast<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        root: usize,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::Broadcast, Ok(buf.len()), root, ReduceOp::Sum, None, buf)
    }
    /// [`Communicator::broadcast_out_of_place`], asynchronously.
    pub fn broadcast_out_of_place<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        root: usize,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::Broadcast, Ok(output.len()), root, ReduceOp::Sum, Some(input), output)
    }
    /// [`Communicator::all_gather`], asynchronously.
    pub fn all_gather<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::AllGather, Ok(input.len()), 0, ReduceOp::Sum, Some(input), output)
    }
    /// [`Communicator::all_gather_in_place`], asynchronously.
    pub fn all_gather_in_place<T: Element>(&'scope self, buf: &'scope mut [T]) -> ScopedWork<'scope, &'scope mut [T]> {
        let c = self.comm.core.block(buf.len());
        self.typed(OpKind::AllGather, c, 0, ReduceOp::Sum, None, buf)
    }
    /// [`Communicator::reduce_scatter`], asynchronously.
    pub fn reduce_scatter<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        op: ReduceOp,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::ReduceScatter, Ok(output.len()), 0, op, Some(input), output)
    }
    /// [`Communicator::reduce_scatter_in_place`], asynchronously.
    pub fn reduce_scatter_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: ReduceOp,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let c = self.comm.core.block(buf.len());
        self.typed(OpKind::ReduceScatter, c, 0, op, None, buf)
    }
    /// [`Communicator::reduce`], asynchronously.
    pub fn reduce<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        op: ReduceOp,
        root: usize,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::Reduce, Ok(input.len()), root, op, Some(input), output)
    }
    /// [`Communicator::reduce_in_place`], asynchronously.
    pub fn reduce_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: ReduceOp,
        root: usize,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::Reduce, Ok(buf.len()), root, op, None, buf)
    }
    /// [`Communicator::gather`], asynchronously; `wait` returns `output` (empty
    /// off the root, as the blocking form allows).
    pub fn gather<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        root: usize,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::Gather, Ok(input.len()), root, ReduceOp::Sum, Some(input), output)
    }
    /// [`Communicator::gather_in_place`], asynchronously; `wait` returns `buf`.
    pub fn gather_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        root: usize,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let c = if root == self.comm.rank() { self.comm.core.block(buf.len()) } else { Ok(buf.len()) };
        self.typed(OpKind::Gather, c, root, ReduceOp::Sum, None, buf)
    }
    /// [`Communicator::scatter`], asynchronously; `wait` returns `output`.
    pub fn scatter<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        root: usize,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        self.typed(OpKind::Scatter, Ok(output.len()), root, ReduceOp::Sum, Some(input), output)
    }
    /// [`Communicator::scatter_in_place`], asynchronously; `wait` returns `buf`.
    pub fn scatter_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        root: usize,
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let c = if root == self.comm.rank() { self.comm.core.block(buf.len()) } else { Ok(buf.len()) };
        self.typed(OpKind::Scatter, c, root, ReduceOp::Sum, None, buf)
    }
    /// [`Communicator::all_to_all`], asynchronously.
    pub fn all_to_all<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> ScopedWork<'scope, &'scope mut [T]> {
        let c = self.comm.core.block(input.len());
        self.typed(OpKind::AllToAll, c, 0, ReduceOp::Sum, Some(input), output)
    }
    /// [`Communicator::all_to_all_in_place`], asynchronously.
    pub fn all_to_all_in_place<T: Element>(&'scope self, buf: &'scope mut [T]) -> ScopedWork<'scope, &'scope mut [T]> {
        let c = self.comm.core.block(buf.len());
        self.typed(OpKind::AllToAll, c, 0, ReduceOp::Sum, None, buf)
    }
    /// [`Communicator::barrier`], asynchronously.
    pub fn barrier(&'scope self) -> ScopedWork<'scope, ()> {
        let sig = CallSig::new(OpKind::Barrier, DType::U8, 0, 0, ReduceOp::Sum);
        let ranges = Ranges { input: None, output: nothing() };
        self.issue(sig, ranges, nothing(), unit_back)
    }
    /// [`Communicator::send`], asynchronously: `buf` stays shared-borrowed (readable)
    /// for the scope.
    pub fn send<T: Element>(&'scope self, buf: &'scope [T], peer: usize) -> ScopedWork<'scope, ()> {
        let sig = self.p2p_sig::<T>(OpKind::Send, buf.len(), peer);
        let input = Some((buf.as_ptr() as *const u8, std::mem::size_of_val(buf)));
        let ranges = Ranges { input, output: nothing() };
        self.issue(sig, ranges, nothing(), unit_back)
    }
    /// [`Communicator::recv`], asynchronously; `wait` returns `buf`.
    pub fn recv<T: Element>(&'scope self, buf: &'scope mut [T], peer: usize) -> ScopedWork<'scope, &'scope mut [T]> {
        let sig = self.p2p_sig::<T>(OpKind::Recv, buf.len(), peer);
        let out = (buf.as_mut_ptr() as *mut u8, buf.len());
        let ranges = Ranges { input: None, output: (out.0, std::mem::size_of_val(buf)) };
        self.issue(sig, ranges, out, slice_back::<T>)
    }

    /// [`Communicator::batch_p2p`], asynchronously: every send and receive of `ops`
    /// posted together. The buffers stay borrowed for the whole scope (a group
    /// writes many, of any types): read what it received after the scope returns.
    ///
    /// ```
    /// use braid::{Communicator, P2p};
    /// let comms = Communicator::in_process(2)?;
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || -> braid::Result<()> {
    ///             let other = 1 - c.rank();
    ///             let (mine, mut theirs) = (vec![c.rank() as i64; 1000], vec![0i64; 1000]);
    ///             c.scope(|s| {
    ///                 let group = s.batch_p2p(vec![P2p::recv(&mut theirs, other), P2p::send(&mine, other)]);
    ///                 // ... compute while the messages move ...
    ///                 group.wait()
    ///             })?;
    ///             assert!(theirs.iter().all(|v| *v == other as i64));
    ///             Ok(())
    ///         });
    ///     }
    /// });
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn batch_p2p(&'scope self, ops: Vec<P2p<'scope>>) -> ScopedWork<'scope, ()> {
        // Checked (or refused) now, before the buffers reach the worker.
        let group = self.comm.core.check_group(&ops);
        let call = self.in_flight.enter();
        let work = self.comm.spawn(move |core: &Core, ticket| {
            let _call = call;
            core.group_at(ticket, group)
        });
        ScopedWork { work: Some(work), lent: nothing(), hand_back: unit_back, spent: false, scope: PhantomData }
    }

    /// Send/recv carry the peer where collectives carry the root (checked by `p2p_at`).
    fn p2p_sig<T: Element>(&self, op: OpKind, count: usize, peer: usize) -> CallSig {
        CallSig::new(op, T::DTYPE, count as u64, u32::try_from(peer).unwrap_or(u32::MAX), ReduceOp::Sum)
    }
}

/// A call refused before it was issued (as the blocking form refuses it): no ticket
/// taken, the buffer never lent to the worker.
pub(super) fn refused<'scope, T: Element>(
    e: crate::Error,
    out: (*mut u8, usize),
) -> ScopedWork<'scope, &'scope mut [T]> {
    let (_, rx) = mpsc::channel();
    let work = Some(Work { rx, done: Some(Err(e)) });
    ScopedWork { work, lent: out, hand_back: slice_back::<T>, spent: false, scope: PhantomData }
}

/// The empty range of calls that write nothing.
fn nothing() -> (*mut u8, usize) {
    (std::ptr::NonNull::dangling().as_ptr(), 0)
}
