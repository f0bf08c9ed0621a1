//! `braid_set_log_callback`: braid's log lines to a function of the C program
//! instead of stderr. The function is called on whichever thread logs (the
//! caller's, or one of braid's own), so it may run on several threads at once;
//! braid calls made from inside it are refused (a line may be logged while braid
//! holds a lock the call would need), and so are the lines such a call would log.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

use tracing::field::Visit;
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

use crate::braid_result::{self, BRAID_SUCCESS};
use crate::{entry, swap_last_error, Fail, Res};

/// The `level` passed to a `braid_log_fn`: how severe the line is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum braid_log_level {
    /// Something failed.
    BRAID_LOG_ERROR = 1,
    /// Something went wrong that braid worked around (a fallback, a retry).
    BRAID_LOG_WARN = 2,
    /// Rare events worth knowing (fault injection).
    BRAID_LOG_INFO = 3,
    /// How a communicator was built: topology, links, transports, tuning.
    BRAID_LOG_DEBUG = 4,
    /// Per-call detail.
    BRAID_LOG_TRACE = 5,
}

/// A log callback: `user` as registered, `level` a `braid_log_level`, `target` the
/// part of braid that logged (e.g. `"braid::topology"`) and `message` the line with
/// its fields (`"topology discovered rank=0 ..."`). Both strings are NUL-terminated
/// and valid only during the call: copy them to keep them.
pub type braid_log_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, level: c_int, target: *const c_char, message: *const c_char)>;

/// The registered callback and its user pointer.
#[derive(Clone, Copy)]
struct Callback {
    call: unsafe extern "C" fn(*mut c_void, c_int, *const c_char, *const c_char),
    user: *mut c_void,
}

// SAFETY: braid never dereferences `user`; the program promises (documented on
// `braid_set_log_callback`) that its callback may be called from any thread.
unsafe impl Send for Callback {}
// SAFETY: as above.
unsafe impl Sync for Callback {}

/// The callback. Calls hold the read lock, so replacing it (the write lock) waits
/// for the calls in progress: none reaches the old one after the setter returns.
static CALLBACK: RwLock<Option<Callback>> = RwLock::new(None);
/// Whether `CALLBACK` is set, read for every line without taking the lock.
static REGISTERED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set on a thread while it runs the callback.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether a callback is registered (the stderr output is off while one is).
pub(super) fn registered() -> bool {
    REGISTERED.load(Ordering::Acquire)
}

/// Whether this thread is running the log callback: braid calls are refused.
pub(crate) fn inside_callback() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(false)
}

/// The C code of a `tracing` level.
fn level_code(level: tracing::Level) -> braid_log_level {
    use braid_log_level::*;
    match level {
        tracing::Level::ERROR => BRAID_LOG_ERROR,
        tracing::Level::WARN => BRAID_LOG_WARN,
        tracing::Level::INFO => BRAID_LOG_INFO,
        tracing::Level::DEBUG => BRAID_LOG_DEBUG,
        tracing::Level::TRACE => BRAID_LOG_TRACE,
    }
}

/// An event's text: its message, then its other fields as `name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

/// C text: interior NULs shown rather than cutting the line short.
fn c_text(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// The layer that hands each event passing the filter to the registered callback.
pub(super) struct Forward;

impl<S: tracing::Subscriber> Layer<S> for Forward {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        // Lines logged while this thread formats or delivers one are dropped: the
        // callback would be re-entered, and the read lock taken twice.
        let Some(_inside) = (if registered() { Inside::enter() } else { None }) else { return };
        // A panic here (a field's `Debug` impl) must not unwind into the braid code
        // that logged, nor kill one of braid's threads.
        let delivered = catch_unwind(AssertUnwindSafe(|| deliver(event)));
        if delivered.is_err() {
            eprintln!("braid: formatting a log line for the log callback panicked; the line was dropped");
        }
    }
}

/// This thread is inside the log callback (or formatting a line for it) until dropped.
struct Inside;

impl Inside {
    /// `None` when the thread already is, or is exiting (its flag is gone).
    fn enter() -> Option<Inside> {
        INSIDE.try_with(|inside| inside.replace(true)).ok().filter(|was| !was).map(|_| Inside)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|inside| inside.set(false));
    }
}

/// Format `event` and call the callback, if one is still registered.
fn deliver(event: &tracing::Event<'_>) {
    let guard = CALLBACK.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(cb) = *guard else { return };
    let meta = event.metadata();
    let mut line = Line::default();
    event.record(&mut line);
    let (target, message) = (c_text(meta.target()), c_text(&(line.message + &line.fields)));
    let level = level_code(*meta.level()) as c_int;
    // A braid call refused inside the callback leaves its message in this thread's
    // last error: the call that logged keeps its own.
    let saved = swap_last_error(CString::default());
    // SAFETY: a function pointer the program registered, with the arguments its
    // type promises; the strings live until it returns. It cannot unwind (C ABI).
    unsafe { (cb.call)(cb.user, level, target.as_ptr(), message.as_ptr()) };
    swap_last_error(saved);
}

/// Send braid's log lines to `callback` instead of stderr: every line that passes
/// the filter (`BRAID_DEBUG`, `braid_set_log_level`), with `user` passed back
/// unchanged. NULL restores stderr. When this returns, no call to the previous
/// callback is still running or will start.
///
/// The callback is called on whichever thread logs, the program's own or one of
/// braid's, possibly on several at once: it must be thread-safe, must return
/// (not `longjmp` or throw), and should be quick (braid waits for it). It must
/// not call braid: a braid call from inside it returns `BRAID_ERR_UNSUPPORTED`
/// (`braid_last_error()` says why; reading that is allowed). A Rust panic while
/// formatting a line is caught; the line is dropped.
///
/// `BRAID_ERR_UNSUPPORTED` where another `tracing` subscriber was installed first
/// (a Rust program linking the static library: give that subscriber a layer).
///
/// # Safety
/// `callback` is NULL or a function of this type, callable with `user` from any
/// thread until it is replaced.
#[no_mangle]
pub unsafe extern "C" fn braid_set_log_callback(callback: braid_log_fn, user: *mut c_void) -> braid_result {
    entry("braid_set_log_callback", || {
        if super::install().is_none() {
            return Err(Fail::unsupported("another tracing subscriber was installed first: add a layer to it instead"));
        }
        let mut slot = CALLBACK.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = callback.map(|call| Callback { call, user });
        REGISTERED.store(slot.is_some(), Ordering::Release);
        Res::<braid_result>::Ok(BRAID_SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use std::sync::Mutex;
    use tracing_subscriber::layer::SubscriberExt;

    /// What the test callback received.
    static SEEN: Mutex<Vec<(c_int, String, String)>> = Mutex::new(Vec::new());

    unsafe extern "C" fn record(user: *mut c_void, level: c_int, target: *const c_char, message: *const c_char) {
        assert_eq!(user as usize, 0x5eed, "the user pointer comes back unchanged");
        // SAFETY: NUL-terminated strings valid during the call (the callback's contract).
        let (t, m) = unsafe { (CStr::from_ptr(target), CStr::from_ptr(message)) };
        // Only this test's lines: braid's other tests log through the global subscriber.
        if t.to_str() != Ok(module_path!()) {
            return;
        }
        // A braid call from inside is refused.
        // SAFETY: a NUL-terminated filter.
        let refused = unsafe { crate::braid_set_log_level(c"debug".as_ptr()) };
        SEEN.lock().unwrap().push((level, t.to_string_lossy().into(), format!("{m:?} refused={refused:?}")));
    }

    /// A field whose formatting panics, as a buggy `Debug` impl would.
    struct Explodes;
    impl std::fmt::Debug for Explodes {
        fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            panic!("formatting exploded")
        }
    }

    #[test]
    fn events_reach_the_callback_with_level_and_fields_and_stop_when_it_is_unregistered() {
        let subscriber = tracing_subscriber::registry().with(Forward);
        tracing::subscriber::with_default(subscriber, || {
            // SAFETY: `record` has the callback's type and is callable from any thread.
            assert_eq!(unsafe { braid_set_log_callback(Some(record), 0x5eed as *mut c_void) }, BRAID_SUCCESS);
            tracing::debug!(rank = 3, "topology discovered");
            tracing::warn!(peer = 1, odd = ?Explodes, "never delivered");
            tracing::error!("after the panic");
            // SAFETY: NULL unregisters.
            assert_eq!(unsafe { braid_set_log_callback(None, std::ptr::null_mut()) }, BRAID_SUCCESS);
            tracing::error!("after unregistering");
        });
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!((seen[0].0, seen[0].1.as_str()), (braid_log_level::BRAID_LOG_DEBUG as c_int, module_path!()));
        assert!(
            seen[0].2.contains("topology discovered rank=3") && seen[0].2.contains("BRAID_ERR_UNSUPPORTED"),
            "{seen:?}"
        );
        assert_eq!(seen[1].0, braid_log_level::BRAID_LOG_ERROR as c_int);
        assert!(seen[1].2.contains("after the panic"), "{seen:?}");
    }
}
