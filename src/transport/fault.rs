//! Fault injection under the executor: [`FaultLink`] wraps any [`Link`] and, at
//! one point of the byte stream this rank sends on it, delays, stalls, cuts or
//! corrupts it as a [`FaultPlan`] says. The tests' fault grid drives every
//! collective over every stream transport through it (`tests/fault_grid.rs`).
//!
//! A plan names a rank, a link of that rank (or any), the data frame on that link
//! (data and rendezvous frames, counted from 0 as they begin; control frames —
//! abort, goodbye, ack — pass uncounted) and a byte offset into it. The wrapper
//! finds frame boundaries from each header's length (see [`crate::frame`]).
//! Everything else is forwarded unchanged, the single-copy calls included: a
//! rendezvous frame is a frame of the stream like any other, and the peer's reads of
//! this rank's memory go through the peer's own link.
//!
//! Only header bytes are corrupted. Nothing in a frame checks its payload: TCP
//! checksums its segments and shared memory is local memory, so a real link does
//! not flip payload bits, and a flipped one would be a wrong result that no
//! receiver could tell from a right one.
//!
//! Without a plan no link is wrapped: the hook costs one check at connect time.

use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Link, TransportKind};
use crate::error::{Error, Result};
use crate::frame::{padding, FrameKind, HEADER_LEN};

/// What happens to the stream at the plan's point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Take no byte for this long from the point on, then deliver everything unchanged.
    Delay(Duration),
    /// Deliver nothing from the point on and keep the link open (a wedged peer or
    /// path): only a deadline can tell. Closing the link is swallowed too.
    Stall,
    /// Tear the connection down at the point: the link is dropped, so this end's
    /// writes and reads fail and the peer finds it closed.
    Cut,
    /// The rank dies at the point, as a process killed there would: this link is
    /// dropped at once and every other link of the rank the next time the rank
    /// touches it (the failing call touches them all as it ends), each without its
    /// abort or goodbye, so every peer finds its link ended without a word.
    Vanish,
    /// XOR `xor` (non-zero) into the header byte at the point's offset (below
    /// [`FaultPlan::HEADER_BYTES`]) of the frame; the rest goes unchanged.
    CorruptHeader {
        /// The bits flipped.
        xor: u8,
    },
}

/// Where in a rank's outgoing stream a fault acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultPoint {
    /// The link to this peer; None: whichever link of the rank reaches the point first.
    pub peer: Option<usize>,
    /// The data frame on that link, counted from 0 (data and rendezvous frames only).
    pub frame: u64,
    /// Bytes into that frame (header included) written before the fault acts; at or
    /// past the frame's end, the fault acts before its last byte (so it always acts
    /// inside the frame, never on a control frame that follows it).
    pub offset: usize,
}

/// One fault for a communicator: rank `rank`'s stream at `point` suffers `action`,
/// once. Clones share whether and where it fired ([`FaultPlan::fired`]). Faults of
/// other ranks may ride along ([`FaultPlan::and`]), one per rank.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    rank: usize,
    point: FaultPoint,
    action: FaultAction,
    /// The peer of the link where the fault acted, once it has.
    fired: Arc<Mutex<Option<usize>>>,
    /// The plans of other ranks given with this one.
    others: Vec<FaultPlan>,
}

impl PartialEq for FaultPlan {
    fn eq(&self, other: &Self) -> bool {
        (self.rank, self.point, self.action) == (other.rank, other.point, other.action)
    }
}

impl Eq for FaultPlan {}

impl FaultPlan {
    /// Length of a frame header: the bytes [`FaultAction::CorruptHeader`] may flip.
    pub const HEADER_BYTES: usize = HEADER_LEN;

    /// A plan, refused when a corruption names no header byte or flips no bit.
    pub fn new(rank: usize, point: FaultPoint, action: FaultAction) -> Result<FaultPlan> {
        if let FaultAction::CorruptHeader { xor } = action {
            if point.offset >= HEADER_LEN || xor == 0 {
                return Err(Error::InvalidArgument(format!(
                    "fault plan: a header corruption flips a non-zero mask into one of the first {HEADER_LEN} \
                     bytes of a frame (got offset {}, mask {xor:#04x}); payload bytes are not checked by any \
                     receiver, so flipping them is not a fault braid can report",
                    point.offset
                )));
            }
        }
        Ok(FaultPlan { rank, point, action, fired: Arc::default(), others: Vec::new() })
    }

    /// This plan and `other`, for another rank, given together (to an in-process
    /// group, whose ranks share one configuration). `other` keeps sharing
    /// [`FaultPlan::fired`] with its clones. Refused for a rank that has a plan here.
    pub fn and(mut self, other: FaultPlan) -> Result<FaultPlan> {
        let mut added = vec![other.clone()];
        added.extend(other.others.iter().cloned());
        for p in &added {
            if self.for_rank(p.rank).is_some() {
                return Err(Error::InvalidArgument(format!("fault plan: two faults for rank {}", p.rank)));
            }
            let mut p = p.clone();
            p.others.clear();
            self.others.push(p);
        }
        Ok(self)
    }

    /// The plan of `rank`, if this one or one given with it is.
    fn for_rank(&self, rank: usize) -> Option<&FaultPlan> {
        std::iter::once(self).chain(&self.others).find(|p| p.rank == rank)
    }

    /// The rank whose outgoing stream the fault acts on.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Where the fault acts.
    pub fn point(&self) -> FaultPoint {
        self.point
    }

    /// What the fault does.
    pub fn action(&self) -> FaultAction {
        self.action
    }

    /// The peer of the link where the fault acted; None while it has not (the link
    /// carried fewer frames, or the call failed before the point).
    pub fn fired(&self) -> Option<usize> {
        *self.fired.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claim the fault for the link to `peer`: false when another link already had it.
    fn claim(&self, peer: usize) -> bool {
        let mut fired = self.fired.lock().unwrap_or_else(PoisonError::into_inner);
        if fired.is_some() {
            return false;
        }
        *fired = Some(peer);
        true
    }
}

/// `link` of rank `rank`, wrapped when `plan` acts on it (a vanishing rank's links
/// all are: they all end when it vanishes).
pub(crate) fn wrap(plan: Option<&FaultPlan>, rank: usize, link: Box<dyn Link>) -> Box<dyn Link> {
    match plan.and_then(|p| p.for_rank(rank)) {
        Some(p) if p.action == FaultAction::Vanish || p.point.peer.is_none_or(|q| q == link.peer()) => {
            Box::new(FaultLink::new(link, p.clone()))
        }
        _ => link,
    }
}

/// What the stream does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Normal,
    /// Delayed until then.
    Delayed(Instant),
    Stalled,
    Cut,
}

/// A link whose outgoing stream suffers its plan's fault (see the module docs).
pub(crate) struct FaultLink {
    /// None once cut.
    inner: Option<Box<dyn Link>>,
    peer: usize,
    kind: TransportKind,
    can_peek: bool,
    can_read_peer: bool,
    reads_peer_addresses: bool,
    plan: FaultPlan,
    flow: Flow,
    /// The current frame's header, as far as it is known.
    hdr: [u8; HEADER_LEN],
    /// Bytes of the current frame written.
    at: usize,
    /// The current frame's length, once its header is known.
    total: Option<usize>,
    /// Data and rendezvous frames begun on this link.
    data_frames: u64,
    /// The current frame is the plan's and the fault has not acted yet.
    armed: bool,
    /// The corrupted header byte of the current frame, and its mask.
    flip: Option<(usize, u8)>,
}

impl FaultLink {
    pub(crate) fn new(inner: Box<dyn Link>, plan: FaultPlan) -> FaultLink {
        FaultLink {
            peer: inner.peer(),
            kind: inner.kind(),
            can_peek: inner.can_peek(),
            can_read_peer: inner.can_read_peer(),
            reads_peer_addresses: inner.reads_peer_addresses(),
            inner: Some(inner),
            plan,
            flow: Flow::Normal,
            hdr: [0; HEADER_LEN],
            at: 0,
            total: None,
            data_frames: 0,
            armed: false,
            flip: None,
        }
    }

    /// The offset in the current frame where an armed fault acts.
    fn act_at(&self, total: usize) -> usize {
        self.plan.point.offset.min(total - 1)
    }

    /// The header of a new frame is complete: learn its length, count it, arm the fault.
    fn begin_frame(&mut self) {
        let kind = self.hdr[3];
        let len = u32::from_le_bytes(self.hdr[32..36].try_into().expect("4 bytes")) as usize;
        let carries_data = kind == FrameKind::Data as u8 || kind == FrameKind::Rendezvous as u8;
        let pad = if carries_data { padding(FrameKind::Data, len) } else { 0 };
        self.total = Some(HEADER_LEN + len + pad);
        if carries_data {
            // Only a frame whose header was seen whole before any of it was written can
            // be the plan's (this executor always hands a frame's whole rest over).
            self.armed = self.at == 0
                && self.data_frames == self.plan.point.frame
                && self.plan.point.peer.is_none_or(|q| q == self.peer);
            self.data_frames += 1;
        }
    }

    /// The plan's point is reached: act. `Some` is what `try_write` returns now.
    fn act(&mut self) -> Option<io::Result<usize>> {
        self.armed = false;
        if !self.plan.claim(self.peer) {
            return None;
        }
        let (rank, peer, frame, offset) = (self.plan.rank, self.peer, self.plan.point.frame, self.at);
        tracing::info!(rank, peer, frame, offset, action = ?self.plan.action, "fault injection acts");
        match self.plan.action {
            FaultAction::Delay(d) => {
                self.flow = Flow::Delayed(Instant::now() + d);
                Some(Ok(0))
            }
            FaultAction::Stall => {
                self.flow = Flow::Stalled;
                Some(Ok(0))
            }
            FaultAction::Cut | FaultAction::Vanish => {
                self.inner = None;
                self.flow = Flow::Cut;
                Some(Err(cut_error(self.peer, io::ErrorKind::BrokenPipe)))
            }
            FaultAction::CorruptHeader { xor } => {
                self.flip = Some((self.plan.point.offset, xor));
                None
            }
        }
    }

    /// Write a prefix of `bufs`, which continue the current frame, through to the link.
    fn write_through(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        let Some(total) = self.total else {
            // A header split over calls: what is here goes through unexamined.
            let take = HEADER_LEN - self.at;
            let parts = slices(bufs, 0, take);
            let n = self.link()?.try_write(&parts)?;
            copy_prefix(&parts, &mut self.hdr[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        };
        let mut limit = total - self.at;
        if self.armed {
            limit = limit.min(self.act_at(total) - self.at);
        }
        // The header goes from this wrapper's copy (corrupted, if the plan says so),
        // the rest from the caller's buffers.
        let mut hdr = self.hdr;
        if let Some((i, xor)) = self.flip {
            hdr[i] ^= xor;
        }
        let head = &hdr[self.at.min(HEADER_LEN)..];
        let mut parts = vec![head];
        parts.extend(slices(bufs, head.len(), usize::MAX));
        let parts = slices(&parts, 0, limit);
        let n = self.link()?.try_write(&parts)?;
        self.at += n;
        Ok(n)
    }

    /// The wrapped link; an error once it was cut.
    fn link(&mut self) -> io::Result<&mut Box<dyn Link>> {
        self.vanish_if_gone();
        let peer = self.peer;
        self.inner.as_mut().ok_or_else(|| cut_error(peer, io::ErrorKind::ConnectionReset))
    }

    /// A vanishing rank's other links end, unannounced, once it has vanished.
    fn vanish_if_gone(&mut self) {
        if self.plan.action == FaultAction::Vanish && self.inner.is_some() && self.plan.fired().is_some() {
            self.inner = None;
            self.flow = Flow::Cut;
        }
    }
}

fn cut_error(peer: usize, kind: io::ErrorKind) -> io::Error {
    io::Error::new(kind, format!("the link to rank {peer} was cut (fault injection)"))
}

/// `bufs` as one byte string: its slices from byte `skip` on, at most `max` bytes.
fn slices<'a>(bufs: &[&'a [u8]], mut skip: usize, mut max: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        let take = (b.len() - skip).min(max);
        if take > 0 {
            out.push(&b[skip..skip + take]);
        }
        max -= take;
        skip = 0;
    }
    out
}

/// Fill `dst` from the start of `parts` as one byte string (which holds enough).
fn copy_prefix(parts: &[&[u8]], dst: &mut [u8]) {
    let mut at = 0;
    for p in parts {
        let take = p.len().min(dst.len() - at);
        dst[at..at + take].copy_from_slice(&p[..take]);
        at += take;
    }
}

impl Link for FaultLink {
    fn peer(&self) -> usize {
        self.peer
    }

    fn kind(&self) -> TransportKind {
        self.kind
    }

    fn try_write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        self.vanish_if_gone();
        match self.flow {
            Flow::Stalled => return Ok(0),
            Flow::Cut => return Err(cut_error(self.peer, io::ErrorKind::BrokenPipe)),
            Flow::Delayed(until) if Instant::now() < until => return Ok(0),
            Flow::Delayed(_) => self.flow = Flow::Normal,
            Flow::Normal => {}
        }
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        if let Some(total) = self.total {
            if self.armed && self.at >= self.act_at(total) {
                if let Some(r) = self.act() {
                    return r;
                }
            }
            if self.at == total {
                (self.at, self.total, self.armed, self.flip) = (0, None, false, None);
            }
        }
        if self.total.is_none() {
            let want = HEADER_LEN - self.at;
            let parts = slices(bufs, 0, want);
            if parts.iter().map(|p| p.len()).sum::<usize>() == want {
                copy_prefix(&parts, &mut self.hdr[self.at..]);
                self.begin_frame();
                if self.armed && self.act_at(self.total.expect("header known")) == 0 {
                    if let Some(r) = self.act() {
                        return r;
                    }
                }
            }
        }
        self.write_through(bufs)
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.link()?.try_read(buf)
    }

    fn poll_fd(&self) -> Option<RawFd> {
        // Held bytes are released by a later write, not by the descriptor: the
        // executor must poll the link, not sleep on a socket that is writable.
        match self.flow {
            Flow::Normal => self.inner.as_ref().and_then(|l| l.poll_fd()),
            _ => None,
        }
    }

    fn close(&mut self) {
        self.vanish_if_gone();
        if self.flow != Flow::Stalled {
            if let Some(l) = self.inner.as_mut() {
                l.close();
            }
        }
    }

    fn can_peek(&self) -> bool {
        self.can_peek
    }

    fn peek(&mut self, max: usize) -> io::Result<&[u8]> {
        self.link()?.peek(max)
    }

    fn peer_gone(&mut self) -> bool {
        self.vanish_if_gone();
        self.inner.as_mut().is_some_and(|l| l.peer_gone())
    }

    fn consume(&mut self, n: usize) {
        if let Some(l) = self.inner.as_mut() {
            l.consume(n);
        }
    }

    fn sent_unread(&self) -> bool {
        self.inner.as_ref().is_some_and(|l| l.sent_unread())
    }

    fn can_read_peer(&self) -> bool {
        self.can_read_peer
    }

    fn reads_peer_addresses(&self) -> bool {
        self.reads_peer_addresses
    }

    fn read_peer(&mut self, addr: usize, dst: &mut [u8]) -> io::Result<()> {
        self.link()?.read_peer(addr, dst)
    }

    unsafe fn expose(&mut self, addr: usize, len: usize) {
        if let Some(l) = self.inner.as_mut() {
            // SAFETY: the caller's promise about [addr, addr + len) is passed on as is.
            unsafe { l.expose(addr, len) };
        }
    }

    fn revoke_exposed(&mut self) {
        // A cut link was dropped, which revoked everything it exposed.
        if let Some(l) = self.inner.as_mut() {
            l.revoke_exposed();
        }
    }
}

#[cfg(test)]
#[path = "fault_tests.rs"]
mod tests;
