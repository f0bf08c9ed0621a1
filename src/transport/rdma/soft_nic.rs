//! A software adapter for the tests: the [`Adapter`] and [`Nic`] of ranks joined
//! by one fabric, checking what the hardware checks.
//!
//! - Registrations live in a protection domain of a host. A write's gather list
//!   must lie in registrations of its queue pair's domain, checked at posting (the
//!   channel's contract) and again when the adapter reads it, at landing (a
//!   registration dropped in between is a local protection error). A write lands
//!   only through a remote key of a registration with remote write access in the
//!   domain of the queue pair it arrives on, covering its range (else a remote
//!   access error): as in verbs, a key opens memory to its own domain's queue pairs.
//! - A write posted stays in flight until the next poll of either end of its queue
//!   pair (the adapter works between the channel's calls), and while the receiving
//!   queue pair has no receive posted or is stalled (an adapter that does not
//!   answer). Landing copies the bytes into the ring and completes at both ends.
//! - A failed write puts its queue pair in the error state: what is in flight and
//!   whatever is posted later completes flushed, as does everything on
//!   [`Nic::halt`].
//! - A registration dropped while a write posted under it is in flight is recorded
//!   ([`Fabric::dropped_in_flight`]): on hardware it breaks the queue pair.
//!
//! The bytes of a write are copied when it is posted (the memory may be gone by
//! landing time once a test has ended a call), so its data is what it was then.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use super::endpoint::Endpoint;
use super::nic::{Adapter, Completion, Nic, Sge};
use super::protocol::RingSpec;
use crate::error::Result;

/// A write on its way.
struct Write {
    addr: u64,
    bytes: Vec<u8>,
    imm: u32,
    wr_id: u64,
    lkeys: Vec<u32>,
    rkey: u32,
}

struct Reg {
    key: u32,
    host: usize,
    pd: usize,
    start: usize,
    len: usize,
    remote_write: bool,
}

struct Qp {
    host: usize,
    pd: usize,
    /// The queue pair it is connected to.
    peer: Option<usize>,
    recv_wrs: usize,
    completions: VecDeque<Completion>,
    /// Writes posted on it that have not landed.
    outbox: VecDeque<Write>,
    error: bool,
    /// Writes arriving on it do not land.
    stalled: bool,
}

/// Every host's registrations and queue pairs.
#[derive(Default)]
pub(super) struct Fabric {
    regs: Vec<Reg>,
    qps: Vec<Qp>,
    pds: usize,
    next_key: u32,
    /// Registrations dropped under a write in flight that reads them.
    pub(super) dropped_in_flight: Vec<String>,
}

fn lock(f: &Mutex<Fabric>) -> MutexGuard<'_, Fabric> {
    f.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fabric {
    /// A fabric to share between the adapters of the ranks.
    pub(super) fn shared() -> Arc<Mutex<Fabric>> {
        Arc::new(Mutex::new(Fabric::default()))
    }

    /// Writes posted and not landed, on every queue pair.
    pub(super) fn in_flight(&self) -> usize {
        self.qps.iter().map(|q| q.outbox.len()).sum()
    }

    /// Stall (or resume) every queue pair of `host`: writes to it stay in flight.
    pub(super) fn stall_host(&mut self, host: usize, stalled: bool) {
        self.qps.iter_mut().filter(|q| q.host == host).for_each(|q| q.stalled = stalled);
    }

    fn covered(&self, key: u32, host: usize, pd: usize, addr: usize, len: usize, remote: bool) -> bool {
        self.regs.iter().any(|r| {
            r.key == key
                && r.host == host
                && r.pd == pd
                && (r.remote_write || !remote)
                && r.start <= addr
                && addr.checked_add(len).is_some_and(|end| end <= r.start + r.len)
        })
    }

    /// Queue pair `q` fails work request `wr_id` and goes to the error state.
    fn fail(&mut self, q: usize, wr_id: u64, status: &str) {
        let qp = &mut self.qps[q];
        qp.error = true;
        qp.completions.push_back(Completion::Failed { wr_id, status: status.into() });
        self.flush(q);
    }

    /// Everything in flight on `q` (in the error state) completes flushed.
    fn flush(&mut self, q: usize) {
        let qp = &mut self.qps[q];
        while let Some(w) = qp.outbox.pop_front() {
            qp.completions.push_back(Completion::Failed { wr_id: w.wr_id, status: "work request flushed".into() });
        }
    }

    /// Land what queue pair `q` sent, in order, as far as its peer takes it.
    fn deliver(&mut self, q: usize) {
        let Some(p) = self.qps[q].peer else { return };
        while !self.qps[p].stalled && self.qps[p].recv_wrs > 0 {
            let Some(w) = self.qps[q].outbox.pop_front() else { return };
            let (host, pd) = (self.qps[q].host, self.qps[q].pd);
            // The adapter reads the gather list now.
            if !w.lkeys.iter().all(|&k| self.regs.iter().any(|r| r.key == k && r.host == host && r.pd == pd)) {
                self.fail(q, w.wr_id, "local protection error (a registration of the gather list is gone)");
                return;
            }
            // The responder checks the key against the domain of the queue pair the
            // write arrived on.
            let (at, n) = (w.addr as usize, w.bytes.len());
            if !self.covered(w.rkey, self.qps[p].host, self.qps[p].pd, at, n, true) {
                self.fail(q, w.wr_id, &format!("remote access error (key {:#x} at {at:#x} +{n})", w.rkey));
                return;
            }
            if n > 0 {
                // SAFETY: the range lies in a live registration with remote write
                // access, whose owner keeps it allocated while registered (it
                // deregisters first, under the fabric's lock).
                unsafe { std::ptr::copy_nonoverlapping(w.bytes.as_ptr(), at as *mut u8, n) };
            }
            self.qps[p].recv_wrs -= 1;
            self.qps[p].completions.push_back(Completion::Recv { imm: w.imm, byte_len: n as u32 });
            self.qps[q].completions.push_back(Completion::Sent { wr_id: w.wr_id });
        }
    }
}

/// One host's adapter on the fabric.
pub(super) struct SoftAdapter {
    pub(super) fabric: Arc<Mutex<Fabric>>,
    pub(super) host: usize,
}

/// A queue pair on the fabric.
pub(super) struct SoftNic {
    fabric: Arc<Mutex<Fabric>>,
    qp: usize,
}

/// A registration; dropping it deregisters.
pub(super) struct SoftMr {
    fabric: Arc<Mutex<Fabric>>,
    key: u32,
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        let mut f = lock(&self.fabric);
        f.regs.retain(|r| r.key != self.key);
        let under: Vec<u64> =
            f.qps.iter().flat_map(|q| &q.outbox).filter(|w| w.lkeys.contains(&self.key)).map(|w| w.wr_id).collect();
        for wr_id in under {
            let note = format!("registration {:#x} dropped under write {wr_id:#x} in flight", self.key);
            f.dropped_in_flight.push(note);
        }
    }
}

/// A registration of `range` (start, length) in domain `at` (host, domain).
fn register(fabric: &Arc<Mutex<Fabric>>, at: (usize, usize), range: (usize, usize), remote_write: bool) -> SoftMr {
    let mut g = lock(fabric);
    g.next_key += 1;
    let key = 0x100 + g.next_key;
    let (host, pd) = at;
    g.regs.push(Reg { key, host, pd, start: range.0, len: range.1, remote_write });
    SoftMr { fabric: fabric.clone(), key }
}

impl Nic for SoftNic {
    type Mr = SoftMr;

    fn lkey(mr: &SoftMr) -> u32 {
        mr.key
    }

    unsafe fn register(&mut self, addr: usize, len: usize) -> std::result::Result<SoftMr, String> {
        let at = {
            let f = lock(&self.fabric);
            (f.qps[self.qp].host, f.qps[self.qp].pd)
        };
        Ok(register(&self.fabric, at, (addr, len), false))
    }

    fn post_recvs(&mut self, n: usize) -> io::Result<()> {
        let mut f = lock(&self.fabric);
        if !f.qps[self.qp].error {
            f.qps[self.qp].recv_wrs += n;
        }
        Ok(())
    }

    unsafe fn post_write(&mut self, wr_id: u64, sges: &[Sge], imm: u32, remote_addr: u64, rkey: u32) -> io::Result<()> {
        let mut f = lock(&self.fabric);
        let (host, pd) = (f.qps[self.qp].host, f.qps[self.qp].pd);
        let mut bytes = Vec::new();
        for s in sges {
            let (addr, len) = (s.addr as usize, s.len as usize);
            if !f.covered(s.lkey, host, pd, addr, len, false) {
                return Err(io::Error::other(format!("local protection error: {s:?} is not registered")));
            }
            // SAFETY: the entry lies in a live registration, whose memory the
            // caller keeps allocated and unchanged until completion.
            bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
        }
        let lkeys = sges.iter().map(|s| s.lkey).collect();
        let qp = &mut f.qps[self.qp];
        if qp.error {
            qp.completions.push_back(Completion::Failed { wr_id, status: "work request flushed".into() });
        } else {
            qp.outbox.push_back(Write { addr: remote_addr, bytes, imm, wr_id, lkeys, rkey });
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<()> {
        let mut f = lock(&self.fabric);
        f.deliver(self.qp);
        if let Some(p) = f.qps[self.qp].peer {
            f.deliver(p);
        }
        out.extend(f.qps[self.qp].completions.drain(..));
        Ok(())
    }

    fn halt(&mut self) -> io::Result<()> {
        let mut f = lock(&self.fabric);
        f.qps[self.qp].error = true;
        f.flush(self.qp);
        Ok(())
    }
}

impl Adapter for SoftAdapter {
    type Pd = usize;
    type Nic = SoftNic;

    fn alloc_pd(&self, _peer: usize) -> Result<usize> {
        let mut f = lock(&self.fabric);
        f.pds += 1;
        Ok(f.pds)
    }

    fn create_qp(&self, pd: &usize, _spec: &RingSpec, _peer: usize) -> Result<SoftNic> {
        let mut f = lock(&self.fabric);
        f.qps.push(Qp {
            host: self.host,
            pd: *pd,
            peer: None,
            recv_wrs: 0,
            completions: VecDeque::new(),
            outbox: VecDeque::new(),
            error: false,
            stalled: false,
        });
        Ok(SoftNic { fabric: self.fabric.clone(), qp: f.qps.len() - 1 })
    }

    unsafe fn register(
        &self,
        pd: &usize,
        addr: *mut u8,
        len: usize,
        remote_write: bool,
        _peer: usize,
    ) -> Result<(SoftMr, u32)> {
        let mr = register(&self.fabric, (self.host, *pd), (addr as usize, len), remote_write);
        let key = mr.key;
        Ok((mr, key))
    }

    fn endpoint(&self, nic: &SoftNic, ring_addr: u64, rkey: u32, spec: &RingSpec) -> Endpoint {
        Endpoint {
            lid: self.host as u16,
            qpn: nic.qp as u32,
            psn: 0,
            gid: [0; 16],
            mtu: 5,
            ring_addr,
            rkey,
            slots: spec.slots as u32,
            payload_bytes: spec.payload_bytes as u32,
        }
    }

    fn connect(&self, nic: &mut SoftNic, remote: &Endpoint, _peer: usize) -> Result<()> {
        let mut f = lock(&self.fabric);
        let p = remote.qpn as usize;
        if f.qps.get(p).is_none_or(|q| q.host != remote.lid as usize) {
            return Err(crate::error::Error::Store(format!("no queue pair {p} on host {}", remote.lid)));
        }
        f.qps[nic.qp].peer = Some(p);
        Ok(())
    }
}
