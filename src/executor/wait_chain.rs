//! Naming the rank at the end of a chain of waits when a call times out.
//!
//! A rank that times out waiting for rank 1 learns nothing from its own links about
//! why rank 1 is silent: rank 1 may itself wait for rank 2, which waits for rank 3,
//! which is stopped (a debugger, SIGSTOP) or busy outside braid. Blaming rank 1
//! sends the user to the wrong process. So at the deadline a rank asks the ranks
//! it waits for whom they wait for ([`FrameKind::WaitQuery`]), follows the answers
//! ([`FrameKind::WaitReply`]: the answering rank's call and the ranks it waits
//! for) over its own links, asking each rank at most once, for a short
//! [`window`], and names the chain and how it ends in the [`Error::Timeout`].
//!
//! A question can be stuck behind data: a peer that has not posted the receive
//! for a frame this rank sent early (a later round of a collective) reads nothing
//! past it. So a rank at its deadline also tells every peer, unasked, whom it
//! waits for. That word travels the other way, on the link the waiting rank
//! reads because it waits for that peer, and is kept for the rest of the call.
//!
//! Any rank inside a call answers: the executor polls its links anyway, and asks
//! each link whether a question arrived now and then (see [`answer_queries`]). A
//! rank between calls reads nothing, so it cannot answer; that it did not answer
//! is itself the finding ("stopped, or stuck outside braid").
//!
//! Both frames are control frames on the data links, written at a frame boundary
//! ahead of queued data (like acks). Neither counts as progress of the call, so a
//! rank that answers questions still times out when its own call does not move.
//! A reply is untrusted input: its list is bounded ([`MAX_LISTED`]), every rank in
//! it must be in the communicator, and it counts only in this call and
//! communicator (it is forgotten when the call ends, and it makes no rank asked).

use std::time::{Duration, Instant};

pub use super::wait_slot::{check_reply_len, WaitSlot, MAX_LISTED};
use super::{block_on_fds, CallInfo, Channels};
use crate::error::{ChainEnd, Error, Result, WaitChain};
use crate::frame::{FrameKind, Header};

/// Bounds of the time a rank that timed out spends asking.
const MIN_WINDOW: Duration = Duration::from_millis(20);
const MAX_WINDOW: Duration = Duration::from_secs(1);
/// Polling interval of the asking loop on links without a descriptor.
const ASK_POLL: Duration = Duration::from_micros(200);

/// How long a rank whose call timed out after `timeout` asks about the chain:
/// a tenth of it, between 20 ms and 1 s. A call that times out fails this much
/// later than the timeout at most.
pub fn window(timeout: Duration) -> Duration {
    (timeout / 10).clamp(MIN_WINDOW, MAX_WINDOW)
}

fn query_frame(call: &CallInfo) -> [u8; crate::frame::HEADER_LEN] {
    Header::control(FrameKind::WaitQuery, call.comm_id, call.epoch, 0).encode()
}

fn reply_frame(call: &CallInfo, waits: &[usize]) -> Vec<u8> {
    let listed = &waits[..waits.len().min(MAX_LISTED)];
    let (comm_id, epoch, seq, sig) = (call.comm_id, call.epoch, call.ctx.seq, call.sig);
    let len = (listed.len() * 4) as u32;
    let mut frame = Header { kind: FrameKind::WaitReply, comm_id, epoch, seq, sig, len }.encode().to_vec();
    for &r in listed {
        frame.extend_from_slice(&(r as u32).to_le_bytes());
    }
    frame
}

/// The ranks whose channels still have work of this call.
pub(super) fn busy_ranks(channels: &Channels) -> Vec<usize> {
    (0..channels.len()).filter(|&p| channels[p].as_ref().is_some_and(|ch| ch.busy())).collect()
}

/// Answer every question that arrived: the asker learns whom this call waits for now.
pub(super) fn answer_queries(channels: &mut Channels, call: &CallInfo) {
    let mut waits = None;
    for p in 0..channels.len() {
        let asked = channels[p].as_mut().and_then(|ch| ch.wait_slot()).is_some_and(|s| std::mem::take(&mut s.asked));
        if !asked {
            continue;
        }
        let waits: &Vec<usize> = waits.get_or_insert_with(|| busy_ranks(channels));
        if let Some(slot) = channels[p].as_mut().and_then(|ch| ch.wait_slot()) {
            slot.queue(&reply_frame(call, waits));
        }
    }
}

/// What this rank knows of a rank while it follows the chain.
#[derive(Clone)]
enum Probe {
    Unasked,
    Asked,
    Answered(Vec<usize>),
    End(ChainEnd),
}

/// How the deadline of a call ended.
pub(super) enum Verdict {
    /// The call's transfers completed while this rank was asking.
    Finished,
    /// The chains from each rank waited for.
    Chains(Vec<WaitChain>),
}

/// The call timed out waiting for `waiting_on`: ask along the chains for at most
/// [`window`] (still driving the call, and answering questions), then say how each
/// chain ends. Only an abort of this rank is an error here.
pub(super) fn investigate(
    channels: &mut Channels,
    gates: &mut [usize],
    call: &CallInfo,
    waiting_on: &[usize],
) -> Result<Verdict> {
    let world = channels.len();
    let me = call.ctx.rank;
    let deadline = Instant::now() + window(call.timeout);
    let mut probes = vec![Probe::Unasked; world];
    if let Some(p) = probes.get_mut(me) {
        *p = Probe::Answered(waiting_on.to_vec());
    }
    let mut failed = vec![false; world];
    // Unasked: a rank that waits for this one may be unable to ask it.
    let word = reply_frame(call, waiting_on);
    for slot in channels.iter_mut().flatten().filter_map(|ch| ch.wait_slot()) {
        slot.queue(&word);
    }
    loop {
        if call.flags.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Aborted { rank: me, call: Some(call.sig) });
        }
        ask_reachable(channels, call, &mut probes, &failed);
        let mut pending = false;
        for (peer, ch) in channels.iter_mut().enumerate() {
            let Some(ch) = ch.as_mut().filter(|_| !failed[peer]) else { continue };
            match ch.progress(peer, gates, call) {
                Ok(_) => pending |= ch.busy(),
                Err(e) => {
                    failed[peer] = true;
                    if matches!(probes[peer], Probe::Unasked | Probe::Asked) {
                        probes[peer] = Probe::End(ChainEnd::Left(why_left(&e)));
                    }
                }
            }
        }
        if !pending && !failed.contains(&true) {
            forget_questions(channels);
            return Ok(Verdict::Finished);
        }
        answer_queries(channels, call);
        take_replies(channels, world, &mut probes);
        let asking = probes.iter().any(|p| matches!(p, Probe::Asked));
        if (!asking && !has_unasked(&probes)) || Instant::now() >= deadline {
            break;
        }
        if !block_on_fds(channels, gates, Duration::from_millis(1)) {
            std::thread::sleep(ASK_POLL);
        }
    }
    for (peer, p) in probes.iter_mut().enumerate() {
        let unsent = channels[peer].as_mut().and_then(|ch| ch.wait_slot()).is_some_and(|s| !s.unsent().is_empty());
        match p {
            Probe::Asked if unsent => {
                *p = Probe::End(ChainEnd::NotAsked("its link did not take the question in time".into()))
            }
            Probe::Asked => *p = Probe::End(ChainEnd::Silent),
            Probe::Unasked => *p = Probe::End(ChainEnd::NotAsked("the time to ask ran out".into())),
            Probe::Answered(_) | Probe::End(_) => {}
        }
    }
    forget_questions(channels);
    Ok(Verdict::Chains(waiting_on.iter().map(|&w| follow(w, me, &probes)).collect()))
}

/// The reason a peer gave for stopping, or what this rank saw of its link.
fn why_left(e: &Error) -> String {
    match e {
        Error::PeerAborted { reason, .. } => reason.clone(),
        Error::PeerLost { detail, .. } => detail.clone(),
        other => other.to_string(),
    }
}

/// Whether a rank some answer names has not been asked yet.
fn has_unasked(probes: &[Probe]) -> bool {
    probes.iter().any(|p| match p {
        Probe::Answered(waits) => waits.iter().any(|&w| matches!(probes[w], Probe::Unasked)),
        _ => false,
    })
}

/// Ask every rank that an answer so far names (each once), over this rank's links.
fn ask_reachable(channels: &mut Channels, call: &CallInfo, probes: &mut [Probe], failed: &[bool]) {
    while has_unasked(probes) {
        let named: Vec<usize> = probes
            .iter()
            .filter_map(|p| if let Probe::Answered(w) = p { Some(w.clone()) } else { None })
            .flatten()
            .filter(|&w| matches!(probes[w], Probe::Unasked))
            .collect();
        for r in named {
            probes[r] = match channels[r].as_mut().map(|ch| (ch.kind(), ch.wait_slot())) {
                None => Probe::End(ChainEnd::NotAsked("this rank has no link to it".into())),
                Some((kind, None)) => {
                    Probe::End(ChainEnd::NotAsked(format!("its {kind} link cannot carry the question")))
                }
                Some(_) if failed[r] => Probe::End(ChainEnd::NotAsked("its link failed".into())),
                Some((_, Some(slot))) => {
                    slot.awaiting = true;
                    // A rank that already said whom it waits for need not be asked.
                    if slot.reply.is_none() {
                        slot.queue(&query_frame(call));
                    }
                    Probe::Asked
                }
            };
        }
    }
}

/// Take the replies (and departures) of the ranks asked, checking each reply.
fn take_replies(channels: &mut Channels, world: usize, probes: &mut [Probe]) {
    for (peer, p) in probes.iter_mut().enumerate() {
        if !matches!(p, Probe::Asked) {
            continue;
        }
        let Some(slot) = channels[peer].as_mut().and_then(|ch| ch.wait_slot()) else { continue };
        if let Some(reply) = slot.reply.take() {
            *p = match reply.waits.iter().find(|&&r| r as usize >= world) {
                Some(bad) => {
                    Probe::End(ChainEnd::Invalid(format!("it named rank {bad} in a communicator of {world} ranks")))
                }
                None => {
                    let mut waits: Vec<usize> =
                        reply.waits.iter().map(|&r| r as usize).filter(|&r| r != peer).collect();
                    waits.sort_unstable();
                    waits.dedup();
                    if waits.is_empty() {
                        Probe::End(ChainEnd::WaitsForNobody)
                    } else {
                        Probe::Answered(waits)
                    }
                }
            };
        } else if let Some(why) = slot.gone.take() {
            *p = Probe::End(ChainEnd::Left(why));
        }
    }
}

/// The exchange is over: later replies are dropped, questions not yet written are not sent.
fn forget_questions(channels: &mut Channels) {
    for ch in channels.iter_mut().flatten() {
        if let Some(slot) = ch.wait_slot() {
            slot.awaiting = false;
            if !slot.mid_frame() {
                slot.drop_unsent();
            }
        }
    }
}

/// The chain from `start`, as rank `me` sees it: the shortest path of answers to a
/// rank that ends it (one that did not answer, left, could not be asked, or waits
/// for nobody); else the nearest rank that waits for `me` (its chain goes on
/// through `me`'s own waits, which the other chains describe); else the ranks
/// wait for each other and the chain ends where it closes.
fn follow(start: usize, me: usize, probes: &[Probe]) -> WaitChain {
    let mut parent = vec![usize::MAX; probes.len()];
    parent[start] = start;
    let mut waits_for_me = None;
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(r) = queue.pop_front() {
        let waits = match &probes[r] {
            Probe::Answered(waits) => waits,
            Probe::End(end) => return WaitChain { ranks: path_to(r, &parent), end: end.clone() },
            Probe::Unasked | Probe::Asked => return WaitChain { ranks: path_to(r, &parent), end: ChainEnd::Silent },
        };
        for &w in waits {
            if w == me {
                waits_for_me = waits_for_me.or(Some(r));
            } else if parent[w] == usize::MAX {
                parent[w] = r;
                queue.push_back(w);
            }
        }
    }
    if let Some(r) = waits_for_me {
        return WaitChain { ranks: path_to(r, &parent), end: ChainEnd::WaitsForThisRank };
    }
    // Every rank reached answered and waits for another: walk to where it closes.
    let mut ranks = vec![start];
    while let Probe::Answered(waits) = &probes[ranks[ranks.len() - 1]] {
        match waits.iter().find(|&&w| w != me) {
            Some(&next) if ranks.contains(&next) => return WaitChain { ranks, end: ChainEnd::Cycle(next) },
            Some(&next) if ranks.len() < probes.len() => ranks.push(next),
            _ => break,
        }
    }
    let last = ranks[ranks.len() - 1];
    WaitChain { ranks, end: ChainEnd::Cycle(last) }
}

/// The ranks from the start of the search to `r`, following `parent` links.
fn path_to(mut r: usize, parent: &[usize]) -> Vec<usize> {
    let mut path = vec![r];
    while parent[r] != r && path.len() <= parent.len() {
        r = parent[r];
        path.push(r);
    }
    path.reverse();
    path
}

#[cfg(test)]
#[path = "wait_chain_tests.rs"]
mod tests;
