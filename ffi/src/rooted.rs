//! Gather and scatter, the rooted collectives that move distinct blocks: `count`
//! is one rank's block, and the root's buffer holds `world_size` blocks in rank
//! order. In place (`send == recv`, MPI_IN_PLACE's meaning) the root's own block is
//! at block `root` of that buffer; off the root, `send == recv` is the rank's block.

use std::ffi::{c_int, c_void};

use crate::braid_result;
use crate::collectives::{issue, Call};
use crate::comm::braid_comm;
use crate::work::braid_work;
use crate::DTypeArg;

/// Gather: `root`'s `recv` (`world_size * count` elements) receives every rank's
/// `send` (`count` elements) in rank order. `recv` is written only on `root` (NULL
/// elsewhere is fine). In place at the root: `send == recv`, or `send == recv +
/// root * count` elements, with the root's block already at block `root`.
///
/// # Safety
/// As `braid_all_reduce`, with the root's `recv` valid for `world_size * count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_gather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    root: c_int,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_gather", comm, None, Call::Gather(send, recv, count, dtype, root)) }
}

/// Scatter: block `j` of `root`'s `send` (`world_size * count` elements) goes to
/// rank `j`'s `recv` (`count` elements). `send` is read only on `root` (NULL
/// elsewhere is fine). In place at the root: `send == recv`, or `recv == send +
/// root * count` elements; the root's block stays at block `root`.
///
/// # Safety
/// As `braid_all_reduce`, with the root's `send` valid for `world_size * count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_scatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    root: c_int,
    comm: *mut braid_comm,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_scatter", comm, None, Call::Scatter(send, recv, count, dtype, root)) }
}

/// `braid_gather`, asynchronously.
///
/// # Safety
/// As `braid_all_reduce_async`, with the root's `recv` valid for `world_size * count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_gather_async(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    root: c_int,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_gather_async", comm, Some(work), Call::Gather(send, recv, count, dtype, root)) }
}

/// `braid_scatter`, asynchronously.
///
/// # Safety
/// As `braid_all_reduce_async`, with the root's `send` valid for `world_size * count` elements.
#[no_mangle]
pub unsafe extern "C" fn braid_scatter_async(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DTypeArg,
    root: c_int,
    comm: *mut braid_comm,
    work: *mut *mut braid_work,
) -> braid_result {
    // SAFETY: the caller's promises, as documented.
    unsafe { issue("braid_scatter_async", comm, Some(work), Call::Scatter(send, recv, count, dtype, root)) }
}
