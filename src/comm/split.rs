//! Sub-communicators: `split` by color, ordered by key (NCCL's `ncclCommSplit`,
//! MPI's `MPI_Comm_split`), `dup` (the same ranks again, `MPI_Comm_dup`) and
//! `new_group` from a rank list (torch's `new_group`).
//!
//! For a split the parent all-gathers every rank's (color, key) through its own
//! collectives; ranks of one color form a group, ranked by (key, parent rank). A
//! dup needs no exchange: every rank is its own rank again. A group from a list is
//! formed by the listed ranks alone, ranked in list order. A child built over a
//! store connects under `{parent prefix}/{name}` (`split{n}/c{color}`, `dup{n}`,
//! `group{list}/{k}`) with its own claims, nonce, id and links; a child of threads
//! (`Communicator::in_process`) gets its own in-memory links. Either way the child
//! is independent of its parent and its siblings: all may run calls at the same time.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::builder::connect;
use super::origin::{fnv32, InProcGroup, Origin};
use super::Communicator;
use crate::error::{Error, Result};
use crate::executor::WaitPolicy;
use crate::transport::loopback::LoopbackLink;
use crate::transport::Link;

impl InProcGroup {
    /// Rank `rank` of the `world`-rank sub-group `name`.
    pub(super) fn join(&self, name: &str, rank: usize, world: usize) -> Result<Communicator> {
        let (group, row) = {
            let mut forming = self.forming.lock().unwrap_or_else(|e| e.into_inner());
            let (group, rows) = forming.entry(name.to_string()).or_insert_with(|| {
                let prefix = format!("{}/{name}", self.prefix);
                let group = Arc::new(InProcGroup::new(prefix, self.nonce, self.cfg.clone(), self.store.clone()));
                (group, LoopbackLink::mesh(world).into_iter().map(Some).collect())
            });
            let row = match rows.get_mut(rank).and_then(Option::take) {
                Some(row) if rows.len() == world => row,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "in-process split {name}: rank {rank} of {world} does not fit the group being formed"
                    )))
                }
            };
            let group = group.clone();
            if rows.iter().all(Option::is_none) {
                forming.remove(name);
            }
            (group, row)
        };
        let links = row.into_iter().map(|l| l.map(|l| Box::new(l) as Box<dyn Link>)).collect();
        let mut cfg = group.cfg.clone();
        cfg.rank = rank;
        cfg.world_size = world;
        let wait = WaitPolicy::for_ranks(world).with_spin(cfg.tuning.spin);
        let mut comm = Communicator::from_links(rank, world, links, group.id(), &cfg, wait);
        comm.serve_metrics(&cfg)?;
        comm.origin = Origin::InProcess(group);
        Ok(comm)
    }
}

/// Sentinel of "no color" in the all-gathered table.
const NO_COLOR: i64 = -1;

impl Communicator {
    /// Split this communicator (collective: every rank calls it, in the same
    /// order relative to its other calls). Ranks passing the same `color` form a
    /// new communicator, ranked by `(key, rank in this communicator)`; `None`
    /// (MPI's `MPI_UNDEFINED`) joins no group and returns `Ok(None)`.
    ///
    /// The new communicator has its own id and links and may be used at the same
    /// time as this one and as its siblings. Needs a communicator built from a
    /// store or with [`Communicator::in_process`]; one made over hand-connected
    /// links (inside the crate, for tests) cannot be split.
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Communicator>> {
        let (rank, world) = (self.rank(), self.world_size());
        self.can_have_children("split")?;
        // Counted on every rank in the same order, since split is collective.
        let n = self.splits.fetch_add(1, Ordering::Relaxed);
        let mine = [color.map_or(NO_COLOR, i64::from), i64::from(key)];
        let mut table = vec![0i64; 2 * world];
        self.all_gather(&mine, &mut table)?;
        let Some(color) = color else { return Ok(None) };
        let mut members = Vec::new();
        for (r, entry) in table.chunks_exact(2).enumerate() {
            let (c, k) = (entry[0], entry[1]);
            // Peers' entries arrive over links: check them before trusting them.
            let valid = (c == NO_COLOR || u32::try_from(c).is_ok()) && u32::try_from(k).is_ok();
            if !valid {
                return Err(Error::Protocol {
                    ctx: crate::error::OpContext { rank, call: None, seq: n },
                    peer: r,
                    detail: format!("split entry (color {c}, key {k}) is not a u32 pair"),
                });
            }
            if c == i64::from(color) {
                members.push((k, r));
            }
        }
        members.sort_unstable();
        let new_rank = members.iter().position(|&(_, r)| r == rank).ok_or_else(|| {
            Error::InvalidArgument(format!("rank {rank}: split all-gather lost this rank's own color {color}"))
        })?;
        let sub_world = members.len();
        let name = format!("split{n}/c{color}");
        tracing::debug!(rank, color, key, new_rank, sub_world, name, "split");
        self.child(&name, new_rank, sub_world).map(Some)
    }

    /// A second communicator over the same ranks, each keeping its rank (MPI's
    /// `MPI_Comm_dup`): for a second stream of collectives beside this one, such as
    /// a [`crate::fusion::Fuser`] beside a training loop. Collective: every rank
    /// calls it, in the same order relative to its other `split`s and `dup`s of
    /// this communicator.
    ///
    /// The new communicator has its own id, links and call order, the settings
    /// this one was built with, and may be used at the same time as this one.
    /// Needs a communicator built from a store or with [`Communicator::in_process`].
    pub fn dup(&self) -> Result<Communicator> {
        self.can_have_children("dup")?;
        let n = self.splits.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(rank = self.rank(), n, "dup");
        self.child(&format!("dup{n}"), self.rank(), self.world_size())
    }

    /// A communicator of the ranks in `ranks` (torch's `new_group`), formed by those
    /// ranks alone: each of them calls `new_group` with the same list, and ranks not
    /// listed do not call it (they may run anything meanwhile, this communicator's
    /// collectives excepted, which need every rank). Rank `ranks[i]` of this
    /// communicator is rank `i` of the new one, so the list need not be sorted.
    ///
    /// Refused with [`Error::InvalidArgument`]: an empty list, a rank listed twice,
    /// a rank outside this communicator, and a call by a rank not in the list.
    /// The members must call `new_group` with equal lists in the same order
    /// relative to each other; members that pass different lists do not meet and
    /// fail at the communicator's timeout. The new communicator is independent of
    /// this one, as a split's is.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Communicator> {
        let (rank, world) = (self.rank(), self.world_size());
        let refuse = |why: String| Err(Error::InvalidArgument(format!("rank {rank}: new_group({ranks:?}): {why}")));
        if ranks.is_empty() {
            return refuse("the list of ranks is empty".into());
        }
        let mut listed = vec![false; world];
        for &r in ranks {
            match listed.get_mut(r) {
                None => return refuse(format!("rank {r} is not a rank of this {world}-rank communicator")),
                Some(true) => return refuse(format!("rank {r} is listed twice")),
                Some(seen) => *seen = true,
            }
        }
        let Some(new_rank) = ranks.iter().position(|&r| r == rank) else {
            return refuse("this rank is not listed: only the listed ranks call new_group".into());
        };
        self.can_have_children("new_group")?;
        // Counted per list, by the listed ranks only: other ranks' counts of splits
        // and of other lists stay in step whatever groups they are not part of.
        let k = {
            let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            let count = groups.entry(ranks.to_vec()).or_insert(0);
            *count += 1;
            *count - 1
        };
        let name = format!("group{}/{k}", list_name(ranks));
        tracing::debug!(rank, new_rank, sub_world = ranks.len(), name, "new_group");
        self.child(&name, new_rank, ranks.len())
    }

    /// Refuse making children of a communicator that cannot have them.
    fn can_have_children(&self, what: &str) -> Result<()> {
        let rank = self.rank();
        if self.is_aborted() {
            return Err(Error::Aborted { rank, call: None });
        }
        if matches!(self.origin, Origin::Links) {
            return Err(Error::Unsupported(format!(
                "rank {rank}: {what} needs a communicator built from a store or in_process, not from_links"
            )));
        }
        Ok(())
    }

    /// Rank `new_rank` of the `sub_world`-rank child `name` (under this
    /// communicator's namespace), formed with the other ranks that join `name`.
    pub(super) fn child(&self, name: &str, new_rank: usize, sub_world: usize) -> Result<Communicator> {
        self.child_probing(name, new_rank, sub_world, true)
    }

    /// [`Communicator::child`]; without `probe`, a store-built child skips the
    /// tuner's start-up probe (its caller installs a model instead).
    pub(super) fn child_probing(
        &self,
        name: &str,
        new_rank: usize,
        sub_world: usize,
        probe: bool,
    ) -> Result<Communicator> {
        match &self.origin {
            Origin::Store(o) => {
                let mut cfg = o.cfg.clone();
                cfg.rank = new_rank;
                cfg.world_size = sub_world;
                cfg.tuner_probe &= probe;
                // A fault plan names ranks and links of the parent, not of its children.
                cfg.fault = None;
                connect(cfg, o.store.clone(), format!("{}/{name}", o.prefix), o.label.clone())
            }
            Origin::InProcess(group) => group.join(name, new_rank, sub_world),
            Origin::Links => {
                Err(Error::Unsupported(format!("rank {}: {name} of a from_links communicator", self.rank())))
            }
        }
    }
}

/// A rank list as a store-key component: the ranks themselves while short, their
/// number and a hash of them beyond.
pub(super) fn list_name(ranks: &[usize]) -> String {
    let text = ranks.iter().map(usize::to_string).collect::<Vec<_>>().join(".");
    if text.len() <= 64 {
        return text;
    }
    let bytes: Vec<u8> = ranks.iter().flat_map(|&r| (r as u64).to_le_bytes()).collect();
    format!("{}x{:08x}", ranks.len(), fnv32(&[&bytes]))
}
