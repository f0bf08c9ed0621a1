//! Communicators: create, split, dup, group, query, abort, destroy.

use std::ffi::{c_char, c_int, CStr};

use braid::{Communicator, CommunicatorBuilder, Config};

use crate::braid_result::{self, *};
use crate::{comm_ref, entry, entry_keeping_error, put, Fail, Res};

/// A communicator: a group of ranks that run collectives together (opaque).
///
/// Every rank must issue the same collectives in the same order. One handle may be
/// used from several threads (calls on it run in the order they were issued);
/// `braid_comm_abort` may be called from any thread at any time.
pub struct braid_comm {
    pub(crate) comm: Communicator,
}

// Handles are shared between C threads (calls from several, abort from any):
// the communicator must be usable through `&` from any thread.
const _: fn() = || {
    fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<Communicator>();
};

/// Box a communicator into a handle for C.
fn handle(comm: Communicator) -> *mut braid_comm {
    Box::into_raw(Box::new(braid_comm { comm }))
}

/// Connect this process using the environment, as started by `braid run -n N prog`
/// (`BRAID_RANK`, `BRAID_WORLD_SIZE`, `BRAID_STORE`, ...), torchrun, mpirun or
/// srun. Collective: every rank calls it. On success `*out` is a new communicator
/// (free it with `braid_comm_destroy`); on failure `*out` is NULL.
///
/// # Safety
/// `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_init_from_env(out: *mut *mut braid_comm) -> braid_result {
    entry("braid_comm_init_from_env", || {
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, "out", std::ptr::null_mut())? };
        let comm = Communicator::from_env()?;
        // SAFETY: as above.
        unsafe { put(out, "out", handle(comm))? };
        Ok(BRAID_SUCCESS)
    })
}

/// Connect rank `rank` of `world_size` through the store at `store_url`
/// (`tcp://HOST:PORT`, `file:///PATH`). The other settings (`BRAID_TIMEOUT`,
/// `BRAID_JOB_KEY`, `BRAID_TRANSPORTS`, ...) still come from the environment.
/// Collective: every rank calls it with the same store and world size. On success
/// `*out` is a new communicator; on failure `*out` is NULL.
///
/// # Safety
/// `store_url` is NULL or a NUL-terminated string; `out` is NULL or valid for
/// writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_init(
    rank: c_int,
    world_size: c_int,
    store_url: *const c_char,
    out: *mut *mut braid_comm,
) -> braid_result {
    entry("braid_comm_init", || {
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, "out", std::ptr::null_mut())? };
        if world_size < 1 || rank < 0 || rank >= world_size {
            return Err(Fail::invalid(format!("rank {rank} of world size {world_size}: need 0 <= rank < world_size")));
        }
        if store_url.is_null() {
            return Err(Fail::invalid("store_url is NULL"));
        }
        // SAFETY: not null, and NUL-terminated (the caller's promise).
        let url = unsafe { CStr::from_ptr(store_url) }
            .to_str()
            .map_err(|_| Fail::invalid("store_url is not UTF-8"))?
            .to_string();
        let (rank, world) = (rank.to_string(), world_size.to_string());
        let cfg = Config::from_lookup(|k| match k {
            "BRAID_RANK" => Some(rank.clone()),
            "BRAID_WORLD_SIZE" => Some(world.clone()),
            "BRAID_STORE" => Some(url.clone()),
            other => std::env::var(other).ok(),
        })?;
        let comm = CommunicatorBuilder::from_config(cfg).build()?;
        // SAFETY: as above.
        unsafe { put(out, "out", handle(comm))? };
        Ok(BRAID_SUCCESS)
    })
}

/// Split `comm` (collective: every rank of `comm` calls it, in the same order
/// relative to its other calls). Ranks passing the same `color >= 0` form a new
/// communicator, ranked by `key` (any int, ties broken by rank in `comm`); with
/// `color < 0` this rank joins none and `*out` is NULL. The new communicator is
/// independent of `comm` and of its siblings: all may run calls at the same time.
///
/// # Safety
/// `comm` is NULL or a live handle; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_split(
    comm: *mut braid_comm,
    color: c_int,
    key: c_int,
    out: *mut *mut braid_comm,
) -> braid_result {
    entry("braid_comm_split", || {
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, "out", std::ptr::null_mut())? };
        // SAFETY: the caller's promise on `comm`.
        let c = unsafe { live(comm)? };
        let color = u32::try_from(color).ok();
        // Order-preserving map of every int onto u32.
        let key = (key as u32) ^ 0x8000_0000;
        if let Some(child) = c.split(color, key)? {
            // SAFETY: as above.
            unsafe { put(out, "out", handle(child))? };
        }
        Ok(BRAID_SUCCESS)
    })
}

/// A second communicator over the same ranks as `comm`, each keeping its rank
/// (MPI's `MPI_Comm_dup`), with its own links and call order: it may run calls at
/// the same time as `comm`. Collective: every rank of `comm` calls it, in the same
/// order relative to its other splits and dups of `comm`. On success `*out` is the
/// new communicator; on failure `*out` is NULL.
///
/// # Safety
/// `comm` is NULL or a live handle; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_dup(comm: *mut braid_comm, out: *mut *mut braid_comm) -> braid_result {
    entry("braid_comm_dup", || {
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, "out", std::ptr::null_mut())? };
        // SAFETY: the caller's promise on `comm`.
        let child = unsafe { live(comm)? }.dup()?;
        // SAFETY: as above.
        unsafe { put(out, "out", handle(child))? };
        Ok(BRAID_SUCCESS)
    })
}

/// After a failure, agree with the other surviving ranks on which ranks of `comm`
/// are alive and how many collectives all of them completed (ULFM's
/// `MPIX_Comm_agree`). Every survivor calls it; all get the same answer. The live
/// ranks go to `live_ranks` (ascending, at most `live_cap` of them), their number
/// to `*nlive` and the count of calls to `*completed_calls`; a `live_cap` below
/// the number is `BRAID_ERR_INVALID_ARGUMENT` (with `*nlive` set, so the caller
/// can size `live_ranks`). A rank the others went on without gets an error.
///
/// # Safety
/// `comm` is NULL or a live handle; `live_ranks` is NULL or valid for writing
/// `live_cap` ints; `nlive` and `completed_calls` are NULL or valid for writing.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_agree(
    comm: *mut braid_comm,
    live_ranks: *mut c_int,
    live_cap: usize,
    nlive: *mut usize,
    completed_calls: *mut u64,
) -> braid_result {
    entry("braid_comm_agree", || {
        // SAFETY: the caller's promise on `comm`.
        let c = unsafe { live(comm)? };
        let agreed = c.agree()?;
        // SAFETY: the caller's promises on `nlive` and `completed_calls`.
        unsafe {
            put(nlive, "nlive", agreed.live.len())?;
            put(completed_calls, "completed_calls", agreed.completed_calls)?;
        }
        if agreed.live.len() > live_cap {
            return Err(Fail::invalid(format!("{} live ranks do not fit live_cap {live_cap}", agreed.live.len())));
        }
        if live_ranks.is_null() && !agreed.live.is_empty() {
            return Err(Fail::invalid("live_ranks is NULL"));
        }
        for (i, &r) in agreed.live.iter().enumerate() {
            // SAFETY: `live_ranks` holds `live_cap` ints and `i < agreed.live.len() <= live_cap`.
            unsafe { live_ranks.add(i).write(r as c_int) };
        }
        Ok(BRAID_SUCCESS)
    })
}

/// A communicator of the ranks of `comm` still alive after a failure (ULFM's
/// `MPIX_Comm_shrink`, NCCL's `ncclCommShrink`): the survivors agree on who they
/// are and connect anew, ranked in their order in `comm`, keeping `comm`'s
/// settings and measured link costs. Every survivor calls it; `comm` stays
/// broken (destroy it). If another rank dies while the new one forms, this fails
/// at the timeout, and calling it again leaves that rank out too. On success
/// `*out` is the new communicator; on failure `*out` is NULL.
///
/// # Safety
/// `comm` is NULL or a live handle; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_shrink(comm: *mut braid_comm, out: *mut *mut braid_comm) -> braid_result {
    entry("braid_comm_shrink", || {
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, "out", std::ptr::null_mut())? };
        // SAFETY: the caller's promise on `comm`.
        let small = unsafe { live(comm)? }.shrink()?;
        // SAFETY: as above.
        unsafe { put(out, "out", handle(small))? };
        Ok(BRAID_SUCCESS)
    })
}

/// A communicator of the `nranks` ranks of `comm` listed in `ranks` (torch's
/// `new_group`), formed by those ranks alone: each calls it with the same list,
/// and ranks not listed do not call it. Rank `ranks[i]` of `comm` is rank `i` of
/// the new communicator (the list need not be sorted). An empty list, a rank
/// listed twice or outside `comm`, and a call by a rank not listed are
/// `BRAID_ERR_INVALID_ARGUMENT`. On success `*out` is the new communicator; on
/// failure `*out` is NULL.
///
/// # Safety
/// `comm` is NULL or a live handle; `ranks` is NULL or valid for reading `nranks`
/// ints; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_new_group(
    comm: *mut braid_comm,
    ranks: *const c_int,
    nranks: usize,
    out: *mut *mut braid_comm,
) -> braid_result {
    entry("braid_comm_new_group", || {
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, "out", std::ptr::null_mut())? };
        // SAFETY: the caller's promise on `comm`.
        let c = unsafe { live(comm)? };
        if ranks.is_null() {
            return Err(Fail::invalid("ranks is NULL"));
        }
        if nranks > c.world_size() {
            return Err(Fail::invalid(format!(
                "{nranks} ranks listed for a communicator of {}: one is listed twice or out of range",
                c.world_size()
            )));
        }
        // SAFETY: not null, and `nranks` ints (the caller's promise; bounded above).
        let list = unsafe { std::slice::from_raw_parts(ranks, nranks) };
        // A negative rank becomes one no communicator has, refused as out of range.
        let list: Vec<usize> = list.iter().map(|&r| usize::try_from(r).unwrap_or(usize::MAX)).collect();
        let child = c.new_group(&list)?;
        // SAFETY: as above.
        unsafe { put(out, "out", handle(child))? };
        Ok(BRAID_SUCCESS)
    })
}

/// Destroy a communicator, reporting whether every rank closed it in order.
/// Collective: every rank calls it, in the same order relative to its other calls
/// on `comm`. Async work still outstanding on it finishes first (this call blocks
/// until it has; its `braid_work` handles stay valid to wait on and free); then the
/// ranks confirm to each other that each reached its destroy, within the
/// communicator's timeout. The error (`BRAID_ERR_REMOTE`, `BRAID_ERR_TIMEOUT`, ...,
/// with `braid_last_error()` naming the peer) says a peer exited, was killed,
/// aborted or did not come. A communicator that was aborted or broken by a failed
/// call is destroyed without the exchange and returns `BRAID_SUCCESS`. The handle
/// is freed and invalid afterwards, whatever the result.
///
/// # Safety
/// `comm` is NULL or a live handle that no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_destroy(comm: *mut braid_comm) -> braid_result {
    entry("braid_comm_destroy", || {
        if comm.is_null() {
            return Err(Fail::invalid("the communicator is NULL"));
        }
        // SAFETY: a handle from `handle` (Box::into_raw), destroyed once (the caller's promise).
        let owned = unsafe { Box::from_raw(comm) };
        owned.comm.destroy()?;
        Ok(BRAID_SUCCESS)
    })
}

/// Abort `comm`, from any thread, also while calls are in flight: they and every
/// later call on it return `BRAID_ERR_ABORTED` (the one in flight within a fraction
/// of a second), and the peers' calls that still need this rank fail with
/// `BRAID_ERR_REMOTE` instead of waiting for a deadline (a call this rank already
/// served completes on them). Never blocks; cannot be undone. Destroy the handle as usual.
///
/// # Safety
/// `comm` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_abort(comm: *mut braid_comm) -> braid_result {
    // Called while handling an error: the error's message stays readable.
    entry_keeping_error("braid_comm_abort", || {
        // SAFETY: the caller's promise.
        unsafe { comm_ref(comm)? }.abort();
        Ok(BRAID_SUCCESS)
    })
}

/// Write this rank's flight record of `comm` (its last calls, where each got to and
/// how each failed, as JSON; `braid doctor DIR` reads the records of all ranks) into
/// the directory `dir`, or into `BRAID_TRACE_DIR` when `dir` is NULL, as
/// `braid-<comm>-e<epoch>-rank<r>.json`. Safe from any thread, also while a call
/// on `comm` hangs. `BRAID_ERR_UNSUPPORTED` when the recorder is off
/// (`BRAID_TRACE_BUFFER=0`), `BRAID_ERR_INVALID_ARGUMENT` when there is no
/// directory to write to.
///
/// # Safety
/// `comm` is NULL or a live handle; `dir` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_dump_trace(comm: *const braid_comm, dir: *const c_char) -> braid_result {
    entry_keeping_error("braid_comm_dump_trace", || {
        // SAFETY: the caller's promise.
        let c = unsafe { comm_ref(comm)? };
        let dir = if dir.is_null() {
            None
        } else {
            // SAFETY: not null, and NUL-terminated (the caller's promise).
            let text = unsafe { CStr::from_ptr(dir) }.to_str().map_err(|_| Fail::invalid("dir is not UTF-8"))?;
            Some(std::path::PathBuf::from(text))
        };
        c.dump_flight_record(dir.as_deref())?;
        Ok(BRAID_SUCCESS)
    })
}

/// This process's rank in `comm`, `0..size`, into `*rank`.
///
/// # Safety
/// `comm` is NULL or a live handle; `rank` is NULL or valid for writing an int.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_rank(comm: *const braid_comm, rank: *mut c_int) -> braid_result {
    entry("braid_comm_rank", || {
        // SAFETY: the caller's promises.
        let r = unsafe { comm_ref(comm)? }.rank();
        // SAFETY: as above.
        unsafe { put(rank, "rank", c_int::try_from(r).unwrap_or(c_int::MAX))? };
        Ok(BRAID_SUCCESS)
    })
}

/// The number of ranks of `comm`, into `*size`.
///
/// # Safety
/// `comm` is NULL or a live handle; `size` is NULL or valid for writing an int.
#[no_mangle]
pub unsafe extern "C" fn braid_comm_size(comm: *const braid_comm, size: *mut c_int) -> braid_result {
    entry("braid_comm_size", || {
        // SAFETY: the caller's promises.
        let n = unsafe { comm_ref(comm)? }.world_size();
        // SAFETY: as above.
        unsafe { put(size, "size", c_int::try_from(n).unwrap_or(c_int::MAX))? };
        Ok(BRAID_SUCCESS)
    })
}

/// The communicator behind a handle, refusing one that was aborted.
///
/// # Safety
/// As [`comm_ref`].
pub(crate) unsafe fn live<'a>(comm: *const braid_comm) -> Res<&'a Communicator> {
    // SAFETY: the caller's promise.
    let c = unsafe { comm_ref(comm)? };
    if c.is_aborted() {
        return Err(Fail {
            code: BRAID_ERR_ABORTED,
            msg: format!("rank {}: the communicator was aborted (braid_comm_abort)", c.rank()),
        });
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: braid_last_error returns a NUL-terminated string valid until the next call.
        unsafe { CStr::from_ptr(crate::braid_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn abort_keeps_the_error_that_led_to_it() {
        let comm = Communicator::in_process_with(Config::new(0, 1)).unwrap().pop().unwrap();
        let h = handle(comm);
        // SAFETY: `h` is a live handle; a NULL output is refused, not written.
        let failed = unsafe { braid_comm_rank(h, std::ptr::null_mut()) };
        assert_ne!(failed, BRAID_SUCCESS);
        let why = last_error();
        assert!(why.contains("braid_comm_rank") && why.contains("NULL"), "{why}");
        // SAFETY: `h` is a live handle.
        assert_eq!(unsafe { braid_comm_abort(h) }, BRAID_SUCCESS);
        assert_eq!(last_error(), why, "braid_comm_abort cleared the error being handled");
        // An abort that fails itself says why.
        // SAFETY: NULL is refused.
        assert_ne!(unsafe { braid_comm_abort(std::ptr::null_mut()) }, BRAID_SUCCESS);
        assert!(last_error().starts_with("braid_comm_abort"), "{}", last_error());
        // SAFETY: `h` came from `handle` and is not used again.
        drop(unsafe { Box::from_raw(h) });
    }

    #[test]
    fn a_flight_record_is_written_where_asked() {
        let comm = Communicator::in_process_with(Config::new(0, 1)).unwrap().pop().unwrap();
        let mut one = [1.0f32];
        comm.all_reduce_in_place(&mut one, braid::ReduceOp::Sum).unwrap();
        let id = comm.id();
        let h = handle(comm);
        let dir = std::env::temp_dir().join(format!("braid-ffi-trace-{}", std::process::id()));
        let c_dir = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        // SAFETY: `h` is a live handle, `c_dir` a NUL-terminated string.
        assert_eq!(unsafe { braid_comm_dump_trace(h, c_dir.as_ptr()) }, BRAID_SUCCESS, "{}", last_error());
        let text = std::fs::read_to_string(dir.join(format!("braid-{id:08x}-e0-rank0.json"))).unwrap();
        assert!(text.contains("\"op\":\"all-reduce\"") && text.contains("\"state\":\"done\""), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
        // Without a directory (none given, and this test sets no BRAID_TRACE_DIR), an error says so.
        // SAFETY: as above; NULL asks for BRAID_TRACE_DIR.
        assert_ne!(unsafe { braid_comm_dump_trace(h, std::ptr::null()) }, BRAID_SUCCESS);
        assert!(last_error().contains("BRAID_TRACE_DIR"), "{}", last_error());
        // SAFETY: NULL is refused.
        assert_ne!(unsafe { braid_comm_dump_trace(std::ptr::null(), std::ptr::null()) }, BRAID_SUCCESS);
        // SAFETY: `h` came from `handle` and is not used again.
        drop(unsafe { Box::from_raw(h) });
    }
}
