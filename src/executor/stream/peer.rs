//! The stream channel as the executor sees it: [`PeerChannel`] over the state in
//! `mod.rs`, driving the outbound and inbound halves.

use std::time::Instant;

use super::inbound::{self, progress_recv};
use super::outbound::{frame_parts, progress_send, queue_send, send_now, writable};
use super::*;

impl PeerChannel for StreamChannel {
    fn kind(&self) -> TransportKind {
        self.link.kind()
    }

    fn next_send_is_exchange(&mut self, exchange: bool) {
        self.exchange = exchange;
    }

    fn post_send(&mut self, src: MemRegion, first_gate: Option<usize>, call: &CallInfo) -> Result<()> {
        // The flag holds for the send it was said for, not the ones after.
        let exchange = std::mem::take(&mut self.exchange) && first_gate.is_none();
        self.require_host(&src, "a send to", call)?;
        self.require_present(call)?;
        // A small plain send with nothing queued before it leaves now: no queue entry,
        // and the peer's data (and so its wait) starts a pass earlier.
        if first_gate.is_none()
            && src.len <= EAGER_BYTES
            && src.len < self.tuning.rendezvous_bytes
            && self.out.is_empty()
            && self.tx_at_boundary
            && self.acks_owed == 0
        {
            return send_now(self, call, src.ptr as *const u8, src.len);
        }
        queue_send(self, call, src.ptr as *const u8, src.len, first_gate, exchange);
        Ok(())
    }

    fn post_recv(
        &mut self,
        dst: MemRegion,
        reduce: Option<Reduction>,
        mut forward: Option<&mut Vec<usize>>,
        call: &CallInfo,
    ) -> Result<()> {
        self.require_host(&dst, "a receive from", call)?;
        self.require_present(call)?;
        if let Some(r) = &reduce {
            self.require_host(&r.src, "the local operand of a receive-reduce from", call)?;
        }
        let (base, s) = (dst.ptr, reduce.map(|r| r.src.ptr as *const u8));
        let (dtype, op) = reduce.map_or((DType::U8, ReduceOp::Sum), |r| (r.dtype, r.op));
        for (off, len) in frames(dst.len) {
            // SAFETY: off + len <= dst.len (== the operand's length), inside the
            // regions the executor bounds-checked.
            let mut m = InMsg::new(unsafe { base.add(off) }, s.map(|s| unsafe { s.add(off) }), len, dtype, op);
            // What its frames must say, fixed now: a group posts receives of several
            // messages (each its own sequence number and signature) in one call.
            (m.seq, m.sig) = (call.recv_seq, call.sig);
            // By the call's whole buffer, not this receive's part of it: a chain or a
            // ring moves a long message in pieces, and it is the buffer that leaves
            // the cache (2-rank broadcast of 64 MiB: the chain's pieces with
            // ordinary stores took 1.4x the tree's one receive with streaming ones).
            let call_bytes = (call.sig.count as usize).saturating_mul(call.sig.dtype.size());
            m.stream = reduce.is_none() && dst.len.max(call_bytes) >= self.tuning.stream_recv_bytes;
            if let Some(gates) = forward.as_deref_mut() {
                m.feeds = Some(gates.len());
                gates.push(0);
            }
            self.inq.push_back(m);
        }
        Ok(())
    }

    fn progress(&mut self, peer: usize, gates: &mut [usize], call: &CallInfo) -> Result<bool> {
        if let Rx::Gone(g) = &self.rx {
            if self.wait.awaiting && self.wait.gone.is_none() {
                self.wait.gone = Some(g.describe());
            }
            self.acks_owed = 0;
            return if self.needs_peer() { Err(g.error(call, peer)) } else { Ok(false) };
        }
        // Most passes of a small call have nothing to send: that costs a check here,
        // not a call (progress_send would find both queues empty and return false).
        let sent = if self.out.is_empty() && self.acks_owed == 0 && self.wait.unsent().is_empty() {
            false
        } else {
            match progress_send(self, gates, call) {
                Ok(sent) => sent,
                Err(e) => return Err(inbound::write_failed(self, peer, call, e)),
            }
        };
        let received = progress_recv(self, peer, gates, call)?;
        Ok(sent | received)
    }

    fn busy(&self) -> bool {
        !self.out.is_empty() || !self.inq.is_empty() || self.acks_awaited > 0 || self.acks_owed > 0
    }

    fn sent_unread(&self) -> bool {
        self.link.sent_unread()
    }

    fn readiness(&self, gates: &[usize]) -> Readiness {
        let Some(fd) = self.link.poll_fd() else { return Readiness::NoFd };
        let mut events = 0;
        // A forward waiting for its reduction waits on input, not on the socket.
        if self.out.front().is_some_and(|m| writable(m, gates, self.forward_grain) > m.sent)
            || self.acks_owed > 0
            || !self.wait.unsent().is_empty()
        {
            events |= libc::POLLOUT;
        }
        // Watch input when a receive or an ack is awaited, or (idle) for an abort
        // or EOF — but not when a complete header already waits for its step.
        // A peer that is gone is not watched: progress fails at once if it is needed.
        if matches!(self.rx, Rx::Gone(_)) {
            return Readiness::Fd { fd, events: 0 };
        }
        if !self.inq.is_empty()
            || self.acks_awaited > 0
            || matches!(self.rx, Rx::Header { .. } | Rx::Reason { .. } | Rx::WaitList { .. })
        {
            events |= libc::POLLIN;
        }
        Readiness::Fd { fd, events }
    }

    fn peer_gone(&mut self) -> bool {
        // Asked when a call fails and while the survivors agree: what the peer
        // sent is no longer wanted, and its goodbye may wait behind it unread.
        if !matches!(self.rx, Rx::Gone(_)) {
            inbound::read_ahead(self, |_| None);
        }
        // A peer that said goodbye closed its communicator: it will not agree
        // either. One that aborted is alive, failing as this rank is.
        match &self.rx {
            Rx::Gone(Gone::Lost(..) | Gone::Goodbye) => true,
            Rx::Gone(Gone::Aborted(_)) => false,
            _ => self.said_goodbye || self.link.peer_gone(),
        }
    }

    /// Bounded in time: `give_up` is shared by all the channels a rank closes at
    /// once, so closing many full links still takes at most
    /// [`CONTROL_GRACE`](super::CONTROL_GRACE) in all.
    fn send_control_and_close(&mut self, kind: FrameKind, comm_id: u32, epoch: u8, reason: &str, give_up: Instant) {
        if self.tx_at_boundary {
            let payload = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
            let hdr = Header::control(kind, comm_id, epoch, payload.len() as u32).encode();
            let total = HEADER_LEN + payload.len();
            let mut sent = 0;
            while sent < total && Instant::now() < give_up {
                match self.link.try_write(&frame_parts(&hdr, payload, 0, sent)) {
                    Ok(0) => std::thread::yield_now(),
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
            }
        }
        self.tx_at_boundary = false;
        self.link.close();
    }

    fn wait_slot(&mut self) -> Option<&mut WaitSlot> {
        Some(&mut self.wait)
    }

    /// With nothing posted, progress reads up to the next data header and stops
    /// there (`Rx::Ready`): the frame stays whole for the receive that takes it.
    fn next_data_frame(&mut self, peer: usize, call: &CallInfo) -> Result<NextFrame> {
        if !self.inq.is_empty() || !self.out.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{}: looking for the next frame from rank {peer} with transfers posted",
                call.ctx
            )));
        }
        self.progress(peer, &mut [], call)?;
        match &self.rx {
            Rx::Ready(h) => Ok(NextFrame::Data(*h)),
            Rx::Gone(Gone::Goodbye) => Ok(NextFrame::Closed),
            Rx::Gone(g) => Err(g.error(call, peer)),
            _ => Ok(NextFrame::Nothing),
        }
    }

    fn end_call(&mut self) {
        self.wait.end_call();
        if std::mem::take(&mut self.exposed) {
            self.link.revoke_exposed();
        }
        self.out.clear();
        self.inq.clear();
    }
}
