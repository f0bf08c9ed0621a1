//! Logging for C programs. braid logs through `tracing`, which prints nothing until a
//! subscriber is installed; a Rust program installs its own, but a C program cannot,
//! so the library installs one on its first call: `BRAID_DEBUG`'s filter (the
//! `braid` command's variable; `warn` when unset or unparsable), lines on stderr.
//! `braid_set_log_level` changes the filter later, and `braid_set_log_callback`
//! sends the lines that pass it to the program instead of stderr (`callback.rs`).

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

use tracing_subscriber::filter::dynamic_filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

use crate::braid_result::{self, BRAID_SUCCESS};
use crate::{entry, Fail, Res};

mod callback;
pub(crate) use callback::inside_callback;
pub use callback::*;

/// What `braid_set_log_level` changes; `None` when another subscriber was already
/// the process's (a Rust host linked the static library and installed its own).
static FILTER: OnceLock<Option<reload::Handle<EnvFilter, Registry>>> = OnceLock::new();

/// The filter when nothing asks for more: what the `braid` command prints.
const DEFAULT_FILTER: &str = "warn";

/// Installs the subscriber, once per process; later calls only return its handle.
pub(crate) fn install() -> Option<&'static reload::Handle<EnvFilter, Registry>> {
    FILTER
        .get_or_init(|| {
            let wanted = std::env::var("BRAID_DEBUG").unwrap_or_default();
            let filter = EnvFilter::try_new(if wanted.trim().is_empty() { DEFAULT_FILTER } else { wanted.trim() })
                .unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
            let (layer, handle) = reload::Layer::new(filter);
            // Stderr only while no callback is registered; the filter is asked per
            // event (not cached per call site) because the callback comes and goes.
            let fmt = tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .with_filter(dynamic_filter_fn(|_, _| !callback::registered()));
            Registry::default().with(layer).with(fmt).with(callback::Forward).try_init().ok().map(|()| handle)
        })
        .as_ref()
}

/// Sets which of braid's log lines reach stderr, as `BRAID_DEBUG` does (which this
/// overrides): a `tracing` filter such as `"warn"`, `"debug"` or `"braid=trace"`.
/// `BRAID_ERR_INVALID_ARGUMENT` for NULL or a filter that does not parse (the
/// filter in force stays); `BRAID_ERR_UNSUPPORTED` where another `tracing`
/// subscriber was installed first (a Rust program linking the static library).
///
/// # Safety
/// `filter` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn braid_set_log_level(filter: *const c_char) -> braid_result {
    entry("braid_set_log_level", || {
        if filter.is_null() {
            return Err(Fail::invalid("filter is NULL"));
        }
        // SAFETY: not null, and NUL-terminated (the caller's promise).
        let text = unsafe { CStr::from_ptr(filter) }.to_str().map_err(|_| Fail::invalid("filter is not UTF-8"))?;
        let parsed = EnvFilter::try_new(text).map_err(|e| {
            Fail::invalid(format!("`{text}` is not a log filter (e.g. \"debug\", \"braid=trace\"): {e}"))
        })?;
        let handle = install().ok_or_else(|| {
            Fail::unsupported("another tracing subscriber was installed first: set its filter instead")
        })?;
        handle.reload(parsed).map_err(|e| Fail::unsupported(format!("the log filter cannot be changed: {e}")))?;
        Res::Ok(BRAID_SUCCESS)
    })
}
