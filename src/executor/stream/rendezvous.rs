//! The rendezvous frame of a single-copy transfer: which transfers of a link go
//! single-copy ([`SingleCopy`]), and the descriptor that names the sender's data
//! (written by [`describe`], checked by [`parse_descriptor`]). Pure encoding: the
//! pulling itself is in `single_copy.rs`.

use crate::registered;
use crate::transport::Link;

// Single-copy reductions read the peer's data in chunks of `Tuning::peer_chunk`
// (default 1 MiB), then reduce each chunk while it is still in cache. Measured on
// the 2-core VM (2 ranks): 1 MiB chunks beat 64 KiB and 256 KiB by 5–15 % at
// 16–64 MiB, because each `process_vm_readv` pins pages at a fixed cost per call.
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
    /// no system call. Plain buffers between processes go through the shared ring
    /// (CMA off with `BRAID_CMA=0`, or not working between these processes).
    Registered,
    /// Everything (threads of one process: a plain copy from the peer's buffer;
    /// or `BRAID_CMA=1` for `process_vm_readv` between processes).
    Always,
    /// Registered buffers, and plain ones only in an exchange (`BRAID_CMA=exchange`):
    /// where both ranks send and receive in the same round, the ring's two copies
    /// both fall on busy ranks and one `process_vm_readv` saves one of them; a
    /// one-way transfer through the ring has the sender and the receiver copy at
    /// the same time, which measured faster than the receiver pulling alone.
    Exchanges,
}

impl SingleCopy {
    /// Shared memory: registered buffers single-copy through the peer's mapped
    /// segment; plain ones too only when the link reads any peer address (CMA
    /// wanted with `BRAID_CMA=1` and probed in both directions at connect time).
    pub(super) fn for_link(link: &dyn Link, exchanges_only: bool) -> SingleCopy {
        if !link.can_read_peer() {
            SingleCopy::Never
        } else if link.reads_peer_addresses() {
            if exchanges_only && link.kind() == crate::transport::TransportKind::Shm {
                SingleCopy::Exchanges
            } else {
                SingleCopy::Always
            }
        } else {
            SingleCopy::Registered
        }
    }

    /// Whether the frame of `len` bytes at `data`, part of a transfer of `total`
    /// bytes, goes as a rendezvous.
    pub(super) fn applies(self, data: *const u8, len: usize, total: usize, threshold: usize, exchange: bool) -> bool {
        total >= threshold
            && match self {
                SingleCopy::Never => false,
                SingleCopy::Always => true,
                SingleCopy::Exchanges if exchange => true,
                SingleCopy::Registered | SingleCopy::Exchanges => {
                    crate::registered::lookup(data as usize, len).is_some()
                }
            }
    }
}

/// The rendezvous payload for `len` bytes at `data`, naming the registered segment
/// that holds them, if any.
pub(super) fn describe(data: *const u8, len: usize) -> ([u8; DESC_MAX], usize) {
    let reg = registered::lookup(data as usize, len);
    encode_descriptor(data as usize, len, reg.as_ref().map(|(name, offset)| (name.as_str(), *offset)))
}

/// The rendezvous payload for `len` bytes at `addr`, at `offset` of the registered
/// segment `name` if given (names are at most [`registered::MAX_NAME`] bytes).
pub(super) fn encode_descriptor(addr: usize, len: usize, reg: Option<(&str, usize)>) -> ([u8; DESC_MAX], usize) {
    let mut d = [0u8; DESC_MAX];
    d[..8].copy_from_slice(&(addr as u64).to_le_bytes());
    d[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    let Some((name, offset)) = reg else { return (d, DESC_FIXED) };
    d[16..24].copy_from_slice(&(offset as u64).to_le_bytes());
    d[24] = name.len() as u8;
    d[DESC_FIXED..DESC_FIXED + name.len()].copy_from_slice(name.as_bytes());
    (d, DESC_FIXED + name.len())
}

/// A rendezvous payload, checked.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Desc<'a> {
    /// Where the data lies in the sender's address space.
    pub addr: usize,
    /// How long it is (the receiving step's length).
    pub len: usize,
    /// Offset of the data in the registered segment `name`.
    pub offset: usize,
    /// The registered segment holding the data, if any (`braid-reg-…`).
    pub name: Option<&'a str>,
}

/// Parse and check the rendezvous payload `b` of a frame whose receive step
/// expects `expected_len` bytes. Every field is the peer's to write, so nothing is
/// trusted: lengths must agree, ranges must not wrap, and a segment name must be
/// one of braid's (`braid-reg-` then letters, digits and dashes).
pub(super) fn parse_descriptor(b: &[u8], expected_len: usize) -> std::result::Result<Desc<'_>, String> {
    if !(DESC_FIXED..=DESC_MAX).contains(&b.len()) {
        return Err(format!("rendezvous payload of {} bytes (expected {DESC_FIXED}..={DESC_MAX})", b.len()));
    }
    let field = |i: usize| {
        let v = u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        usize::try_from(v).map_err(|_| format!("rendezvous field {v:#x} does not fit an address"))
    };
    let (addr, len, offset) = (field(0)?, field(8)?, field(16)?);
    let name_len = b[24] as usize;
    if len != expected_len {
        return Err(format!("rendezvous of {len} bytes where this rank expects {expected_len}"));
    }
    if DESC_FIXED + name_len != b.len() {
        return Err(format!("rendezvous names a segment of {name_len} bytes in a payload of {}", b.len()));
    }
    if addr.checked_add(len).is_none() {
        return Err(format!("rendezvous range {addr:#x} + {len} wraps the address space"));
    }
    if name_len == 0 {
        if offset != 0 {
            return Err(format!("rendezvous offset {offset} without a registered segment"));
        }
        return Ok(Desc { addr, len, offset, name: None });
    }
    let name = std::str::from_utf8(&b[DESC_FIXED..])
        .ok()
        .filter(|n| n.len() > "braid-reg-".len() && n.starts_with("braid-reg-"))
        .filter(|n| n.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'))
        .ok_or_else(|| {
            format!("rendezvous names `{}`, not a braid registered segment", b[DESC_FIXED..].escape_ascii())
        })?;
    if offset.checked_add(len).is_none() {
        return Err(format!("rendezvous range {offset} + {len} of segment {name} wraps"));
    }
    Ok(Desc { addr, len, offset, name: Some(name) })
}
