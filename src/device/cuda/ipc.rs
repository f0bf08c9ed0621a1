//! Device memory shared with peers on one GPU: CUDA IPC handles between
//! processes, the plain address between ranks of one process.
//!
//! The peer domain is the host's boot id and the set of GPUs (by PCI bus id) that
//! this GPU and each member reach both ways (`cuDeviceCanAccessPeer`): ranks on GPUs
//! of one such set — or on one GPU, as with MPS — copy from each other's memory
//! (NVLink or PCIe peer copies); others stage through host memory. Both ends must
//! compute the same string, so an asymmetric topology only turns the path off. A
//! handle carries the exporting process's random token
//! ([`process_token`](crate::device::peer_maps::process_token)), the allocation's
//! base and size, and its `CUipcMemHandle`. Whether the base is an address here is
//! decided by where the communicator established the peer runs, never by the
//! handle: a peer of another process is always imported through the driver (which
//! validates the handle), and a handle of it claiming this process is refused. Peer
//! mappings are held per call and closed when the last call holding them ends
//! ([`crate::device::peer_maps`]), never evicted while a copy may read them.
//!
//! Not run on a GPU yet (none was available to the work that wrote it): written to
//! the driver API's documented behaviour, and checked here only for the handle
//! decoding that a peer's bytes reach.

use cudarc::driver::sys::{self, CUdevice, CUdeviceptr, CUipcMemHandle};

use crate::device::peer_maps::{check_claim, process_token, Mappings, TOKEN_LEN};
use crate::device::{DevicePtr, Export, PeerProcess};
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"BRDC";
/// 2: the process is a random token, no longer a pid.
const VERSION: u8 = 2;
/// Where the fields after the token start.
const T: usize = 5 + TOKEN_LEN;
/// magic, version, process token, base u64, size u64, the 64-byte IPC handle.
pub const HANDLE_LEN: usize = T + 8 + 8 + 64;

/// A decoded handle. Every field came from a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub process: [u8; TOKEN_LEN],
    pub base: u64,
    pub size: u64,
    pub ipc: [u8; 64],
}

impl Handle {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HANDLE_LEN);
        v.extend_from_slice(MAGIC);
        v.push(VERSION);
        v.extend_from_slice(&self.process);
        v.extend_from_slice(&self.base.to_le_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.ipc);
        v
    }

    /// Decode bytes from a peer: exact length, magic and version, a non-empty
    /// allocation that does not wrap the address space.
    pub fn decode(b: &[u8]) -> std::result::Result<Handle, String> {
        if b.len() != HANDLE_LEN {
            return Err(format!("a CUDA export handle of {} bytes (expected {HANDLE_LEN})", b.len()));
        }
        if &b[..4] != MAGIC || b[4] != VERSION {
            return Err("not a braid CUDA export handle (magic or version)".into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let h = Handle {
            process: b[5..T].try_into().expect("token bytes"),
            base: u64_at(T),
            size: u64_at(T + 8),
            ipc: b[T + 16..HANDLE_LEN].try_into().expect("64 bytes"),
        };
        if h.size == 0 || h.base == 0 || h.base.checked_add(h.size).is_none() {
            return Err(format!("a CUDA export of {} bytes at {:#x}", h.size, h.base));
        }
        Ok(h)
    }
}

/// The PCI bus id of `dev`.
fn bus_id(dev: CUdevice) -> Option<String> {
    let mut bus = [0 as std::ffi::c_char; 32];
    // SAFETY: `bus` is a writable buffer of the length passed; the driver writes a
    // NUL-terminated string into it.
    let r = unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    // SAFETY: on success the buffer holds a NUL-terminated string within its length.
    Some(unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned())
}

/// Whether `a` and `b` can each access the other's memory.
fn mutual_peers(a: CUdevice, b: CUdevice) -> bool {
    let can = |x: CUdevice, y: CUdevice| {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: `v` is a valid out-parameter; the devices are ordinals' handles.
        let r = unsafe { sys::cuDeviceCanAccessPeer(&mut v, x, y) };
        r == sys::CUresult::CUDA_SUCCESS && v != 0
    };
    can(a, b) && can(b, a)
}

/// The peer domain of device `dev` (None when anything is unknown, so such a
/// device never takes the single-copy path).
pub fn domain(dev: CUdevice) -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let mut count: std::ffi::c_int = 0;
    // SAFETY: a valid out-parameter.
    if unsafe { sys::cuDeviceGetCount(&mut count) } != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    let mut members = vec![bus_id(dev)?];
    for ordinal in 0..count {
        let mut other: CUdevice = 0;
        // SAFETY: a valid out-parameter and an ordinal below the device count.
        if unsafe { sys::cuDeviceGet(&mut other, ordinal) } != sys::CUresult::CUDA_SUCCESS {
            return None;
        }
        if other != dev && mutual_peers(dev, other) {
            members.push(bus_id(other)?);
        }
    }
    members.sort();
    Some(format!("cuda:{}:{}", boot.trim(), members.join(",")))
}

/// Let the current context access memory of the context owning `ptr` (another GPU
/// of this process); a no-op when it is the current one or access is on already.
fn enable_peer_access(tag: &str, ptr: CUdeviceptr) -> Result<()> {
    let mut owner: sys::CUcontext = std::ptr::null_mut();
    let mut current: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-parameters; the attribute of a context is a CUcontext.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut owner as *mut sys::CUcontext).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
            ptr,
        )
    };
    // SAFETY: a valid out-parameter.
    let c = unsafe { sys::cuCtxGetCurrent(&mut current) };
    if r != sys::CUresult::CUDA_SUCCESS || c != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Device(format!("{tag}: finding the context of a peer's memory: {r:?} {c:?}")));
    }
    if owner.is_null() || owner == current {
        return Ok(());
    }
    // SAFETY: `owner` is a live context of this process (it owns a live allocation).
    match unsafe { sys::cuCtxEnablePeerAccess(owner, 0) } {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        r => Err(Error::Device(format!("{tag}: enabling peer access to another GPU: {r:?}"))),
    }
}

/// The allocation holding `[ptr, ptr + len)`: base and size.
fn address_range(ptr: CUdeviceptr) -> std::result::Result<(CUdeviceptr, usize), sys::CUresult> {
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: plain out-parameters; the driver only reads `ptr` as a number.
    let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok((base, size))
    } else {
        Err(r)
    }
}

/// Export `[ptr, ptr + len)` (the device's context is current on this thread).
pub fn export(tag: &str, ptr: DevicePtr, len: usize) -> Result<Export> {
    // Unsupported, not a failure: the executor then stages the range through
    // memory it can export (virtual-memory allocations may have no range here).
    let (base, size) = address_range(ptr)
        .map_err(|r| Error::Unsupported(format!("{tag}: finding the allocation at {ptr:#x}: {r:?}")))?;
    let offset = (ptr - base) as usize;
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::InvalidArgument(format!("{tag}: [{ptr:#x}, +{len}) is not inside one allocation")));
    }
    let mut ipc = CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `ipc` is a valid out-parameter; `base` is the start of an allocation
    // of this context (just looked up).
    let r = unsafe { sys::cuIpcGetMemHandle(&mut ipc, base) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Unsupported(format!("{tag}: this memory cannot be shared with peers ({r:?})")));
    }
    let h = Handle { process: process_token(), base, size: size as u64, ipc: ipc.reserved.map(|c| c as u8) };
    Ok(Export { handle: h.encode(), offset })
}

/// Peer allocations mapped here through IPC, held per call (see
/// [`crate::device::peer_maps`]); memory of this process is used by address and
/// not held.
#[derive(Default)]
pub struct OpenPeers {
    maps: Mappings<CUdeviceptr>,
}

impl OpenPeers {
    /// Map the allocation `bytes` names for a peer running as `peer` says (the
    /// device's context is current); one hold, given back by [`OpenPeers::release`].
    pub fn open(&mut self, tag: &str, bytes: &[u8], peer: PeerProcess) -> Result<(DevicePtr, usize)> {
        let refuse = |why: String| Error::InvalidArgument(format!("{tag}: {why}"));
        let h = Handle::decode(bytes).map_err(refuse)?;
        check_claim(peer, &h.process, &process_token()).map_err(refuse)?;
        if peer == PeerProcess::This {
            // One process: the address is valid here (unified addressing), if it is
            // still exactly that allocation, checked on every open (nothing cached);
            // IPC cannot open a process's own handles.
            return match address_range(h.base) {
                Ok((base, size)) if base == h.base && size as u64 == h.size => {
                    enable_peer_access(tag, base)?;
                    Ok((base, size))
                }
                _ => Err(Error::InvalidArgument(format!("{tag}: an export of memory no longer allocated"))),
            };
        }
        self.maps.acquire(tag, bytes, || {
            let mut p: CUdeviceptr = 0;
            let ipc = CUipcMemHandle { reserved: h.ipc.map(|b| b as std::ffi::c_char) };
            let flags = sys::CUipcMem_flags_enum::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
            // SAFETY: `p` is a valid out-parameter; the driver validates the handle
            // bytes (from a peer) and fails on anything it did not issue.
            let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, ipc, flags) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(Error::Device(format!("{tag}: opening a peer's memory: {r:?}")));
            }
            // The size is the driver's, not the peer's word.
            match address_range(p) {
                Ok((base, size)) if base == p => Ok((p, size, p)),
                _ => {
                    // SAFETY: `p` was opened just above, is used by nothing and closed once.
                    unsafe { sys::cuIpcCloseMemHandle(p) };
                    Err(Error::Device(format!("{tag}: a peer's memory mapped without a size")))
                }
            }
        })
    }

    /// Give back one hold on `bytes`: the mapping to close when it was the last.
    pub fn release(&mut self, bytes: &[u8]) -> Option<CUdeviceptr> {
        self.maps.release(bytes)
    }

    /// Every mapping (the device is going away).
    pub fn drain(&mut self) -> Vec<CUdeviceptr> {
        self.maps.drain()
    }
}

/// Close an IPC mapping.
///
/// # Safety
/// `p` came from `cuIpcOpenMemHandle` (an [`OpenPeers`] mapping no longer held),
/// is closed once, and no work that reads it is queued or running; the device's
/// context is current.
pub unsafe fn close(tag: &str, p: CUdeviceptr) {
    // SAFETY: as the caller promises.
    let r = unsafe { sys::cuIpcCloseMemHandle(p) };
    if r != sys::CUresult::CUDA_SUCCESS {
        tracing::warn!(device = tag, result = ?r, "cuIpcCloseMemHandle failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_forged_ones_are_refused() {
        let h = Handle { process: [7; TOKEN_LEN], base: 0x7000_0000, size: 4096, ipc: [3; 64] };
        assert_eq!(Handle::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[0] = b'X';
        assert!(Handle::decode(&b).unwrap_err().contains("magic"));
        assert!(Handle::decode(&h.encode()[..HANDLE_LEN - 1]).unwrap_err().contains("bytes"));
        let wraps = Handle { base: u64::MAX - 10, ..h };
        assert!(Handle::decode(&wraps.encode()).is_err());
        let empty = Handle { size: 0, ..h };
        assert!(Handle::decode(&empty.encode()).is_err());
    }

    /// A peer of another process whose handle claims this process (a forged or
    /// colliding id) is refused before its base is used or the driver is called;
    /// so is a handle of another process from a peer of this one.
    #[test]
    fn a_claim_of_this_process_from_another_is_refused_without_using_its_base() {
        let mut peers = OpenPeers::default();
        let forged = Handle { process: process_token(), base: 0x7000_0000, size: 4096, ipc: [0; 64] };
        let e = peers.open("cuda:9", &forged.encode(), PeerProcess::Other).unwrap_err().to_string();
        assert!(e.contains("cuda:9") && e.contains("claiming this process"), "{e}");
        let foreign = Handle { process: [process_token()[0] ^ 1; TOKEN_LEN], ..forged };
        let e = peers.open("cuda:9", &foreign.encode(), PeerProcess::This).unwrap_err().to_string();
        assert!(e.contains("another process"), "{e}");
        assert!(peers.drain().is_empty(), "nothing was mapped");
    }
}
