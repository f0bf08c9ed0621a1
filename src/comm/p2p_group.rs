//! Grouped point-to-point and tags: [`Communicator::batch_p2p`] (NCCL's
//! `ncclGroupStart/End` around sends and receives, torch's `batch_isend_irecv`,
//! MPI's `Isend`/`Irecv` and `Waitall`), and [`Communicator::send_tagged`] /
//! [`Communicator::recv_tagged`].
//!
//! A group is one call: every message is posted, then all are driven together
//! ([`crate::executor::group`]). Each message still pairs with the peer's sends or
//! receives in posting order, grouped or not: a message takes the next sequence
//! number of its link in its direction when the group runs.

use std::marker::PhantomData;
use std::sync::atomic::Ordering;

use super::calls::Core;
use super::engine::Engine;
use super::{Communicator, Work};
use crate::error::{Error, OpContext, Result};
use crate::executor::group::{execute_group, GroupMessage};
use crate::executor::CallInfo;
use crate::types::{CallSig, DType, Element, OpKind, ReduceOp};

/// One send or receive of a group ([`Communicator::batch_p2p`]), holding its
/// buffer's borrow: `P2p::send(&a, 1)`, `P2p::recv(&mut b, 2).tag(7)`.
///
/// Tags are checked, not used to pick a message: a receive takes the peer's
/// sends to this rank in posting order (as untagged ones do), and if their tags
/// differ the call fails, naming both tags (MPI would instead wait for a send
/// with the receive's tag).
#[derive(Debug)]
pub struct P2p<'a> {
    op: OpKind,
    ptr: *mut u8,
    /// Bytes.
    len: usize,
    dtype: DType,
    peer: usize,
    tag: u32,
    buf: PhantomData<&'a mut [u8]>,
}

// SAFETY: a `P2p` stands for the `&[T]` or `&mut [T]` it was made from (or, made
// unsafely, for memory its maker vouches for), of `Element`s, which are Send + Sync.
unsafe impl Send for P2p<'_> {}

impl<'a> P2p<'a> {
    /// Send `buf` to `peer`.
    pub fn send<T: Element>(buf: &'a [T], peer: usize) -> P2p<'a> {
        let len = std::mem::size_of_val(buf);
        P2p { op: OpKind::Send, ptr: buf.as_ptr() as *mut u8, len, dtype: T::DTYPE, peer, tag: 0, buf: PhantomData }
    }

    /// Receive `buf.len()` elements from `peer` into `buf`.
    pub fn recv<T: Element>(buf: &'a mut [T], peer: usize) -> P2p<'a> {
        let len = std::mem::size_of_val(buf);
        P2p { op: OpKind::Recv, ptr: buf.as_mut_ptr() as *mut u8, len, dtype: T::DTYPE, peer, tag: 0, buf: PhantomData }
    }

    /// Send `count` elements of `dtype` at `buf` to `peer` (the C ABI's form).
    ///
    /// # Safety
    /// `buf` is valid for reading `count` elements and not written until the
    /// group that takes this message has returned.
    pub unsafe fn send_raw(buf: *const u8, count: usize, dtype: DType, peer: usize) -> Result<P2p<'a>> {
        let (ptr, len) = raw_bytes(buf as *mut u8, count, dtype)?;
        Ok(P2p { op: OpKind::Send, ptr, len, dtype, peer, tag: 0, buf: PhantomData })
    }

    /// Receive `count` elements of `dtype` from `peer` into `buf` (the C ABI's form).
    ///
    /// # Safety
    /// `buf` is valid for writing `count` elements and used by nothing else until
    /// the group that takes this message has returned (a group refuses receives
    /// that overlap its other messages).
    pub unsafe fn recv_raw(buf: *mut u8, count: usize, dtype: DType, peer: usize) -> Result<P2p<'a>> {
        let (ptr, len) = raw_bytes(buf, count, dtype)?;
        Ok(P2p { op: OpKind::Recv, ptr, len, dtype, peer, tag: 0, buf: PhantomData })
    }

    /// This message with `tag` (default 0), which the peer's matching call must carry too.
    pub fn tag(self, tag: u32) -> P2p<'a> {
        P2p { tag, ..self }
    }

    /// The signature the message travels under.
    fn sig(&self) -> CallSig {
        let count = (self.len / self.dtype.size()) as u64;
        CallSig::new(self.op, self.dtype, count, u32::try_from(self.peer).unwrap_or(u32::MAX), ReduceOp::Sum)
            .with_tag(self.tag)
    }
}

/// The start and byte length of `count` elements of `dtype` at `buf`, checked; an
/// empty message at NULL gets a dangling start, as an empty slice has.
pub(super) fn raw_bytes(buf: *mut u8, count: usize, dtype: DType) -> Result<(*mut u8, usize)> {
    let len = count
        .checked_mul(dtype.size())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Error::InvalidArgument(format!("{count} elements of {dtype} are more bytes than fit")))?;
    if buf.is_null() && len > 0 {
        return Err(Error::InvalidArgument("a message's buffer is NULL".into()));
    }
    Ok((if buf.is_null() { std::ptr::NonNull::dangling().as_ptr() } else { buf }, len))
}

/// A checked group, as the worker runs it.
pub(super) struct Group {
    messages: Vec<(usize, CallSig, *mut u8, usize)>,
}

// SAFETY: made from `P2p`s (Send) whose memory the caller keeps for the call.
unsafe impl Send for Group {}

impl Core {
    /// Check a group before anything of it runs: peers, no message to this rank,
    /// and no receive overlapping another message of the group.
    pub(super) fn check_group(&self, ops: &[P2p<'_>]) -> Result<Group> {
        let arg = |i: usize, what: String| {
            Error::InvalidArgument(format!("rank {}: message {i} of the group: {what}", self.rank))
        };
        for (i, m) in ops.iter().enumerate() {
            if m.peer >= self.world {
                return Err(arg(i, format!("peer {} is not a rank of this {}-rank communicator", m.peer, self.world)));
            }
            if m.peer == self.rank {
                return Err(arg(i, format!("a {} to itself (rank {})", m.op, self.rank)));
            }
            if !m.len.is_multiple_of(m.dtype.size()) {
                return Err(arg(i, format!("{} bytes is not a whole number of {}", m.len, m.dtype)));
            }
        }
        if let Some((a, b)) = receive_overlap(ops) {
            return Err(arg(
                b,
                format!(
                    "its buffer overlaps message {a}'s, and one of them is a receive (each needs memory of its own)"
                ),
            ));
        }
        Ok(Group { messages: ops.iter().map(|m| (m.peer, m.sig(), m.ptr, m.len)).collect() })
    }

    /// Run a checked group (or the reason it was refused) at `ticket`.
    pub(super) fn group_at(&self, ticket: u64, group: Result<Group>) -> Result<()> {
        let first = group.as_ref().ok().and_then(|g| g.messages.first().map(|m| m.1));
        self.shared.in_turn(ticket, first, |e| e.p2p_group(&group?))
    }
}

/// Two messages (by index, the earlier first) of which one is a receive and whose
/// buffers overlap, if any: sorted by start, each receive is checked against the
/// furthest end of all earlier buffers, and every buffer against that of earlier
/// receives.
fn receive_overlap(ops: &[P2p<'_>]) -> Option<(usize, usize)> {
    let mut by_start: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].len > 0).collect();
    by_start.sort_by_key(|&i| ops[i].ptr as usize);
    let (mut any, mut recv): (Option<usize>, Option<usize>) = (None, None);
    let end = |i: usize| ops[i].ptr as usize + ops[i].len;
    for &i in &by_start {
        let start = ops[i].ptr as usize;
        let hit = |j: Option<usize>| j.filter(|&j| start < end(j));
        let other = if ops[i].op == OpKind::Recv { hit(any) } else { None }.or_else(|| hit(recv));
        if let Some(j) = other {
            return Some((i.min(j), i.max(j)));
        }
        if any.is_none_or(|j| end(i) > end(j)) {
            any = Some(i);
        }
        if ops[i].op == OpKind::Recv && recv.is_none_or(|j| end(i) > end(j)) {
            recv = Some(i);
        }
    }
    None
}

impl Engine {
    /// Run a group: each message takes its link's next sequence number in its
    /// direction, all are posted, then driven together.
    fn p2p_group(&mut self, group: &Group) -> Result<()> {
        let Some(&(_, first, _, _)) = group.messages.first() else { return Ok(()) };
        if self.aborted.load(Ordering::Relaxed) {
            self.notice_abort();
            return Err(Error::Aborted { rank: self.rank, call: Some(first) });
        }
        if let Some(why) = &self.broken {
            return Err(Error::Broken(why.clone()));
        }
        let messages: Vec<GroupMessage> = group
            .messages
            .iter()
            .map(|&(peer, sig, ptr, len)| {
                let next = if sig.op == OpKind::Send { &mut self.p2p_sent[peer] } else { &mut self.p2p_received[peer] };
                let seq = *next;
                *next += 1;
                GroupMessage { peer, sig, seq, ptr, len }
            })
            .collect();
        let info = CallInfo {
            ctx: OpContext { rank: self.rank, call: Some(first), seq: messages[0].seq },
            sig: first,
            send_seq: messages[0].seq,
            recv_seq: messages[0].seq,
            comm_id: self.comm_id,
            epoch: self.epoch,
            dtype: first.dtype,
            reduce_op: ReduceOp::Sum,
            timeout: self.timeout,
            wait: self.wait,
            flags: self.aborted.clone(),
        };
        // SAFETY: the messages come from `P2p`s, whose memory the caller keeps for
        // the call, receives overlapping nothing else (`check_group`).
        let mut result = unsafe { execute_group(&mut self.channels, &messages, &info) };
        if result.is_ok() && self.aborted.load(Ordering::Relaxed) {
            result = Err(Error::Aborted { rank: self.rank, call: Some(first) });
        }
        if let Err(e) = &result {
            self.fail(e.to_string());
        }
        result
    }
}

impl Communicator {
    /// Post every send and receive of `ops` together and return when all have
    /// completed: NCCL's `ncclGroupStart`/`ncclGroupEnd` around sends and receives,
    /// torch's `batch_isend_irecv`, MPI's `Isend`/`Irecv` then `Waitall`.
    ///
    /// Messages go to and come from any other ranks, several to one peer included;
    /// nothing waits on anything else, so a ring of large messages or an exchange
    /// with every rank cannot deadlock, whatever the order of `ops`. Each message
    /// pairs with the peer's sends or receives in posting order, grouped or not;
    /// a receive's tag must equal that of the send it pairs with (see [`P2p`]).
    /// Refused before anything runs: a peer out of range, a message to this rank, a
    /// receive whose buffer overlaps another message's. Host buffers only.
    ///
    /// ```
    /// use braid::{Communicator, P2p};
    /// let comms = Communicator::in_process(2)?;
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || -> braid::Result<()> {
    ///             let other = 1 - c.rank();
    ///             let (mine, mut theirs) = ([c.rank() as f32; 4], [0f32; 4]);
    ///             c.batch_p2p(&mut [P2p::send(&mine, other).tag(7), P2p::recv(&mut theirs, other).tag(7)])?;
    ///             assert_eq!(theirs, [other as f32; 4]);
    ///             Ok(())
    ///         });
    ///     }
    /// });
    /// # Ok::<(), braid::Error>(())
    /// ```
    pub fn batch_p2p(&self, ops: &mut [P2p<'_>]) -> Result<()> {
        let group = self.core.check_group(ops);
        self.core.group_at(self.core.shared.take_ticket(), group)
    }

    /// [`Communicator::batch_p2p`], asynchronously, on raw messages
    /// ([`P2p::send_raw`], [`P2p::recv_raw`]): what the C ABI's `_async` tagged
    /// calls issue. Its place in this rank's call order is taken now.
    ///
    /// # Safety
    /// Every message's buffer is valid (for writing, for a receive) and used by
    /// nothing else until the work completes.
    pub unsafe fn batch_p2p_async_raw(&self, ops: Vec<P2p<'static>>) -> Work<()> {
        let group = self.core.check_group(&ops);
        // The buffers `group` points into stay valid until the job ends: the
        // caller's promise.
        self.spawn(move |core, ticket| core.group_at(ticket, group))
    }

    /// [`Communicator::send`] with a tag, which the peer's receive must carry too
    /// (checked, not used to reorder: see [`P2p`]).
    pub fn send_tagged<T: Element>(&self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.batch_p2p(&mut [P2p::send(buf, peer).tag(tag)])
    }

    /// [`Communicator::recv`] with a tag: fails, naming both tags, if the send it
    /// pairs with (the peer's next to this rank) carries another.
    pub fn recv_tagged<T: Element>(&self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.batch_p2p(&mut [P2p::recv(buf, peer).tag(tag)])
    }
}
