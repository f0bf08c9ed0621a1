//! [`RdmaChannel`]: the [`PeerChannel`] over a verbs queue pair, driving the
//! [`Protocol`] with the calls of [`super::verbs`], and [`connect`], which sets up
//! one per peer through the store.
//!
//! Compile-verified only (no RDMA hardware where it was written).

use std::sync::Arc;
use std::time::Instant;

use rdma_sys::{ibv_access_flags, ibv_sge, ibv_wc, ibv_wc_opcode, ibv_wc_status};

use super::protocol::{Action, Protocol, RingSpec, WriteData};
use super::regcache::RegCache;
use super::verbs::{self, Device, Mr, QueuePair, SendRegistrar, STAGE_STRIDE};
use crate::error::{Error, Result};
use crate::executor::channel::{MemRegion, PeerChannel, Readiness, Reduction};
use crate::executor::CallInfo;
use crate::frame::{FrameKind, HEADER_LEN};
use crate::transport::{ConnectRequest, TransportKind};

/// Registrations of send buffers kept at most (entries, bytes).
const CACHE_ENTRIES: usize = 256;
const CACHE_BYTES: usize = 4 << 30;
/// Completions taken per poll.
const POLL_BATCH: usize = 32;

/// A cache line, so slots (and the payloads 40 bytes into them) stay aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Memory the device may access, in whole 64-byte-aligned lines.
struct Pinned {
    mem: Box<[Line]>,
}

impl Pinned {
    fn new(bytes: usize) -> Pinned {
        Pinned { mem: vec![Line([0; 64]); bytes.div_ceil(64)].into_boxed_slice() }
    }
    fn ptr(&mut self) -> *mut u8 {
        self.mem.as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        self.mem.len() * 64
    }
}

/// One peer's verbs channel.
pub struct RdmaChannel {
    rank: usize,
    peer: usize,
    proto: Protocol,
    /// Dropped before the registrations and buffers below.
    qp: QueuePair,
    /// This rank's receive ring for the peer (the peer writes it) and its region.
    _ring_mr: Mr,
    ring: Pinned,
    /// Headers (and abort reasons) of writes in flight, one stride per peer slot.
    stage_mr: Mr,
    stage: Pinned,
    remote_ring: u64,
    remote_rkey: u32,
    cache: RegCache<Mr>,
    registrar: SendRegistrar,
    /// Cache entries pinned by this call's sends.
    pins: Vec<u64>,
    actions: Vec<Action>,
    wcs: Vec<ibv_wc>,
}

// SAFETY: every verbs handle is owned by this channel (or shared through Arc and
// thread-safe in libibverbs); the raw pointers of posted requests inside the
// protocol are forgotten in end_call before the executor returns.
unsafe impl Send for RdmaChannel {}

impl Drop for RdmaChannel {
    fn drop(&mut self) {
        // Registrations go after the queue pair stops (its Drop runs first among
        // the fields; the cache's entries are dropped here explicitly).
        self.cache.clear(&mut self.registrar);
    }
}

fn segment_of(addr: usize, len: usize) -> Option<String> {
    crate::registered::lookup(addr, len).map(|(name, _)| name)
}

impl RdmaChannel {
    fn fail(&self, call: &CallInfo, what: &str, e: impl std::fmt::Display) -> Error {
        let detail = if self.proto.said_goodbye() {
            format!("it closed its communicator (rdma {what}: {e})")
        } else {
            format!("rdma {what}: {e}")
        };
        Error::PeerLost { ctx: call.ctx.clone(), peer: self.peer, detail }
    }

    /// Take completions off the queue and hand them to the protocol.
    fn poll(&mut self, call: &CallInfo) -> Result<bool> {
        let mut any = false;
        loop {
            let n = self.qp.poll(&mut self.wcs).map_err(|e| self.fail(call, "ibv_poll_cq", e))?;
            for i in 0..n {
                let wc = &self.wcs[i];
                // SAFETY: the union holds the immediate for receive completions of
                // writes with immediate (the only ones read below); any bits are a u32.
                let imm = u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
                let (status, opcode, byte_len, wr_id) = (wc.status, wc.opcode, wc.byte_len, wc.wr_id);
                if status != ibv_wc_status::IBV_WC_SUCCESS {
                    // Only wr_id and status are defined in an error completion;
                    // receive work requests carry id 0, writes a tagged one.
                    let what = if wr_id == 0 { "receive" } else { "write" };
                    return Err(self.fail(call, &format!("{what} completion"), verbs::status_text(status)));
                }
                if opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
                    self.proto.on_arrival(imm, byte_len, self.peer, call)?;
                } else {
                    self.proto.on_send_complete(wr_id, self.peer, call)?;
                }
            }
            any |= n > 0;
            if n < self.wcs.len() {
                return Ok(any);
            }
        }
    }

    /// Carry out what the protocol asked for.
    fn perform(&mut self, call: &CallInfo) -> Result<()> {
        let stride = self.proto.spec().slot_stride() as u64;
        let mut actions = std::mem::take(&mut self.actions);
        for a in actions.drain(..) {
            match a {
                Action::PostRecvs(n) => self.qp.post_recvs(n).map_err(|e| self.fail(call, "ibv_post_recv", e))?,
                Action::Credit { wr_id, imm } => {
                    // SAFETY: no SGE; the target is the start of the peer's ring.
                    unsafe { self.qp.post_write(wr_id, &mut [], imm, self.remote_ring, self.remote_rkey) }
                        .map_err(|e| self.fail(call, "ibv_post_send (credit)", e))?;
                }
                Action::Write { wr_id, slot, header, data, imm } => {
                    // The protocol names slots below the ring's; the staging has one per slot.
                    let at = slot * STAGE_STRIDE;
                    let extra = match &data {
                        WriteData::Bytes(b) => b.as_slice(),
                        WriteData::Region { .. } => &[],
                    };
                    let staged = HEADER_LEN + extra.len().min(STAGE_STRIDE - HEADER_LEN);
                    // SAFETY: slot < slots, so [at, at + staged) lies in the staging
                    // buffer; no write of this slot is in flight (the protocol reuses
                    // a slot only after its completion), so the device is not reading it.
                    let stage = unsafe { std::slice::from_raw_parts_mut(self.stage.ptr().add(at), staged) };
                    stage[..HEADER_LEN].copy_from_slice(&header);
                    stage[HEADER_LEN..].copy_from_slice(&extra[..staged - HEADER_LEN]);
                    let mut sges = [
                        ibv_sge { addr: stage.as_ptr() as u64, length: staged as u32, lkey: self.stage_mr.lkey() },
                        ibv_sge { addr: 0, length: 0, lkey: 0 },
                    ];
                    let mut n_sge = 1;
                    if let WriteData::Region { addr, len } = data {
                        if len > 0 {
                            let Some(mr) = self.cache.find(addr as usize, len) else {
                                return Err(self.fail(call, "write", "a send buffer that is not registered"));
                            };
                            sges[1] = ibv_sge { addr: addr as u64, length: len as u32, lkey: mr.lkey() };
                            n_sge = 2;
                        }
                    }
                    let remote = self.remote_ring + slot as u64 * stride;
                    // SAFETY: the staging SGE is in the staging MR; the data SGE is in a
                    // registration pinned until end_call, covering a region the
                    // executor keeps alive for the call; `remote` is slot `slot` of the
                    // peer's ring, which holds header and payload (payload <= slot size).
                    unsafe { self.qp.post_write(wr_id, &mut sges[..n_sge], imm, remote, self.remote_rkey) }
                        .map_err(|e| self.fail(call, "ibv_post_send (write)", e))?;
                }
            }
        }
        self.actions = actions;
        Ok(())
    }
}

impl PeerChannel for RdmaChannel {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn post_send(&mut self, src: MemRegion, first_gate: Option<usize>, call: &CallInfo) -> Result<()> {
        self.proto.post_send(src, first_gate, call)?;
        if src.len > 0 {
            let seg = segment_of(src.ptr as usize, src.len);
            let (id, _) =
                self.cache.acquire(&mut self.registrar, src.ptr as usize, src.len, seg.as_deref()).map_err(|why| {
                    Error::Io {
                        what: format!("{}: rdma registration of a send to rank {}", call.ctx, self.peer),
                        source: std::io::Error::other(why),
                    }
                })?;
            self.pins.push(id);
        }
        Ok(())
    }

    fn post_recv(
        &mut self,
        dst: MemRegion,
        reduce: Option<Reduction>,
        forward: Option<&mut Vec<usize>>,
        call: &CallInfo,
    ) -> Result<()> {
        self.proto.post_recv(dst, reduce, forward, self.peer, call)
    }

    fn progress(&mut self, peer: usize, gates: &mut [usize], call: &CallInfo) -> Result<bool> {
        debug_assert_eq!(peer, self.peer);
        let polled = self.poll(call)?;
        // SAFETY: the ring is this channel's own memory. The peer writes only slots
        // it holds credits for, which the protocol does not read; a peer that writes
        // elsewhere can change bytes under the protocol's reads of plain `u8`s, each
        // of which is validated before use.
        let ring = unsafe { std::slice::from_raw_parts(self.ring.ptr() as *const u8, self.proto.spec().ring_bytes()) };
        let moved = self.proto.progress(ring, gates, self.peer, call, &mut self.actions)?;
        self.perform(call)?;
        Ok(polled | moved)
    }

    fn busy(&self) -> bool {
        self.proto.busy()
    }

    fn readiness(&self, _gates: &[usize]) -> Readiness {
        Readiness::NoFd
    }

    fn send_control_and_close(&mut self, kind: FrameKind, comm_id: u32, epoch: u8, reason: &str, give_up: Instant) {
        let sig = crate::types::CallSig::new(
            crate::types::OpKind::Barrier,
            crate::types::DType::U8,
            0,
            0,
            crate::types::ReduceOp::Sum,
        );
        let call = CallInfo {
            ctx: crate::error::OpContext { rank: self.rank, call: None, seq: 0 },
            sig,
            send_seq: 0,
            recv_seq: 0,
            comm_id,
            epoch,
            dtype: crate::types::DType::U8,
            reduce_op: crate::types::ReduceOp::Sum,
            timeout: give_up.saturating_duration_since(Instant::now()),
            wait: crate::executor::WaitPolicy::for_ranks(1),
            aborted: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        // Wait (bounded) for a credit, then for the control chunk's completion.
        while Instant::now() < give_up {
            if let Some(a) = self.proto.control(kind, comm_id, epoch, reason) {
                self.actions.push(a);
                if self.perform(&call).is_err() {
                    return;
                }
                break;
            }
            if self.poll(&call).is_err() {
                return;
            }
            std::thread::yield_now();
        }
        while Instant::now() < give_up && self.proto.writes_in_flight() && self.poll(&call).is_ok() {
            std::thread::yield_now();
        }
    }

    fn end_call(&mut self) {
        self.proto.end_call();
        for id in self.pins.drain(..) {
            self.cache.release(&mut self.registrar, id);
        }
        self.cache.end_call(&mut self.registrar, segment_of);
    }
}

/// Half-built channel: queue pair in INIT, ring registered, endpoint published.
struct Pending {
    peer: usize,
    qp: QueuePair,
    ring: Pinned,
    ring_mr: Mr,
    stage: Pinned,
    stage_mr: Mr,
}

impl RdmaChannel {
    /// Verbs channels to every peer marked in `req.peers` (None elsewhere).
    pub fn connect_all(req: &ConnectRequest) -> Result<Vec<Option<RdmaChannel>>> {
        connect(req)
    }
}

fn connect(req: &ConnectRequest) -> Result<Vec<Option<RdmaChannel>>> {
    let (rank, world) = (req.rank, req.world);
    let spec = RingSpec::DEFAULT;
    let dev: Arc<Device> = verbs::open_device(rank)?;
    tracing::debug!(rank, device = dev.name, port = dev.port, roce = dev.roce, "rdma device opened");
    let mut pending: Vec<Pending> = Vec::new();
    let mut entries = vec![None; world];
    for peer in (0..world).filter(|&p| req.peers.get(p).copied().unwrap_or(false) && p != rank) {
        let qp = QueuePair::create(&dev, &spec, rank, peer)?;
        let mut ring = Pinned::new(spec.ring_bytes());
        let mut stage = Pinned::new(spec.slots * STAGE_STRIDE);
        let rw = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        // SAFETY: the ring lives in the channel next to its registration, which is
        // dropped first (field order and Drop), so it stays allocated while registered.
        let ring_mr = unsafe { Mr::register(&dev, ring.ptr(), ring.len(), rw) }
            .ok_or_else(|| verbs_err(rank, peer, "ibv_reg_mr (receive ring)"))?;
        // SAFETY: as for the ring; local access only.
        let stage_mr =
            unsafe { Mr::register(&dev, stage.ptr(), stage.len(), ibv_access_flags::IBV_ACCESS_LOCAL_WRITE) }
                .ok_or_else(|| verbs_err(rank, peer, "ibv_reg_mr (staging)"))?;
        entries[peer] = Some(verbs::local_endpoint(&dev, &qp, ring.ptr() as u64, ring_mr.rkey(), &spec));
        pending.push(Pending { peer, qp, ring, ring_mr, stage, stage_mr });
    }
    req.store.set(&format!("rdma/{rank}"), &super::endpoint::encode(&entries))?;
    let mut out: Vec<Option<RdmaChannel>> = (0..world).map(|_| None).collect();
    for p in pending {
        let raw = req.store.wait_get(&format!("rdma/{}", p.peer), req.config.timeout)?;
        let remote = verbs::remote_endpoint(&raw, world, rank, p.peer, &spec)?;
        let mut proto = Protocol::new(spec);
        p.qp.post_recvs(proto.take_initial_recvs())
            .map_err(|e| Error::io(format!("rank {rank}: rdma ibv_post_recv for peer {}", p.peer), e))?;
        p.qp.connect(&remote, rank, p.peer)?;
        out[p.peer] = Some(RdmaChannel {
            rank,
            peer: p.peer,
            proto,
            qp: p.qp,
            _ring_mr: p.ring_mr,
            ring: p.ring,
            stage_mr: p.stage_mr,
            stage: p.stage,
            remote_ring: remote.ring_addr,
            remote_rkey: remote.rkey,
            cache: RegCache::new(CACHE_ENTRIES, CACHE_BYTES),
            registrar: SendRegistrar { dev: dev.clone() },
            pins: Vec::new(),
            actions: Vec::new(),
            wcs: verbs::wc_buffer(POLL_BATCH),
        });
    }
    // Nobody writes before every queue pair it writes to is ready to receive.
    req.store.set(&format!("rdma/{rank}/ready"), b"1")?;
    let keys: Vec<String> = (0..world).filter(|&p| out[p].is_some()).map(|p| format!("rdma/{p}/ready")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    req.store.wait(&refs, req.config.timeout)?;
    Ok(out)
}

fn verbs_err(rank: usize, peer: usize, what: &str) -> Error {
    Error::io(format!("rank {rank}: rdma {what} for peer {peer}"), std::io::Error::last_os_error())
}
