//! Shared-memory links between processes of one host.
//!
//! Each pair of ranks shares one segment: a small header, then two byte rings
//! ([`super::ring`]), lower rank to higher and back. The lower rank creates the
//! segment as a sealed memfd: `fallocate`d (a full tmpfs fails here, not as a
//! SIGBUS on first touch later), then sealed against shrinking and growing, so
//! a peer cannot truncate it under our mapping (which would SIGBUS this process).
//! It publishes `memfd:{pid}:{fd}:{id}` in the store under
//! `{key_prefix}/shm/{a}/{b}`; the higher rank opens `/proc/{pid}/fd/{fd}`, checks
//! the seals and the id in the header, maps it and says so in the header; the
//! creator then closes its descriptor, so a crash leaves nothing behind.
//!
//! Where `/proc` does not show the creator (another pid namespace, `hidepid`) or
//! memfds are unavailable, the segment is a file in `/dev/shm` with a unique
//! name instead (the attacher asks for one under `{...}/need-file`; the creator
//! publishes it under `{...}/file`). Such a file cannot be sealed (tmpfs allows
//! seals only on memfds), so there a peer that truncates it can still crash us
//! with SIGBUS; the mapping's length is fixed at creation and never re-read from
//! the file. The name is unlinked as soon as the peer has opened it, and on every
//! error path.
//!
//! A peer process that is killed leaves no end-of-stream mark in the rings, so
//! the header carries both pids and a link checks its peer's liveness (a pidfd,
//! immune to pid reuse) whenever it finds nothing to read or no room to write
//! and at least [`LIVENESS_INTERVAL`] passed since the last check. (Pids are
//! those of the creator's pid namespace: ranks that share `/dev/shm` but not a
//! pid namespace are not supported, their liveness checks would watch the wrong pid.)
//!
//! Single copy: the peer's registered buffers ([`crate::registered`]) live in
//! `/dev/shm` segments of their own, which any rank sharing `/dev/shm` can map, so
//! rendezvous framing is always allowed on these links ([`Link::can_read_peer`]).
//! Reading any other address of the peer goes through [`Link::read_peer`] with
//! `process_vm_readv` (CMA), only when wanted ([`ShmOptions::cma`]: unless
//! `BRAID_CMA=0`). Whether CMA works depends on ptrace policy, user namespaces
//! and seccomp, so it is then probed at connect time with a real read of a token
//! each side publishes, and enabled only when it works in both directions
//! ([`Link::reads_peer_addresses`]; both ends must agree, since it decides the
//! framing). See [`cma`] for the ptrace policy.
//!
//! Either way a pull reads only what the peer exposes ([`Link::expose`]) for the
//! call under way: each end publishes its exposure in the segment header and
//! withdraws it when the call ends ([`Link::revoke_exposed`]), so a pull that comes
//! late (the peer's call ended early) fails instead of reading memory its owner has
//! since freed or reused ([`exposure`]).
//!
//! Both ends prove the job key ([`ShmOptions::key`]) through the segment header
//! before the link is used; see [`setup`].
//!
//! Everything in the segment can be rewritten by the peer at any time: sizes are
//! checked once and kept privately ([`segment`]), and the ring ends check every
//! counter they read ([`super::ring`]), so a bad peer causes an error, not an
//! out-of-bounds access.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::ring::{RingReader, RingWriter};
pub use super::stream_copy::{StreamPolicy, TunerSwitch};
use super::{Link, TransportKind};
use crate::auth::JobKey;

mod cma;
mod connect;
mod exposure;
mod segment;
mod setup;

use cma::vm_read;
pub use connect::connect_shm;
use exposure::{while_exposed, Exposer};

#[cfg(test)]
mod tests;

/// Data bytes buffered per direction of a shared-memory link when every rank of
/// the host has a core. 2-core Zen 4 VM (1 MiB L2), 2 ranks bound to a core each,
/// alternating rounds at 1–64 MiB (`results/ring-size-2026-11-24.md`): 512 KiB
/// lost to 1 MiB and 2 MiB for every collective (all-reduce 1 MiB: 10.6–11.0 GB/s
/// against 16.1–16.4), and 2 MiB beat 1 MiB from 16 MiB up (all-reduce 64 MiB
/// 7.6 against 5.9, all-gather 64 MiB 7.6 against 5.4) and 4 MiB at most sizes.
pub const SHM_RING_BYTES: usize = 2 << 20;
/// Ring bytes when ranks outnumber cores: a rank can then post a whole step and
/// give up its core instead of waiting for room (4 ranks on 2 cores: 1.4–1.6 GB/s
/// at 1 MiB with 512 KiB rings, 2.1–2.3 with 4 MiB).
pub const SHM_RING_BYTES_OVERSUBSCRIBED: usize = 4 << 20;
/// Ring bytes one rank may receive into across all its shared-memory links: with
/// many ranks on a host, rings shrink (to no less than [`SHM_RING_BYTES_MIN`]) so
/// `/dev/shm` use grows with the ranks, not with their square.
pub const SHM_RING_BUDGET: usize = 16 << 20;
/// The smallest ring the budget shrinks to.
pub const SHM_RING_BYTES_MIN: usize = 256 << 10;

/// The ring size for a host running `local_ranks` ranks of the communicator on
/// `cores` CPUs between them (0: unknown, taken as the machine's). Not this
/// process's affinity: a rank bound to one core is not oversubscribed when its
/// peers have cores of their own.
pub fn default_ring_bytes(local_ranks: usize, cores: usize) -> usize {
    let cores = crate::placement::cpus_or_online(cores);
    let wanted = if local_ranks > cores { SHM_RING_BYTES_OVERSUBSCRIBED } else { SHM_RING_BYTES };
    let share = SHM_RING_BUDGET / local_ranks.saturating_sub(1).max(1);
    // A multiple of the page size, as segment set-up requires.
    wanted.min(share.max(SHM_RING_BYTES_MIN)) / 4096 * 4096
}

/// Least time between two liveness checks of a link's peer process.
pub const LIVENESS_INTERVAL: Duration = Duration::from_millis(50);
/// Empty polls of a link between two reads of the clock for liveness checks (a
/// rank that sleeps between polls sleeps at most 1 ms, so a dead peer is still
/// seen within about 0.1 s).
const POLLS_PER_CLOCK_READ: u32 = 64;

/// Directory the segments live in (a tmpfs on Linux).
const SHM_DIR: &str = "/dev/shm";

/// How to set up the shared-memory links of one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmOptions {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Store namespace of this communicator; segment names go under `{key_prefix}/shm/{a}/{b}`.
    pub key_prefix: String,
    /// Which ranks to link with (`world` entries; this rank's own entry is ignored).
    /// Both ends of a pair must mark each other, or setup waits for the missing one.
    pub peers: Vec<bool>,
    /// Deadline for the whole setup.
    pub timeout: Duration,
    /// Data bytes per direction, `1..=`[`MAX_RING_BYTES`] (the creator's value wins;
    /// the attacher reads it from the segment and checks it).
    pub ring_bytes: usize,
    /// Whether plain buffers may be read with `process_vm_readv` (unless `BRAID_CMA=0`):
    /// only then is CMA probed and ptrace relaxed for the local peers.
    pub cma: bool,
    /// Whether large ring writes use non-temporal stores (`BRAID_NT_STORES`).
    pub stream: StreamPolicy,
    /// Under [`StreamPolicy::Auto`], the communicator's switch the writers follow.
    pub switch: TunerSwitch,
    /// The job key both ends of each segment prove (none: the exchange runs with
    /// the empty key and proves nothing).
    pub key: JobKey,
}

impl ShmOptions {
    /// Options linking `rank` with every other rank of `world`, 60 s timeout,
    /// [`SHM_RING_BYTES`] per direction, no CMA, no job key.
    pub fn new(rank: usize, world: usize, key_prefix: impl Into<String>) -> ShmOptions {
        ShmOptions {
            rank,
            world,
            key_prefix: key_prefix.into(),
            peers: vec![true; world],
            timeout: crate::config::DEFAULT_TIMEOUT,
            ring_bytes: SHM_RING_BYTES,
            cma: false,
            stream: StreamPolicy::Auto,
            switch: TunerSwitch::default(),
            key: JobKey::none(),
        }
    }
}

/// The store key under which lower rank `a` publishes the segment it shares with `b`.
pub fn segment_key(key_prefix: &str, a: usize, b: usize) -> String {
    format!("{key_prefix}/shm/{a}/{b}")
}

/// How a link learns that its peer process is gone.
enum PeerWatch {
    /// The peer is this very process (ranks as threads): it cannot die alone.
    SameProcess,
    /// A pidfd: readable once the process exited, whatever later reuses its pid.
    Pidfd(OwnedFd),
    /// No pidfd (old kernel): `kill(pid, 0)` and ESRCH.
    Pid(i32),
}

impl PeerWatch {
    fn new(pid: i32) -> PeerWatch {
        if pid == std::process::id() as i32 {
            return PeerWatch::SameProcess;
        }
        // SAFETY: plain system call; on success it returns a new descriptor we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor nothing else owns.
            PeerWatch::Pidfd(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        } else {
            PeerWatch::Pid(pid)
        }
    }

    fn alive(&self) -> bool {
        match self {
            PeerWatch::SameProcess => true,
            PeerWatch::Pidfd(fd) => {
                let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd, zero timeout.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                !(n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0)
            }
            // Never a real peer's pid (the header is the peer's to write): 0 and
            // negatives would address process groups.
            PeerWatch::Pid(pid) if *pid <= 0 => false,
            PeerWatch::Pid(pid) => {
                // SAFETY: signal 0 only checks that the process exists.
                let r = unsafe { libc::kill(*pid, 0) };
                !(r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH))
            }
        }
    }
}

/// One end of a shared-memory connection to a process on this host.
pub struct ShmLink {
    peer: usize,
    peer_pid: i32,
    tx: RingWriter,
    rx: RingReader,
    watch: PeerWatch,
    last_check: Instant,
    /// Empty polls since the clock was last read (see `check_due`).
    idle_polls: u32,
    cma: bool,
    /// What this end lets the peer read, as published in the segment header.
    exposer: Exposer,
    /// This end's index in the segment header (0: the creator).
    side: usize,
    /// The segment, for its header's exposure words.
    map: std::sync::Arc<segment::Mapping>,
}

impl ShmLink {
    /// The peer's process id.
    #[cfg(test)]
    pub fn peer_pid(&self) -> i32 {
        self.peer_pid
    }

    /// Whether a liveness check is due (at most one per [`LIVENESS_INTERVAL`]).
    /// The clock is read only every [`POLLS_PER_CLOCK_READ`] empty polls: a waiting
    /// rank polls in a tight loop, and reading the clock on every pass delayed
    /// noticing the peer's data.
    fn check_due(&mut self) -> bool {
        self.idle_polls += 1;
        if self.idle_polls < POLLS_PER_CLOCK_READ {
            return false;
        }
        self.idle_polls = 0;
        let now = Instant::now();
        if now.duration_since(self.last_check) >= LIVENESS_INTERVAL {
            self.last_check = now;
            true
        } else {
            false
        }
    }

    fn broke_protocol(&self, e: io::Error) -> io::Error {
        protocol_error(self.peer, e)
    }

    /// The words in which this end publishes its exposure, and the peer's.
    fn exposure_words(&self) -> (&exposure::ExposureWords, &exposure::ExposureWords) {
        let words = &self.map.header().exposure;
        (&words[self.side], &words[1 - self.side])
    }

    fn gone_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("rank {} (pid {}) exited without closing its shared-memory link", self.peer, self.peer_pid),
        )
    }
}

impl Link for ShmLink {
    fn peer(&self) -> usize {
        self.peer
    }

    fn sent_unread(&self) -> bool {
        self.tx.free() < self.tx.capacity()
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn try_write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        if self.tx.is_reader_closed() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("rank {} dropped its shared-memory link", self.peer),
            ));
        }
        let n = self.tx.write(bufs).map_err(|e| self.broke_protocol(e))?;
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) && self.check_due() && !self.watch.alive() {
            return Err(self.gone_error());
        }
        Ok(n)
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.rx.read(buf).map_err(|e| self.broke_protocol(e))?;
        if n > 0 || buf.is_empty() {
            return Ok(n);
        }
        if self.rx.is_writer_closed() && self.rx.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("rank {} closed its shared-memory link", self.peer),
            ));
        }
        if self.check_due() && !self.watch.alive() {
            // What it wrote before dying is still good: hand that out first.
            return match self.rx.read(buf).map_err(|e| self.broke_protocol(e))? {
                0 => Err(self.gone_error()),
                n => Ok(n),
            };
        }
        Ok(0)
    }

    fn can_peek(&self) -> bool {
        true
    }

    fn peek(&mut self, max: usize) -> io::Result<&[u8]> {
        // Same end-of-stream and liveness rules as `try_read`; the borrow of the ring
        // is taken last so the checks can use `self`.
        if self.rx.is_empty() && max > 0 {
            if self.rx.is_writer_closed() && self.rx.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("rank {} closed its shared-memory link", self.peer),
                ));
            }
            if self.check_due() && !self.watch.alive() && self.rx.is_empty() {
                return Err(self.gone_error());
            }
        }
        let peer = self.peer;
        self.rx.peek(max).map_err(|e| protocol_error(peer, e))
    }

    fn consume(&mut self, n: usize) {
        self.rx.consume(n);
    }

    fn poll_fd(&self) -> Option<RawFd> {
        None
    }

    fn peer_gone(&mut self) -> bool {
        self.tx.is_reader_closed() || !self.watch.alive()
    }

    fn close(&mut self) {
        self.tx.close();
    }

    /// The peer's registered segments can always be mapped: it shares our `/dev/shm`.
    fn can_read_peer(&self) -> bool {
        true
    }

    fn reads_peer_addresses(&self) -> bool {
        self.cma
    }

    fn read_peer(&mut self, addr: usize, dst: &mut [u8]) -> io::Result<()> {
        if !self.cma {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "cannot read the memory of rank {} (pid {}): process_vm_readv is off (BRAID_CMA) \
                     or did not pass the connect-time probe",
                    self.peer, self.peer_pid
                ),
            ));
        }
        let (peer, pid, len) = (self.peer, self.peer_pid, dst.len());
        while_exposed(self.exposure_words().1, peer, addr, len, || {
            vm_read(pid, addr, dst).map_err(|e| {
                let kind = if e.raw_os_error() == Some(libc::ESRCH) { io::ErrorKind::UnexpectedEof } else { e.kind() };
                io::Error::new(kind, format!("reading {len} bytes at {addr:#x} of rank {peer} (pid {pid}): {e}"))
            })
        })
    }

    /// A copy out of the peer's registered segment, checked against its
    /// exposure like a CMA read (see [`exposure`]).
    fn read_peer_with(&mut self, addr: usize, len: usize, copy: &mut dyn FnMut()) -> io::Result<()> {
        while_exposed(self.exposure_words().1, self.peer, addr, len, || {
            copy();
            Ok(())
        })
    }

    unsafe fn expose(&mut self, addr: usize, len: usize) {
        let words = &self.map.header().exposure[self.side];
        self.exposer.expose(words, addr, len);
    }

    fn revoke_exposed(&mut self) {
        let words = &self.map.header().exposure[self.side];
        self.exposer.revoke(words);
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        // `expose` promises the memory only until revocation or drop; the peer
        // keeps the segment mapped after we unmap it.
        self.revoke_exposed();
    }
}

/// A ring counter the peer wrote is impossible: name the peer, keep the kind (`InvalidData`).
fn protocol_error(peer: usize, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("shared-memory link with rank {peer}: {e}"))
}

/// 64 random bits from the kernel (falls back to std's per-process random keys).
pub(crate) fn random_u64() -> u64 {
    u64::from_ne_bytes(crate::auth::random_bytes())
}
