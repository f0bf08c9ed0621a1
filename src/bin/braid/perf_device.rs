//! `braid perf` on device buffers: `--device sim` (host memory behind the device
//! interface, for trying the device path anywhere) or `--device cuda` (what
//! `--transport cuda` means: every rank on a GPU, rank `r` on GPU `r % count`, so
//! several ranks may share one; the bytes move over the usual host links).

use std::sync::Arc;

use braid::device::{Device, DeviceBuffer, SimDevice};

/// Which memory the sweep's buffers live in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    /// Host memory (the default).
    None,
    /// The simulated device (host memory behind the device interface).
    Sim,
    /// CUDA devices (needs a build with `--features cuda`, a driver and a GPU).
    Cuda,
}

/// The device `rank` uses, or why there is none.
pub fn open(choice: DeviceChoice, rank: usize) -> braid::Result<Option<Arc<dyn Device>>> {
    match choice {
        DeviceChoice::None => Ok(None),
        DeviceChoice::Sim => Ok(Some(Arc::new(SimDevice::new(&format!("rank{rank}"))))),
        DeviceChoice::Cuda => open_cuda(rank).map(Some),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(rank: usize) -> braid::Result<Arc<dyn Device>> {
    let count = braid::device::cuda::device_count().map_err(braid::Error::Unsupported)?;
    let dev: Arc<dyn Device> = braid::device::cuda::CudaDevice::new(rank % count)?;
    Ok(dev)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_rank: usize) -> braid::Result<Arc<dyn Device>> {
    let why = braid::TransportKind::Cuda.available().err();
    Err(braid::Error::Unsupported(why.unwrap_or_else(|| "the cuda transport is not in this build".into())))
}

/// A case's buffers on the device, mirroring the host ones.
pub struct DeviceBufs {
    pub input: DeviceBuffer,
    pub output: DeviceBuffer,
}

impl DeviceBufs {
    pub fn new(dev: &Arc<dyn Device>, in_len: usize, out_len: usize) -> braid::Result<DeviceBufs> {
        Ok(DeviceBufs { input: DeviceBuffer::new(dev, in_len)?, output: DeviceBuffer::new(dev, out_len)? })
    }
}
