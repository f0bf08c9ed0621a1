//! The C ABI of braid: `libbraid.so` and `libbraid.a`, declared by the generated
//! `include/braid.h` (cbindgen, from this crate's documentation comments).
//!
//! Every entry point returns a [`braid_result`], catches panics (a panic is
//! `BRAID_ERR_INTERNAL`, never an unwind into C), checks its pointers, enum values,
//! roots, peers and sizes, and leaves a message for [`braid_last_error`] when it
//! fails. Files: `lib.rs` codes, errors and argument checks; `comm.rs` communicators;
//! `collectives.rs` the blocking and async collectives; `group.rs` grouped and
//! tagged send/recv (`braid_group_start`/`end`); `work.rs` work handles;
//! `log.rs` the log subscriber (`BRAID_DEBUG`, `braid_set_log_level`,
//! `braid_set_log_callback`); `rooted.rs` gather and scatter;
//! `vcollectives.rs` all-gather-v, reduce-scatter-v and all-to-all-v.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use braid::{Communicator, DType, Error, ReduceOp};

mod collectives;
mod comm;
mod group;
mod log;
mod rooted;
mod vcollectives;
mod work;

pub use collectives::*;
pub use comm::*;
pub use group::*;
pub use log::*;
pub use vcollectives::*;
pub use work::*;

/// What every braid call returns: `BRAID_SUCCESS`, or why it failed (the
/// message is in `braid_last_error()`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum braid_result {
    /// The call succeeded (for `braid_work_test`: the work has finished successfully).
    BRAID_SUCCESS = 0,
    /// A null pointer, an unknown enum value, a root or peer that is not a rank,
    /// sizes that overflow, overlapping buffers, or a bad configuration.
    BRAID_ERR_INVALID_ARGUMENT,
    /// A wait passed its deadline (`BRAID_TIMEOUT`): the message names the ranks
    /// that did not arrive.
    BRAID_ERR_TIMEOUT,
    /// A peer failed: it died, closed its connection, aborted, or sent bytes that
    /// are not a braid frame.
    BRAID_ERR_REMOTE,
    /// This communicator was aborted (`braid_comm_abort`).
    BRAID_ERR_ABORTED,
    /// Ranks issued different calls at the same point (the message names both).
    BRAID_ERR_MISMATCH,
    /// An operating-system or rendezvous-store error (connecting, binding, spawning).
    BRAID_ERR_IO,
    /// The operation or transport is not available in this build or on this machine.
    BRAID_ERR_UNSUPPORTED,
    /// An internal error: a communicator broken by an earlier failure, a device
    /// error, or a bug (a panic inside braid).
    BRAID_ERR_INTERNAL,
    /// `braid_work_test` and `braid_work_wait_timeout` only: the work has not finished yet.
    BRAID_IN_PROGRESS,
}

use braid_result::*;

/// Element types. The values are braid's wire codes; any other value passed for a
/// `braid_dtype` is `BRAID_ERR_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum braid_dtype {
    /// 32-bit IEEE float (`float`).
    BRAID_F32 = 0,
    /// 64-bit IEEE float (`double`).
    BRAID_F64 = 1,
    /// 16-bit IEEE float (binary16).
    BRAID_F16 = 2,
    /// bfloat16 (the upper half of a `float`).
    BRAID_BF16 = 3,
    /// `int8_t`.
    BRAID_I8 = 4,
    /// `uint8_t`.
    BRAID_U8 = 5,
    /// `int32_t`.
    BRAID_I32 = 6,
    /// `int64_t`.
    BRAID_I64 = 7,
}

/// Reduction operators. Integers wrap on overflow; `BRAID_AVG` is the sum divided
/// by the number of ranks (integers: truncating division). Any other value passed
/// for a `braid_reduce_op` is `BRAID_ERR_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum braid_reduce_op {
    /// Sum.
    BRAID_SUM = 0,
    /// Product.
    BRAID_PROD = 1,
    /// Minimum.
    BRAID_MIN = 2,
    /// Maximum.
    BRAID_MAX = 3,
    /// Average.
    BRAID_AVG = 4,
}

/// How entry points receive a `braid_dtype`: as the plain integer C may pass
/// (any value), checked before use. The header names it `braid_dtype`.
pub type DTypeArg = c_int;
/// How entry points receive a `braid_reduce_op` (the header names it so).
pub type OpArg = c_int;

/// Why a call failed: its code and message.
#[derive(Clone, Debug)]
pub(crate) struct Fail {
    code: braid_result,
    msg: String,
}

impl Fail {
    pub(crate) fn invalid(msg: impl Into<String>) -> Fail {
        Fail { code: BRAID_ERR_INVALID_ARGUMENT, msg: msg.into() }
    }

    pub(crate) fn unsupported(msg: impl Into<String>) -> Fail {
        Fail { code: BRAID_ERR_UNSUPPORTED, msg: msg.into() }
    }
}

/// The result code of each braid error.
fn code_of(e: &Error) -> braid_result {
    match e {
        Error::InvalidArgument(_) | Error::Config(_) => BRAID_ERR_INVALID_ARGUMENT,
        Error::Timeout { .. } => BRAID_ERR_TIMEOUT,
        Error::PeerLost { .. } | Error::PeerAborted { .. } | Error::Protocol { .. } => BRAID_ERR_REMOTE,
        Error::Aborted { .. } => BRAID_ERR_ABORTED,
        Error::Mismatch { .. } => BRAID_ERR_MISMATCH,
        Error::Io { .. } | Error::Store(_) | Error::JoinClosed { .. } => BRAID_ERR_IO,
        Error::Unsupported(_) => BRAID_ERR_UNSUPPORTED,
        Error::Broken(_) | Error::Device(_) => BRAID_ERR_INTERNAL,
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail { code: code_of(&e), msg: e.to_string() }
    }
}

pub(crate) type Res<T> = Result<T, Fail>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Replace this thread's last error, returning what it was.
pub(crate) fn swap_last_error(text: CString) -> CString {
    LAST_ERROR.try_with(|e| e.replace(text)).unwrap_or_default()
}

fn set_last_error(msg: String) {
    // Interior NULs would cut the message short in C: show them instead.
    let text = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// The text of a panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic with a non-text payload")
}

/// Run the body of entry point `name`: clear this thread's last error, install the
/// log subscriber on the first call, catch panics, and record the message of a failure.
pub(crate) fn entry(name: &str, body: impl FnOnce() -> Res<braid_result>) -> braid_result {
    set_last_error(String::new());
    entry_keeping_error(name, body)
}

/// [`entry`] for a call made while handling an error (`braid_comm_abort`): this
/// thread's last error stays what the failed call said unless this call fails too.
pub(crate) fn entry_keeping_error(name: &str, body: impl FnOnce() -> Res<braid_result>) -> braid_result {
    if log::inside_callback() {
        // The line being delivered may have been logged while braid holds a lock
        // this call would need.
        set_last_error(format!("{name}: braid calls are refused inside the log callback (braid_set_log_callback)"));
        return BRAID_ERR_UNSUPPORTED;
    }
    let logged_body = || {
        log::install();
        body()
    };
    match catch_unwind(AssertUnwindSafe(logged_body)) {
        Ok(Ok(code)) => code,
        Ok(Err(fail)) => {
            set_last_error(format!("{name}: {}", fail.msg));
            fail.code
        }
        Err(payload) => {
            set_last_error(format!("{name}: internal error: braid panicked: {}", panic_text(payload.as_ref())));
            BRAID_ERR_INTERNAL
        }
    }
}

/// Borrow the communicator behind a handle.
///
/// # Safety
/// `comm` is null or a handle from `braid_comm_init*`/`braid_comm_split` not yet destroyed.
pub(crate) unsafe fn comm_ref<'a>(comm: *const comm::braid_comm) -> Res<&'a Communicator> {
    // SAFETY: null is refused; otherwise the caller's promise.
    unsafe { comm.as_ref() }.map(|c| &c.comm).ok_or_else(|| Fail::invalid("the communicator is NULL"))
}

/// Write `value` through an output pointer.
///
/// # Safety
/// `out` is null or valid for writing one `T`.
pub(crate) unsafe fn put<T>(out: *mut T, what: &str, value: T) -> Res<()> {
    if out.is_null() {
        return Err(Fail::invalid(format!("{what} is NULL")));
    }
    // SAFETY: not null, and valid for writes (the caller's promise).
    unsafe { out.write(value) };
    Ok(())
}

/// A `braid_dtype` value from C.
pub(crate) fn dtype_of(v: DTypeArg) -> Res<DType> {
    u8::try_from(v)
        .ok()
        .and_then(DType::from_code)
        .ok_or_else(|| Fail::invalid(format!("unknown braid_dtype value {v} (expected 0..=7, BRAID_F32 to BRAID_I64)")))
}

/// A `braid_reduce_op` value from C.
pub(crate) fn op_of(v: OpArg) -> Res<ReduceOp> {
    u8::try_from(v).ok().and_then(ReduceOp::from_code).ok_or_else(|| {
        Fail::invalid(format!("unknown braid_reduce_op value {v} (expected 0..=4, BRAID_SUM to BRAID_AVG)"))
    })
}

/// A root or peer rank from C: `0..world_size`.
pub(crate) fn rank_of(what: &str, v: c_int, comm: &Communicator) -> Res<usize> {
    usize::try_from(v).ok().filter(|&r| r < comm.world_size()).ok_or_else(|| {
        Fail::invalid(format!("{what} {v} is not a rank of this {}-rank communicator", comm.world_size()))
    })
}

/// The version of braid this library was built from (e.g. `"0.1.0"`): a static
/// string, never freed.
#[no_mangle]
pub extern "C" fn braid_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// This thread's last error message: what the last braid call on this thread that
/// failed said, `""` when it succeeded (every call but this one, `braid_version`
/// and `braid_comm_abort` clears it). NUL-terminated, owned by braid, valid until the next
/// braid call on this thread; copy it to keep it.
#[no_mangle]
pub extern "C" fn braid_last_error() -> *const c_char {
    const NONE: &[u8] = b"\0";
    // `try_with`: no panic while the thread's storage is being torn down.
    catch_unwind(|| LAST_ERROR.try_with(|e| e.borrow().as_ptr()).ok()).ok().flatten().unwrap_or(NONE.as_ptr().cast())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last_error() -> String {
        // SAFETY: braid_last_error returns a NUL-terminated string valid until the next call.
        unsafe { CStr::from_ptr(braid_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn the_c_enums_are_braids_codes() {
        use braid_dtype::*;
        use braid_reduce_op::*;
        let dtypes = [BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16, BRAID_I8, BRAID_U8, BRAID_I32, BRAID_I64];
        for (c, d) in dtypes.into_iter().zip(DType::ALL) {
            assert_eq!(dtype_of(c as DTypeArg).ok(), Some(d));
        }
        let ops = [BRAID_SUM, BRAID_PROD, BRAID_MIN, BRAID_MAX, BRAID_AVG];
        for (c, o) in ops.into_iter().zip(ReduceOp::ALL) {
            assert_eq!(op_of(c as OpArg).ok(), Some(o));
        }
        for bad in [-1, 8, 255, 256, c_int::MAX, c_int::MIN] {
            assert!(dtype_of(bad).is_err(), "dtype {bad}");
        }
        assert!(op_of(5).is_err() && op_of(-5).is_err());
    }

    #[test]
    fn a_panic_is_an_internal_error_with_its_message_and_success_clears_it() {
        let code = entry("braid_test_entry", || panic!("boom {}", 42));
        assert_eq!(code, BRAID_ERR_INTERNAL);
        let msg = last_error();
        assert!(msg.starts_with("braid_test_entry: internal error") && msg.contains("boom 42"), "{msg}");
        assert_eq!(entry("braid_test_entry", || Ok(BRAID_SUCCESS)), BRAID_SUCCESS);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn errors_map_to_their_codes_and_messages_keep_interior_nuls_visible() {
        let fail = Fail::from(Error::Unsupported("no\0rdma".into()));
        assert_eq!(fail.code, BRAID_ERR_UNSUPPORTED);
        assert_eq!(entry("braid_x", || Err(fail)), BRAID_ERR_UNSUPPORTED);
        assert_eq!(last_error(), "braid_x: unsupported: no\\0rdma");
        assert_eq!(code_of(&Error::Store("down".into())), BRAID_ERR_IO);
        assert_eq!(code_of(&Error::Config("x".into())), BRAID_ERR_INVALID_ARGUMENT);
        assert_eq!(code_of(&Error::Aborted { rank: 0, call: None }), BRAID_ERR_ABORTED);
    }
}
