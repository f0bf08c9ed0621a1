//! The thin layer over `rdma-sys`: the device, a protection domain, completion
//! queue and reliable-connected queue pair per peer, memory registration, and the
//! queue-pair state transitions (RESET → INIT → RTR → RTS, and ERR to stop) — the
//! [`Adapter`] and [`Nic`] that [`connect_over`] sets the channels up with. Every
//! failure is an error naming this rank, the peer and the verbs call.
//!
//! Compile-verified only on machines without RDMA hardware (the machine this was
//! written on has none: `ibv_get_device_list` fails with ENOSYS). The protocol it
//! drives ([`super::protocol`]) is tested on simulated queue pairs.

use std::ffi::CStr;
use std::io;
use std::sync::Arc;

use rdma_sys::*;

use super::channel::RdmaChannel;
use super::endpoint::Endpoint;
use super::nic::{Adapter, Completion, Nic, Sge};
use super::protocol::RingSpec;
use super::setup::connect_over;
use crate::error::{Error, Result};
use crate::transport::ConnectRequest;

/// `IBV_LINK_LAYER_ETHERNET` (a C define that bindgen does not carry): RoCE.
const LINK_LAYER_ETHERNET: u8 = 2;

fn os_err(rank: usize, peer: Option<usize>, what: &str) -> Error {
    let who = match peer {
        Some(p) => format!("rank {rank}: rdma {what} for peer {p}"),
        None => format!("rank {rank}: rdma {what}"),
    };
    Error::io(who, io::Error::last_os_error())
}

/// An opened device: context and the port used.
pub(crate) struct Device {
    ctx: *mut ibv_context,
    /// The rank that opened it (for errors).
    rank: usize,
    pub(crate) port: u8,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    pub(crate) gid_index: u8,
    pub(crate) mtu: u8,
    pub(crate) roce: bool,
    pub(crate) name: String,
}

// SAFETY: libibverbs objects may be used from any thread (the library locks what it
// shares); the pointers are owned by this struct and freed once, in Drop.
unsafe impl Send for Device {}
// SAFETY: as above; `&Device` only reads the fields and passes the handles to verbs.
unsafe impl Sync for Device {}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: ctx came from ibv_open_device, every object made from it
        // (protection domains, and through them queue pairs, CQs and MRs) holds an
        // Arc of this Device and is gone before it, and it is closed once, here.
        unsafe { ibv_close_device(self.ctx) };
    }
}

/// A protection domain: the queue pair to one peer and the memory it may touch.
pub(crate) struct Pd {
    pd: *mut ibv_pd,
    dev: Arc<Device>,
}

// SAFETY: as for Device: a handle libibverbs lets any thread use, freed once in Drop.
unsafe impl Send for Pd {}
// SAFETY: as above; `&Pd` only passes the handle to verbs.
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: pd came from ibv_alloc_pd; every queue pair and MR made in it holds
        // an Arc of this Pd and is gone before it; freed once, here.
        unsafe { ibv_dealloc_pd(self.pd) };
    }
}

/// Open the first device (or the one `BRAID_IB_HCA` names) and its port.
pub(crate) fn open_device(rank: usize, cfg: &crate::config::Config) -> Result<Arc<Device>> {
    let mut n: std::os::raw::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below, after the one
    // device used has been opened (an open device stays valid after the free).
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(Error::Unsupported(format!(
            "rank {rank}: no RDMA devices (ibv_get_device_list: {})",
            io::Error::last_os_error()
        )));
    }
    let want = cfg.ib_hca.clone();
    let mut chosen = None;
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a valid device; the name is a NUL-terminated string it owns.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
        if want.as_ref().is_none_or(|(w, _)| *w == name) {
            chosen = Some((dev, name));
            break;
        }
    }
    let port = want.as_ref().map_or(1, |(_, p)| *p);
    let opened = chosen.map(|(dev, name)| {
        // SAFETY: a device of the live list.
        (unsafe { ibv_open_device(dev) }, name)
    });
    // SAFETY: the list came from ibv_get_device_list and is freed once.
    unsafe { ibv_free_device_list(list) };
    let Some((ctx, name)) = opened else {
        return Err(Error::Unsupported(match want {
            Some((w, _)) => format!("rank {rank}: no RDMA device named {w} (BRAID_IB_HCA)"),
            None => format!("rank {rank}: no RDMA device found"),
        }));
    };
    if ctx.is_null() {
        return Err(os_err(rank, None, &format!("ibv_open_device({name})")));
    }
    let mut dev = Device { ctx, rank, port, lid: 0, gid: [0; 16], gid_index: 0, mtu: 0, roce: false, name };
    // SAFETY: zeroes are a valid ibv_port_attr (plain integers).
    let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: a live context and a valid out-pointer of the size the call is told.
    if unsafe { ___ibv_query_port(ctx, port, &mut attr) } != 0 {
        return Err(os_err(rank, None, &format!("ibv_query_port({}, port {port})", dev.name)));
    }
    if attr.state != ibv_port_state::IBV_PORT_ACTIVE {
        return Err(Error::Unsupported(format!(
            "rank {rank}: port {port} of RDMA device {} is not active (state {})",
            dev.name, attr.state
        )));
    }
    dev.lid = attr.lid;
    dev.mtu = attr.active_mtu.clamp(1, 5) as u8;
    dev.roce = attr.link_layer == LINK_LAYER_ETHERNET;
    dev.gid_index = cfg.ib_gid_index;
    // SAFETY: zeroes are a valid ibv_gid (16 bytes).
    let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: a live context and a valid out-pointer.
    if unsafe { ibv_query_gid(ctx, port, dev.gid_index as i32, &mut gid) } != 0 {
        return Err(os_err(rank, None, &format!("ibv_query_gid({}, index {})", dev.name, dev.gid_index)));
    }
    // SAFETY: every bit pattern of the union is a valid byte array.
    dev.gid = unsafe { gid.raw };
    Ok(Arc::new(dev))
}

/// A registered memory region, deregistered on drop.
pub struct Mr {
    mr: *mut ibv_mr,
    _pd: Arc<Pd>,
}

// SAFETY: an MR handle may be used and freed from any thread.
unsafe impl Send for Mr {}

impl Mr {
    /// Register `[addr, addr + len)` in `pd` with `access`.
    ///
    /// # Safety
    /// The range must stay allocated while the registration lives (the device may
    /// write it when `access` allows remote or local writes).
    pub(crate) unsafe fn register(pd: &Arc<Pd>, addr: *mut u8, len: usize, access: ibv_access_flags) -> Option<Mr> {
        // SAFETY: the caller keeps the range allocated; pd is live (held by `pd`).
        let mr = unsafe { ibv_reg_mr(pd.pd, addr.cast(), len, access.0 as i32) };
        (!mr.is_null()).then(|| Mr { mr, _pd: pd.clone() })
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).lkey }
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by `register`, deregistered once. After this returns
        // the device no longer touches the range.
        unsafe { ibv_dereg_mr(self.mr) };
    }
}

/// A completion queue and a reliable-connected queue pair to one peer.
pub(crate) struct QueuePair {
    pub(crate) qp: *mut ibv_qp,
    pub(crate) cq: *mut ibv_cq,
    pub(crate) psn: u32,
    pd: Arc<Pd>,
}

// SAFETY: queue pairs and CQs may be used from any thread; this one is used by one
// channel at a time (the executor holds it by &mut).
unsafe impl Send for QueuePair {}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created in `create`, destroyed once, the QP before its CQ.
        unsafe {
            ibv_destroy_qp(self.qp);
            ibv_destroy_cq(self.cq);
        }
    }
}

impl QueuePair {
    /// A queue pair in `pd`, in INIT state, with room for the protocol's work requests.
    pub(crate) fn create(pd: &Arc<Pd>, spec: &RingSpec, rank: usize, peer: usize) -> Result<QueuePair> {
        let dev = &pd.dev;
        let depth = (spec.send_wrs() + spec.recv_wrs()) as i32;
        // SAFETY: a live context; no completion channel, no context pointer.
        let cq = unsafe { ibv_create_cq(dev.ctx, depth, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(os_err(rank, Some(peer), "ibv_create_cq"));
        }
        // SAFETY: zeroes are a valid ibv_qp_init_attr (null pointers, zero counts).
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = spec.send_wrs() as u32;
        init.cap.max_recv_wr = spec.recv_wrs() as u32;
        init.cap.max_send_sge = 2;
        init.cap.max_recv_sge = 1;
        // SAFETY: a live PD and a filled-in attribute struct.
        let qp = unsafe { ibv_create_qp(pd.pd, &mut init) };
        if qp.is_null() {
            let e = os_err(rank, Some(peer), "ibv_create_qp");
            // SAFETY: the CQ is not used after this.
            unsafe { ibv_destroy_cq(cq) };
            return Err(e);
        }
        let psn = u32::from_le_bytes(crate::auth::random_bytes::<4>()) & 0xff_ffff;
        let q = QueuePair { qp, cq, psn, pd: pd.clone() };
        // SAFETY: zeroes are a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = dev.port;
        a.qp_access_flags = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0 | ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        q.modify(&mut a, mask, rank, peer, "ibv_modify_qp(INIT)")?;
        Ok(q)
    }

    fn modify(&self, a: &mut ibv_qp_attr, mask: ibv_qp_attr_mask, rank: usize, peer: usize, what: &str) -> Result<()> {
        // SAFETY: a live QP and a filled-in attribute struct.
        let rc = unsafe { ibv_modify_qp(self.qp, a, mask.0 as i32) };
        if rc != 0 {
            // ibv_modify_qp returns the errno (not -1 with errno set).
            return Err(Error::io(
                format!("rank {rank}: rdma {what} for peer {peer}"),
                io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }

    /// Connect to the peer's queue pair: INIT → RTR → RTS.
    pub(crate) fn connect(&self, remote: &Endpoint, rank: usize, peer: usize) -> Result<()> {
        let dev = &self.pd.dev;
        // SAFETY: zeroes are a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = dev.mtu.min(remote.mtu) as ibv_mtu::Type;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.port_num = dev.port;
        // RoCE (and ports without a LID) route by GID; InfiniBand within a subnet by LID.
        if dev.roce || dev.lid == 0 {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            a.ah_attr.grh.sgid_index = dev.gid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, mask, rank, peer, "ibv_modify_qp(RTR)")?;
        // SAFETY: zeroes are a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        // 7: retry forever when the peer has no receive posted (it always reposts).
        a.rnr_retry = 7;
        a.sq_psn = self.psn;
        a.max_rd_atomic = 1;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, rank, peer, "ibv_modify_qp(RTS)")
    }

    /// To the error state: outstanding work requests complete flushed.
    fn halt(&self) -> io::Result<()> {
        // SAFETY: zeroes are a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: a live QP and a filled-in attribute struct.
        let rc = unsafe { ibv_modify_qp(self.qp, &mut a, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// Post `n` receive work requests without buffers (every message is a WRITE
    /// WITH IMMEDIATE: the data goes to the ring, the completion says where).
    fn post_recvs(&self, n: usize) -> io::Result<()> {
        for _ in 0..n {
            // SAFETY: zeroes are a valid ibv_recv_wr (no SGE list, no next).
            let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
            let mut bad = std::ptr::null_mut();
            // SAFETY: a live QP; the WR lives across the call, which copies it.
            let rc = unsafe { ibv_post_recv(self.qp, &mut wr, &mut bad) };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        Ok(())
    }

    /// Post a signalled RDMA WRITE WITH IMMEDIATE of `sges` to `remote_addr`.
    ///
    /// # Safety
    /// Every entry must lie in a registered region that stays registered (and its
    /// memory allocated and unchanged) until the work request completes.
    unsafe fn post_write(&self, wr_id: u64, sges: &[Sge], imm: u32, remote_addr: u64, rkey: u32) -> io::Result<()> {
        let mut list = [ibv_sge { addr: 0, length: 0, lkey: 0 }; 2];
        if sges.len() > list.len() {
            return Err(io::Error::other(format!("a gather list of {} entries (at most 2)", sges.len())));
        }
        for (d, s) in list.iter_mut().zip(sges) {
            *d = ibv_sge { addr: s.addr, length: s.len, lkey: s.lkey };
        }
        // SAFETY: zeroes are a valid ibv_send_wr (null pointers, zero counts).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = if sges.is_empty() { std::ptr::null_mut() } else { list.as_mut_ptr() };
        wr.num_sge = sges.len() as i32;
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = rkey;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP; the WR and gather list live across the call, which
        // copies them; the caller vouches for the memory they name.
        let rc = unsafe { ibv_post_send(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// Poll up to `wcs.len()` completions; returns how many were written.
    fn poll(&self, wcs: &mut [ibv_wc]) -> io::Result<usize> {
        // SAFETY: a live CQ and an array of that many completion records.
        let n = unsafe { ibv_poll_cq(self.cq, wcs.len() as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq failed ({n})")));
        }
        Ok(n as usize)
    }
}

/// The text of a completion status.
fn status_text(status: ibv_wc_status::Type) -> String {
    // SAFETY: returns a static NUL-terminated string for any value.
    let s = unsafe { ibv_wc_status_str(status) };
    if s.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null, static, NUL-terminated.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// Zeroed completion records to poll into.
fn wc_buffer(n: usize) -> Vec<ibv_wc> {
    // SAFETY: zeroes are a valid ibv_wc (integers and a union of integers).
    (0..n).map(|_| unsafe { std::mem::zeroed() }).collect()
}

/// The endpoint this rank publishes for `qp` and the ring at `ring` (`ring_rkey`).
fn local_endpoint(dev: &Device, qp: &QueuePair, ring: u64, ring_rkey: u32, spec: &RingSpec) -> Endpoint {
    // SAFETY: a live QP; qp_num is set at creation and never changes.
    let qpn = unsafe { (*qp.qp).qp_num };
    Endpoint {
        lid: dev.lid,
        qpn,
        psn: qp.psn,
        gid: dev.gid,
        mtu: dev.mtu,
        ring_addr: ring,
        rkey: ring_rkey,
        slots: spec.slots as u32,
        payload_bytes: spec.payload_bytes as u32,
    }
}

/// The [`Nic`] of one queue pair: what [`RdmaChannel`] runs on over hardware.
pub struct VerbsNic {
    qp: QueuePair,
    wcs: Vec<ibv_wc>,
}

impl Nic for VerbsNic {
    type Mr = Mr;

    fn lkey(mr: &Mr) -> u32 {
        mr.lkey()
    }

    unsafe fn register(&mut self, addr: usize, len: usize) -> std::result::Result<Mr, String> {
        // SAFETY: the caller keeps the range allocated while the registration
        // lives; local-read access only, so the device never writes it. In the
        // queue pair's own domain: no other queue pair may use it.
        unsafe { Mr::register(&self.qp.pd, addr as *mut u8, len, ibv_access_flags(0)) }
            .ok_or_else(|| format!("ibv_reg_mr of {len} bytes: {}", io::Error::last_os_error()))
    }

    fn post_recvs(&mut self, n: usize) -> io::Result<()> {
        self.qp.post_recvs(n)
    }

    unsafe fn post_write(&mut self, wr_id: u64, sges: &[Sge], imm: u32, remote_addr: u64, rkey: u32) -> io::Result<()> {
        // SAFETY: forwarded: the caller vouches for the gather list.
        unsafe { self.qp.post_write(wr_id, sges, imm, remote_addr, rkey) }
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<()> {
        loop {
            let n = self.qp.poll(&mut self.wcs)?;
            for wc in &self.wcs[..n] {
                out.push(if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                    // Only wr_id and status are defined in an error completion.
                    Completion::Failed { wr_id: wc.wr_id, status: status_text(wc.status) }
                } else if wc.opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
                    // SAFETY: a receive completion of a write with immediate carries
                    // the immediate in the union; any bits are a valid u32.
                    let imm = u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
                    Completion::Recv { imm, byte_len: wc.byte_len }
                } else {
                    Completion::Sent { wr_id: wc.wr_id }
                });
            }
            if n < self.wcs.len() {
                return Ok(());
            }
        }
    }

    fn halt(&mut self) -> io::Result<()> {
        self.qp.halt()
    }
}

/// Completions taken per poll.
const POLL_BATCH: usize = 32;

/// The [`Adapter`] of an opened device.
pub(crate) struct Verbs(Arc<Device>);

impl Adapter for Verbs {
    type Pd = Arc<Pd>;
    type Nic = VerbsNic;

    fn alloc_pd(&self, peer: usize) -> Result<Arc<Pd>> {
        let dev = &self.0;
        // SAFETY: a live context.
        let pd = unsafe { ibv_alloc_pd(dev.ctx) };
        if pd.is_null() {
            return Err(os_err(dev.rank, Some(peer), &format!("ibv_alloc_pd({})", dev.name)));
        }
        Ok(Arc::new(Pd { pd, dev: dev.clone() }))
    }

    fn create_qp(&self, pd: &Arc<Pd>, spec: &RingSpec, peer: usize) -> Result<VerbsNic> {
        Ok(VerbsNic { qp: QueuePair::create(pd, spec, self.0.rank, peer)?, wcs: wc_buffer(POLL_BATCH) })
    }

    unsafe fn register(
        &self,
        pd: &Arc<Pd>,
        addr: *mut u8,
        len: usize,
        remote_write: bool,
        peer: usize,
    ) -> Result<(Mr, u32)> {
        let (access, what) = if remote_write {
            (
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
                "ibv_reg_mr (receive ring)",
            )
        } else {
            (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE, "ibv_reg_mr (staging)")
        };
        // SAFETY: the caller keeps the range allocated while it is registered.
        let mr = unsafe { Mr::register(pd, addr, len, access) }.ok_or_else(|| os_err(self.0.rank, Some(peer), what))?;
        let rkey = mr.rkey();
        Ok((mr, rkey))
    }

    fn endpoint(&self, nic: &VerbsNic, ring_addr: u64, rkey: u32, spec: &RingSpec) -> Endpoint {
        local_endpoint(&self.0, &nic.qp, ring_addr, rkey, spec)
    }

    fn connect(&self, nic: &mut VerbsNic, remote: &Endpoint, peer: usize) -> Result<()> {
        nic.qp.connect(remote, self.0.rank, peer)
    }
}

/// Verbs channels to every peer marked in `req.peers` (None elsewhere), on the
/// first device (or the one `BRAID_IB_HCA` names): see [`connect_over`].
pub fn connect(req: &ConnectRequest) -> Result<Vec<Option<RdmaChannel<VerbsNic>>>> {
    let dev = open_device(req.rank, req.config)?;
    tracing::debug!(rank = req.rank, device = dev.name, port = dev.port, roce = dev.roce, "rdma device opened");
    connect_over(&Verbs(dev), req.rank, req.world, &req.peers, RingSpec::DEFAULT, req.store, req.config.timeout)
}
