//! The CUDA device (`cuda` feature): braid's [`Device`](super::Device) on a CUDA
//! stream, with reductions from `kernels` compiled ahead of time to PTX (embedded,
//! `nvrtc::EMBEDDED_PTX`) or, with `BRAID_NVRTC=1`, at run time by NVRTC.
//!
//! `kernels` (the CUDA C source and kernel names) builds without the feature, so
//! its arithmetic is checked on every machine; everything that calls CUDA is behind
//! the feature and loads the driver (and NVRTC when asked for) at run time (`cudarc`
//! with dynamic loading), refusing cleanly with
//! [`Error::Unsupported`](crate::error::Error) when one is missing.

// Built without the feature so its tests check the kernels' arithmetic everywhere;
// only the CUDA device uses it outside tests.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod kernels;

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod ipc;
#[cfg(feature = "cuda")]
mod nvrtc;
#[cfg(feature = "cuda")]
mod pinned;
#[cfg(all(test, feature = "cuda"))]
mod tests;

#[cfg(feature = "cuda")]
pub use device::CudaDevice;

/// The number of CUDA devices this process can open with
/// [`CudaDevice::new`](crate::device::cuda), or why there are none in one line: the
/// `cuda` feature is off, the driver library is missing, or it sees no device.
pub fn device_count() -> std::result::Result<usize, String> {
    #[cfg(feature = "cuda")]
    {
        crate::transport::devices::cuda_devices()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(crate::TransportKind::Cuda
            .available()
            .err()
            .unwrap_or_else(|| "the cuda transport is not in this build".into()))
    }
}
