//! The receive half of the executor's data path: reducing incoming bytes as they
//! arrive (from a staging chunk, or straight out of a shared ring), and copying
//! long plain receives out of a ring with non-temporal stores.

use super::{peer_error, CallInfo, Channel, InMsg, REDUCE_GRAIN};
use crate::error::Result;
use crate::reduce;

/// Bytes of a forwarded segment reduced per pass before its forward gets a turn.
/// 2 ranks on the 2-core VM, same session: 64 KiB passes gave 9.4–10.6 GB/s at
/// 1 MiB, unbounded ones 3.6–4.5 at 16 MiB; 256 KiB gave 12.3–12.9 and 3.7–5.0.
const FORWARD_PASS_BYTES: usize = 256 << 10;

/// Reduce what has arrived of a receive-reduce segment, in grains, so reduction
/// overlaps the rest of the transfer.
pub(super) fn reduce_arrived(ch: &mut Channel, m: &mut InMsg, call: &CallInfo) -> Result<()> {
    let Some(src) = m.src else { return Ok(()) };
    let esz = call.dtype.size();
    let ready = if m.got == m.len { m.len } else { (m.got / esz) * esz };
    if ready - m.reduced < REDUCE_GRAIN && ready < m.len {
        return Ok(());
    }
    let (lo, hi) = (m.reduced, ready);
    if hi == lo {
        return Ok(());
    }
    combine_at(m.dst, src, lo, &ch.staging[lo..hi], call)?;
    m.reduced = hi;
    Ok(())
}

/// Reduce what the link holds of a receive-reduce segment straight out of the
/// link's buffer (a shared ring), with no staging copy. Returns whether any byte
/// was taken.
pub(super) fn reduce_from_link(ch: &mut Channel, m: &mut InMsg, peer: usize, call: &CallInfo) -> Result<bool> {
    let Some(src) = m.src else { return Ok(false) };
    let esz = call.dtype.size();
    let mut progressed = false;
    // A segment that feeds a forward returns after FORWARD_PASS_BYTES, so the caller
    // sends that part on while it is still in cache.
    let (start, budget) = (m.got, if m.feeds.is_some() { FORWARD_PASS_BYTES } else { usize::MAX });
    while m.got < m.len && m.got - start < budget {
        // In grains, so the ring space goes back to the writer while the rest is reduced.
        let want = (m.len - m.got - m.carry_len).min(REDUCE_GRAIN);
        let s = ch.link.peek(want).map_err(|e| peer_error(call, peer, ch.said_goodbye, e))?;
        if s.is_empty() {
            break;
        }
        progressed = true;
        if m.carry_len > 0 || s.len() < esz {
            // An element split by the end of the ring's data area: gather it first.
            let take = (esz - m.carry_len).min(s.len());
            m.carry[m.carry_len..m.carry_len + take].copy_from_slice(&s[..take]);
            ch.link.consume(take);
            m.carry_len += take;
            if m.carry_len == esz {
                combine_at(m.dst, src, m.got, &m.carry[..esz], call)?;
                m.got += esz;
                m.carry_len = 0;
            }
            continue;
        }
        let n = s.len() / esz * esz;
        combine_at(m.dst, src, m.got, &s[..n], call)?;
        ch.link.consume(n);
        m.got += n;
    }
    m.reduced = m.got;
    Ok(progressed)
}

/// Copy what the link holds of a long plain receive into place with non-temporal
/// stores. Returns whether any byte was taken.
pub(super) fn stream_from_link(ch: &mut Channel, m: &mut InMsg, peer: usize, call: &CallInfo) -> Result<bool> {
    let mut progressed = false;
    while m.got < m.len {
        let s =
            ch.link.peek((m.len - m.got).min(REDUCE_GRAIN)).map_err(|e| peer_error(call, peer, ch.said_goodbye, e))?;
        if s.is_empty() {
            break;
        }
        let n = s.len();
        // SAFETY: [got, got + n) lies inside the segment's destination, a live buffer
        // region that the ring does not overlap.
        let dst = unsafe { std::slice::from_raw_parts_mut(m.dst.add(m.got), n) };
        reduce::copy_nontemporal(dst, s);
        ch.link.consume(n);
        m.got += n;
        progressed = true;
    }
    Ok(progressed)
}

/// `dst[lo..] = src[lo..] ⊕ inc` for `inc.len()` bytes of a receive-reduce segment.
fn combine_at(dst: *mut u8, src: *const u8, lo: usize, inc: &[u8], call: &CallInfo) -> Result<()> {
    let op = call.reduce_op.combiner();
    let len = inc.len();
    // SAFETY: the callers pass [lo, lo + len) inside the segment's dst/src ranges;
    // src is either the same memory as dst or disjoint from it (checked when queued),
    // and `inc` (staging or a ring) overlaps neither.
    unsafe {
        if std::ptr::eq(src, dst) {
            reduce::reduce_inplace(call.dtype, op, std::slice::from_raw_parts_mut(dst.add(lo), len), inc)
        } else {
            reduce::reduce_into(
                call.dtype,
                op,
                std::slice::from_raw_parts_mut(dst.add(lo), len),
                std::slice::from_raw_parts(src.add(lo), len),
                inc,
            )
        }
    }
}
