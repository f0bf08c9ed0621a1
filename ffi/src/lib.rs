//! C ABI for braid. The entry points, error codes and the generated header
//! (`include/braid.h`) arrive with the C ABI issue; this crate exists now so the
//! workspace layout is the final one.

/// The braid version this library was built from, for C callers to log.
pub const BRAID_FFI_VERSION: &str = env!("CARGO_PKG_VERSION");
