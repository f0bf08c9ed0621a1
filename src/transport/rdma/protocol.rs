//! The per-peer protocol of the verbs channel, with no verbs, no I/O and no clock.
//!
//! # Design
//!
//! Each rank pins one *receive ring* per peer: `slots` slots, each a [`HEADER_LEN`]
//! frame header followed by up to `payload_bytes` of data, in one memory region the
//! peer may write (its address and rkey travel through the store). Data moves as
//! *chunks*: the sender writes the header and the chunk's bytes into the next free
//! slot of the peer's ring with one RDMA WRITE WITH IMMEDIATE, whose immediate
//! value ([`imm`]) names the slot, the chunk's sequence number and whether it ends
//! the message. The write consumes a receive work request at the peer, so the
//! peer learns of the chunk from its completion queue (slot, length) without
//! polling memory.
//!
//! WRITE WITH IMMEDIATE rather than SEND: receive work requests then carry no
//! buffer (reposting one is a counter), the sender names the slot itself and the
//! receiver can check that it names the right one, and the ring stays one
//! registration however many receives are posted.
//!
//! Slots are used round-robin and every chunk costs the sender one *credit*. The
//! receiver copies (or reduces) the chunk out of its slot into the posted receive
//! and returns credits in batches with a zero-length WRITE WITH IMMEDIATE (an
//! immediate of kind credit, carrying the count). The sender never holds more
//! credits than slots, so it never overwrites a slot the receiver has not emptied;
//! the receiver checks that anyway.
//!
//! Chunks of one queue pair arrive in order (reliable connected), so the receiver
//! knows which slot and sequence number must come next and refuses anything else.
//! Local send completions may come before or after the peer's credit for the same
//! slot; a slot is reused only when both happened (its header staging is then free).
//!
//! Every header repeats the call's signature, sequence number, communicator id and
//! epoch ([`Header`]), so a chunk of another call is an [`Error::Mismatch`], not data.
//! A message of `len` bytes is cut into chunks at multiples of
//! [`SEGMENT_BYTES`] (the executor's pieces, whose gates a forward reads) and of the
//! slot payload; a forward sends what its gates say is final. A zero-length message
//! is one header-only chunk.
//!
//! An abort (with the reason) or a goodbye is a chunk too, whose header kind says so.
//!
//! Everything a peer controls (immediate values, byte counts, headers, credit
//! counts) is validated before use; a bad value is an [`Error::Protocol`] naming
//! the peer.

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::executor::channel::{MemKind, MemRegion, Reduction};
use crate::executor::{CallInfo, SEGMENT_BYTES};
use crate::frame::{FrameKind, Header, HEADER_LEN};
use crate::reduce;
use crate::types::{DType, ReduceOp};

/// Longest abort reason carried in a chunk.
pub const MAX_REASON: usize = 4096;
/// Receive work requests beyond those chunks and credits can use up (control chunks).
const CONTROL_WRS: usize = 4;

/// The layout of a receive ring and the pacing of the protocol. Both ends of a
/// queue pair must use the same ring layout (checked when endpoints are exchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSpec {
    /// Slots in the ring (1..=256: the immediate value has 8 bits for the slot).
    pub slots: usize,
    /// Largest chunk payload, a multiple of 8.
    pub payload_bytes: usize,
    /// Least a forward sends before its piece is final (smaller pieces wait).
    pub forward_grain: usize,
    /// Credits returned at once (1..=slots).
    pub credit_batch: usize,
}

impl RingSpec {
    /// 8 slots of a segment each (8 MiB pinned per peer), credits back by halves.
    pub const DEFAULT: RingSpec =
        RingSpec { slots: 8, payload_bytes: SEGMENT_BYTES, forward_grain: 64 << 10, credit_batch: 4 };

    /// Bytes from one slot to the next (header and payload, 64-byte aligned).
    pub const fn slot_stride(&self) -> usize {
        (HEADER_LEN + self.payload_bytes).next_multiple_of(64)
    }

    /// Bytes of the whole ring.
    pub const fn ring_bytes(&self) -> usize {
        self.slots * self.slot_stride()
    }

    /// Receive work requests to keep posted: a chunk or a credit update per slot in
    /// flight, and control chunks.
    pub const fn recv_wrs(&self) -> usize {
        2 * self.slots + CONTROL_WRS
    }

    /// Send work requests that may be outstanding: a chunk and a credit update per
    /// slot, and control chunks.
    pub const fn send_wrs(&self) -> usize {
        2 * self.slots + CONTROL_WRS
    }

    /// Why this layout cannot work, if it cannot.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !(1..=256).contains(&self.slots) {
            return Err(format!("{} ring slots (1 to 256 fit the immediate value)", self.slots));
        }
        if self.payload_bytes == 0 || !self.payload_bytes.is_multiple_of(8) || self.payload_bytes > SEGMENT_BYTES {
            return Err(format!(
                "slot payload of {} bytes (a multiple of 8, at most {SEGMENT_BYTES})",
                self.payload_bytes
            ));
        }
        if !(1..=self.slots).contains(&self.credit_batch) {
            return Err(format!("credit batch {} with {} slots", self.credit_batch, self.slots));
        }
        Ok(())
    }
}

/// The immediate value of a write: what kind of write it is and what it carries.
pub mod imm {
    /// Kind bits (31..30): a data chunk.
    pub const DATA: u32 = 1 << 30;
    /// Kind bits (31..30): returned credits (bits 15..0: how many).
    pub const CREDIT: u32 = 2 << 30;
    /// Mask of the kind bits.
    pub const KIND: u32 = 3 << 30;
    /// Data: the chunk ends its message.
    pub const LAST: u32 = 1 << 29;
    /// Bits that must be zero in a data immediate.
    pub const DATA_RESERVED: u32 = 0x1f << 24;
    /// Bits that must be zero in a credit immediate.
    pub const CREDIT_RESERVED: u32 = 0x3fff << 16;

    /// A data chunk into `slot`, sequence number `seq` (low 16 bits carried).
    pub const fn data(slot: usize, seq: u64, last: bool) -> u32 {
        DATA | if last { LAST } else { 0 } | ((slot as u32 & 0xff) << 16) | (seq as u32 & 0xffff)
    }

    /// `n` credits returned.
    pub const fn credit(n: usize) -> u32 {
        CREDIT | (n as u32 & 0xffff)
    }
}

/// Tags of work-request ids (bits 63..62), so a send completion says what completed.
const WR_DATA: u64 = 1 << 62;
const WR_CREDIT: u64 = 2 << 62;
const WR_TAG: u64 = 3 << 62;

/// Where the bytes of a write come from.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteData {
    /// A range of a posted send's region (to be found in a registered memory region).
    Region {
        /// First byte.
        addr: *const u8,
        /// Length in bytes.
        len: usize,
    },
    /// Bytes of the protocol's own (an abort reason), to stage in registered memory.
    Bytes(Vec<u8>),
}

/// What the I/O layer must do.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// RDMA WRITE WITH IMMEDIATE `imm` of `header` followed by `data` into the
    /// peer's `slot`, signalled, with work-request id `wr_id`.
    Write {
        /// Work-request id, handed back in [`Protocol::on_send_complete`].
        wr_id: u64,
        /// The peer's slot.
        slot: usize,
        /// The frame header (the first [`HEADER_LEN`] bytes of the slot).
        header: [u8; HEADER_LEN],
        /// The chunk's payload.
        data: WriteData,
        /// Immediate value (host order; the I/O layer converts to network order).
        imm: u32,
    },
    /// A zero-length RDMA WRITE WITH IMMEDIATE `imm` returning credits, signalled.
    Credit {
        /// Work-request id.
        wr_id: u64,
        /// Immediate value (host order).
        imm: u32,
    },
    /// Post this many more receive work requests (they carry no buffer: every
    /// incoming message is a WRITE WITH IMMEDIATE).
    PostRecvs(usize),
}

/// A posted send: a message cut into chunks as credits and gates allow.
struct SendMsg {
    serial: u64,
    base: *const u8,
    len: usize,
    first_gate: Option<usize>,
    header: Header,
    /// Bytes put into chunks so far.
    posted: usize,
    /// Whether its first chunk went (a zero-length message is one chunk).
    started: bool,
    /// Chunks posted whose completion has not arrived.
    in_flight: usize,
}

/// A posted receive, filled chunk by chunk.
struct RecvMsg {
    dst: *mut u8,
    len: usize,
    got: usize,
    reduce: Option<(*const u8, DType, ReduceOp)>,
    first_gate: Option<usize>,
}

/// A chunk that landed in this rank's ring and awaits its receive.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    slot: usize,
    len: usize,
    last: bool,
}

/// The protocol state of one queue pair (one peer), both directions.
pub struct Protocol {
    spec: RingSpec,
    // Sending.
    sends: VecDeque<SendMsg>,
    next_serial: u64,
    /// Free slots of the peer's ring this rank may write.
    credits: usize,
    /// Sequence number of the next chunk this rank writes (slot = seq mod slots).
    tx_seq: u64,
    /// Per slot of the peer's ring: the serial of the message whose write into it
    /// has not completed locally (its header staging is in use).
    tx_busy: Vec<Option<u64>>,
    credit_wrs: usize,
    credit_wr_seq: u64,
    /// A control chunk went: nothing more is sent.
    closed: bool,
    // Receiving.
    recvs: VecDeque<RecvMsg>,
    arrivals: VecDeque<Arrival>,
    /// Sequence number of the next chunk expected.
    rx_seq: u64,
    /// Slots emptied whose credit has not gone back yet.
    owed: usize,
    /// Receive work requests posted and not yet consumed.
    recv_wrs: usize,
    /// Receive work requests to post with the next actions.
    recv_wrs_due: usize,
    said_goodbye: bool,
    /// The reason of the peer's abort chunk, once it came: everything the peer
    /// wrote before it was taken first, and only requests that still need the peer
    /// fail (a peer that served this call and then aborted fails nothing).
    peer_aborted: Option<String>,
}

// SAFETY: the raw pointers of posted requests are held only during a call of the
// executor, which calls `end_call` (forgetting them all) before it returns.
unsafe impl Send for Protocol {}

fn protocol_err(call: &CallInfo, peer: usize, detail: String) -> Error {
    Error::Protocol { ctx: call.ctx.clone(), peer, detail }
}

/// How many pieces (gates) a region of `len` bytes is cut into.
fn pieces(len: usize) -> usize {
    len.div_ceil(SEGMENT_BYTES).max(1)
}

impl Protocol {
    /// A fresh protocol with every credit of the peer's ring. The first actions
    /// ([`Protocol::progress`]) post the receive work requests.
    ///
    /// # Panics
    /// When `spec` fails [`RingSpec::check`] (the I/O layer checks it first).
    pub fn new(spec: RingSpec) -> Protocol {
        spec.check().expect("a valid ring spec");
        Protocol {
            spec,
            sends: VecDeque::new(),
            next_serial: 0,
            credits: spec.slots,
            tx_seq: 0,
            tx_busy: vec![None; spec.slots],
            credit_wrs: 0,
            credit_wr_seq: 0,
            closed: false,
            recvs: VecDeque::new(),
            arrivals: VecDeque::new(),
            rx_seq: 0,
            owed: 0,
            recv_wrs: 0,
            recv_wrs_due: spec.recv_wrs(),
            said_goodbye: false,
            peer_aborted: None,
        }
    }

    /// Receive work requests to post before the queue pair connects (so the peer's
    /// first writes find them); counted as posted.
    pub fn take_initial_recvs(&mut self) -> usize {
        self.recv_wrs += self.recv_wrs_due;
        std::mem::take(&mut self.recv_wrs_due)
    }

    /// The ring layout.
    pub fn spec(&self) -> &RingSpec {
        &self.spec
    }

    /// Whether the peer said goodbye.
    pub fn said_goodbye(&self) -> bool {
        self.said_goodbye
    }

    /// The error for a request that needs a peer that aborted, if it did.
    pub fn check_peer_aborted(&self, peer: usize, call: &CallInfo) -> Result<()> {
        match &self.peer_aborted {
            Some(reason) => Err(Error::PeerAborted { ctx: call.ctx.clone(), peer, reason: reason.clone() }),
            None => Ok(()),
        }
    }

    /// Post a send of `src` (host memory), a forward when `first_gate` is given.
    pub fn post_send(&mut self, src: MemRegion, first_gate: Option<usize>, call: &CallInfo) -> Result<()> {
        if src.kind == MemKind::Device {
            return Err(Error::Unsupported(format!("{}: an rdma send of device memory", call.ctx)));
        }
        // `len` is set per chunk.
        let header = Header {
            kind: FrameKind::Data,
            comm_id: call.comm_id,
            epoch: call.epoch,
            seq: call.send_seq,
            sig: call.sig,
            len: 0,
        };
        let serial = self.next_serial;
        self.next_serial += 1;
        let msg = SendMsg {
            serial,
            base: src.ptr,
            len: src.len,
            first_gate,
            header,
            posted: 0,
            started: false,
            in_flight: 0,
        };
        self.sends.push_back(msg);
        Ok(())
    }

    /// Post a receive into `dst`, reduced with `reduce`, opening gates on `forward`.
    pub fn post_recv(
        &mut self,
        dst: MemRegion,
        reduce: Option<Reduction>,
        forward: Option<&mut Vec<usize>>,
        peer: usize,
        call: &CallInfo,
    ) -> Result<()> {
        let device = dst.kind == MemKind::Device || reduce.is_some_and(|r| r.src.kind == MemKind::Device);
        if device {
            return Err(Error::Unsupported(format!(
                "{}: an rdma receive from rank {peer} into device memory",
                call.ctx
            )));
        }
        if forward.is_some() && reduce.is_none() {
            return Err(Error::InvalidArgument(format!(
                "{}: a forward gated on a plain receive from rank {peer}; gates need a receive-reduce",
                call.ctx
            )));
        }
        if let Some(r) = &reduce {
            if r.src.len != dst.len {
                return Err(Error::InvalidArgument(format!(
                    "{}: receive-reduce from rank {peer} of {} bytes with an operand of {}",
                    call.ctx, dst.len, r.src.len
                )));
            }
        }
        let first_gate = forward.map(|gates| {
            let first = gates.len();
            gates.resize(first + pieces(dst.len), 0);
            first
        });
        let reduce = reduce.map(|r| (r.src.ptr as *const u8, r.dtype, r.op));
        self.recvs.push_back(RecvMsg { dst: dst.ptr, len: dst.len, got: 0, reduce, first_gate });
        Ok(())
    }

    /// Whether a write of this rank has not completed yet.
    pub fn writes_in_flight(&self) -> bool {
        self.tx_busy.iter().any(Option::is_some)
    }

    /// Whether posted requests remain.
    pub fn busy(&self) -> bool {
        !self.sends.is_empty() || !self.recvs.is_empty()
    }

    /// A write-with-immediate of `byte_len` bytes landed (a receive completion).
    pub fn on_arrival(&mut self, imm: u32, byte_len: u32, peer: usize, call: &CallInfo) -> Result<()> {
        let bad = |detail: String| Err(protocol_err(call, peer, detail));
        if self.recv_wrs == 0 {
            return bad("a message arrived with no receive posted".into());
        }
        self.recv_wrs -= 1;
        self.recv_wrs_due += 1;
        match imm & imm::KIND {
            imm::CREDIT => {
                let n = (imm & 0xffff) as usize;
                if imm & imm::CREDIT_RESERVED != 0 || byte_len != 0 {
                    return bad(format!("malformed credit update (immediate {imm:#010x}, {byte_len} bytes)"));
                }
                // Credits held plus slots written and not returned is the ring size.
                let outstanding = self.spec.slots - self.credits;
                if n == 0 || n > outstanding {
                    return bad(format!("{n} credits returned where {outstanding} slots are in use"));
                }
                self.credits += n;
                Ok(())
            }
            imm::DATA => {
                let slot = ((imm >> 16) & 0xff) as usize;
                let seq16 = imm & 0xffff;
                let last = imm & imm::LAST != 0;
                if imm & imm::DATA_RESERVED != 0 {
                    return bad(format!("malformed data immediate {imm:#010x}"));
                }
                if slot >= self.spec.slots {
                    return bad(format!("a write into slot {slot} of a ring of {} slots", self.spec.slots));
                }
                let want_slot = (self.rx_seq % self.spec.slots as u64) as usize;
                if slot != want_slot || seq16 != (self.rx_seq & 0xffff) as u32 {
                    return bad(format!(
                        "chunk {seq16} in slot {slot} where chunk {} in slot {want_slot} comes next",
                        self.rx_seq & 0xffff
                    ));
                }
                if self.arrivals.len() + self.owed >= self.spec.slots {
                    return bad(format!("a write into slot {slot}, which holds a chunk not yet credited back"));
                }
                let byte_len = byte_len as usize;
                if !(HEADER_LEN..=HEADER_LEN + self.spec.payload_bytes).contains(&byte_len) {
                    return bad(format!(
                        "a chunk of {byte_len} bytes into a slot of {} (header {HEADER_LEN})",
                        HEADER_LEN + self.spec.payload_bytes
                    ));
                }
                self.rx_seq += 1;
                self.arrivals.push_back(Arrival { slot, len: byte_len - HEADER_LEN, last });
                Ok(())
            }
            _ => bad(format!("a write with unknown immediate {imm:#010x}")),
        }
    }

    /// A signalled write of this rank completed successfully.
    pub fn on_send_complete(&mut self, wr_id: u64, peer: usize, call: &CallInfo) -> Result<()> {
        match wr_id & WR_TAG {
            WR_DATA => {
                let slot = (wr_id & 0xff) as usize;
                let Some(serial) = self.tx_busy.get_mut(slot).and_then(Option::take) else {
                    return Err(protocol_err(call, peer, format!("completion of a write into idle slot {slot}")));
                };
                // The message may be gone (end_call after an error): nothing to count then.
                if let Some(m) = self.sends.iter_mut().find(|m| m.serial == serial) {
                    m.in_flight -= 1;
                }
                Ok(())
            }
            WR_CREDIT if self.credit_wrs > 0 => {
                self.credit_wrs -= 1;
                Ok(())
            }
            _ => Err(protocol_err(call, peer, format!("completion of unknown work request {wr_id:#x}"))),
        }
    }

    /// Move what can move: empty arrived chunks into posted receives (copying or
    /// reducing out of `ring`, this rank's receive ring for the peer, and raising
    /// gates), return credits, and cut sends into writes as credits and gates
    /// allow. Appends what the I/O layer must do to `out`; returns whether anything
    /// moved.
    pub fn progress(
        &mut self,
        ring: &[u8],
        gates: &mut [usize],
        peer: usize,
        call: &CallInfo,
        out: &mut Vec<Action>,
    ) -> Result<bool> {
        if ring.len() != self.spec.ring_bytes() {
            return Err(Error::InvalidArgument(format!(
                "{}: receive ring of {} bytes for rank {peer}; the layout needs {}",
                call.ctx,
                ring.len(),
                self.spec.ring_bytes()
            )));
        }
        let mut moved = false;
        if self.recv_wrs_due > 0 {
            out.push(Action::PostRecvs(self.recv_wrs_due));
            self.recv_wrs += self.recv_wrs_due;
            self.recv_wrs_due = 0;
        }
        moved |= self.drain_arrivals(ring, gates, peer, call)?;
        if self.owed >= self.spec.credit_batch && self.credit_wrs < self.spec.slots {
            self.credit_wrs += 1;
            self.credit_wr_seq += 1;
            out.push(Action::Credit {
                wr_id: WR_CREDIT | (self.credit_wr_seq & 0xffff_ffff),
                imm: imm::credit(self.owed),
            });
            self.owed = 0;
            moved = true;
        }
        moved |= self.cut_sends(gates, peer, call, out)?;
        while self.sends.front().is_some_and(|m| m.started && m.posted == m.len && m.in_flight == 0) {
            self.sends.pop_front();
            moved = true;
        }
        if self.busy() {
            self.check_peer_aborted(peer, call)?;
        }
        Ok(moved)
    }

    fn drain_arrivals(&mut self, ring: &[u8], gates: &mut [usize], peer: usize, call: &CallInfo) -> Result<bool> {
        let mut moved = false;
        while let Some(&a) = self.arrivals.front() {
            let at = a.slot * self.spec.slot_stride();
            let hdr: &[u8; HEADER_LEN] = ring[at..at + HEADER_LEN].try_into().expect("header bytes");
            let h = Header::decode(hdr).map_err(|detail| protocol_err(call, peer, detail))?;
            if h.len as usize != a.len {
                return Err(protocol_err(
                    call,
                    peer,
                    format!("a chunk of {} bytes whose header says {}", a.len, h.len),
                ));
            }
            let payload = &ring[at + HEADER_LEN..at + HEADER_LEN + a.len];
            match h.kind {
                FrameKind::Data => {}
                FrameKind::Abort => {
                    let reason = String::from_utf8_lossy(&payload[..a.len.min(MAX_REASON)]).into_owned();
                    self.peer_aborted = Some(reason);
                    self.arrivals.pop_front();
                    self.owed += 1;
                    moved = true;
                    continue;
                }
                FrameKind::Goodbye => {
                    self.said_goodbye = true;
                    self.arrivals.pop_front();
                    self.owed += 1;
                    moved = true;
                    continue;
                }
                FrameKind::Rendezvous | FrameKind::Ack | FrameKind::WaitQuery | FrameKind::WaitReply => {
                    return Err(protocol_err(call, peer, format!("a {:?} frame on an rdma queue pair", h.kind)));
                }
            }
            let Some(m) = self.recvs.front_mut() else { break };
            check_header(&h, peer, call)?;
            if a.len > m.len - m.got || a.last != (m.got + a.len == m.len) {
                return Err(protocol_err(
                    call,
                    peer,
                    format!(
                        "a chunk of {} bytes{} at offset {} of a receive of {} bytes",
                        a.len,
                        if a.last { " ending its message" } else { "" },
                        m.got,
                        m.len
                    ),
                ));
            }
            land(m, payload, gates, peer, call)?;
            m.got += a.len;
            if a.last {
                self.recvs.pop_front();
            }
            self.arrivals.pop_front();
            self.owed += 1;
            moved = true;
        }
        Ok(moved)
    }

    fn cut_sends(&mut self, gates: &[usize], peer: usize, call: &CallInfo, out: &mut Vec<Action>) -> Result<bool> {
        let mut moved = false;
        let slots = self.spec.slots;
        for m in self.sends.iter_mut() {
            if m.started && m.posted == m.len {
                continue;
            }
            loop {
                let slot = (self.tx_seq % slots as u64) as usize;
                if self.closed || self.credits == 0 || self.tx_busy[slot].is_some() {
                    return Ok(moved);
                }
                let Some(end) = chunk_end(m, self.spec.payload_bytes, self.spec.forward_grain, gates, peer, call)?
                else {
                    // A forward waits for its reduction; later sends wait behind it.
                    return Ok(moved);
                };
                let len = end - m.posted;
                let last = end == m.len;
                let mut header = m.header;
                header.len = len as u32;
                // SAFETY: posted + len <= m.len, inside the region the executor checked.
                let addr = unsafe { m.base.add(m.posted) };
                out.push(Action::Write {
                    wr_id: WR_DATA | slot as u64,
                    slot,
                    header: header.encode(),
                    data: WriteData::Region { addr, len },
                    imm: imm::data(slot, self.tx_seq, last),
                });
                self.tx_busy[slot] = Some(m.serial);
                self.tx_seq += 1;
                self.credits -= 1;
                m.posted = end;
                m.started = true;
                m.in_flight += 1;
                moved = true;
                if last {
                    break;
                }
            }
        }
        Ok(moved)
    }

    /// A control chunk (abort with its reason, or goodbye) into the next slot, if a
    /// credit and the slot's staging are free; after it nothing more is sent.
    pub fn control(&mut self, kind: FrameKind, comm_id: u32, epoch: u8, reason: &str) -> Option<Action> {
        let slot = (self.tx_seq % self.spec.slots as u64) as usize;
        if self.closed || self.credits == 0 || self.tx_busy[slot].is_some() {
            return None;
        }
        let bytes = &reason.as_bytes()[..reason.len().min(MAX_REASON).min(self.spec.payload_bytes)];
        let header = Header::control(kind, comm_id, epoch, bytes.len() as u32);
        let action = Action::Write {
            wr_id: WR_DATA | slot as u64,
            slot,
            header: header.encode(),
            data: WriteData::Bytes(bytes.to_vec()),
            imm: imm::data(slot, self.tx_seq, true),
        };
        self.tx_busy[slot] = Some(u64::MAX);
        self.tx_seq += 1;
        self.credits -= 1;
        self.closed = true;
        Some(action)
    }

    /// The call ends: forget every posted request (chunks of it still in flight
    /// complete later and are counted then; chunks that arrived stay in order).
    pub fn end_call(&mut self) {
        self.sends.clear();
        self.recvs.clear();
    }
}

/// Where the next chunk of `m` ends, or None when a forward must wait for its gate.
fn chunk_end(
    m: &SendMsg,
    payload_bytes: usize,
    grain: usize,
    gates: &[usize],
    peer: usize,
    call: &CallInfo,
) -> Result<Option<usize>> {
    let pos = m.posted;
    if m.len == 0 {
        return Ok(Some(0));
    }
    let piece = pos / SEGMENT_BYTES;
    let piece_start = piece * SEGMENT_BYTES;
    let piece_end = (piece_start + SEGMENT_BYTES).min(m.len);
    let end = (pos + payload_bytes).min(piece_end);
    let Some(first) = m.first_gate else { return Ok(Some(end)) };
    let Some(&gate) = gates.get(first + piece) else {
        return Err(Error::InvalidArgument(format!(
            "{}: a forward to rank {peer} reads gate {} of {}",
            call.ctx,
            first + piece,
            gates.len()
        )));
    };
    let ready = (piece_start + gate).min(piece_end);
    if ready >= end {
        Ok(Some(end))
    } else if ready > pos && (ready - pos >= grain || ready == piece_end) {
        Ok(Some(ready))
    } else {
        Ok(None)
    }
}

/// Copy or reduce a chunk's payload into the receive at its current offset, and
/// raise the gates of the pieces it completes.
fn land(m: &RecvMsg, payload: &[u8], gates: &mut [usize], peer: usize, call: &CallInfo) -> Result<()> {
    let (lo, len) = (m.got, payload.len());
    if len > 0 {
        // SAFETY: lo + len <= m.len (checked by the caller), inside the destination
        // the executor bounds-checked and keeps alive until end_call; the ring
        // (`payload`) is this channel's own memory, disjoint from every call buffer.
        let dst = unsafe { std::slice::from_raw_parts_mut(m.dst.add(lo), len) };
        match m.reduce {
            None => dst.copy_from_slice(payload),
            Some((src, dtype, op)) => {
                if (lo + len < m.len && len % dtype.size() != 0) || lo % dtype.size() != 0 {
                    return Err(protocol_err(
                        call,
                        peer,
                        format!("a chunk of {len} bytes at offset {lo} splits {dtype:?} elements"),
                    ));
                }
                if std::ptr::eq(src, m.dst) {
                    reduce::reduce_inplace(dtype, op, dst, payload)?;
                } else {
                    // SAFETY: the operand has the destination's length (checked when
                    // posted) and is the destination itself or disjoint from it.
                    let s = unsafe { std::slice::from_raw_parts(src.add(lo), len) };
                    reduce::reduce_into(dtype, op, dst, s, payload)?;
                }
            }
        }
    }
    if let Some(first) = m.first_gate {
        let end = lo + len;
        let first_piece = lo / SEGMENT_BYTES;
        let last_piece = if end == 0 { 0 } else { (end - 1) / SEGMENT_BYTES };
        for k in first_piece..=last_piece {
            let piece_start = k * SEGMENT_BYTES;
            let done = end.min(piece_start + SEGMENT_BYTES).min(m.len) - piece_start;
            let g = gates.get_mut(first + k).ok_or_else(|| {
                Error::InvalidArgument(format!("{}: a receive from rank {peer} raises a gate that is gone", call.ctx))
            })?;
            *g = done;
        }
    }
    Ok(())
}

fn check_header(h: &Header, peer: usize, call: &CallInfo) -> Result<()> {
    if h.comm_id != call.comm_id || h.epoch != call.epoch {
        return Err(protocol_err(
            call,
            peer,
            format!(
                "chunk for communicator {:#x} epoch {} arrived on communicator {:#x} epoch {}",
                h.comm_id, h.epoch, call.comm_id, call.epoch
            ),
        ));
    }
    if h.seq != call.recv_seq || !call.sig.matches(&h.sig) {
        return Err(Error::Mismatch { ctx: call.ctx.clone(), peer, ours: call.sig, theirs: h.sig, their_seq: h.seq });
    }
    Ok(())
}
