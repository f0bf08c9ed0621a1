//! Setting up one segment with one peer: the lower rank creates and publishes
//! it, the higher rank checks and maps it, both prove the job key through the
//! header, then (only when CMA is wanted) each probes whether it can read the
//! other's memory.
//!
//! The job-key exchange: the creator writes its challenge before the magic; the
//! attacher writes its own challenge and its answer (role Responder) and sets
//! `attached`; the creator checks that answer, writes its verdict and, when it
//! accepts, its own answer (role Initiator), which the attacher checks in turn.
//! Answers bind both challenges, both ranks and the communicator's store prefix,
//! so a process that learned the segment's name from the store but not the key
//! cannot take the peer's place, and an answer from one pair is no use in another.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::cma::vm_read;
use super::exposure::Exposer;
use super::segment::*;
use super::{random_u64, segment_key, PeerWatch, ShmLink, ShmOptions, SHM_DIR};
use crate::auth::{self, Challenge, JobKey, Role};
use crate::bootstrap::Store;
use crate::error::{Error, OpContext, Result};
use crate::transport::ring::{self, RingReader, RingWriter};
use crate::transport::stream_copy::WriterStreaming;

pub(super) fn setup_ctx(rank: usize) -> OpContext {
    OpContext { rank, call: None, seq: 0 }
}

/// What the job-key answers of the pair (`creator`, `attacher`) are bound to.
fn auth_context(key_prefix: &str, creator: usize, attacher: usize) -> Vec<u8> {
    format!("braid-shm {key_prefix} {creator} {attacher}").into_bytes()
}

/// A segment being set up with one peer.
pub(super) struct Setup {
    pub peer: usize,
    rank: usize,
    /// 0: this rank created the segment (lower rank); 1: it attached.
    pub side: usize,
    pub map: Arc<Mapping>,
    /// What keeps the segment reachable for the peer (the creator's, until the peer attached).
    handle: Option<Handle>,
    /// The creator replaced its memfd by a named segment at the peer's request.
    file_offered: bool,
    /// Our probe token; the peer reads it, so it lives until both probes are done.
    token: Box<u64>,
    /// The peer's pid, read once from the header (0 until the creator sees the attacher).
    pub peer_pid: i32,
    /// Set once the peer's pid is known.
    pub watch: Option<PeerWatch>,
    key: JobKey,
    context: Vec<u8>,
    challenge: Challenge,
    /// Both ends proved the job key.
    pub authenticated: bool,
    /// Whether this side wants CMA (it probes only then).
    cma: bool,
    /// How this side's ring writer stores large writes.
    streaming: WriterStreaming,
    /// This side said it may be probed.
    ready: bool,
    probed: bool,
}

impl Setup {
    pub(super) fn done(&self) -> bool {
        let h = self.map.header();
        self.authenticated && self.probed && h.probe_result.iter().all(|r| r.load(Ordering::Acquire) != PROBE_PENDING)
    }

    fn auth_failed(&self, detail: String) -> Error {
        tracing::debug!(rank = self.rank, peer = self.peer, "shm: job-key check failed: {detail}");
        Error::Protocol { ctx: setup_ctx(self.rank), peer: self.peer, detail }
    }

    /// Move the job-key exchange on; returns whether anything changed.
    pub(super) fn advance_auth(&mut self) -> Result<bool> {
        if self.authenticated {
            return Ok(false);
        }
        let h = self.map.header();
        if self.side == 0 {
            if h.attached.load(Ordering::Acquire) != 1 {
                return Ok(false);
            }
            self.handle = None; // closes the memfd or unlinks the name: both sides have it mapped
            self.peer_pid = h.pids[1].load(Ordering::Relaxed);
            self.watch = Some(PeerWatch::new(self.peer_pid));
            let theirs = load_words(&h.challenge[1]);
            let proof = load_words(&h.proof[1]);
            if !self.key.verify(Role::Responder, &self.context, &self.challenge, &theirs, &proof) {
                h.verdict.store(VERDICT_REJECTED, Ordering::Release);
                return Err(self.auth_failed(format!(
                    "the process attaching to the shared-memory segment as rank {} did not prove the job key \
                     (a different BRAID_JOB_KEY, or not a rank of this job)",
                    self.peer
                )));
            }
            store_words(&h.proof[0], &self.key.prove(Role::Initiator, &self.context, &self.challenge, &theirs));
            h.verdict.store(VERDICT_ACCEPTED, Ordering::Release);
        } else {
            match h.verdict.load(Ordering::Acquire) {
                VERDICT_PENDING => return Ok(false),
                VERDICT_ACCEPTED => {}
                _ => {
                    return Err(self.auth_failed(format!(
                        "rank {} refused this rank's proof of the job key on their shared-memory segment \
                         (a different BRAID_JOB_KEY?)",
                        self.peer
                    )))
                }
            }
            let theirs = load_words(&h.challenge[0]);
            let proof = load_words(&h.proof[0]);
            if !self.key.verify(Role::Initiator, &self.context, &self.challenge, &theirs, &proof) {
                return Err(self.auth_failed(format!(
                    "the shared-memory segment published for rank {} was not made with the job key \
                     (a different BRAID_JOB_KEY, or not a rank of this job)",
                    self.peer
                )));
            }
        }
        self.authenticated = true;
        Ok(true)
    }

    /// Say this side may be probed now (its ptrace policy is in place); a side
    /// that does not want CMA records a failed probe right away instead.
    pub(super) fn mark_ready(&mut self) {
        let h = self.map.header();
        if !self.cma {
            h.probe_result[self.side].store(PROBE_FAILED, Ordering::Release);
            self.probed = true;
        }
        h.probe_ready[self.side].store(1, Ordering::Release);
        self.ready = true;
    }

    /// Probe the peer once both sides are ready; returns whether it did.
    pub(super) fn advance_probe(&mut self) -> bool {
        if !self.ready || self.probed || self.map.header().probe_ready[1 - self.side].load(Ordering::Acquire) != 1 {
            return false;
        }
        self.probe();
        true
    }

    /// Read the other side's token through CMA and record whether it matched.
    fn probe(&mut self) {
        let h = self.map.header();
        let other = 1 - self.side;
        let addr = h.probe_addr[other].load(Ordering::Acquire) as usize;
        let want = h.probetoken[other].load(Ordering::Relaxed);
        let mut got = [0u8; 8];
        // The address is the peer's word; the kernel checks it against the peer's
        // address space and this side only ever writes into `got`.
        let ok = match vm_read(self.peer_pid, addr, &mut got) {
            Ok(()) => u64::from_ne_bytes(got) == want,
            Err(e) => {
                tracing::debug!(peer = self.peer, pid = self.peer_pid, "shm: process_vm_readv probe failed: {e}");
                false
            }
        };
        h.probe_result[self.side].store(if ok { PROBE_OK } else { PROBE_FAILED }, Ordering::Release);
        self.probed = true;
    }

    /// Publish this side's pid and probe token.
    fn announce(&mut self) {
        let h = self.map.header();
        h.pids[self.side].store(std::process::id() as i32, Ordering::Relaxed);
        h.probetoken[self.side].store(*self.token, Ordering::Relaxed);
        h.probe_addr[self.side].store(&*self.token as *const u64 as u64, Ordering::Release);
    }

    pub(super) fn into_link(self) -> Result<ShmLink> {
        let what = |e| Error::io(format!("rank {}: attaching the rings shared with rank {}", self.rank, self.peer), e);
        let keep: Arc<dyn Send + Sync> = self.map.clone();
        let (tx_ring, rx_ring) = if self.side == 0 { (0, 1) } else { (1, 0) };
        let (tx_at, tx_len) = self.map.ring(tx_ring).map_err(what)?;
        let (rx_at, rx_len) = self.map.ring(rx_ring).map_err(what)?;
        // SAFETY: `Mapping::ring` checked that both regions lie in the mapping `keep`
        // holds (with the capacity validated when it was made); the creator set them
        // up, and this side is the only writer of `tx_ring` and the only reader of
        // `rx_ring` (the peer holds the opposite ends). The ends check the ring
        // headers themselves, since the peer can write them.
        let (tx, rx) =
            unsafe { (RingWriter::attach(tx_at, tx_len, keep.clone()), RingReader::attach(rx_at, rx_len, keep)) };
        let h = self.map.header();
        let cma = h.probe_result.iter().all(|r| r.load(Ordering::Acquire) == PROBE_OK);
        let mut tx = tx.map_err(what)?;
        tx.set_streaming(self.streaming);
        Ok(ShmLink {
            peer: self.peer,
            peer_pid: self.peer_pid,
            tx,
            rx: rx.map_err(what)?,
            watch: self.watch.unwrap_or_else(|| PeerWatch::new(self.peer_pid)),
            last_check: Instant::now(),
            idle_polls: 0,
            cma,
            exposer: Exposer::default(),
            side: self.side,
            map: self.map,
        })
    }
}

/// The store key under which an attacher that cannot open the creator's memfd
/// asks for a named segment instead.
pub(super) fn need_file_key(key_prefix: &str, a: usize, b: usize) -> String {
    format!("{}/need-file", segment_key(key_prefix, a, b))
}

/// The store key under which the creator then publishes that named segment.
pub(super) fn file_key(key_prefix: &str, a: usize, b: usize) -> String {
    format!("{}/file", segment_key(key_prefix, a, b))
}

/// What keeps a created segment reachable by the peer until it attached.
#[expect(dead_code, reason = "held only for what dropping it does: close the memfd or unlink the name")]
pub(super) enum Handle {
    /// A sealed memfd: the descriptor the peer opens through `/proc`.
    Memfd(File),
    /// A file in `/dev/shm`, unlinked on drop.
    Named(SegmentFile),
}

/// Make and fill in a segment for `peer`: a sealed memfd when `memfd` (and the
/// kernel allows it), else a file in `/dev/shm`. Returns the mapping, what keeps
/// it reachable, and what to publish.
fn new_segment(
    opts: &ShmOptions,
    peer: usize,
    challenge: &Challenge,
    token: &u64,
    memfd: bool,
) -> Result<(Arc<Mapping>, Handle, Vec<u8>)> {
    let rank = opts.rank;
    let cap = opts.ring_bytes;
    let len = segment_len(cap)
        .filter(|_| (1..=MAX_RING_BYTES).contains(&cap))
        .ok_or_else(|| Error::InvalidArgument(format!("shm ring size {cap} is not in 1..={MAX_RING_BYTES}")))?;
    let pid = std::process::id();
    let segment_id = random_u64();
    let base = format!("braid-{pid}-{rank}-{peer}-{segment_id:016x}");
    let sealed = if memfd {
        create_memfd(&base, len)
            .map_err(|e| tracing::debug!(rank, peer, "shm: no sealed memfd ({e}); using a file in {SHM_DIR}"))
            .ok()
    } else {
        None
    };
    let (file, handle, published) = match sealed {
        Some(file) => {
            // The handle keeps its own descriptor open until the peer attached: that is the one published.
            let kept = file.try_clone().map_err(|e| Error::io(format!("rank {rank}: keeping a memfd segment"), e))?;
            let published = memfd_handle(pid, kept.as_raw_fd(), segment_id);
            (file, Handle::Memfd(kept), published)
        }
        None => {
            let path = PathBuf::from(format!("{SHM_DIR}/{base}"));
            let what =
                |doing: &str| format!("rank {rank}: {doing} shared-memory segment {} for rank {peer}", path.display());
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| Error::io(what("creating"), e))?;
            // From here on, every early return unlinks the name (SegmentFile's drop).
            let guard = SegmentFile { path: path.clone() };
            // SAFETY: plain system call on our descriptor.
            if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) } != 0 {
                let e = io::Error::last_os_error();
                return Err(Error::io(what(&format!("reserving {len} bytes (is {SHM_DIR} full?) for")), e));
            }
            let published = path.to_string_lossy().into_owned();
            (file, Handle::Named(guard), published)
        }
    };
    let what = |doing: &str| format!("rank {rank}: {doing} shared-memory segment {published} for rank {peer}");
    let map = Arc::new(Mapping::map(&file, cap).map_err(|e| Error::io(what("mapping"), e))?);
    for i in 0..2 {
        let (at, _) = map.ring(i).map_err(|e| Error::io(what("laying out"), e))?;
        // SAFETY: `Mapping::ring` checked the region lies inside the fresh mapping; it
        // is page-aligned and nobody uses it yet (nothing is published).
        unsafe { ring::init(at, cap) };
    }
    let h = map.header();
    h.version.store(SEG_VERSION, Ordering::Relaxed);
    h.ring_capacity.store(cap as u64, Ordering::Relaxed);
    h.ranks[0].store(rank as u64, Ordering::Relaxed);
    h.ranks[1].store(peer as u64, Ordering::Relaxed);
    h.segment_id.store(segment_id, Ordering::Relaxed);
    store_words(&h.challenge[0], challenge);
    h.pids[0].store(pid as i32, Ordering::Relaxed);
    h.probetoken[0].store(*token, Ordering::Relaxed);
    h.probe_addr[0].store(token as *const u64 as u64, Ordering::Relaxed);
    h.magic.store(SEG_MAGIC, Ordering::Release);
    tracing::debug!(rank, peer, segment = %published, len, "shm: segment created");
    Ok((map, handle, published.into_bytes()))
}

/// Create, fill in and publish the segment this (lower) rank shares with `peer`.
pub(super) fn create(opts: &ShmOptions, peer: usize, store: &dyn Store) -> Result<Setup> {
    let rank = opts.rank;
    let challenge = auth::challenge();
    let token = Box::new(random_u64());
    let (map, handle, published) = new_segment(opts, peer, &challenge, &token, true)?;
    let s = Setup {
        peer,
        rank,
        side: 0,
        map,
        handle: Some(handle),
        token,
        peer_pid: 0,
        watch: None,
        key: opts.key.clone(),
        context: auth_context(&opts.key_prefix, rank, peer),
        challenge,
        authenticated: false,
        cma: opts.cma,
        streaming: WriterStreaming::new(opts.stream, opts.switch.clone()),
        ready: false,
        probed: false,
        file_offered: false,
    };
    store.set(&segment_key(&opts.key_prefix, rank, peer), &published)?;
    Ok(s)
}

impl Setup {
    /// Whether this (creating) side still waits for the peer to attach.
    pub(super) fn awaits_attach(&self) -> bool {
        self.side == 0 && self.handle.is_some() && !self.file_offered
    }

    /// The peer could not open our memfd: make a named segment in `/dev/shm`
    /// instead and publish it under [`file_key`]. The memfd was never mapped by
    /// anyone else, so it simply goes.
    pub(super) fn offer_file(&mut self, opts: &ShmOptions, store: &dyn Store) -> Result<()> {
        let (map, handle, published) = new_segment(opts, self.peer, &self.challenge, &self.token, false)?;
        self.map = map;
        self.handle = Some(handle);
        self.file_offered = true;
        store.set(&file_key(&opts.key_prefix, self.rank, self.peer), &published)?;
        tracing::debug!(rank = self.rank, peer = self.peer, "shm: offered a named segment instead of a memfd");
        Ok(())
    }
}

/// What an attacher does with a segment handle from the store.
pub(super) enum Attached {
    Done(Box<Setup>),
    /// The memfd could not be opened here; a named segment was asked for.
    WantsFile,
}

/// Attach to what lower rank `peer` published: its memfd through `/proc` when
/// that opens, else ask for a named segment; or a named segment directly.
pub(super) fn attach_published(
    opts: &ShmOptions,
    peer: usize,
    published: &[u8],
    store: &dyn Store,
) -> Result<Attached> {
    let Some((pid, fd, id)) = parse_memfd_handle(published) else {
        return Ok(Attached::Done(Box::new(attach(opts, peer, published)?)));
    };
    #[cfg(test)]
    let opened = if tests_hook::REFUSE_MEMFD.get() {
        Err(io::Error::new(io::ErrorKind::PermissionDenied, "refused by the test"))
    } else {
        open_memfd(pid, fd)
    };
    #[cfg(not(test))]
    let opened = open_memfd(pid, fd);
    match opened {
        Ok(file) => {
            let what = format!("memfd {fd} of pid {pid}");
            Ok(Attached::Done(Box::new(attach_open(opts, peer, file, &what, Some(id))?)))
        }
        Err(e) => {
            tracing::debug!(
                rank = opts.rank,
                peer,
                pid,
                fd,
                "shm: cannot open the peer's memfd ({e}); asking for a file"
            );
            store.set(&need_file_key(&opts.key_prefix, peer, opts.rank), b"1")?;
            Ok(Attached::WantsFile)
        }
    }
}

/// Map the segment lower rank `peer` published as `name` in `/dev/shm`, check
/// it, and answer its challenge.
pub(super) fn attach(opts: &ShmOptions, peer: usize, name: &[u8]) -> Result<Setup> {
    let rank = opts.rank;
    let path = PathBuf::from(String::from_utf8_lossy(name).into_owned());
    let what = |doing: &str| format!("rank {rank}: {doing} shared-memory segment {} of rank {peer}", path.display());
    let bad = |detail: String| Error::Protocol { ctx: setup_ctx(rank), peer, detail };
    // Only a braid segment directly in /dev/shm: the name comes from the store, and
    // this rank is about to write into whatever file it names.
    let is_segment = path.parent() == Some(Path::new(SHM_DIR))
        && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("braid-"));
    if !is_segment {
        return Err(bad(format!("segment name `{}` is not a braid segment in {SHM_DIR}", path.display())));
    }
    // O_NOFOLLOW and O_NONBLOCK: a link or a FIFO planted under a braid name is refused, not followed or waited on.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| Error::io(what("opening"), e))?;
    // The name has served its purpose once we hold the file open.
    super::segment::unlink_quietly(&path);
    attach_open(opts, peer, file, &path.display().to_string(), None)
}

/// Check and map the segment open in `file` (described as `desc`), and answer its challenge.
fn attach_open(opts: &ShmOptions, peer: usize, file: File, desc: &str, id: Option<u64>) -> Result<Setup> {
    let rank = opts.rank;
    let what = |doing: &str| format!("rank {rank}: {doing} shared-memory segment {desc} of rank {peer}");
    let bad = |detail: String| Error::Protocol { ctx: setup_ctx(rank), peer, detail };
    let meta = file.metadata().map_err(|e| Error::io(what("inspecting"), e))?;
    if !meta.file_type().is_file() {
        return Err(bad(format!("segment {desc} is not a regular file")));
    }
    // One snapshot of the header, checked, before anything is mapped: from here on
    // only the checked capacity is used, whatever the peer writes into the header.
    let mut image = vec![0u8; SEG_HEADER_BYTES];
    file.read_exact_at(&mut image, 0).map_err(|e| Error::io(what("reading the header of"), e))?;
    let fields = HeaderFields::parse(&image);
    let cap = validate_header(&fields, meta.len(), peer, rank, id).map_err(|d| bad(format!("segment {desc}: {d}")))?;
    let map = Arc::new(Mapping::map(&file, cap).map_err(|e| Error::io(what("mapping"), e))?);
    let h = map.header();
    let peer_pid = h.pids[0].load(Ordering::Relaxed);
    let context = auth_context(&opts.key_prefix, peer, rank);
    let challenge = auth::challenge();
    let theirs = load_words(&h.challenge[0]);
    store_words(&h.challenge[1], &challenge);
    store_words(&h.proof[1], &opts.key.prove(Role::Responder, &context, &challenge, &theirs));
    let mut s = Setup {
        peer,
        rank,
        side: 1,
        map,
        handle: None,
        token: Box::new(random_u64()),
        peer_pid,
        watch: Some(PeerWatch::new(peer_pid)),
        key: opts.key.clone(),
        context,
        challenge,
        authenticated: false,
        cma: opts.cma,
        streaming: WriterStreaming::new(opts.stream, opts.switch.clone()),
        ready: false,
        probed: false,
        file_offered: false,
    };
    s.announce();
    s.map.header().attached.store(1, Ordering::Release);
    tracing::debug!(rank, peer, segment = desc, "shm: segment attached");
    Ok(s)
}

/// Lets a test play a rank that cannot open its peer's memfd (another pid namespace).
#[cfg(test)]
pub(super) mod tests_hook {
    thread_local! {
        pub static REFUSE_MEMFD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
}
