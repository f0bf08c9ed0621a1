//! Pipelined packing: a bucket of owned tensors goes out in pieces, so that
//! packing the next piece and unpacking the last one overlap the piece on the wire.
//!
//! The fuser's thread packs piece k into a buffer of its own and hands it to the
//! communicator's worker ([`Communicator::collective_bytes_async`]); with
//! [`DEPTH`] pieces in flight it waits for the oldest, unpacks it into its
//! tensors and answers their requests, then packs the next. The pieces are cut
//! by [`plan::buckets`] at the piece size the ranks agreed with the batch's cut (see
//! [`super::Pipeline`]), a pure function of the agreed layout and size, so every rank runs the same calls in the same order.
//!
//! This pays where the link does not need the rank's core (TCP, whose copies the
//! kernel makes while the socket waits): over memory transports on a machine
//! with a core per rank the worker and the packer compete for it.

use std::collections::VecDeque;

use super::plan::{self, Entry};
use super::{Packer, Request};
use crate::comm::Work;
use crate::error::{Error, Result};
use crate::types::{CallSig, OpKind};

/// Pieces in flight at once: one on the wire while the thread unpacks the one
/// before it and packs the one after.
pub(super) const DEPTH: usize = 2;

/// One piece on the worker: its call and the requests whose tensors it carries.
type InFlight = (Work<Vec<u8>>, Vec<Request>);

impl Packer {
    /// All-reduce one bucket (`run`, one dtype and op, uncompressed) in pieces of
    /// about the agreed piece size, answering each piece's requests once it is
    /// unpacked. Every piece handed to the worker is waited on before this
    /// returns, also after a failure: the next negotiation must not run beside it.
    pub(super) fn run_pipelined(&mut self, run: Vec<Request>) -> Result<()> {
        let entries: Vec<Entry> = run.iter().map(|r| r.entry).collect();
        let pieces = plan::buckets(&entries, self.piece_bytes);
        let mut run: VecDeque<Request> = run.into();
        let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(DEPTH);
        let mut first: Option<Error> = None;
        for piece in pieces {
            let reqs: Vec<Request> = run.drain(..piece.len()).collect();
            if in_flight.len() >= DEPTH {
                if let Some(oldest) = in_flight.pop_front() {
                    self.finish_piece(oldest, &mut first);
                }
            }
            if let Some(e) = &first {
                // No new call after a failure: answer the rest with it.
                reqs.into_iter().for_each(|q| q.done.send(Err(e.share())));
                continue;
            }
            let mut buf = self.spare.pop().unwrap_or_default();
            buf.clear();
            reqs.iter().for_each(|q| buf.extend_from_slice(q.tensor.bytes()));
            let e = reqs[0].entry;
            let sig = CallSig::new(OpKind::AllReduce, e.dtype, (buf.len() / e.dtype.size()) as u64, 0, e.op);
            in_flight.push_back((self.comm.collective_bytes_async(sig, buf), reqs));
        }
        while let Some(oldest) = in_flight.pop_front() {
            self.finish_piece(oldest, &mut first);
        }
        first.map_or(Ok(()), Err)
    }

    /// Wait for one piece, copy its result into its tensors and answer them (or
    /// answer them with its error, the first of which is kept in `first`).
    fn finish_piece(&mut self, (work, reqs): InFlight, first: &mut Option<Error>) {
        match work.wait() {
            Ok(buf) => {
                let mut off = 0;
                let mut replies = Vec::with_capacity(reqs.len());
                for mut q in reqs {
                    let n = q.entry.bytes;
                    q.tensor.bytes_mut().copy_from_slice(&buf[off..off + n]);
                    off += n;
                    replies.push((q.done, q.tensor));
                }
                // Answered after the whole piece is unpacked, for the reason the
                // unpipelined path gives (a wake per answer takes the core).
                super::answer_all(replies.into_iter().map(|(done, tensor)| (done, Ok(tensor))));
                self.spare.push(buf);
            }
            Err(e) => {
                reqs.into_iter().for_each(|q| q.done.send(Err(e.share())));
                first.get_or_insert(e);
            }
        }
    }
}
