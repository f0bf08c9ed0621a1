//! The `*v` collectives, MPI's meaning: counts and displacements are in elements,
//! each a `size_t` array of `world_size` entries (a NULL array is
//! `BRAID_ERR_INVALID_ARGUMENT` naming it). Displacements may leave gaps and come
//! in any order; blocks must not overlap. A NULL buffer is refused unless its
//! counts give it zero bytes; sizes that overflow are refused before anything runs.
//! Each has an `_async` form that returns a work handle (as `braid_all_reduce_async`);
//! it copies the arrays before it returns, so the caller may free them at once.
//! Not allowed between `braid_group_start` and `braid_group_end`.

use std::ffi::c_void;

use braid::{Communicator, Work};

use crate::braid_result::{self, *};
use crate::collectives::GROUP_ONLY_P2P;
use crate::comm::{braid_comm, live};
use crate::work::braid_work;
use crate::{dtype_of, entry, op_of, put, DTypeArg, Fail, OpArg, Res};

/// The `world_size` entries of the array `what` at `p`.
///
/// # Safety
/// `p` is NULL or valid for reading `world_size` entries while the call runs.
unsafe fn per_rank<'a>(what: &str, p: *const usize, c: &Communicator) -> Res<&'a [usize]> {
    if p.is_null() {
        return Err(Fail::invalid(format!("{what} is NULL (it needs {} entries, one per rank)", c.world_size())));
    }
    // SAFETY: not NULL; valid for `world_size` entries (the caller's promise).
    Ok(unsafe { std::slice::from_raw_parts(p, c.world_size()) })
}

/// Run `body` on the live communicator as entry point `name`, refusing it inside a group.
///
/// # Safety
/// `comm` is NULL or a live handle.
unsafe fn run_v(name: &str, comm: *mut braid_comm, body: impl FnOnce(&Communicator) -> Res<()>) -> braid_result {
    entry(name, || {
        if crate::group::open() {
            return crate::group::queue(name, comm, Err(Fail::invalid(GROUP_ONLY_P2P)));
        }
        // SAFETY: the caller's promise on `comm`.
        body(unsafe { live(comm)? })?;
        Ok(BRAID_SUCCESS)
    })
}

/// Run `body` as [`run_v`] does, and hand the work it issued back through `work`
/// (NULL there on failure).
///
/// # Safety
/// `comm` is NULL or a live handle; `work` is NULL or valid for writing a pointer.
unsafe fn run_v_async(
    name: &str,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
    body: impl FnOnce(&Communicator) -> Res<Work<()>>,
) -> braid_result {
    entry(name, || {
        // SAFETY: the caller's promise on `work`.
        unsafe { put(work, "work", std::ptr::null_mut())? };
        if crate::group::open() {
            return crate::group::queue(name, comm, Err(Fail::invalid(GROUP_ONLY_P2P)));
        }
        // SAFETY: the caller's promise on `comm`.
        let w = body(unsafe { live(comm)? })?;
        // SAFETY: the caller's promise on `work`.
        unsafe { put(work, "work", braid_work::new(w))? };
        Ok(BRAID_SUCCESS)
    })
}

/// All-gather-v (MPI_Allgatherv): `recv` receives rank `j`'s `send`
/// (`recv_counts[j]` elements) at element `displs[j]`; this rank's `send_count`
/// must equal `recv_counts[rank]`. Every rank passes the same `recv_counts`. In
/// place (MPI_IN_PLACE): `send == recv`, this rank's block already at `displs[rank]`.
///
/// # Safety
/// `comm` is NULL or a live handle; `recv_counts` and `displs` are NULL or valid for
/// `world_size` entries; `send` is NULL or valid for `send_count` elements and
/// `recv` for the furthest `displs[j] + recv_counts[j]`, while the call runs.
#[no_mangle]
pub unsafe extern "C" fn braid_all_gather_v(
    send: *const c_void,
    send_count: usize,
    recv: *mut c_void,
    recv_counts: *const usize,
    displs: *const usize,
    dtype: DTypeArg,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe {
        run_v("braid_all_gather_v", comm, |c| {
            let (counts, displs) = (per_rank("recv_counts", recv_counts, c)?, per_rank("displs", displs, c)?);
            Ok(c.all_gather_v_raw(send.cast(), send_count, recv.cast(), counts, displs, dtype_of(dtype)?)?)
        })
    }
}

/// Reduce-scatter-v (MPI_Reduce_scatter): `send` holds blocks of `recv_counts[j]`
/// elements packed in rank order; the reduction with `op` of every rank's `send`
/// is computed and block `rank` lands in `recv` (`recv_counts[rank]` elements).
/// Every rank passes the same `recv_counts`. In place (MPI_IN_PLACE): `send ==
/// recv`, the result left at the start of the buffer.
///
/// # Safety
/// `comm` is NULL or a live handle; `recv_counts` is NULL or valid for `world_size`
/// entries; `send` is NULL or valid for the sum of `recv_counts` elements and
/// `recv` for `recv_counts[rank]`, while the call runs.
#[no_mangle]
pub unsafe extern "C" fn braid_reduce_scatter_v(
    send: *const c_void,
    recv: *mut c_void,
    recv_counts: *const usize,
    dtype: DTypeArg,
    op: OpArg,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe {
        run_v("braid_reduce_scatter_v", comm, |c| {
            let counts = per_rank("recv_counts", recv_counts, c)?;
            Ok(c.reduce_scatter_v_raw(send.cast(), recv.cast(), counts, dtype_of(dtype)?, op_of(op)?)?)
        })
    }
}

/// All-to-all-v (MPI_Alltoallv): `send_counts[j]` elements at element
/// `send_displs[j]` of `send` go to rank `j`; rank `j`'s block arrives in `recv` at
/// `recv_displs[j]` (`recv_counts[j]` elements, which must equal rank `j`'s
/// `send_counts[rank]`). No in-place form: the buffers must not overlap.
///
/// # Safety
/// `comm` is NULL or a live handle; the four arrays are NULL or valid for
/// `world_size` entries; `send` and `recv` are NULL or valid for their furthest
/// `displs[j] + counts[j]` elements, while the call runs.
#[no_mangle]
pub unsafe extern "C" fn braid_all_to_all_v(
    send: *const c_void,
    send_counts: *const usize,
    send_displs: *const usize,
    recv: *mut c_void,
    recv_counts: *const usize,
    recv_displs: *const usize,
    dtype: DTypeArg,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe {
        run_v("braid_all_to_all_v", comm, |c| {
            let sc = per_rank("send_counts", send_counts, c)?;
            let sd = per_rank("send_displs", send_displs, c)?;
            let rc = per_rank("recv_counts", recv_counts, c)?;
            let rd = per_rank("recv_displs", recv_displs, c)?;
            Ok(c.all_to_all_v_raw(send.cast(), sc, sd, recv.cast(), rc, rd, dtype_of(dtype)?)?)
        })
    }
}

/// `braid_all_gather_v`, asynchronously: `*work` receives the handle to wait on.
/// The arrays are copied before this returns; the buffers are the call's until the
/// work completes.
///
/// # Safety
/// As `braid_all_gather_v`, with the buffers valid until the work completes;
/// `work` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_all_gather_v_async(
    send: *const c_void,
    send_count: usize,
    recv: *mut c_void,
    recv_counts: *const usize,
    displs: *const usize,
    dtype: DTypeArg,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe {
        run_v_async("braid_all_gather_v_async", comm, work, |c| {
            let (counts, displs) = (per_rank("recv_counts", recv_counts, c)?, per_rank("displs", displs, c)?);
            Ok(c.all_gather_v_async_raw(send.cast(), send_count, recv.cast(), counts, displs, dtype_of(dtype)?)?)
        })
    }
}

/// `braid_reduce_scatter_v`, asynchronously: `*work` receives the handle to wait
/// on. `recv_counts` is copied before this returns; the buffers are the call's
/// until the work completes.
///
/// # Safety
/// As `braid_reduce_scatter_v`, with the buffers valid until the work completes;
/// `work` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_reduce_scatter_v_async(
    send: *const c_void,
    recv: *mut c_void,
    recv_counts: *const usize,
    dtype: DTypeArg,
    op: OpArg,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe {
        run_v_async("braid_reduce_scatter_v_async", comm, work, |c| {
            let counts = per_rank("recv_counts", recv_counts, c)?;
            Ok(c.reduce_scatter_v_async_raw(send.cast(), recv.cast(), counts, dtype_of(dtype)?, op_of(op)?)?)
        })
    }
}

/// `braid_all_to_all_v`, asynchronously: `*work` receives the handle to wait on.
/// The four arrays are copied before this returns; the buffers are the call's
/// until the work completes.
///
/// # Safety
/// As `braid_all_to_all_v`, with the buffers valid until the work completes;
/// `work` is NULL or valid for writing a pointer.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn braid_all_to_all_v_async(
    send: *const c_void,
    send_counts: *const usize,
    send_displs: *const usize,
    recv: *mut c_void,
    recv_counts: *const usize,
    recv_displs: *const usize,
    dtype: DTypeArg,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe {
        run_v_async("braid_all_to_all_v_async", comm, work, |c| {
            let sc = per_rank("send_counts", send_counts, c)?;
            let sd = per_rank("send_displs", send_displs, c)?;
            let rc = per_rank("recv_counts", recv_counts, c)?;
            let rd = per_rank("recv_displs", recv_displs, c)?;
            Ok(c.all_to_all_v_async_raw(send.cast(), sc, sd, recv.cast(), rc, rd, dtype_of(dtype)?)?)
        })
    }
}
