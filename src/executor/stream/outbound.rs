//! The send half of the stream channel: queueing a transfer's frames (data or
//! rendezvous, the sender's choice per frame) and writing them, a forward only as
//! far as its reduction has got.

use std::io;

use super::single_copy::{describe, DESC_MAX};
use super::{frames, CallInfo, OutMsg, StreamChannel};
use crate::error::Result;
use crate::frame::{padding, FrameKind, Header, HEADER_LEN, PAYLOAD_ALIGN};

/// Queue the frames of a transfer of `total` bytes at `base` to `peer`. A forward
/// (`first_gate`) sends frame `k` only as far as gate `first_gate + k` allows.
pub(super) fn queue_send(
    ch: &mut StreamChannel,
    call: &CallInfo,
    base: *const u8,
    total: usize,
    first_gate: Option<usize>,
    exchange: bool,
) {
    // Under `BRAID_CMA=auto` an exchange long enough to go single-copy asks the
    // tuner's switch (which so learns that this call has one to choose).
    let single_exchange =
        exchange && ch.exchange_switch.as_ref().is_none_or(|s| total >= ch.tuning.rendezvous_bytes && s.consult());
    for (k, (off, len)) in frames(total).enumerate() {
        // SAFETY: off + len <= total, inside a region the caller checked.
        let data = unsafe { base.add(off) };
        let single = ch.single_copy.applies(data, len, total, ch.tuning.rendezvous_bytes, single_exchange);
        if single {
            // SAFETY: [data, data + len) lies in one of this call's buffers, which the
            // caller of `execute` keeps alive until it returns, and `execute` revokes
            // every exposure before returning (`CallEnd` calls `end_call`).
            unsafe { ch.link.expose(data as usize, len) };
            ch.exposed = true;
        }
        let kind = if single { FrameKind::Rendezvous } else { FrameKind::Data };
        let (desc, desc_len) = if single { describe(data, len) } else { ([0; DESC_MAX], 0) };
        let wire_len = if single { desc_len } else { len };
        let (comm_id, epoch, seq, sig) = (call.comm_id, call.epoch, call.send_seq, call.sig);
        let hdr = Header { kind, comm_id, epoch, seq, sig, len: wire_len as u32 }.encode();
        let gate = first_gate.map(|g| g + k);
        ch.out.push_back(OutMsg { hdr, kind, data, len, desc, desc_len, sent: 0, gate });
    }
}

/// Write the single data frame of a plain send of `len` bytes at `data` now; what
/// the link does not take is queued. The caller checked that nothing is queued
/// and the stream is at a frame boundary.
pub(super) fn send_now(ch: &mut StreamChannel, call: &CallInfo, data: *const u8, len: usize) -> Result<()> {
    let kind = FrameKind::Data;
    let hdr =
        Header { kind, comm_id: call.comm_id, epoch: call.epoch, seq: call.send_seq, sig: call.sig, len: len as u32 }
            .encode();
    // SAFETY: [data, data + len) lies in one of this call's buffers (checked by the
    // executor), alive until `execute` returns.
    let payload = unsafe { std::slice::from_raw_parts(data, len) };
    let pad = padding(kind, len);
    let sent = match ch.link.try_write(&frame_parts(&hdr, payload, pad, 0)) {
        Ok(sent) => sent,
        Err(e) => {
            let peer = ch.link.peer();
            return Err(super::inbound::write_failed(ch, peer, call, e));
        }
    };
    if sent < HEADER_LEN + len + pad {
        ch.tx_at_boundary = sent == 0;
        ch.out.push_back(OutMsg { hdr, kind, data, len, desc: [0; DESC_MAX], desc_len: 0, sent, gate: None });
    }
    Ok(())
}

/// The slices still to be written of a frame (header, payload, `pad` zero bytes)
/// of which `sent` bytes went out.
pub(super) fn frame_parts<'a>(hdr: &'a [u8], payload: &'a [u8], pad: usize, sent: usize) -> [&'a [u8]; 3] {
    static ZEROS: [u8; PAYLOAD_ALIGN] = [0; PAYLOAD_ALIGN];
    let zeros = &ZEROS[..pad];
    let (h, p) = (hdr.len(), payload.len());
    if sent < h {
        [&hdr[sent..], payload, zeros]
    } else if sent < h + p {
        [&[], &payload[sent - h..], zeros]
    } else {
        [&[], &[], &zeros[sent - h - p..]]
    }
}

// A forward on a memory link goes out in pieces of at least `Tuning::forward_grain`
// while its reduction is still going on, so it does not trickle out in tiny pieces.
// Sockets wait for whole frames: piecewise forwards measured 1.7–1.8 GB/s against
// 3.0–3.5 for whole ones (TCP loopback, 2 ranks, 1 MiB all-reduce).

/// How many bytes of frame `m` (header and padding included) may be written by
/// now: all of them, or for a forward as far as its gate is open, in steps of at
/// least `grain` (a rendezvous forward only when all of its data is final).
pub(super) fn writable(m: &OutMsg, gates: &[usize], grain: usize) -> usize {
    let total = HEADER_LEN + m.payload().len() + padding(m.kind, m.payload().len());
    let Some(g) = m.gate else { return total };
    let ready = gates[g];
    if ready >= m.len {
        total
    } else if m.kind == FrameKind::Data && HEADER_LEN + ready >= m.sent.saturating_add(grain) {
        HEADER_LEN + ready
    } else {
        m.sent
    }
}

/// The first `max` bytes of `parts`.
fn cap_parts(parts: [&[u8]; 3], mut max: usize) -> [&[u8]; 3] {
    parts.map(|p| {
        let take = p.len().min(max);
        max -= take;
        &p[..take]
    })
}

/// Write the queued wait query and reply frames (see `wait_chain`), at a frame
/// boundary only. They are not progress of the call, and a link that fails them
/// drops them: a transfer that needs the link reports the failure.
fn write_wait_frames(ch: &mut StreamChannel) {
    if ch.wait.unsent().is_empty() || !(ch.tx_at_boundary || ch.wait.mid_frame()) {
        return;
    }
    match ch.link.try_write(&[ch.wait.unsent()]) {
        Ok(n) => {
            ch.wait.wrote(n);
            ch.tx_at_boundary = !ch.wait.mid_frame();
        }
        Err(_) => ch.wait.drop_unsent(),
    }
}

pub(super) fn progress_send(ch: &mut StreamChannel, gates: &[usize], call: &CallInfo) -> io::Result<bool> {
    let mut progressed = false;
    write_wait_frames(ch);
    if ch.wait.mid_frame() {
        return Ok(false);
    }
    let q = &mut ch.out;
    // Acks jump the queue at a frame boundary: the peer's round waits on them.
    while ch.acks_owed > 0 && ch.tx_at_boundary && q.front().is_none_or(|m| m.sent == 0) {
        q.push_front(OutMsg::ack(call));
        ch.acks_owed -= 1;
    }
    while let Some(m) = q.front_mut() {
        let limit = writable(m, gates, ch.forward_grain);
        if limit <= m.sent {
            break;
        }
        let payload = m.payload();
        let pad = padding(m.kind, payload.len());
        let total = HEADER_LEN + payload.len() + pad;
        let n = ch.link.try_write(&cap_parts(frame_parts(&m.hdr, payload, pad, m.sent), limit - m.sent))?;
        if n == 0 {
            break;
        }
        progressed = true;
        m.sent += n;
        ch.tx_at_boundary = m.sent == total;
        if ch.tx_at_boundary {
            if m.kind == FrameKind::Rendezvous {
                ch.acks_awaited += 1;
            }
            q.pop_front();
            if !ch.wait.unsent().is_empty() {
                // A question or answer goes between frames, not after the whole queue.
                break;
            }
        }
    }
    Ok(progressed)
}
