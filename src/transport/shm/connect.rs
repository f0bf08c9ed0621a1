//! Linking this rank with its shared-memory peers: create a segment for each
//! higher peer, attach to each lower one's, until all are ready or the deadline.

use std::time::{Duration, Instant};

use super::cma::{self, PeerProc};
use super::segment::MAX_RING_BYTES;
use super::setup::{attach, attach_published, create, file_key, need_file_key, setup_ctx, Attached, Setup};
use super::{segment_key, ShmLink, ShmOptions, LIVENESS_INTERVAL};
use crate::bootstrap::Store;
use crate::error::{Error, Result};

/// Connect this rank by shared memory to every rank marked in `opts.peers`.
///
/// Returns one entry per rank: a link for each marked peer, `None` elsewhere
/// (this rank included). The lower rank of each pair creates the segment, so
/// the call never waits on a rank that waits on it. Fails with
/// [`Error::Timeout`] naming the peers that did not finish by `opts.timeout`,
/// [`Error::PeerLost`] when a peer process dies during setup, and
/// [`Error::Io`] naming both ranks when a segment cannot be made or mapped.
pub fn connect_shm(opts: &ShmOptions, store: &dyn Store) -> Result<Vec<Option<ShmLink>>> {
    let (rank, world) = (opts.rank, opts.world);
    if world == 0 || rank >= world {
        return Err(Error::InvalidArgument(format!("rank {rank} is not below world size {world}")));
    }
    if opts.peers.len() != world {
        return Err(Error::InvalidArgument(format!(
            "shm peers mask has {} entries for world size {world}",
            opts.peers.len()
        )));
    }
    if !(1..=MAX_RING_BYTES).contains(&opts.ring_bytes) {
        return Err(Error::InvalidArgument(format!(
            "shm ring size {} is not in 1..={MAX_RING_BYTES}",
            opts.ring_bytes
        )));
    }
    let wanted = |j: usize| j != rank && opts.peers[j];
    let mut links: Vec<Option<ShmLink>> = (0..world).map(|_| None).collect();
    if !(0..world).any(wanted) {
        return Ok(links);
    }
    let deadline = Instant::now() + opts.timeout;

    // Higher peers first: publishing never waits, so no rank waits on one that waits on it.
    let mut setups: Vec<Setup> = Vec::new();
    for b in (rank + 1..world).filter(|&b| wanted(b)) {
        setups.push(create(opts, b, store)?);
    }
    // Lower peers whose segment is still to come: (rank, whether it is the named
    // segment asked for because its memfd could not be opened here).
    let mut lower: Vec<(usize, bool)> = (0..rank).filter(|&a| wanted(a)).map(|a| (a, false)).collect();
    let mut pause = Duration::from_micros(100);
    let mut last_check = Instant::now();
    let mut ptrace_ready = false;
    loop {
        let mut progressed = false;
        let mut i = 0;
        while i < lower.len() {
            let (a, want_file) = lower[i];
            let key =
                if want_file { file_key(&opts.key_prefix, a, rank) } else { segment_key(&opts.key_prefix, a, rank) };
            let Some(published) = store.get(&key)? else {
                i += 1;
                continue;
            };
            progressed = true;
            if want_file {
                setups.push(attach(opts, a, &published)?);
                lower.swap_remove(i);
                continue;
            }
            match attach_published(opts, a, &published, store)? {
                Attached::Done(s) => {
                    setups.push(*s);
                    lower.swap_remove(i);
                }
                Attached::WantsFile => lower[i].1 = true,
            }
        }
        for s in setups.iter_mut() {
            progressed |= s.advance_auth()?;
        }
        // Once every peer proved the key (and so its pid is known), set the ptrace
        // policy for all of them at once (one ptracer per process), then let them probe.
        if !ptrace_ready && lower.is_empty() && setups.iter().all(|s| s.authenticated) {
            if opts.cma {
                let peers: Vec<PeerProc> =
                    setups.iter().map(|s| PeerProc { pid: s.peer_pid, ppid: cma::ppid_of(s.peer_pid) }).collect();
                cma::allow_ptrace_by(&peers);
            }
            setups.iter_mut().for_each(Setup::mark_ready);
            ptrace_ready = true;
            progressed = true;
        }
        for s in setups.iter_mut() {
            progressed |= s.advance_probe();
        }
        if lower.is_empty() && setups.iter().all(Setup::done) {
            break;
        }
        if last_check.elapsed() >= LIVENESS_INTERVAL {
            last_check = Instant::now();
            // Rare (a peer that cannot see our /proc), so looked for only this often.
            for s in setups.iter_mut().filter(|s| s.awaits_attach()) {
                if store.get(&need_file_key(&opts.key_prefix, rank, s.peer))?.is_some() {
                    s.offer_file(opts, store)?;
                }
            }
            for s in setups.iter().filter(|s| !s.done()) {
                if s.watch.as_ref().is_some_and(|w| !w.alive()) {
                    return Err(Error::PeerLost {
                        ctx: setup_ctx(rank),
                        peer: s.peer,
                        detail: "its process exited during shared-memory setup".into(),
                    });
                }
            }
        }
        if Instant::now() >= deadline {
            let mut waiting_on: Vec<usize> = lower.iter().map(|&(a, _)| a).collect();
            waiting_on.extend(setups.iter().filter(|s| !s.done()).map(|s| s.peer));
            waiting_on.sort_unstable();
            return Err(Error::Timeout { ctx: setup_ctx(rank), timeout: opts.timeout, waiting_on, chain: Vec::new() });
        }
        // Short pauses while things move (ranks start together), longer ones for a late rank.
        pause = if progressed { Duration::from_micros(100) } else { (pause * 2).min(Duration::from_millis(10)) };
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
    }
    for s in setups {
        let peer = s.peer;
        links[peer] = Some(s.into_link()?);
    }
    Ok(links)
}
