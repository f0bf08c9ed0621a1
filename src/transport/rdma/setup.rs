//! Setting up a rank's verbs channels over any [`Adapter`]: per peer a protection
//! domain of its own, a queue pair in it, a receive ring registered for remote
//! writes in that domain alone, and header staging; then the endpoint record
//! under `rdma/{rank}`, every queue pair connected to what its peer published, and
//! a barrier (`rdma/{rank}/ready`) so nobody writes to a queue pair that is not
//! ready to receive.
//!
//! Why a domain per peer: a remote key opens its registration to every queue pair
//! of the registration's protection domain, and the record `rdma/{rank}`, which
//! every rank can read, lists the ring address and key this rank gives each peer.
//! With one domain for all, any peer could write into the ring this rank keeps
//! for another (corrupting that peer's chunks, or forging them) with the key
//! published for it; with one domain per peer, a key works only on the queue pair
//! of the peer it was given to, and a write with another's is refused by the
//! adapter (a remote access error at the writer).

use std::time::Duration;

use super::channel::{Pinned, RdmaChannel, Setup, STAGE_STRIDE};
use super::endpoint;
use super::nic::{Adapter, Nic};
use super::protocol::{Protocol, RingSpec};
use crate::bootstrap::Store;
use crate::error::{Error, Result};

/// A peer's half-built channel: queue pair created, ring and staging registered,
/// endpoint published. Registrations before the memory they cover, so that on
/// an error they go first.
struct Pending<A: Adapter> {
    peer: usize,
    nic: A::Nic,
    ring_mr: <A::Nic as Nic>::Mr,
    stage_mr: <A::Nic as Nic>::Mr,
    ring: Pinned,
    stage: Pinned,
}

/// Verbs channels of `rank` to every peer marked in `peers` (None elsewhere), set
/// up through `adapter` with rings of layout `spec`, endpoints exchanged through
/// `store`; waits at most `timeout` for each peer's record and for the barrier.
pub fn connect_over<A: Adapter>(
    adapter: &A,
    rank: usize,
    world: usize,
    peers: &[bool],
    spec: RingSpec,
    store: &dyn Store,
    timeout: Duration,
) -> Result<Vec<Option<RdmaChannel<A::Nic>>>> {
    let mut pending: Vec<Pending<A>> = Vec::new();
    let mut entries = vec![None; world];
    for peer in (0..world).filter(|&p| p != rank && peers.get(p).copied().unwrap_or(false)) {
        // A domain of the peer's own (module docs): the ring's key opens it to this
        // queue pair only.
        let pd = adapter.alloc_pd(peer)?;
        let nic = adapter.create_qp(&pd, &spec, peer)?;
        let mut ring = Pinned::new(spec.ring_bytes());
        let mut stage = Pinned::new(spec.slots * STAGE_STRIDE);
        // SAFETY: the ring moves into the channel with its registration, which the
        // channel drops before it (field order; `Pending` too), so it stays
        // allocated while registered.
        let (ring_mr, rkey) = unsafe { adapter.register(&pd, ring.ptr(), ring.len(), true, peer)? };
        // SAFETY: as for the ring; local access only.
        let (stage_mr, _) = unsafe { adapter.register(&pd, stage.ptr(), stage.len(), false, peer)? };
        entries[peer] = Some(adapter.endpoint(&nic, ring.ptr() as u64, rkey, &spec));
        pending.push(Pending { peer, nic, ring_mr, stage_mr, ring, stage });
    }
    store.set(&format!("rdma/{rank}"), &endpoint::encode(&entries))?;
    let mut out: Vec<Option<RdmaChannel<A::Nic>>> = (0..world).map(|_| None).collect();
    for mut p in pending {
        let raw = store.wait_get(&format!("rdma/{}", p.peer), timeout)?;
        let remote = endpoint::decode_for(&raw, world, rank, &spec).map_err(|why| {
            Error::Store(format!("rank {rank}: the rdma endpoint record of rank {} is not usable: {why}", p.peer))
        })?;
        let mut proto = Protocol::new(spec);
        p.nic
            .post_recvs(proto.take_initial_recvs())
            .map_err(|e| Error::io(format!("rank {rank}: rdma ibv_post_recv for peer {}", p.peer), e))?;
        adapter.connect(&mut p.nic, &remote, p.peer)?;
        out[p.peer] = Some(RdmaChannel::new(Setup {
            rank,
            peer: p.peer,
            nic: p.nic,
            proto,
            ring: p.ring,
            ring_mr: p.ring_mr,
            stage: p.stage,
            stage_mr: p.stage_mr,
            remote_ring: remote.ring_addr,
            remote_rkey: remote.rkey,
        }));
    }
    store.set(&format!("rdma/{rank}/ready"), b"1")?;
    let keys: Vec<String> = (0..world).filter(|&p| out[p].is_some()).map(|p| format!("rdma/{p}/ready")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    store.wait(&refs, timeout)?;
    Ok(out)
}
