//! The CUDA device: braid's [`Device`](super::Device) on a CUDA stream (`cuda` feature),
//! with reductions compiled at run time by NVRTC from [`kernels`].

pub mod kernels;
