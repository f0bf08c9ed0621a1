//! The single-copy half of the executor: describing a transfer in a rendezvous
//! frame, and pulling it straight out of the peer's memory on the other side —
//! from a mapped registered segment (no system call) or through the link's
//! `read_peer` (`process_vm_readv`, or a plain copy between threads).

use std::io;

use super::{CallInfo, Channel, InMsg, RENDEZVOUS_BYTES, SEGMENT_BYTES};
use crate::error::{Error, Result};
use crate::reduce;
use crate::registered::{self, PeerSegment};
use crate::transport::Link;

/// Single-copy reductions read the peer's data in chunks of this size, then reduce
/// each chunk while it is still in cache. Measured on the 2-core VM (2 ranks): 1 MiB
/// chunks beat 64 KiB and 256 KiB by 5–15 % at 16–64 MiB, because each
/// `process_vm_readv` pins pages at a fixed cost per call.
const PEER_CHUNK: usize = 1 << 20;
/// Rendezvous payload: address u64, length u64, offset in a registered segment
/// u64, name length u8, then the segment's name (empty: not registered).
pub(super) const DESC_FIXED: usize = 25;
pub(super) const DESC_MAX: usize = DESC_FIXED + registered::MAX_NAME;

/// Which transfers of at least [`rendezvous_bytes`] go single-copy on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SingleCopy {
    /// The link cannot read peer memory: every byte goes through it.
    Never,
    /// Only data in registered buffers: the peer maps the segment and reads it with
    /// no system call. Plain buffers between processes go through the shared ring,
    /// which measured faster here than `process_vm_readv` at every size (pinning
    /// pages costs more than the ring's extra copy; see `results/`).
    Registered,
    /// Everything (threads of one process: a plain copy from the peer's buffer;
    /// or `BRAID_CMA=1` for `process_vm_readv` between processes).
    Always,
}

impl SingleCopy {
    /// Shared memory: registered buffers single-copy through the peer's mapped
    /// segment; plain ones too only when the link reads any peer address (CMA
    /// wanted with `BRAID_CMA=1` and probed in both directions at connect time).
    pub(super) fn for_link(link: &dyn Link) -> SingleCopy {
        if !link.can_read_peer() {
            SingleCopy::Never
        } else if link.reads_peer_addresses() {
            SingleCopy::Always
        } else {
            SingleCopy::Registered
        }
    }

    /// Whether the frame of `len` bytes at `data`, part of a transfer of `total`
    /// bytes, goes as a rendezvous.
    pub(super) fn applies(self, data: *const u8, len: usize, total: usize) -> bool {
        total >= rendezvous_bytes()
            && match self {
                SingleCopy::Never => false,
                SingleCopy::Always => true,
                SingleCopy::Registered => crate::registered::lookup(data as usize, len).is_some(),
            }
    }
}

/// The rendezvous payload for `len` bytes at `data`, naming the registered segment
/// that holds them, if any.
pub(super) fn describe(data: *const u8, len: usize) -> ([u8; DESC_MAX], usize) {
    let mut d = [0u8; DESC_MAX];
    d[..8].copy_from_slice(&(data as u64).to_le_bytes());
    d[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    let Some((name, offset)) = registered::lookup(data as usize, len) else { return (d, DESC_FIXED) };
    d[16..24].copy_from_slice(&(offset as u64).to_le_bytes());
    d[24] = name.len() as u8;
    d[DESC_FIXED..DESC_FIXED + name.len()].copy_from_slice(name.as_bytes());
    (d, DESC_FIXED + name.len())
}

/// The single-copy threshold: [`RENDEZVOUS_BYTES`], or `BRAID_RENDEZVOUS_BYTES`
/// (the sender's value decides each transfer; receivers follow each frame's kind).
pub(super) fn rendezvous_bytes() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("BRAID_RENDEZVOUS_BYTES")
            .ok()
            .and_then(|v| crate::config::parse_size(&v).ok())
            .unwrap_or(RENDEZVOUS_BYTES)
    })
}

/// Whether plain (unregistered) buffers between processes of a host go single-copy
/// through `process_vm_readv`: only with `BRAID_CMA=1`. Off by default because
/// the shared ring measured faster at every size on the 2-core VM (pinning each
/// 4 KiB page costs more than the ring's extra copy through cache).
pub(crate) fn cma_for_plain_buffers() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("BRAID_CMA").is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes" | "on")))
}

/// Single copy: read a rendezvous transfer straight from the peer's memory —
/// into place for a plain receive, or chunk by chunk through a cache-sized staging
/// buffer that is reduced while still hot.
pub(super) fn pull_from_peer(ch: &mut Channel, m: &mut InMsg, peer: usize, call: &CallInfo) -> Result<()> {
    let field = |i: usize| u64::from_le_bytes(m.desc[i..i + 8].try_into().expect("8 bytes")) as usize;
    let (addr, len, offset) = (field(0), field(8), field(16));
    let name_len = m.desc[24] as usize;
    if len != m.len || DESC_FIXED + name_len != m.desc_got {
        let detail = format!("rendezvous of {len} bytes where this rank expects {}", m.len);
        return Err(Error::Protocol { ctx: call.ctx.clone(), peer, detail });
    }
    if name_len > 0 {
        let name = String::from_utf8_lossy(&m.desc[DESC_FIXED..DESC_FIXED + name_len]).into_owned();
        if pull_registered(ch, m, &name, offset, call)? {
            tracing::trace!(peer, bytes = len, "single copy from the peer's registered segment {name}");
            return Ok(());
        }
    }
    tracing::trace!(peer, bytes = len, "single copy through the link ({})", ch.link.kind());
    let lost = |e: io::Error| Error::PeerLost {
        ctx: call.ctx.clone(),
        peer,
        detail: format!("reading its memory failed: {e}"),
    };
    let Some(src) = m.src else {
        // SAFETY: dst..dst+len is a live region of this rank's buffers.
        let dst = unsafe { std::slice::from_raw_parts_mut(m.dst, len) };
        // One kernel copy straight into place. (Pulling through a cached chunk
        // and streaming it out measured slower here: the extra pass costs more
        // than the destination reads it saves.)
        return ch.link.read_peer(addr, dst).map_err(lost);
    };
    if ch.staging.len() < PEER_CHUNK {
        ch.staging.resize(PEER_CHUNK.max(SEGMENT_BYTES), 0);
    }
    let op = call.reduce_op.combiner();
    let mut off = 0;
    while off < len {
        let n = (len - off).min(PEER_CHUNK);
        ch.link.read_peer(addr + off, &mut ch.staging[..n]).map_err(lost)?;
        let inc = &ch.staging[..n];
        // SAFETY: [off, off+n) lies inside the step's dst and src ranges; src is
        // either the same memory as dst or disjoint from it (checked when queued).
        unsafe {
            let dst = std::slice::from_raw_parts_mut(m.dst.add(off), n);
            if std::ptr::eq(src, m.dst) {
                reduce::reduce_inplace(call.dtype, op, dst, inc)?;
            } else {
                reduce::reduce_into(call.dtype, op, dst, std::slice::from_raw_parts(src.add(off), n), inc)?;
            }
        }
        off += n;
    }
    m.got = len;
    Ok(())
}

/// Zero copy from a peer's registered segment, mapped once per link: copy or
/// reduce straight out of the mapping. Returns false when the segment cannot be
/// mapped here, so the caller falls back to reading through the kernel.
fn pull_registered(ch: &mut Channel, m: &mut InMsg, name: &str, offset: usize, call: &CallInfo) -> Result<bool> {
    if !ch.peer_segments.contains_key(name) {
        match PeerSegment::open(name) {
            Ok(seg) => {
                ch.peer_segments.insert(name.to_owned(), seg);
            }
            Err(e) => {
                tracing::debug!("cannot map registered segment {name}: {e}; reading through the kernel");
                return Ok(false);
            }
        }
    }
    let Some(peer) = ch.peer_segments.get(name).and_then(|seg| seg.slice(offset, m.len)) else { return Ok(false) };
    let op = call.reduce_op.combiner();
    // SAFETY: dst (and src) are live regions of this rank's buffers; src is dst or disjoint.
    unsafe {
        let dst = std::slice::from_raw_parts_mut(m.dst, m.len);
        match m.src {
            None => reduce::copy_streaming(dst, peer),
            Some(src) if std::ptr::eq(src, m.dst) => reduce::reduce_inplace(call.dtype, op, dst, peer)?,
            Some(src) => reduce::reduce_into(call.dtype, op, dst, std::slice::from_raw_parts(src, m.len), peer)?,
        }
    }
    m.got = m.len;
    Ok(true)
}
