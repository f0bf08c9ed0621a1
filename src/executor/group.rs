//! Grouped point-to-point: several sends and receives, to and from any peers,
//! posted together and driven to completion together in one transfer loop.
//!
//! A collective's [`Schedule`](crate::algorithm::Schedule) runs under one signature
//! and one sequence number. The messages of a group do not: each is matched by the
//! peer's own send or receive (grouped or not), so each carries the sequence number
//! it takes on its link and its own signature (count, dtype, tag). Channels fix both
//! when a transfer is posted, so the group posts every message with its own
//! [`CallInfo`] and then drives all channels at once — one round of many steps.
//! Posting everything before waiting on anything is what makes a ring of large
//! messages, or an exchange with every peer, free of deadlock whatever the order.

use super::channel::{MemKind, MemRegion};
use super::{channel_mut, run_transfers, CallEnd, CallInfo, Channels};
use crate::error::{OpContext, Result};
use crate::types::{CallSig, OpKind};

/// One message of a group: a send of, or a receive into, `len` bytes at `ptr`.
#[derive(Clone, Copy, Debug)]
pub struct GroupMessage {
    /// The rank it goes to or comes from.
    pub peer: usize,
    /// Its signature ([`OpKind::Send`] or [`OpKind::Recv`], count, dtype, tag).
    pub sig: CallSig,
    /// The sequence number it takes on its link, in its direction.
    pub seq: u64,
    /// Host memory: read by a send, written by a receive.
    pub ptr: *mut u8,
    /// Its length in bytes.
    pub len: usize,
}

/// Post every message of `group`, in order, then drive them all to completion.
/// `call` names the group in errors and carries the deadline and abort flag.
///
/// # Safety
/// Each message's memory is valid for the whole call (reads for a send, writes for
/// a receive), and no receive's memory overlaps another message's or is touched by
/// anything else meanwhile.
pub unsafe fn execute_group(channels: &mut Channels, group: &[GroupMessage], call: &CallInfo) -> Result<()> {
    // However the call ends, the channels forget the posted pointers.
    let end = CallEnd { channels };
    for m in group {
        let info = CallInfo {
            ctx: OpContext { rank: call.ctx.rank, call: Some(m.sig), seq: m.seq },
            sig: m.sig,
            send_seq: m.seq,
            recv_seq: m.seq,
            comm_id: call.comm_id,
            epoch: call.epoch,
            dtype: m.sig.dtype,
            reduce_op: m.sig.reduce_op,
            timeout: call.timeout,
            wait: call.wait,
            flags: call.flags.clone(),
        };
        let region = MemRegion { ptr: m.ptr, len: m.len, kind: MemKind::Host };
        let ch = channel_mut(end.channels, m.peer, &info)?;
        match m.sig.op {
            OpKind::Send => ch.post_send(region, None, &info)?,
            _ => ch.post_recv(region, None, None, &info)?,
        }
    }
    run_transfers(end.channels, &mut [], call)
}
