//! [`RdmaChannel`] on a software adapter: writes gather their entries from
//! registered local memory (an unregistered entry or a wrong key is refused, as
//! the hardware would), land in the peer's registered ring at the address the
//! channel names (checked against the ring's bounds and rkey), consume one of the
//! peer's posted receives (held back while none is posted: receiver not ready),
//! and complete at both ends. The channels run under the real executor through
//! [`Communicator::from_channels`], one thread per rank.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::channel::{Pinned, RdmaChannel, Setup, STAGE_STRIDE};
use super::nic::{Completion, Nic, Sge};
use super::protocol::{Protocol, RingSpec};
use crate::algorithm::Algorithm;
use crate::comm::tests::on_ranks;
use crate::comm::Communicator;
use crate::config::Config;
use crate::executor::{PeerChannel, WaitPolicy};
use crate::types::ReduceOp;

struct Landing {
    addr: u64,
    bytes: Vec<u8>,
    imm: u32,
    wr_id: u64,
}

#[derive(Default)]
struct Port {
    recv_wrs: usize,
    completions: VecDeque<Completion>,
    inbox: VecDeque<Landing>,
    /// Live registrations: (lkey, start, len).
    regs: Vec<(u32, usize, usize)>,
    /// The ring peers may write: (start, len, rkey).
    ring: (usize, usize, u32),
    next_key: u32,
}

/// Two ports joined by a reliable connection.
#[derive(Default)]
struct Fabric {
    ports: [Port; 2],
}

impl Fabric {
    /// Land what port `to` has room for, in order.
    fn deliver(&mut self, to: usize) {
        while self.ports[to].recv_wrs > 0 {
            let Some(w) = self.ports[to].inbox.pop_front() else { return };
            // The ring may have been deregistered since the write was posted (its
            // channel dropped): the write fails at the sender, as on hardware.
            let (start, len, _) = self.ports[to].ring;
            let at = w.addr as usize;
            if at < start || at + w.bytes.len() > start + len {
                let status = "remote access error (the peer's ring is gone)".to_string();
                self.ports[1 - to].completions.push_back(Completion::Failed { wr_id: w.wr_id, status });
                continue;
            }
            if !w.bytes.is_empty() {
                // SAFETY: the range lies in port `to`'s ring, which is registered,
                // so the channel owning it has not freed it (it deregisters first,
                // under the fabric's lock).
                unsafe { std::ptr::copy_nonoverlapping(w.bytes.as_ptr(), w.addr as *mut u8, w.bytes.len()) };
            }
            let p = &mut self.ports[to];
            p.recv_wrs -= 1;
            p.completions.push_back(Completion::Recv { imm: w.imm, byte_len: w.bytes.len() as u32 });
            self.ports[1 - to].completions.push_back(Completion::Sent { wr_id: w.wr_id });
        }
    }
}

struct SoftNic {
    fabric: Arc<Mutex<Fabric>>,
    me: usize,
}

struct SoftMr {
    fabric: Arc<Mutex<Fabric>>,
    me: usize,
    lkey: u32,
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        let mut f = self.fabric.lock().unwrap_or_else(|e| e.into_inner());
        let port = &mut f.ports[self.me];
        if let Some(&(_, start, _)) = port.regs.iter().find(|r| r.0 == self.lkey) {
            if port.ring.0 == start {
                port.ring = (0, 0, 0);
            }
        }
        port.regs.retain(|r| r.0 != self.lkey);
    }
}

impl Nic for SoftNic {
    type Mr = SoftMr;

    fn lkey(mr: &SoftMr) -> u32 {
        mr.lkey
    }

    unsafe fn register(&mut self, addr: usize, len: usize) -> Result<SoftMr, String> {
        let mut f = self.fabric.lock().unwrap();
        let p = &mut f.ports[self.me];
        p.next_key += 1;
        p.regs.push((p.next_key, addr, len));
        Ok(SoftMr { fabric: self.fabric.clone(), me: self.me, lkey: p.next_key })
    }

    fn post_recvs(&mut self, n: usize) -> io::Result<()> {
        let mut f = self.fabric.lock().unwrap();
        f.ports[self.me].recv_wrs += n;
        f.deliver(self.me);
        Ok(())
    }

    unsafe fn post_write(&mut self, wr_id: u64, sges: &[Sge], imm: u32, remote_addr: u64, rkey: u32) -> io::Result<()> {
        let mut f = self.fabric.lock().unwrap();
        let mut bytes = Vec::new();
        for s in sges {
            let (addr, len) = (s.addr as usize, s.len as usize);
            let covered =
                f.ports[self.me].regs.iter().any(|&(k, a, l)| k == s.lkey && a <= addr && addr + len <= a + l);
            if !covered {
                return Err(io::Error::other(format!("local protection error: {s:?} is not registered")));
            }
            // SAFETY: the entry lies in a live registration, whose memory the
            // caller keeps allocated and unchanged until completion.
            bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
        }
        let peer = 1 - self.me;
        let (start, len, key) = f.ports[peer].ring;
        let at = remote_addr as usize;
        if key != rkey || at < start || at + bytes.len() > start + len {
            return Err(io::Error::other(format!("remote access error at {at:#x} (+{})", bytes.len())));
        }
        f.ports[peer].inbox.push_back(Landing { addr: remote_addr, bytes, imm, wr_id });
        f.deliver(peer);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<()> {
        let mut f = self.fabric.lock().unwrap();
        f.deliver(self.me);
        out.extend(f.ports[self.me].completions.drain(..));
        Ok(())
    }
}

/// Channels `(a to b, b to a)` over one software connection.
fn pair(a: usize, b: usize, spec: RingSpec) -> (RdmaChannel<SoftNic>, RdmaChannel<SoftNic>) {
    let fabric = Arc::new(Mutex::new(Fabric::default()));
    let mut rings = [Pinned::new(spec.ring_bytes()), Pinned::new(spec.ring_bytes())];
    for (i, ring) in rings.iter_mut().enumerate() {
        fabric.lock().unwrap().ports[i].ring = (ring.ptr() as usize, ring.len(), 0x1000 + i as u32);
    }
    let addrs = [rings[0].ptr() as u64, rings[1].ptr() as u64];
    let [r0, r1] = rings;
    let make = |me: usize, mut ring: Pinned, rank: usize, peer: usize| {
        let mut nic = SoftNic { fabric: fabric.clone(), me };
        let mut stage = Pinned::new(spec.slots * STAGE_STRIDE);
        // SAFETY: ring and stage move into the channel with their registrations,
        // which it drops first.
        let (ring_mr, stage_mr) = unsafe {
            (
                nic.register(ring.ptr() as usize, ring.len()).unwrap(),
                nic.register(stage.ptr() as usize, stage.len()).unwrap(),
            )
        };
        let mut proto = Protocol::new(spec);
        nic.post_recvs(proto.take_initial_recvs()).unwrap();
        RdmaChannel::new(Setup {
            rank,
            peer,
            nic,
            proto,
            ring,
            ring_mr,
            stage,
            stage_mr,
            remote_ring: addrs[1 - me],
            remote_rkey: 0x1000 + (1 - me) as u32,
        })
    };
    let x = make(0, r0, a, b);
    let y = make(1, r1, b, a);
    (x, y)
}

/// Communicators of `world` ranks whose every pair is linked by rdma channels.
fn mesh(world: usize, spec: RingSpec) -> Vec<Communicator> {
    let mut rows: Vec<Vec<Option<Box<dyn PeerChannel>>>> =
        (0..world).map(|_| (0..world).map(|_| None).collect()).collect();
    for (a, b) in (0..world).flat_map(|a| (a + 1..world).map(move |b| (a, b))) {
        let (x, y) = pair(a, b, spec);
        rows[a][b] = Some(Box::new(x));
        rows[b][a] = Some(Box::new(y));
    }
    rows.into_iter()
        .enumerate()
        .map(|(rank, row)| {
            let mut cfg = Config::new(rank, world);
            cfg.timeout = Duration::from_secs(20);
            Communicator::from_channels(rank, world, row, 0xabc, &cfg, WaitPolicy::for_ranks(world))
        })
        .collect()
}

#[test]
fn collectives_run_over_rdma_channels_under_the_executor() {
    let small = RingSpec { slots: 4, payload_bytes: 4096, forward_grain: 1024, credit_batch: 2 };
    for (world, spec) in [(2, small), (3, small), (3, RingSpec::DEFAULT)] {
        let comms = mesh(world, spec);
        assert!(comms[0].transports().iter().flatten().all(|k| *k == crate::transport::TransportKind::Rdma));
        let results = on_ranks(comms, move |c| {
            let (r, w) = (c.rank() as i32, c.world_size() as i32);
            for (algo, n) in [(None, 1usize), (None, 1000), (None, 300_001), (Some(Algorithm::Ring), 300_001)] {
                c.set_algorithm(algo);
                let mut buf: Vec<i32> = (0..n as i32).map(|i| i % 977 + r).collect();
                c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                for (i, v) in buf.iter().enumerate() {
                    assert_eq!(*v, w * (i as i32 % 977) + w * (w - 1) / 2, "all-reduce of {n}, element {i}");
                }
                let mut b: Vec<i32> = if r == 1 { (0..n as i32).collect() } else { vec![-1; n] };
                c.broadcast(&mut b, 1).unwrap();
                assert!(b.iter().enumerate().all(|(i, v)| *v == i as i32), "broadcast of {n}");
                let mine: Vec<i32> = (0..n as i32).map(|i| i * w + r).collect();
                let mut all = vec![0i32; n * w as usize];
                c.all_gather(&mine, &mut all).unwrap();
                for (k, v) in all.iter().enumerate() {
                    let (from, i) = ((k / n) as i32, (k % n) as i32);
                    assert_eq!(*v, i * w + from, "all-gather of {n}, element {k}");
                }
            }
            c.barrier().unwrap();
            c.rank()
        });
        assert_eq!(results, (0..world).collect::<Vec<_>>());
    }
}

#[test]
fn a_mismatched_call_is_an_error_on_both_ranks_over_rdma() {
    let comms = mesh(2, RingSpec::DEFAULT);
    let errors = on_ranks(comms, |c| {
        let mut buf = vec![1i32; 10 + c.rank()];
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap_err().to_string()
    });
    for e in &errors {
        assert!(e.contains("mismatched collective calls") || e.contains("aborted because rank"), "{e}");
    }
    assert!(errors.iter().any(|e| e.contains("AllReduce") || e.contains("all-reduce")), "{errors:?}");
}

fn call_info(rank: usize) -> crate::executor::CallInfo {
    let sig = crate::types::CallSig::new(crate::types::OpKind::AllReduce, crate::types::DType::U8, 8, 0, ReduceOp::Sum);
    crate::executor::CallInfo {
        ctx: crate::error::OpContext { rank, call: Some(sig), seq: 0 },
        sig,
        send_seq: 0,
        recv_seq: 0,
        comm_id: 1,
        epoch: 0,
        dtype: crate::types::DType::U8,
        reduce_op: ReduceOp::Sum,
        timeout: Duration::from_secs(5),
        wait: WaitPolicy::for_ranks(2),
        aborted: Arc::new(std::sync::atomic::AtomicBool::new(false)),
    }
}

fn host(v: &mut [u8]) -> crate::executor::MemRegion {
    crate::executor::MemRegion { ptr: v.as_mut_ptr(), len: v.len(), kind: crate::executor::MemKind::Host }
}

/// A peer that finished its last call and closed (its ring deregistered) fails the
/// credits still owed to it: harmless while nothing more is wanted from it, an
/// error naming it as soon as something is.
#[test]
fn a_peer_gone_after_its_last_call_is_an_error_only_when_needed() {
    let spec = RingSpec { slots: 2, payload_bytes: 64, forward_grain: 8, credit_batch: 1 };
    let (mut a, mut b) = pair(0, 1, spec);
    let (ca, cb) = (call_info(0), call_info(1));
    let mut src = *b"12345678";
    let mut dst = [0u8; 8];
    a.post_send(host(&mut src), None, &ca).unwrap();
    b.post_recv(host(&mut dst), None, None, &cb).unwrap();
    while a.busy() {
        a.progress(1, &mut [], &ca).unwrap();
    }
    a.end_call();
    drop(a);
    // The data landed before the peer left: the receive completes, and the credit
    // it then owes cannot be delivered.
    while b.busy() {
        b.progress(0, &mut [], &cb).unwrap();
    }
    assert_eq!(&dst, b"12345678");
    b.progress(0, &mut [], &cb).unwrap();
    b.end_call();
    b.post_recv(host(&mut dst), None, None, &cb).unwrap();
    match b.progress(0, &mut [], &cb) {
        Err(crate::error::Error::PeerLost { peer: 0, detail, .. }) => {
            assert!(detail.contains("remote access error"), "{detail}")
        }
        other => panic!("expected the peer to be lost, got {other:?}"),
    }
}
