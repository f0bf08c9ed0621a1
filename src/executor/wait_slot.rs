//! This end of a link's share of the wait-chain questions (see
//! [`super::wait_chain`]): what was asked, what to answer, what the peer answered.
//! The channels hold one each; the questioning itself lives in `wait_chain.rs`.

use crate::frame::Header;
use crate::types::CallSig;

use super::call::CallInfo;

/// Most ranks a reply lists (a rank waiting for more names the first ones).
pub const MAX_LISTED: usize = 64;

/// A peer's answer, as read off its link (its ranks not yet checked against the world).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitReply {
    /// The answering rank's call and its sequence number.
    pub sig: CallSig,
    /// Its sequence number.
    pub seq: u64,
    /// The ranks it waits for.
    pub waits: Vec<u32>,
}

/// A channel's part in the exchange: questions and answers read off its link, and
/// the frames to write on it. Kept between calls.
#[derive(Default)]
pub struct WaitSlot {
    /// The peer asked; this rank has not answered yet.
    pub asked: bool,
    /// This rank asked the peer and waits for its reply (or for its departure).
    pub awaiting: bool,
    /// The peer's latest word in this call on whom it waits for (asked or not).
    pub reply: Option<WaitReply>,
    /// The peer left or failed while awaited: why.
    pub gone: Option<String>,
    /// Whole frames to write at the next frame boundary, and how much of them went out.
    out: Vec<u8>,
    sent: usize,
}

impl WaitSlot {
    /// Queue a frame to write.
    pub(super) fn queue(&mut self, frame: &[u8]) {
        self.out.extend_from_slice(frame);
    }

    /// Bytes queued and not written yet.
    pub fn unsent(&self) -> &[u8] {
        &self.out[self.sent..]
    }

    /// Part of the queued frames went out: nothing else may be written until they all have.
    pub fn mid_frame(&self) -> bool {
        self.sent > 0
    }

    /// `n` more bytes went out.
    pub fn wrote(&mut self, n: usize) {
        self.sent += n;
        if self.sent >= self.out.len() {
            self.out.clear();
            self.sent = 0;
        }
    }

    /// The call ended: what the peer said of its waits is stale. (A question is
    /// still answered, by the next call: with what it waits for then.)
    pub fn end_call(&mut self) {
        self.reply = None;
        self.gone = None;
    }

    /// The link failed: what is queued is dropped (whoever needs the link sees the failure).
    pub fn drop_unsent(&mut self) {
        self.out.clear();
        self.sent = 0;
    }

    /// A question arrived for the call `call` (frames of another communicator are ignored).
    pub fn on_query(&mut self, h: &Header, call: &CallInfo) {
        if h.comm_id == call.comm_id && h.epoch == call.epoch {
            self.asked = true;
        }
    }

    /// A reply arrived with `payload` (whole, of the length the header gave, which
    /// [`check_reply_len`] accepted): kept for this call if it is of this communicator.
    pub fn on_reply(&mut self, h: &Header, payload: &[u8], call: &CallInfo) {
        if h.comm_id != call.comm_id || h.epoch != call.epoch {
            return;
        }
        let waits = payload.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        self.reply = Some(WaitReply { sig: h.sig, seq: h.seq, waits });
    }
}

/// Whether a reply of `len` payload bytes is well formed: whole ranks, at most [`MAX_LISTED`].
pub fn check_reply_len(len: u32) -> std::result::Result<usize, String> {
    let len = len as usize;
    if !len.is_multiple_of(4) || len / 4 > MAX_LISTED {
        return Err(format!("a wait reply of {len} bytes (at most {MAX_LISTED} ranks of 4 bytes)"));
    }
    Ok(len)
}
