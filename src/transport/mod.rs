//! Links: one per peer, each a reliable ordered byte stream driven without
//! blocking. The executor frames messages on top and decides how to wait.
//! [`connect`] hands the communicator channels: stream channels over these links
//! (shm, tcp), or verbs channels ([`rdma`], feature `rdma`), which are not byte
//! streams but queue pairs driven by their own protocol.
//!
//! A transport provides `try_write` / `try_read` that never block, plus a way to
//! wait for readiness (a pollable file descriptor, or nothing, in which case the
//! executor spins, yields and then sleeps briefly).

pub mod devices;
pub mod fault;
pub mod ifaces;
pub mod loopback;
// Without the `rdma` feature the verbs protocol, its channel and registration cache
// are still built and tested on simulated and software queue pairs (`sim_tests`,
// `soft_tests`); only the verbs layer, behind the feature, uses them outside tests.
mod connect;
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub mod rdma;
mod request;
pub mod ring;
pub mod shm;
pub mod stream_copy;
pub mod tcp;
pub use connect::connect;
pub use request::ConnectRequest;

use std::fmt;
use std::io;

use crate::error::Result;
use std::os::fd::RawFd;
use std::str::FromStr;

/// The kind of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Threads of one process, through in-memory rings.
    InProcess,
    /// TCP sockets.
    Tcp,
    /// Processes of one host, through rings in a shared-memory segment.
    Shm,
    /// GPU memory through CUDA: the device behind calls on GPU buffers, which
    /// travel staged over the host links (see [`crate::device`]); not a link itself.
    Cuda,
    /// RDMA verbs (InfiniBand, RoCE): reliable-connected queue pairs (feature `rdma`).
    Rdma,
}

impl TransportKind {
    /// Lower-case name (`inproc`, `tcp`, `shm`, `cuda`, `rdma`).
    pub const fn name(self) -> &'static str {
        match self {
            TransportKind::InProcess => "inproc",
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
            TransportKind::Cuda => "cuda",
            TransportKind::Rdma => "rdma",
        }
    }

    /// Whether this build and this machine can set up links of this kind; the
    /// error says why not in one line (the feature is off, or no driver/device).
    pub fn available(self) -> Result<(), String> {
        match self {
            TransportKind::InProcess | TransportKind::Tcp | TransportKind::Shm => Ok(()),
            TransportKind::Cuda if !cfg!(feature = "cuda") => {
                Err("the cuda transport is not in this build (build braid with `--features cuda`)".into())
            }
            TransportKind::Rdma if !cfg!(feature = "rdma") => {
                Err("the rdma transport is not in this build (build braid with `--features rdma`)".into())
            }
            TransportKind::Rdma => {
                #[cfg(feature = "rdma")]
                devices::rdma_devices().map_err(|why| format!("the rdma transport cannot run: {why}"))?;
                Ok(())
            }
            TransportKind::Cuda => {
                #[cfg(feature = "cuda")]
                devices::cuda_devices().map_err(|why| format!("the cuda transport cannot run: {why}"))?;
                Ok(())
            }
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "inproc" | "in-process" | "loopback" | "threads" => Ok(TransportKind::InProcess),
            "tcp" => Ok(TransportKind::Tcp),
            "shm" => Ok(TransportKind::Shm),
            "cuda" => Ok(TransportKind::Cuda),
            "rdma" | "ib" | "verbs" => Ok(TransportKind::Rdma),
            other => Err(format!("unknown transport `{other}` (expected tcp, shm, inproc, cuda or rdma)")),
        }
    }
}

/// A bidirectional byte stream to one peer.
///
/// Both calls are non-blocking. `try_read` returns `Ok(0)` when no byte is
/// available yet and an error of kind `UnexpectedEof` when the peer closed the
/// stream; `try_write` returns `Ok(0)` when the stream cannot take more now.
pub trait Link: Send {
    /// The peer's rank.
    fn peer(&self) -> usize;
    /// What carries the bytes.
    fn kind(&self) -> TransportKind;
    /// Write a prefix of the concatenation of `bufs`; returns how many bytes were taken.
    fn try_write(&mut self, bufs: &[&[u8]]) -> io::Result<usize>;
    /// Read up to `buf.len()` bytes.
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// A descriptor that polls readable/writable with the stream, if the transport has one.
    fn poll_fd(&self) -> Option<RawFd>;
    /// Stop sending: the peer reads end-of-stream after the bytes already written.
    fn close(&mut self);

    /// Whether the peer's end is known to be gone, looked at without blocking or
    /// consuming anything: its process died or its link was dropped (not merely
    /// closed for writing, which is how a failing peer says it stops). False when
    /// unknown. The evidence a failed rank gives its survivors' agreement.
    fn peer_gone(&mut self) -> bool {
        false
    }

    /// Whether [`Link::peek`] works on this link.
    fn can_peek(&self) -> bool {
        false
    }

    /// Zero-copy receive: up to `max` buffered bytes as one contiguous slice, left in
    /// the stream until [`Link::consume`]. `Ok` of an empty slice and errors mean what
    /// they mean for [`Link::try_read`]. Only called when `can_peek` is true.
    fn peek(&mut self, max: usize) -> io::Result<&[u8]> {
        let _ = max;
        Err(io::Error::new(io::ErrorKind::Unsupported, "this link has no zero-copy receive"))
    }

    /// Drop the first `n` bytes of what [`Link::peek`] showed.
    fn consume(&mut self, n: usize) {
        let _ = n;
    }

    /// Whether bytes written to this link wait unread by the peer, where the link
    /// can tell (shared-memory rings); `false` where it cannot.
    fn sent_unread(&self) -> bool {
        false
    }

    /// Whether single copy (rendezvous framing) may be used on this link: the peer's
    /// memory can be read here, at least its registered segments. Both ends of a
    /// link must answer the same, since it decides the framing.
    fn can_read_peer(&self) -> bool {
        false
    }

    /// Whether [`Link::read_peer`] works for any address the peer announces, not
    /// only its registered segments (threads of one process; shared memory with
    /// CMA wanted and probed). Both ends must answer the same.
    fn reads_peer_addresses(&self) -> bool {
        self.can_read_peer()
    }

    /// Single-copy path: copy `dst.len()` bytes from address `addr` of the peer's
    /// address space into `dst` (e.g. `process_vm_readv`, or a plain copy between
    /// threads). Only called when `can_read_peer` is true. A link whose
    /// [`Link::reads_peer_addresses`] is false answers `Unsupported` (the executor
    /// then fails the receive naming the peer).
    ///
    /// This method is safe, so an implementation must be sound for *any* `addr` a
    /// peer (or a caller) hands it: either the kernel checks the access
    /// (`process_vm_readv` fails cleanly on unmapped memory of the other process), or
    /// the implementation copies only from a range the peer currently exposes through
    /// [`Link::expose`] and has not revoked, and holds off [`Link::revoke_exposed`]
    /// until the copy is done. Anything else is an error, never a dereference.
    fn read_peer(&mut self, addr: usize, dst: &mut [u8]) -> io::Result<()> {
        let _ = (addr, dst);
        Err(io::Error::new(io::ErrorKind::Unsupported, "this link cannot read peer memory"))
    }

    /// Single copy by another path than [`Link::read_peer`] (the peer's registered
    /// segment, mapped here): run `copy`, which reads `[addr, addr + len)` of the
    /// peer's memory (its address, as for `read_peer`) through that path, only while
    /// the peer exposes that range ([`Link::expose`]). An error when it does not, or
    /// when it revoked the range before `copy` returned: what `copy` produced is then
    /// to be discarded. Links that keep no record of exposures answer `Unsupported`.
    fn read_peer_with(&mut self, addr: usize, len: usize, copy: &mut dyn FnMut()) -> io::Result<()> {
        let _ = (addr, len, copy);
        Err(io::Error::new(io::ErrorKind::Unsupported, "this link keeps no record of what its peer exposes"))
    }

    /// Announce that the peer may [`Link::read_peer`] `[addr, addr + len)` of this
    /// rank's memory, until [`Link::revoke_exposed`] (or until this link is dropped).
    /// Links whose peer reads through the kernel keep no record (the default).
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay allocated and initialised until this link's
    /// next `revoke_exposed` returns or the link is dropped, whichever comes first.
    unsafe fn expose(&mut self, addr: usize, len: usize) {
        let _ = (addr, len);
    }

    /// Withdraw everything this end exposed. A copy the peer has in progress is
    /// waited for (threads of one process, where the copy dereferences this
    /// memory) or fails once done (shared memory, where it goes through the kernel
    /// or a mapping of the peer's own); a later `read_peer` or `read_peer_with` of
    /// those ranges fails. Called before the exposed memory may be freed or reused.
    fn revoke_exposed(&mut self) {}
}
