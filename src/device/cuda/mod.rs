//! The CUDA device (`cuda` feature): braid's [`Device`](super::Device) on a CUDA
//! stream, with reductions compiled at run time by NVRTC from [`kernels`].
//!
//! [`kernels`] (the CUDA C source and kernel names) builds without the feature, so
//! its arithmetic is checked on every machine; everything that calls CUDA is behind
//! the feature and loads the driver and NVRTC at run time (`cudarc` with dynamic
//! loading), refusing cleanly with [`Error::Unsupported`](crate::error::Error) when
//! either is missing.

pub mod kernels;

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod ipc;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
mod pinned;
#[cfg(all(test, feature = "cuda"))]
mod tests;

#[cfg(feature = "cuda")]
pub use device::CudaDevice;
