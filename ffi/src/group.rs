//! Grouped send/recv as NCCL has them, and tags.
//!
//! Between `braid_group_start()` and `braid_group_end()` (per thread, and nestable,
//! as NCCL's `ncclGroupStart`/`ncclGroupEnd`), `braid_send`, `braid_recv`,
//! `braid_send_tagged` and `braid_recv_tagged` only queue their message and return;
//! the outermost `braid_group_end` posts every queued message of a communicator
//! together and returns when all have completed (groups on several communicators
//! run at the same time). So a ring of large messages, or an exchange with every
//! rank, cannot deadlock whatever the order. Buffers stay the caller's to keep
//! valid, and untouched, until `braid_group_end` returns; a communicator may not be
//! destroyed while messages of it are queued.
//!
//! A call refused while queueing (a bad dtype, peer or buffer), a receive whose
//! buffer overlaps another message of the group, or a message to the calling rank
//! fails the whole group: `braid_group_end` then runs nothing of it and says why.
//! Collectives and `*_async` calls are refused inside a group.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};

use braid::{Communicator, DType, P2p};

use crate::braid_result::{self, *};
use crate::comm::{braid_comm, live};
use crate::work::braid_work;
use crate::{dtype_of, entry, put, rank_of, DTypeArg, Fail, Res};

/// The open group of this thread.
#[derive(Default)]
struct Group {
    /// `braid_group_start` calls not yet ended.
    depth: usize,
    /// Queued messages, by communicator handle, in queueing order.
    queued: Vec<(*mut braid_comm, P2p<'static>)>,
    /// The first call of the group that failed, if any: the group then runs nothing.
    failed: Option<Fail>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Whether this thread has a group open.
pub(crate) fn open() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Inside an open group: queue the message `op` made (or record why it could not
/// be made, failing the group) and return.
pub(crate) fn queue(name: &str, comm: *mut braid_comm, op: Res<P2p<'static>>) -> Res<braid_result> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match op {
            Ok(op) => {
                g.queued.push((comm, op));
                Ok(BRAID_SUCCESS)
            }
            Err(f) => {
                let why = Fail { msg: format!("{name} (message {} of the group): {}", g.queued.len(), f.msg), ..f };
                g.failed.get_or_insert(why.clone());
                Err(why)
            }
        }
    })
}

/// A send (`send`) or receive message from C's arguments, checked against `c`.
///
/// # Safety
/// `buf` is NULL or valid for `count` elements (reading for a send, writing for a
/// receive) until the message has run.
pub(crate) unsafe fn message(
    c: &Communicator,
    send: bool,
    (buf, count, dtype): (*mut c_void, usize, DType),
    peer: c_int,
    tag: u32,
) -> Res<P2p<'static>> {
    let peer = rank_of("peer", peer, c)?;
    // SAFETY: the caller's promise.
    let op = unsafe {
        if send {
            P2p::send_raw(buf as *const u8, count, dtype, peer)
        } else {
            P2p::recv_raw(buf as *mut u8, count, dtype, peer)
        }
    };
    Ok(op?.tag(tag))
}

/// Queue or run one tagged message.
///
/// # Safety
/// As [`message`], and `comm` is NULL or a live handle.
unsafe fn tagged(
    name: &str,
    comm: *mut braid_comm,
    send: bool,
    (buf, count, dtype): (*mut c_void, usize, DTypeArg),
    peer: c_int,
    tag: u32,
) -> braid_result {
    entry(name, || {
        // SAFETY: the caller's promises on `comm` and the buffer.
        let made = unsafe { live(comm) }.and_then(|c| {
            let op = dtype_of(dtype).and_then(|d| unsafe { message(c, send, (buf, count, d), peer, tag) })?;
            Ok((c, op))
        });
        if open() {
            return queue(name, comm, made.map(|(_, op)| op));
        }
        let (c, op) = made?;
        c.batch_p2p(&mut [op])?;
        Ok(BRAID_SUCCESS)
    })
}

/// Open a group on this thread (or nest one inside the open group): until the
/// matching `braid_group_end`, sends and receives are queued, not run.
#[no_mangle]
pub extern "C" fn braid_group_start() -> braid_result {
    entry("braid_group_start", || {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(BRAID_SUCCESS)
    })
}

/// Close this thread's innermost open group: the outermost close hands back its
/// queued messages (None for a nested one), or the failure recorded while queueing.
fn close_group() -> Res<Option<Vec<(*mut braid_comm, P2p<'static>)>>> {
    let group = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Fail::invalid("no group is open on this thread (call braid_group_start first)"));
        }
        g.depth -= 1;
        Ok((g.depth == 0).then(|| std::mem::take(&mut *g)))
    })?;
    let Some(Group { queued, failed, .. }) = group else { return Ok(None) };
    if let Some(f) = failed {
        return Err(Fail { msg: format!("nothing of the group ran: {}", f.msg), ..f });
    }
    Ok(Some(queued))
}

/// End the group `braid_group_start` opened. The outermost end posts every
/// queued message together (each communicator's in one call, all communicators
/// at once) and returns when all have completed, with the first failure if any.
/// If a call of the group failed, or the group is refused (a message to this
/// rank, a receive overlapping another message's buffer), nothing of it runs.
#[no_mangle]
pub extern "C" fn braid_group_end() -> braid_result {
    entry("braid_group_end", || {
        let Some(queued) = close_group()? else { return Ok(BRAID_SUCCESS) };
        let mut by_comm: Vec<(*mut braid_comm, Vec<P2p<'static>>)> = Vec::new();
        for (comm, op) in queued {
            match by_comm.iter_mut().find(|(c, _)| *c == comm) {
                Some((_, ops)) => ops.push(op),
                None => by_comm.push((comm, vec![op])),
            }
        }
        let mut comms = Vec::with_capacity(by_comm.len());
        for (comm, ops) in by_comm {
            // SAFETY: queued from a live handle, which the caller keeps until the group ends.
            comms.push((unsafe { live(comm)? }, ops));
        }
        let results: Vec<braid::Result<()>> = match &mut comms[..] {
            [] => Vec::new(),
            [(c, ops)] => vec![c.batch_p2p(ops)],
            // Each communicator's group on its own thread: one might wait on another.
            many => std::thread::scope(|s| {
                let running: Vec<_> = many.iter_mut().map(|(c, ops)| s.spawn(move || c.batch_p2p(ops))).collect();
                running.into_iter().map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
            }),
        };
        results.into_iter().collect::<braid::Result<Vec<()>>>()?;
        Ok(BRAID_SUCCESS)
    })
}

/// `braid_group_end`, asynchronously: the outermost end issues every queued
/// message together and `*work` receives the one handle that completes when all
/// have (`braid_work_wait`, then `braid_work_free`); the buffers stay braid's until
/// then. The group's messages must all be on one communicator (else
/// `BRAID_ERR_INVALID_ARGUMENT` and nothing runs). Ending a nested group gives
/// `*work = NULL` (nothing is issued yet). This is how a receive posted before a
/// send to the same peer completes without a deadlock: both go in one group.
///
/// # Safety
/// `work` is NULL or valid for writing a pointer; the queued messages' buffers
/// are valid until the work completes.
#[no_mangle]
pub unsafe extern "C" fn braid_group_end_async(work: *mut *mut braid_work) -> braid_result {
    entry("braid_group_end_async", || {
        // SAFETY: the caller's promise on `work`.
        unsafe { put(work, "work", std::ptr::null_mut())? };
        let Some(queued) = close_group()? else { return Ok(BRAID_SUCCESS) };
        let Some(&(comm, _)) = queued.first() else { return Ok(BRAID_SUCCESS) };
        if queued.iter().any(|(c, _)| *c != comm) {
            return Err(Fail::invalid(
                "braid_group_end_async: the group's messages are on several communicators \
                 (use braid_group_end, or one group per communicator)",
            ));
        }
        // SAFETY: the caller's promise on the handles queued in the group.
        let c = unsafe { live(comm)? };
        let ops: Vec<P2p<'static>> = queued.into_iter().map(|(_, op)| op).collect();
        // SAFETY: the buffers stay valid until the work completes (the caller's promise).
        let w = unsafe { c.batch_p2p_async_raw(ops) };
        // SAFETY: checked non-null by `put` above.
        unsafe { put(work, "work", braid_work::new(w))? };
        Ok(BRAID_SUCCESS)
    })
}

/// `braid_send` with a tag, which the receive it pairs with must carry too. Tags
/// are checked, not used to choose: a receive pairs with the peer's sends to this
/// rank in posting order (unlike MPI), and a receive whose tag differs fails with
/// `BRAID_ERR_MISMATCH` naming both tags (the sender's call, or its next one,
/// fails too). `braid_send` and `braid_recv` carry tag 0. Host buffers.
///
/// # Safety
/// `comm` is NULL or a live handle; `buf` is NULL or valid for reading `count`
/// elements (inside a group: until `braid_group_end` returns).
#[no_mangle]
pub unsafe extern "C" fn braid_send_tagged(
    buf: *const c_void,
    count: usize,
    dtype: DTypeArg,
    peer: c_int,
    tag: u32,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { tagged("braid_send_tagged", comm, true, (buf as *mut c_void, count, dtype), peer, tag) }
}

/// `braid_recv` with a tag: see `braid_send_tagged`.
///
/// # Safety
/// `comm` is NULL or a live handle; `buf` is NULL or valid for writing `count`
/// elements (inside a group: until `braid_group_end` returns).
#[no_mangle]
pub unsafe extern "C" fn braid_recv_tagged(
    buf: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    peer: c_int,
    tag: u32,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { tagged("braid_recv_tagged", comm, false, (buf, count, dtype), peer, tag) }
}

/// `braid_send_tagged`, asynchronously: `*work` receives the handle to wait on
/// (`braid_work_wait`, then `braid_work_free`). Its place among this rank's calls
/// is taken now. Not inside a group (`braid_group_end` is what completes those).
///
/// # Safety
/// As `braid_send_tagged`, with `buf` valid until the work completes; `work` is
/// NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_send_tagged_async(
    buf: *const c_void,
    count: usize,
    dtype: DTypeArg,
    peer: c_int,
    tag: u32,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { tagged_async("braid_send_tagged_async", comm, true, (buf as *mut c_void, count, dtype), peer, tag, work) }
}

/// `braid_recv_tagged`, asynchronously: see `braid_send_tagged_async`.
///
/// # Safety
/// As `braid_recv_tagged`, with `buf` valid until the work completes; `work` is
/// NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_recv_tagged_async(
    buf: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    peer: c_int,
    tag: u32,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { tagged_async("braid_recv_tagged_async", comm, false, (buf, count, dtype), peer, tag, work) }
}

/// Issue one tagged message on the worker thread, its handle into `work`.
///
/// # Safety
/// As the `_async` entry points document.
unsafe fn tagged_async(
    name: &str,
    comm: *mut braid_comm,
    send: bool,
    (buf, count, dtype): (*mut c_void, usize, DTypeArg),
    peer: c_int,
    tag: u32,
    work: *mut *mut braid_work,
) -> braid_result {
    entry(name, || {
        // SAFETY: the caller's promise on `work`.
        unsafe { put(work, "work", std::ptr::null_mut())? };
        if open() {
            return Err(Fail::invalid(crate::collectives::GROUP_ONLY_P2P));
        }
        // SAFETY: the caller's promise on `comm`.
        let c = unsafe { live(comm)? };
        // SAFETY: the caller's promise on the buffer.
        let op = dtype_of(dtype).and_then(|d| unsafe { message(c, send, (buf, count, d), peer, tag) })?;
        // SAFETY: the buffer stays valid until the work completes (the caller's promise).
        let w = unsafe { c.batch_p2p_async_raw(vec![op]) };
        // SAFETY: checked non-null by `put` above.
        unsafe { put(work, "work", braid_work::new(w))? };
        Ok(BRAID_SUCCESS)
    })
}

/// Receive `count` elements into `buf` from whichever rank first sends this rank a
/// message tagged `tag`, and write that rank into `*source` (MPI's
/// `MPI_ANY_SOURCE`, torch's `recv(src=None)`). Each peer's sends are still taken
/// in the order it made them: a peer whose next send carries another tag is
/// passed over. Fails at once when no peer could still send a match
/// (`BRAID_ERR_MISMATCH` naming one whose next send differs, or a peer that
/// closed), after the communicator's timeout when none sends (`BRAID_ERR_TIMEOUT`),
/// and as `braid_recv_tagged` when the send has another count or dtype. Host
/// buffers; refused inside a group (which it fails, as collectives do).
///
/// # Safety
/// `comm` is NULL or a live handle; `buf` is NULL or valid for writing `count`
/// elements; `source` is NULL or valid for writing an int.
#[no_mangle]
pub unsafe extern "C" fn braid_recv_any(
    comm: *mut braid_comm,
    buf: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    tag: u32,
    source: *mut c_int,
) -> braid_result {
    entry("braid_recv_any", || {
        if open() {
            return queue("braid_recv_any", comm, Err(Fail::invalid(crate::collectives::GROUP_ONLY_P2P)));
        }
        // Checked before anything is received: a message taken must be reported.
        if source.is_null() {
            return Err(Fail::invalid("source is NULL"));
        }
        // SAFETY: the caller's promise on `comm`.
        let c = unsafe { live(comm)? };
        let d = dtype_of(dtype)?;
        // SAFETY: the caller's promise on `buf`.
        let from = unsafe { c.recv_any_raw(buf.cast(), count, d, tag)? };
        // SAFETY: checked not NULL; the caller's promise.
        unsafe { put(source, "source", c_int::try_from(from).unwrap_or(c_int::MAX))? };
        Ok(BRAID_SUCCESS)
    })
}
