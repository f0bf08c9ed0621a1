//! Work handles of asynchronous calls.

use std::ffi::c_int;

use braid::Work;

use crate::braid_result::{self, *};
use crate::{entry, Fail, Res};

/// The handle of an asynchronous call (opaque): wait for it, test it, free it.
/// One thread at a time may use a handle.
pub struct braid_work {
    state: State,
}

enum State {
    Running(Work<()>),
    /// Finished: its result, reported by every later wait or test.
    Done(Res<()>),
}

impl braid_work {
    pub(crate) fn new(w: Work<()>) -> *mut braid_work {
        Box::into_raw(Box::new(braid_work { state: State::Running(w) }))
    }

    /// Block until the work is done (if it is not yet); its result.
    fn finish(&mut self) -> Res<()> {
        if let State::Running(_) = self.state {
            let State::Running(w) = std::mem::replace(&mut self.state, State::Done(Ok(()))) else { unreachable!() };
            self.state = State::Done(w.wait().map_err(Fail::from));
        }
        match &self.state {
            State::Done(r) => r.clone(),
            State::Running(_) => unreachable!("finished above"),
        }
    }
}

/// The work behind a handle.
///
/// # Safety
/// `w` is NULL or a live handle that no other thread is using.
unsafe fn work_mut<'a>(w: *mut braid_work) -> Res<&'a mut braid_work> {
    // SAFETY: null is refused; otherwise the caller's promise.
    unsafe { w.as_mut() }.ok_or_else(|| Fail::invalid("the work handle is NULL"))
}

/// Block until the work has completed; its result (`BRAID_SUCCESS`, or the error
/// the call failed with — every later wait or test reports the same). The
/// buffers of the call are the caller's again once this returns.
///
/// # Safety
/// `w` is NULL or a live handle that no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn braid_work_wait(w: *mut braid_work) -> braid_result {
    entry("braid_work_wait", || {
        // SAFETY: the caller's promise.
        unsafe { work_mut(w)? }.finish()?;
        Ok(BRAID_SUCCESS)
    })
}

/// Whether the work has completed, without blocking: `BRAID_IN_PROGRESS` while it
/// runs (its buffers are still braid's), then its result as `braid_work_wait` gives it.
///
/// # Safety
/// `w` is NULL or a live handle that no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn braid_work_test(w: *mut braid_work) -> braid_result {
    entry("braid_work_test", || {
        // SAFETY: the caller's promise.
        let w = unsafe { work_mut(w)? };
        if let State::Running(work) = &mut w.state {
            if !work.test() {
                return Ok(BRAID_IN_PROGRESS);
            }
        }
        w.finish()?;
        Ok(BRAID_SUCCESS)
    })
}

/// Block until the work has completed or `timeout_ms` milliseconds have passed,
/// whichever comes first: `BRAID_IN_PROGRESS` when the time ran out first (the
/// work still runs and its buffers are still braid's: wait, test or wait with a
/// timeout again), else its result as `braid_work_wait` gives it. A timeout of 0
/// only looks, as `braid_work_test` does; a negative one is
/// `BRAID_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `w` is NULL or a live handle that no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn braid_work_wait_timeout(w: *mut braid_work, timeout_ms: c_int) -> braid_result {
    entry("braid_work_wait_timeout", || {
        // SAFETY: the caller's promise.
        let w = unsafe { work_mut(w)? };
        let timeout_ms = u64::try_from(timeout_ms)
            .map_err(|_| Fail::invalid(format!("timeout_ms is {timeout_ms}: a timeout is 0 or more milliseconds")))?;
        if let State::Running(work) = &mut w.state {
            match work.wait_timeout(std::time::Duration::from_millis(timeout_ms)) {
                Ok(None) => return Ok(BRAID_IN_PROGRESS),
                Ok(Some(())) => w.state = State::Done(Ok(())),
                Err(e) => w.state = State::Done(Err(Fail::from(e))),
            }
        }
        w.finish()?;
        Ok(BRAID_SUCCESS)
    })
}

/// Free a work handle. Work that has not completed is waited for first (this call
/// blocks until braid no longer uses the call's buffers, so they may be freed right
/// after); its result is then dropped — wait or test first to learn it. Returns
/// `BRAID_SUCCESS` whenever `w` is a handle; it is invalid afterwards.
///
/// # Safety
/// `w` is NULL or a live handle that no other thread is using, freed once.
#[no_mangle]
pub unsafe extern "C" fn braid_work_free(w: *mut braid_work) -> braid_result {
    entry("braid_work_free", || {
        // SAFETY: the caller's promise.
        let _ = unsafe { work_mut(w)? }.finish();
        // SAFETY: a handle from `braid_work::new` (Box::into_raw), freed once (the caller's promise).
        drop(unsafe { Box::from_raw(w) });
        Ok(BRAID_SUCCESS)
    })
}
