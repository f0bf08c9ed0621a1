//! Whether this machine has what the CUDA and RDMA transports need, asked of the
//! driver libraries themselves, with the reason in one line when it does not.
//!
//! cudarc loads `libcuda.so` at run time and panics when it is missing, so its
//! presence is checked first; verbs calls fail with ENOSYS on kernels without RDMA.

/// The number of CUDA devices, or why there are none to use.
#[cfg(feature = "cuda")]
pub fn cuda_devices() -> Result<usize, String> {
    // SAFETY: only tries to load the driver library; calls nothing in it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver on this machine (libcuda.so could not be loaded)".into());
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err("the CUDA driver sees no device".into()),
        Err(e) => Err(format!("the CUDA driver failed: {e}")),
    }
}

/// The number of RDMA devices, or why there are none to use.
#[cfg(feature = "rdma")]
pub fn rdma_devices() -> Result<usize, String> {
    let mut n: std::os::raw::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list returned is freed below and
    // nothing else is kept from it.
    let list = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = std::io::Error::last_os_error();
        return Err(format!("no RDMA devices (ibv_get_device_list: {e})"));
    }
    // SAFETY: a non-null list from ibv_get_device_list, freed exactly once.
    unsafe { rdma_sys::ibv_free_device_list(list) };
    if n > 0 {
        Ok(n as usize)
    } else {
        Err("no RDMA device found".into())
    }
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_probe_answers_without_panicking() {
        // On a machine without a driver (CI) this is the error path; with a GPU it
        // counts devices. Either way no panic, and an error says something.
        match super::cuda_devices() {
            Ok(n) => assert!(n > 0),
            Err(why) => assert!(why.contains("CUDA"), "{why}"),
        }
    }

    #[cfg(feature = "rdma")]
    #[test]
    fn rdma_probe_answers_without_panicking() {
        match super::rdma_devices() {
            Ok(n) => assert!(n > 0),
            Err(why) => assert!(why.contains("RDMA"), "{why}"),
        }
    }
}
