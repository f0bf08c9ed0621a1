//! Going on without a lost rank: the survivors agree on who is alive
//! ([`Communicator::agree`], ULFM's `MPIX_Comm_agree`) and form a communicator of
//! themselves ([`Communicator::shrink`], `MPIX_Comm_shrink`, NCCL's `ncclCommShrink`).
//!
//! A failed call closes every link of its communicator (each peer is told why), so
//! the agreement cannot run over the links: it runs through the store the
//! communicator was built from (or, for threads, an in-memory one), whose
//! `set_if_absent` orders concurrent proposals. Agreement `k` of a communicator:
//!
//! 1. each rank posts `present/{rank}` (the collectives it completed) and, for
//!    each peer whose link ended under a call, `dead/{peer}`;
//! 2. it polls until every rank is present, has been reported dead, or the
//!    communicator's timeout passed, then proposes the present ranks;
//! 3. the first proposal stored under `decision` is everyone's answer, including
//!    a rank that adopts it before its own polling ended.
//!
//! Ranks that fail while agreeing are either in the decision (they posted
//! `present` first: the shrunk communicator then fails to form, at its timeout, and
//! a second `shrink` leaves them out) or not; every survivor reads the same
//! decision either way, and no wait is longer than the timeout. A rank left out of
//! the decision (it arrived after it) gets an error and must not go on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::origin::Origin;
use super::split::list_name;
use super::Communicator;
use crate::bootstrap::Store;
use crate::error::{Error, OpContext, Result};

/// What the survivors of a failure agreed on ([`Communicator::agree`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agreement {
    /// Which agreement of this communicator it was (0 for the first): names the
    /// communicator [`Communicator::shrink`] forms.
    pub round: u64,
    /// The ranks (of this communicator) that take part in what follows, ascending.
    pub live: Vec<usize>,
    /// Collectives every live rank completed: the first `completed_calls` calls of
    /// this communicator finished everywhere among them; the next one may have
    /// finished on some and failed on others.
    pub completed_calls: u64,
}

/// First pause between polls of the store; doubled up to [`POLL_MAX`].
const POLL_START: Duration = Duration::from_micros(200);
const POLL_MAX: Duration = Duration::from_millis(5);
/// Format tag of a stored decision.
const DECISION_TAG: &str = "v1";

impl Communicator {
    /// Agree with the other live ranks on which ranks are alive and how many
    /// collectives all of them completed (ULFM's `MPIX_Comm_agree`). Collective over
    /// the survivors: after a failure (a call returned [`Error::PeerLost`],
    /// [`Error::PeerAborted`], [`Error::Timeout`], ...), every surviving rank calls
    /// it, and all get the same [`Agreement`]. It can be called on a healthy
    /// communicator too (every rank must), and then lists every rank.
    ///
    /// It runs through the store this communicator was built from (which must
    /// support [`Store::set_if_absent`], as braid's `tcp://` and `file://` stores
    /// do) or, for [`Communicator::in_process`] threads, an in-memory one; not over
    /// the links, which a failure closes. A rank that no one reported dead is
    /// waited for up to the communicator's timeout. A rank that arrives after the
    /// others decided without it gets [`Error::Broken`].
    pub fn agree(&self) -> Result<Agreement> {
        let (store, prefix) = self.agreement_store()?;
        let round = self.agreements.fetch_add(1, Ordering::Relaxed);
        let (completed, lost, timeout) = {
            let e = self.core.shared.lock_engine();
            (e.completed_calls, e.lost_peers.clone(), e.timeout)
        };
        let ns = format!("{prefix}/agree{round}");
        // A rank that died after this one's failure left no evidence then: its
        // link, closed for writing but still held, is looked at again while waiting.
        let gone = |peer: usize| {
            let mut e = self.core.shared.lock_engine();
            e.channels.get_mut(peer).and_then(Option::as_mut).is_some_and(|c| c.peer_gone())
        };
        let agreement = agree_through(
            store.as_ref(),
            &ns,
            Proposer { rank: self.rank(), world: self.world_size(), completed, lost: &lost, round, gone: &gone },
            timeout,
        )?;
        if !agreement.live.contains(&self.rank()) {
            return Err(Error::Broken(format!(
                "rank {}: the survivors' agreement {round} went on without this rank (live ranks {:?})",
                self.rank(),
                agreement.live
            )));
        }
        tracing::info!(rank = self.rank(), round, live = ?agreement.live, completed = agreement.completed_calls, "agreed");
        Ok(agreement)
    }

    /// A communicator of the ranks still alive after a failure (ULFM's
    /// `MPIX_Comm_shrink`, NCCL's `ncclCommShrink`): the survivors [`agree`] on who
    /// they are, then connect anew, ranked in the order of their ranks here. Every
    /// survivor calls it; this communicator stays broken.
    ///
    /// The new communicator has its own id, so frames of this one are refused on
    /// it, the settings this one was built with, and the link costs this one's
    /// tuner measured (no start-up probe). Its links are new: a failure closes all
    /// of a communicator's links, so there are none to keep. If a survivor dies while it
    /// forms, forming fails at the timeout; calling `shrink` again (on this
    /// communicator) leaves that rank out too.
    ///
    /// [`agree`]: Communicator::agree
    pub fn shrink(&self) -> Result<Communicator> {
        self.shrink_to(&self.agree()?)
    }

    /// The communicator of the ranks `agreement` lists (what [`Communicator::shrink`]
    /// does after agreeing), for a caller that wants the agreement itself too, such
    /// as the count of completed calls. Every listed rank calls it with the same
    /// agreement.
    pub fn shrink_to(&self, agreement: &Agreement) -> Result<Communicator> {
        let new_rank = agreement.live.iter().position(|&r| r == self.rank()).ok_or_else(|| {
            Error::Broken(format!("rank {}: not among the agreed live ranks {:?}", self.rank(), agreement.live))
        })?;
        let name = format!("shrink{}/{}", agreement.round, list_name(&agreement.live));
        tracing::info!(rank = self.rank(), new_rank, world = agreement.live.len(), name, "shrink");
        // The links' costs were measured when this communicator formed and have not
        // changed: the survivors keep them instead of probing again (seconds).
        let (tuner, _, _) = self.tuner();
        let child = self.child_probing(&name, new_rank, agreement.live.len(), false)?;
        super::builder::install_model(&child, tuner.model, tuner.source);
        Ok(child)
    }

    /// The store the agreement runs through and its namespace for this communicator.
    fn agreement_store(&self) -> Result<(Arc<dyn Store>, String)> {
        match &self.origin {
            Origin::Store(o) => Ok((o.store.clone(), o.prefix.clone())),
            Origin::InProcess(group) => Ok((group.store.clone() as Arc<dyn Store>, group.prefix().to_owned())),
            Origin::Links => Err(Error::Unsupported(format!(
                "rank {}: agreeing needs a communicator built from a store or in_process, not from_links",
                self.rank()
            ))),
        }
    }
}

/// One rank's side of an agreement.
struct Proposer<'a> {
    rank: usize,
    world: usize,
    completed: u64,
    /// Peers this rank saw vanish.
    lost: &'a [usize],
    round: u64,
    /// Whether this rank's link shows a peer gone now.
    gone: &'a dyn Fn(usize) -> bool,
}

/// Run agreement `p.round` under the store keys `ns/…` (see the module docs).
fn agree_through(store: &dyn Store, ns: &str, p: Proposer<'_>, timeout: Duration) -> Result<Agreement> {
    let deadline = Instant::now() + timeout;
    let decision_key = format!("{ns}/decision");
    store.set(&format!("{ns}/present/{}", p.rank), p.completed.to_string().as_bytes())?;
    for &peer in p.lost {
        store.set(&format!("{ns}/dead/{peer}"), p.rank.to_string().as_bytes())?;
    }
    let mut pause = POLL_START;
    loop {
        if let Some(held) = store.get(&decision_key)? {
            return parse_decision(&held, p.round, p.world, p.rank);
        }
        let expired = Instant::now() >= deadline;
        let mut present = Vec::with_capacity(p.world);
        let mut waiting = false;
        for r in 0..p.world {
            if r == p.rank {
                present.push((r, p.completed));
                continue;
            }
            match store.get(&format!("{ns}/present/{r}"))? {
                Some(v) => present.push((r, parse_count(&v, r, p.rank, p.round)?)),
                None if expired => {}
                None => {
                    let dead_key = format!("{ns}/dead/{r}");
                    if store.get(&dead_key)?.is_some() {
                        continue;
                    }
                    if (p.gone)(r) {
                        store.set(&dead_key, p.rank.to_string().as_bytes())?;
                        continue;
                    }
                    waiting = true;
                }
            }
        }
        if !waiting {
            let live: Vec<usize> = present.iter().map(|&(r, _)| r).collect();
            let completed = present.iter().map(|&(_, c)| c).min().unwrap_or(p.completed);
            let proposal = encode_decision(&live, completed);
            let held = store.set_if_absent(&decision_key, proposal.as_bytes())?;
            return parse_decision(&held, p.round, p.world, p.rank);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(POLL_MAX);
    }
}

fn encode_decision(live: &[usize], completed: u64) -> String {
    let ranks: Vec<String> = live.iter().map(usize::to_string).collect();
    format!("{DECISION_TAG};{completed};{}", ranks.join(","))
}

/// A decision read from the store, which any process with the store's key can
/// write: checked before a rank trusts it.
fn parse_decision(bytes: &[u8], round: u64, world: usize, rank: usize) -> Result<Agreement> {
    let bad = |why: &str| {
        Error::Store(format!(
            "rank {rank}: agreement {round}: the stored decision {:?} is not valid: {why}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ))
    };
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
    let mut parts = text.splitn(3, ';');
    if parts.next() != Some(DECISION_TAG) {
        return Err(bad("unknown format"));
    }
    let completed = parts.next().and_then(|c| c.parse::<u64>().ok()).ok_or_else(|| bad("no call count"))?;
    let list = parts.next().ok_or_else(|| bad("no ranks"))?;
    let mut live = Vec::new();
    for r in list.split(',') {
        let r: usize = r.parse().map_err(|_| bad("a rank is not a number"))?;
        if r >= world || live.last().is_some_and(|&prev| prev >= r) {
            return Err(bad("ranks out of range or not ascending"));
        }
        live.push(r);
    }
    Ok(Agreement { round, live, completed_calls: completed })
}

/// A peer's posted count of completed calls.
fn parse_count(bytes: &[u8], peer: usize, rank: usize, round: u64) -> Result<u64> {
    std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()).ok_or_else(|| Error::Protocol {
        ctx: OpContext { rank, call: None, seq: round },
        peer,
        detail: format!("agreement {round}: its count of completed calls {bytes:?} is not a number"),
    })
}

#[cfg(test)]
#[path = "shrink_tests.rs"]
mod tests;
