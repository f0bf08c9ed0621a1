//! A receive from any source (MPI's `MPI_ANY_SOURCE`, torch's `recv(src=None)`):
//! find the first peer whose next frame is a send to this rank with the receive's
//! tag, so that the ordinary receive from that peer takes it.
//!
//! Frames from one peer are taken in the order it sent them, so only each peer's
//! *next* data frame can match: its header is read and the frame left whole in the
//! link ([`PeerChannel::next_data_frame`]). A peer whose next frame is something
//! else (another tag, a collective it runs ahead of this rank) is passed over: its
//! frame stays for the call it belongs to. When no peer is left that could still
//! send a match (every one passed over or gone), the receive fails at once rather
//! than wait for a frame that cannot come.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::channel::NextFrame;
use super::{block_on_fds, CallInfo, Channels, YIELD_PHASE};
use crate::error::{Error, Result};
use crate::frame::{FrameKind, Header};
use crate::types::OpKind;

/// The rank whose next frame is a send to this rank carrying `call.sig`'s tag, the
/// first to arrive within `call.timeout`.
///
/// Fails at once when no peer can send a match any more: with
/// [`Error::Mismatch`] naming a peer whose next frame is another call, or
/// [`Error::PeerLost`] when every peer closed its communicator; after the
/// deadline with [`Error::Timeout`] naming the peers that sent nothing.
pub fn first_sender(channels: &mut Channels, call: &CallInfo) -> Result<usize> {
    let start = Instant::now();
    let mut sleep = Duration::from_micros(5);
    loop {
        if call.flags.load(Ordering::Relaxed) {
            return Err(Error::Aborted { rank: call.ctx.rank, call: Some(call.sig) });
        }
        let mut silent = Vec::new();
        let mut passed_over: Option<(usize, Header)> = None;
        let mut closed: Option<usize> = None;
        for (peer, ch) in channels.iter_mut().enumerate() {
            let Some(ch) = ch.as_mut() else { continue };
            match ch.next_data_frame(peer, call)? {
                NextFrame::Nothing => silent.push(peer),
                NextFrame::Closed => {
                    closed.get_or_insert(peer);
                }
                NextFrame::Data(h) if sends_to_this_call(&h, call) => return Ok(peer),
                NextFrame::Data(h) => {
                    passed_over.get_or_insert((peer, h));
                }
            }
        }
        if silent.is_empty() {
            return Err(no_sender(passed_over, closed, call));
        }
        let idle = start.elapsed();
        if idle >= call.timeout {
            return Err(Error::Timeout {
                ctx: call.ctx.clone(),
                timeout: call.timeout,
                waiting_on: silent,
                chain: vec![],
            });
        }
        if idle < call.wait.spin {
            if call.wait.yield_while_spinning {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        let left = call.timeout - idle;
        if !block_on_fds(channels, &[], left.min(Duration::from_millis(100))) {
            if idle < call.wait.spin + YIELD_PHASE {
                std::thread::yield_now();
            } else {
                std::thread::sleep(sleep.min(left));
                sleep = (sleep * 2).min(Duration::from_millis(1));
            }
        }
    }
}

/// Whether `h` is a send to this rank with the receive's tag, on this
/// communicator. Its count, dtype and sequence number are left to the receive that
/// takes it, which fails as a receive from that peer would if they differ.
fn sends_to_this_call(h: &Header, call: &CallInfo) -> bool {
    matches!(h.kind, FrameKind::Data | FrameKind::Rendezvous)
        && h.comm_id == call.comm_id
        && h.epoch == call.epoch
        && h.sig.op == OpKind::Send
        && h.sig.tag == call.sig.tag
}

/// The error of a receive that no peer can satisfy: one peer's next frame is
/// another call (named with this one), or every peer has closed.
fn no_sender(passed_over: Option<(usize, Header)>, closed: Option<usize>, call: &CallInfo) -> Error {
    if let Some((peer, h)) = passed_over {
        let mut theirs = h.sig;
        if theirs.op.point_to_point() {
            // A send names the rank it goes to, which is this one (not on the wire).
            theirs.root = call.ctx.rank as u32;
        }
        return Error::Mismatch { ctx: call.ctx.clone(), peer, ours: call.sig, theirs, their_seq: h.seq };
    }
    Error::PeerLost {
        ctx: call.ctx.clone(),
        peer: closed.unwrap_or(call.ctx.rank),
        detail: "it closed its communicator, and no other rank is left that could send to this receive".into(),
    }
}
