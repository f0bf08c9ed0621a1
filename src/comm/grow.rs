//! Taking new processes into a running communicator (issue 38): a process that
//! was started to replace a lost one (a launcher's restart: torchrun's
//! `--max-restarts`, Slurm's requeue, a Kubernetes Job) calls
//! [`Communicator::join`] and waits; the members, at a call boundary of their
//! choosing, see it waiting ([`Communicator::pending_joiners`]) and call
//! [`Communicator::grow`] together. Both sides then connect as one communicator:
//! the members keep their ranks, the joiners take the ranks after them in the
//! order they arrived.
//!
//! It runs through the job's store, under `braid-join/{name}/`:
//! - a joiner takes a ticket: `add("waiting", 1)`, its ticket is the count before;
//! - rank 0 of the members, growing by `k`, seats tickets `admitted..admitted + k`
//!   (`seat/{ticket}` = the new communicator's namespace, rank and world) and then
//!   moves `admitted` on; the joiner reads its seat and connects there;
//! - when the job ends, a member sets `closed`: joiners still waiting (a launcher
//!   may restart a worker just before the end) fail at once with
//!   [`Error::JoinClosed`] instead of waiting out their timeout.
//!
//! Every wait is bounded by the timeout; a seat read from the store is checked
//! before it is used.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::builder::connect;
use super::origin::Origin;
use super::Communicator;
use crate::bootstrap::Store;
use crate::config::Config;
use crate::error::{Error, Result};

/// The most processes one grow takes in, and the most a store may say wait. More
/// than any launcher restarts at once; the count is written by whoever holds the
/// job key, and a forged one must not make rank 0 write seats without end.
pub(crate) const MAX_JOINERS: usize = 4096;

/// Keys of joining under `name`.
fn key(name: &str, what: &str) -> String {
    format!("braid-join/{name}/{what}")
}

/// An integer counter of the store (absent: 0).
fn counter(store: &dyn Store, key: &str) -> Result<u64> {
    match store.get(key)? {
        None => Ok(0),
        Some(v) => std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| Error::Store(format!("key `{key}` does not hold a count"))),
    }
}

/// How often a waiting joiner looks for its seat and for the job closing.
const SEAT_POLL: Duration = Duration::from_millis(25);

/// Wait up to `wait` for ticket `ticket`'s seat under `name`. A seat given before
/// the job closed joining is still taken.
fn wait_for_seat(store: &dyn Store, name: &str, ticket: u64, wait: Duration) -> Result<Vec<u8>> {
    let deadline = std::time::Instant::now() + wait;
    let seat = key(name, &format!("seat/{ticket}"));
    loop {
        if let Some(v) = store.get(&seat)? {
            return Ok(v);
        }
        if store.get(&key(name, "closed"))?.is_some() {
            // The members seat before they close: look once more.
            return store.get(&seat)?.ok_or_else(|| Error::JoinClosed { name: name.to_owned(), ticket });
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(Error::Store(format!(
                "joining `{name}` as ticket {ticket}: no member took this process in within {wait:?}"
            )));
        }
        std::thread::sleep(left.min(SEAT_POLL));
    }
}

/// Where a joiner goes: the new communicator's namespace, its rank, its world,
/// and whether that communicator runs the tuner's start-up probe (all its ranks
/// must, or none).
#[derive(Debug, PartialEq, Eq)]
struct Seat {
    prefix: String,
    rank: usize,
    world: usize,
    probe: bool,
}

impl Seat {
    fn encode(&self) -> String {
        format!("v1\n{}\n{}\n{}\n{}", self.rank, self.world, u8::from(self.probe), self.prefix)
    }

    /// A seat as read from the store, which anyone holding the job key can write.
    fn parse(bytes: &[u8]) -> Result<Seat> {
        let bad = |why: &str| Error::Store(format!("a joiner's seat is not valid: {why}"));
        let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
        let mut lines = text.splitn(5, '\n');
        if lines.next() != Some("v1") {
            return Err(bad("unknown format"));
        }
        let mut num = |what: &str| -> Result<usize> {
            lines.next().and_then(|l| l.parse().ok()).ok_or_else(|| bad(&format!("no {what}")))
        };
        let (rank, world, probe) = (num("rank")?, num("world")?, num("probe flag")?);
        let prefix = lines.next().filter(|p| p.starts_with("braid/")).ok_or_else(|| bad("no namespace"))?;
        if rank >= world || probe > 1 {
            return Err(bad("rank outside the world"));
        }
        Ok(Seat { prefix: prefix.to_owned(), rank, world, probe: probe == 1 })
    }
}

impl Communicator {
    /// Join a running job as a new rank (the joiner's side of
    /// [`Communicator::grow`]): wait in `store` under `name` until the members grow
    /// to take this process in, then connect with them. `cfg` gives the settings
    /// (timeout, transports, job key); its rank and world are replaced by the seat
    /// the members give. Fails after `wait` if no member takes it in, and at
    /// once with [`Error::JoinClosed`] if the job closes joining first.
    pub fn join(store: Arc<dyn Store>, name: &str, cfg: Config, wait: Duration) -> Result<Communicator> {
        let count = store.add(&key(name, "waiting"), 1)?;
        let ticket = u64::try_from(count - 1).map_err(|_| {
            Error::Store(format!("joining `{name}`: the store counts {count} waiting after adding this one"))
        })?;
        tracing::info!(name, ticket, "joining: waiting to be seated");
        let seat = Seat::parse(&wait_for_seat(store.as_ref(), name, ticket, wait)?)?;
        let mut cfg = cfg;
        cfg.rank = seat.rank;
        cfg.world_size = seat.world;
        cfg.tuner_probe = seat.probe;
        cfg.fault = None;
        tracing::info!(name, ticket, rank = seat.rank, world = seat.world, "joining: seated");
        connect(cfg, store, seat.prefix, format!("the store joined as `{name}`"))
    }

    /// [`Communicator::join`] with the settings and store of the environment
    /// (`BRAID_STORE`, `BRAID_JOB_KEY`, `BRAID_TIMEOUT`, ...; a launcher's rank and
    /// world, if any, are ignored), waiting up to the timeout.
    pub fn join_from_env(name: &str) -> Result<Communicator> {
        let cfg = Config::from_env()?;
        let url = cfg.store.clone().ok_or_else(|| Error::Config("joining needs a store: set BRAID_STORE".into()))?;
        let store = crate::bootstrap::connect_store(&url, false, 1, cfg.job_key.clone(), cfg.timeout)?;
        let wait = cfg.timeout;
        Communicator::join(store, name, cfg, wait)
    }

    /// Take no more joiners under `name`: processes waiting in
    /// [`Communicator::join`] there, and any that come later, fail at once with
    /// [`Error::JoinClosed`] instead of waiting out their timeout. Call it when the
    /// job ends (a launcher may restart a worker just before); any rank may, and
    /// more than once.
    pub fn close_joining(&self, name: &str) -> Result<()> {
        self.join_store()?.set(&key(name, "closed"), b"1")
    }

    /// Processes waiting in [`Communicator::join`] under `name` and not yet taken
    /// in. One store read; not collective (each rank reads the store at its own
    /// time, so give every member rank 0's count, as the elastic strategy does, before they
    /// [`grow`](Communicator::grow)).
    pub fn pending_joiners(&self, name: &str) -> Result<usize> {
        let store = self.join_store()?;
        let waiting = counter(store.as_ref(), &key(name, "waiting"))?;
        let admitted = counter(store.as_ref(), &key(name, "admitted"))?;
        let pending = waiting.saturating_sub(admitted);
        if pending > MAX_JOINERS as u64 {
            return Err(Error::Store(format!(
                "rank {}: the store says {pending} processes wait to join `{name}` ({waiting} waiting, {admitted} \
                 admitted), more than the {MAX_JOINERS} one grow takes in; the count looks forged",
                self.rank()
            )));
        }
        Ok(pending as usize)
    }

    /// Take `joiners` processes waiting under `name` into a new communicator
    /// with this one's ranks first (the members' side of [`Communicator::join`]).
    /// Collective over this communicator: every rank calls it with the same
    /// `joiners`, in the same order relative to its other calls. Needs a
    /// communicator built from a store (the joiners meet there).
    pub fn grow(&self, name: &str, joiners: usize) -> Result<Communicator> {
        let Origin::Store(o) = &self.origin else {
            return Err(Error::Unsupported(format!(
                "rank {}: grow needs a communicator built from a store, which joiners can reach",
                self.rank()
            )));
        };
        let (rank, world) = (self.rank(), self.world_size());
        if joiners > MAX_JOINERS {
            return Err(Error::InvalidArgument(format!(
                "rank {rank}: grow by {joiners} processes: at most {MAX_JOINERS} join at once"
            )));
        }
        let n = self.splits.fetch_add(1, Ordering::Relaxed);
        let child = format!("grow{n}");
        let total = world + joiners;
        if rank == 0 && joiners > 0 {
            let admitted = counter(o.store.as_ref(), &key(name, "admitted"))?;
            for j in 0..joiners as u64 {
                let seat = Seat {
                    prefix: format!("{}/{child}", o.prefix),
                    rank: world + j as usize,
                    world: total,
                    probe: o.cfg.tuner_probe,
                };
                o.store.set(&key(name, &format!("seat/{}", admitted + j)), seat.encode().as_bytes())?;
            }
            o.store.set(&key(name, "admitted"), (admitted + joiners as u64).to_string().as_bytes())?;
        }
        tracing::info!(rank, world, joiners, child, "grow");
        self.child(&child, rank, total)
    }

    /// The raw store joiners meet in.
    fn join_store(&self) -> Result<Arc<dyn Store>> {
        match &self.origin {
            Origin::Store(o) => Ok(o.store.clone()),
            _ => Err(Error::Unsupported(format!(
                "rank {}: joining needs a communicator built from a store",
                self.rank()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::MemStore;
    use crate::ReduceOp;

    #[test]
    fn seats_round_trip_and_forged_ones_are_refused() {
        let s = Seat { prefix: "braid/comm0/grow1".into(), rank: 3, world: 4, probe: true };
        assert_eq!(Seat::parse(s.encode().as_bytes()).unwrap(), s);
        for bad in
            ["v1\n4\n4\n1\nbraid/x", "v1\n1\n4\n2\nbraid/x", "v1\n1\n4\n1\n/etc", "v2\n1\n4\n1\nbraid/x", "v1\n1"]
        {
            assert!(Seat::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    /// A store writer that inflates the waiting count gets an error, not seats
    /// written without end; a grow past the cap is refused before any seat is.
    #[test]
    fn a_forged_waiting_count_is_refused() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let mut cfg = Config::new(0, 1);
        cfg.tuner_probe = false;
        let c = crate::CommunicatorBuilder::from_config(cfg).store(store.clone()).build().unwrap();
        store.set(&key("job", "waiting"), (MAX_JOINERS as u64 + 1).to_string().as_bytes()).unwrap();
        let e = c.pending_joiners("job").unwrap_err().to_string();
        assert!(e.contains("looks forged") && e.contains("rank 0"), "{e}");
        store.set(&key("job", "waiting"), MAX_JOINERS.to_string().as_bytes()).unwrap();
        assert_eq!(c.pending_joiners("job").unwrap(), MAX_JOINERS);
        let e = c.grow("job", MAX_JOINERS + 1).err().expect("refused").to_string();
        assert!(e.contains("at most 4096"), "{e}");
        assert!(store.get(&key("job", "seat/0")).unwrap().is_none());
    }

    /// A joiner waiting when the job closes joining fails at once, naming its
    /// ticket; one arriving later too.
    #[test]
    fn joiners_of_a_closed_job_fail_at_once() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let mut cfg = Config::new(0, 1);
        cfg.tuner_probe = false;
        let c = crate::CommunicatorBuilder::from_config(cfg.clone()).store(store.clone()).build().unwrap();
        let waiting = {
            let (store, cfg) = (store.clone(), cfg.clone());
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                (Communicator::join(store, "job", cfg, Duration::from_secs(30)).err(), t.elapsed())
            })
        };
        while c.pending_joiners("job").unwrap() == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        c.close_joining("job").unwrap();
        let (e, took) = waiting.join().unwrap();
        let e = e.expect("not taken in");
        assert!(matches!(e, Error::JoinClosed { ticket: 0, .. }), "{e}");
        assert!(e.to_string().contains("joining `job` as ticket 0: the job closed joining"), "{e}");
        assert!(took < Duration::from_secs(15), "waited {took:?}");
        let late = Communicator::join(store, "job", cfg, Duration::from_secs(30)).err().expect("closed");
        assert!(matches!(late, Error::JoinClosed { ticket: 1, .. }), "{late}");
    }

    /// Three members over TCP; two processes (threads here) join; the five sum
    /// exactly with the members first and the joiners in ticket order.
    #[test]
    fn members_grow_and_joiners_take_the_ranks_after_them() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let mut cfg = Config::new(0, 3);
        cfg.timeout = Duration::from_secs(20);
        cfg.tuner_probe = false;
        let joiners: Vec<_> = (0..2)
            .map(|j| {
                let (store, cfg) = (store.clone(), cfg.clone());
                std::thread::spawn(move || {
                    // Tickets in order: the second joiner arrives after the first.
                    std::thread::sleep(Duration::from_millis(100 * j));
                    let c = Communicator::join(store, "job", cfg, Duration::from_secs(20)).unwrap();
                    let mut v = vec![c.rank() as i64 + 1; 77];
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    (c.rank(), c.world_size(), v[0])
                })
            })
            .collect();
        let members: Vec<_> = (0..3)
            .map(|rank| {
                let store = store.clone();
                let mut cfg = cfg.clone();
                cfg.rank = rank;
                std::thread::spawn(move || {
                    let c = crate::CommunicatorBuilder::from_config(cfg).store(store).build().unwrap();
                    // Rank 0 decides when both are waiting and tells the others.
                    let mut pending = [0i64];
                    while pending[0] < 2 {
                        pending[0] = if c.rank() == 0 { c.pending_joiners("job").unwrap() as i64 } else { 0 };
                        c.broadcast(&mut pending, 0).unwrap();
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let big = c.grow("job", 2).unwrap();
                    let mut v = vec![big.rank() as i64 + 1; 77];
                    big.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    assert_eq!(c.pending_joiners("job").unwrap(), 0);
                    (big.rank(), big.world_size(), v[0])
                })
            })
            .collect();
        let mut seen: Vec<_> = members.into_iter().chain(joiners).map(|t| t.join().unwrap()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..5).map(|r| (r, 5, 15)).collect::<Vec<_>>());
    }
}
