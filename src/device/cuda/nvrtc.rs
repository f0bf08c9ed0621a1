//! The reduction kernels as PTX: ahead of time, embedded in the library (what the
//! device loads by default, so a user needs only the driver), or compiled with NVRTC
//! at run time, once per architecture per process (`BRAID_NVRTC=1`).
//!
//! `kernels.ptx` is NVRTC's output for [`kernels::source`](super::kernels::source)
//! and [`EMBEDDED_ARCH`], written by `scripts/gen-ptx.sh` and committed; a test (run
//! in CI's NVRTC step) fails when it no longer matches the source.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::kernels;
use crate::error::{Error, Result};

/// The virtual architecture of [`EMBEDDED_PTX`]: the oldest braid supports (Volta),
/// which the driver JIT-compiles for whatever newer GPU is present.
pub const EMBEDDED_ARCH: &str = "compute_70";

/// Every kernel, compiled ahead of time for [`EMBEDDED_ARCH`] by NVRTC 12.9 (the
/// `nvidia-cuda-nvrtc-cu12==12.9.86` wheel CI fetches).
pub const EMBEDDED_PTX: &str = include_str!("kernels.ptx");

/// The environment variable that makes devices compile their kernels with NVRTC
/// for their own architecture instead of loading [`EMBEDDED_PTX`].
pub const NVRTC_ENV: &str = "BRAID_NVRTC";

/// Whether `BRAID_NVRTC=1` asks for run-time compilation.
pub fn requested() -> bool {
    std::env::var(NVRTC_ENV).as_deref() == Ok("1")
}

/// Whether the NVRTC library can be loaded; the reason in one line when not.
pub fn nvrtc_available() -> std::result::Result<(), String> {
    // SAFETY: only tries to load the library (dlopen); calls nothing in it.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err("BRAID_NVRTC=1 asks for CUDA reductions compiled at run time, and libnvrtc.so could not be loaded \
             (install the CUDA toolkit or the nvidia-cuda-nvrtc-cu12 wheel and put its lib directory on LD_LIBRARY_PATH)"
            .into())
    }
}

/// The PTX of every kernel for virtual architecture `arch` (e.g. `compute_90`),
/// compiled on first use and kept for the process.
pub fn ptx_for(arch: &str) -> Result<String> {
    static CACHE: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(p) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(arch) {
        return Ok(p.clone());
    }
    // Compiled outside the lock: two threads racing compile twice, harmlessly.
    let ptx = compile(arch)?;
    cache.lock().unwrap_or_else(|p| p.into_inner()).insert(arch.to_string(), ptx.clone());
    Ok(ptx)
}

/// The version of the NVRTC library that loads, `(major, minor)`.
#[cfg(test)]
pub fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc_available().map_err(Error::Unsupported)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live locals; cudarc panics (caught) when the
    // symbol is missing from the library it loaded.
    let rc = catch_unwind(AssertUnwindSafe(|| unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }))
        .map_err(|_| Error::Unsupported("libnvrtc has no nvrtcVersion".into()))?;
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Device(format!("nvrtcVersion failed: {rc:?}")));
    }
    Ok((major, minor))
}

/// The oldest architecture (e.g. 75 for `compute_75`) the loaded NVRTC compiles
/// for: CUDA 13's NVRTC dropped Volta, so [`EMBEDDED_ARCH`] is not always one.
#[cfg(test)]
pub fn oldest_supported_arch() -> Result<u32> {
    nvrtc_available().map_err(Error::Unsupported)?;
    let missing = |_| Error::Unsupported("libnvrtc has no nvrtcGetSupportedArchs".into());
    let mut n: std::ffi::c_int = 0;
    // SAFETY: an out-pointer to a live local.
    let rc = catch_unwind(AssertUnwindSafe(|| unsafe { cudarc::nvrtc::sys::nvrtcGetNumSupportedArchs(&mut n) }))
        .map_err(missing)?;
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS || !(1..=256).contains(&n) {
        return Err(Error::Device(format!("nvrtcGetNumSupportedArchs: {rc:?}, {n} architectures")));
    }
    let mut archs = vec![0 as std::ffi::c_int; n as usize];
    // SAFETY: `archs` holds the `n` entries NVRTC said it writes.
    let rc =
        catch_unwind(AssertUnwindSafe(|| unsafe { cudarc::nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }))
            .map_err(missing)?;
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Device(format!("nvrtcGetSupportedArchs failed: {rc:?}")));
    }
    archs
        .into_iter()
        .filter(|&a| a > 0)
        .min()
        .map(|a| a as u32)
        .ok_or_else(|| Error::Device("NVRTC lists no architecture".into()))
}

/// The NVRTC release [`EMBEDDED_PTX`] was generated with (its header names it).
#[cfg(test)]
pub const EMBEDDED_NVRTC: (i32, i32) = (12, 9);

/// Compile the kernel source for `arch` (uncached).
///
/// The flags pin IEEE arithmetic (no flush-to-zero, no fused multiply-add, exact
/// division) so results match the host kernels whatever NVRTC's defaults become.
pub fn compile(arch: &str) -> Result<String> {
    nvrtc_available().map_err(Error::Unsupported)?;
    let opts = CompileOptions {
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        fmad: Some(false),
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some("braid_reduce.cu".into()),
        ..Default::default()
    };
    let started = Instant::now();
    // cudarc panics (rather than erring) when a symbol is missing from the library
    // it loaded, or on an interior NUL; neither may take the process down.
    let out = catch_unwind(AssertUnwindSafe(|| compile_ptx_with_opts(kernels::source(), opts))).map_err(|_| {
        Error::Unsupported(format!(
            "NVRTC panicked compiling the CUDA reductions for {arch} (an incompatible libnvrtc?)"
        ))
    })?;
    let ptx = out.map_err(|e| Error::Device(format!("NVRTC failed to compile the CUDA reductions for {arch}: {e}")))?;
    let src = ptx.to_src();
    tracing::debug!(arch, bytes = src.len(), ms = started.elapsed().as_millis() as u64, "compiled the CUDA reductions");
    Ok(src)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether NVRTC is here; panics when it must be (`BRAID_REQUIRE_NVRTC=1`, as in CI).
    fn nvrtc_or_skip(test: &str) -> bool {
        match nvrtc_available() {
            Ok(()) => true,
            Err(why) => {
                assert!(std::env::var("BRAID_REQUIRE_NVRTC").as_deref() != Ok("1"), "BRAID_REQUIRE_NVRTC=1 but {why}");
                eprintln!("skipping {test}: {why}");
                false
            }
        }
    }

    #[test]
    fn nvrtc_compiles_every_kernel() {
        if !nvrtc_or_skip("nvrtc_compiles_every_kernel") {
            return;
        }
        // A virtual architecture (PTX only: the oldest this NVRTC takes, Volta up
        // to CUDA 12, Turing from 13), and real ones, for which NVRTC also runs its
        // back end to machine code: that proves the PTX assembles.
        let oldest = format!("compute_{}", oldest_supported_arch().unwrap().max(70));
        for arch in [oldest.as_str(), "sm_80", "sm_90"] {
            let started = Instant::now();
            let ptx = compile(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            eprintln!("NVRTC {arch}: {} bytes of PTX in {} ms", ptx.len(), started.elapsed().as_millis());
            let target = format!(".target sm_{}", arch.trim_start_matches(|c: char| !c.is_ascii_digit()));
            assert!(ptx.contains(&target), "{arch}: no `{target}` in the PTX");
            for name in kernels::kernel_names() {
                assert!(ptx.contains(&format!(".entry {name}(")), "{arch}: no .entry for {name}");
            }
            assert_eq!(ptx.matches(".entry ").count(), kernels::kernel_names().len(), "{arch}: unexpected entries");
            // IEEE arithmetic as on the host: no flushed subnormals, no contractions.
            assert!(!ptx.contains(".ftz"), "{arch}: flush-to-zero in the PTX");
            assert!(!ptx.contains("fma."), "{arch}: a fused multiply-add in the PTX");
            assert!(ptx.contains("add.rn.f32") && ptx.contains("div.rn.f64"), "{arch}: rounding not explicit");
            if std::env::var_os("BRAID_DUMP_PTX").is_some() {
                std::fs::write(format!("/tmp/braid-{arch}.ptx"), &ptx).unwrap();
            }
        }
    }

    /// Writes `kernels.ptx` with `BRAID_WRITE_PTX=1` (what `scripts/gen-ptx.sh` does);
    /// otherwise fails when the committed file is not what NVRTC makes of the source.
    #[test]
    fn embedded_ptx_is_what_nvrtc_makes_of_the_source() {
        if !nvrtc_or_skip("embedded_ptx_is_what_nvrtc_makes_of_the_source") {
            return;
        }
        let version = nvrtc_version().unwrap();
        assert!(
            EMBEDDED_PTX.contains(&format!("release {}.{},", EMBEDDED_NVRTC.0, EMBEDDED_NVRTC.1)),
            "kernels.ptx does not name NVRTC {EMBEDDED_NVRTC:?} in its header"
        );
        if version != EMBEDDED_NVRTC {
            // Another NVRTC makes other text (CUDA 13's does not take compute_70 at
            // all): drift is judged by the release the file was made with, which CI
            // fetches. The GPU tests load the committed file itself.
            assert!(
                std::env::var("BRAID_REQUIRE_NVRTC").as_deref() != Ok("1"),
                "BRAID_REQUIRE_NVRTC=1 with NVRTC {version:?}: the drift check needs NVRTC {EMBEDDED_NVRTC:?}"
            );
            eprintln!("skipping the drift check: NVRTC {version:?} here, kernels.ptx is from {EMBEDDED_NVRTC:?}");
            return;
        }
        let fresh = compile(EMBEDDED_ARCH).unwrap();
        if std::env::var("BRAID_WRITE_PTX").as_deref() == Ok("1") {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/device/cuda/kernels.ptx");
            std::fs::write(path, &fresh).unwrap();
            eprintln!("wrote {path} ({} bytes)", fresh.len());
            return;
        }
        if fresh != EMBEDDED_PTX {
            let line = fresh.lines().zip(EMBEDDED_PTX.lines()).position(|(a, b)| a != b);
            let at = line.map_or("in length".to_string(), |l| format!("first at line {}", l + 1));
            panic!(
                "src/device/cuda/kernels.ptx is stale: NVRTC makes different PTX of the kernel source ({at}); \
                 regenerate it with scripts/gen-ptx.sh (NVRTC from nvidia-cuda-nvrtc-cu12==12.9.86) and commit it"
            );
        }
        // Deterministic: a second compilation is the same text.
        assert_eq!(compile(EMBEDDED_ARCH).unwrap(), fresh, "NVRTC's output differs between two runs");
    }

    #[test]
    fn embedded_ptx_has_every_kernel_for_the_oldest_architecture() {
        // Runs without NVRTC: the committed file alone.
        assert!(EMBEDDED_PTX.contains(".target sm_70"), "not compute_70 PTX");
        for name in kernels::kernel_names() {
            assert!(EMBEDDED_PTX.contains(&format!(".entry {name}(")), "no .entry for {name}");
        }
        assert_eq!(EMBEDDED_PTX.matches(".entry ").count(), kernels::kernel_names().len());
        assert!(!EMBEDDED_PTX.contains(".ftz") && !EMBEDDED_PTX.contains("fma."), "not IEEE arithmetic");
    }

    #[test]
    fn cached_ptx_is_the_compiled_ptx_of_that_arch() {
        if !nvrtc_or_skip("cached_ptx_is_the_compiled_ptx_of_that_arch") {
            return;
        }
        let cached = ptx_for("compute_80").unwrap();
        assert!(cached.contains(".target sm_80"));
        assert_eq!(ptx_for("compute_80").unwrap(), cached);
        assert_eq!(compile("compute_80").unwrap(), cached);
    }

    #[test]
    fn a_bad_architecture_is_an_error_not_a_panic() {
        if !nvrtc_or_skip("a_bad_architecture_is_an_error_not_a_panic") {
            return;
        }
        match compile("compute_1") {
            Err(Error::Device(m)) => assert!(m.contains("compute_1"), "{m}"),
            other => panic!("expected a device error, got {other:?}"),
        }
    }
}
