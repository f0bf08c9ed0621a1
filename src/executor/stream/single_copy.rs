//! The single-copy half of the stream channel: describing a transfer in a rendezvous
//! frame, and pulling it straight out of the peer's memory on the other side —
//! from a mapped registered segment (no system call) or through the link's
//! `read_peer` (`process_vm_readv`, or a plain copy between threads).

use std::io;

use super::{CallInfo, InMsg, StreamChannel, SEGMENT_BYTES};
use crate::error::{Error, Result};
use crate::reduce;

pub(super) use super::rendezvous::{describe, parse_descriptor, Desc, SingleCopy, DESC_FIXED, DESC_MAX};

/// Single copy: read a rendezvous transfer straight from the peer's memory —
/// into place for a plain receive, or chunk by chunk through a cache-sized staging
/// buffer that is reduced while still hot.
pub(super) fn pull_from_peer(ch: &mut StreamChannel, m: &mut InMsg, peer: usize, call: &CallInfo) -> Result<()> {
    // A copy (at most DESC_MAX bytes), so `m` stays free for the pull below.
    let raw = m.desc;
    let desc = parse_descriptor(&raw[..m.desc_got], m.len).map_err(|detail| Error::Protocol {
        ctx: call.ctx.clone(),
        peer,
        detail,
    })?;
    let Desc { addr, len, offset, name } = desc;
    let lost = |e: io::Error| Error::PeerLost {
        ctx: call.ctx.clone(),
        peer,
        detail: format!("reading its memory failed: {e}"),
    };
    if let Some(name) = name {
        if pull_registered(ch, m, name, offset, addr, lost)? {
            tracing::trace!(peer, bytes = len, "single copy from the peer's registered segment {name}");
            return Ok(());
        }
    }
    tracing::trace!(peer, bytes = len, "single copy through the link ({})", ch.link.kind());
    let Some(src) = m.src else {
        // SAFETY: dst..dst+len is a live region of this rank's buffers.
        let dst = unsafe { std::slice::from_raw_parts_mut(m.dst, len) };
        // One kernel copy straight into place. (Pulling through a cached chunk
        // and streaming it out measured slower here: the extra pass costs more
        // than the destination reads it saves.)
        return ch.link.read_peer(addr, dst).map_err(lost);
    };
    let chunk = ch.tuning.peer_chunk;
    if ch.staging.len() < chunk {
        ch.staging.resize(chunk.max(SEGMENT_BYTES), 0);
    }
    let op = m.op;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(chunk);
        ch.link.read_peer(addr + off, &mut ch.staging[..n]).map_err(lost)?;
        let inc = &ch.staging[..n];
        // SAFETY: [off, off+n) lies inside the step's dst and src ranges; src is
        // either the same memory as dst or disjoint from it (checked when queued).
        unsafe {
            let dst = std::slice::from_raw_parts_mut(m.dst.add(off), n);
            if std::ptr::eq(src, m.dst) {
                reduce::reduce_inplace(m.dtype, op, dst, inc)?;
            } else {
                reduce::reduce_into(m.dtype, op, dst, std::slice::from_raw_parts(src.add(off), n), inc)?;
            }
        }
        off += n;
    }
    m.got = len;
    Ok(())
}

/// Zero copy from a peer's registered segment, mapped once per link: copy or
/// reduce straight out of the mapping, while the link says the peer still exposes
/// `addr` (where the data lies in its address space; [`Link::read_peer_with`]).
/// Returns false when the segment cannot be mapped here, so the caller falls back
/// to reading through the kernel; a refusal is an error made by `refused`.
fn pull_registered(
    ch: &mut StreamChannel,
    m: &mut InMsg,
    name: &str,
    offset: usize,
    addr: usize,
    refused: impl FnOnce(io::Error) -> Error,
) -> Result<bool> {
    let seg = match ch.peer_segments.get_or_open(name) {
        Ok(seg) => seg,
        Err(e) => {
            tracing::debug!("cannot map registered segment {name}: {e}; reading through the kernel");
            return Ok(false);
        }
    };
    let Some(peer) = seg.slice(offset, m.len) else { return Ok(false) };
    let (op, dtype, len, dst, src) = (m.op, m.dtype, m.len, m.dst, m.src);
    let mut reduced = Ok(());
    let mut copy = || {
        // SAFETY: dst (and src) are live regions of this rank's buffers; src is dst or disjoint.
        reduced = unsafe {
            let dst = std::slice::from_raw_parts_mut(dst, len);
            match src {
                None => {
                    reduce::copy_streaming(dst, peer);
                    Ok(())
                }
                Some(src) if std::ptr::eq(src, dst.as_ptr()) => reduce::reduce_inplace(dtype, op, dst, peer),
                Some(src) => reduce::reduce_into(dtype, op, dst, std::slice::from_raw_parts(src, len), peer),
            }
        };
    };
    match ch.link.read_peer_with(addr, len, &mut copy) {
        Err(e) if e.kind() == io::ErrorKind::Unsupported => return Ok(false),
        Err(e) => return Err(refused(e)),
        Ok(()) => reduced?,
    }
    m.got = m.len;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::super::rendezvous::encode_descriptor;
    use super::*;
    use crate::config::defaults::RENDEZVOUS_BYTES;
    use crate::transport::Link;
    use proptest::prelude::*;

    fn name_strategy() -> impl Strategy<Value = String> {
        "[a-z0-9-]{1,54}".prop_map(|tail| format!("braid-reg-{tail}"))
    }

    #[test]
    fn a_real_descriptor_parses() {
        let (d, n) = encode_descriptor(0x7f00_0000_1000, 1 << 20, Some(("braid-reg-12-3-ab", 4096)));
        let desc = parse_descriptor(&d[..n], 1 << 20).unwrap();
        assert_eq!(desc, Desc { addr: 0x7f00_0000_1000, len: 1 << 20, offset: 4096, name: Some("braid-reg-12-3-ab") });
        let (d, n) = encode_descriptor(0x1000, 200_000, None);
        assert_eq!(parse_descriptor(&d[..n], 200_000).unwrap().name, None);
    }

    #[test]
    fn lies_are_rejected() {
        let (d, n) = encode_descriptor(0x1000, 4096, Some(("braid-reg-1-2-3", 0)));
        assert!(parse_descriptor(&d[..n], 4097).unwrap_err().contains("expects 4097"));
        let mut bad = d;
        bad[24] += 1; // name length longer than the payload
        assert!(parse_descriptor(&bad[..n], 4096).is_err());
        bad[24] = 200; // past any payload
        assert!(parse_descriptor(&bad[..n], 4096).is_err());
        let mut wrap = d;
        wrap[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse_descriptor(&wrap[..n], 4096).unwrap_err().contains("wraps"));
        let (d, n) = encode_descriptor(usize::MAX - 10, 4096, None);
        assert!(parse_descriptor(&d[..n], 4096).unwrap_err().contains("wraps"));
        for name in ["braid-ring-1", "braid-reg-", "braid-reg-../x", "braid-reg-a b", "braid-reg-\u{e9}", "../etc/pw"] {
            let (d, n) = encode_descriptor(0x1000, 64, Some((name, 0)));
            assert!(parse_descriptor(&d[..n], 64).unwrap_err().contains("not a braid"), "{name}");
        }
        let (mut d, n) = encode_descriptor(0x1000, 64, None);
        d[16] = 8; // an offset with no segment
        assert!(parse_descriptor(&d[..n], 64).is_err());
        assert!(parse_descriptor(&d[..DESC_FIXED - 1], 64).is_err());
        assert!(parse_descriptor(&[0u8; DESC_MAX + 1], 0).is_err());
    }

    /// Rank 0's channel to rank 1 and rank 1's bare link to rank 0, over shared
    /// memory with CMA (both ranks are threads here, so it always works).
    fn shm_pair() -> (StreamChannel, Box<dyn Link>) {
        use crate::bootstrap::{MemStore, Store};
        use crate::transport::shm::{connect_shm, ShmOptions};
        let store = MemStore::new();
        let mut links: Vec<_> = std::thread::scope(|s| {
            let store = &store as &dyn Store;
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    s.spawn(move || {
                        let mut o = ShmOptions::new(r, 2, "single-copy");
                        o.cma = true;
                        connect_shm(&o, store).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let (l01, l10) = (links[0][1].take().unwrap(), links[1][0].take().unwrap());
        assert!(l01.reads_peer_addresses(), "same-process CMA must work");
        (StreamChannel::new(Box::new(l01)), Box::new(l10))
    }

    #[test]
    fn plain_buffers_between_processes_go_single_copy_only_in_exchanges_by_default() {
        let (ch, l10) = shm_pair();
        // The default (exchanges only) on a CMA link between processes; `BRAID_CMA=1`
        // everywhere; without CMA only registered buffers.
        assert_eq!(SingleCopy::for_link(l10.as_ref(), true), SingleCopy::Exchanges);
        assert_eq!(SingleCopy::for_link(l10.as_ref(), false), SingleCopy::Always);
        drop(ch);
        let buf = vec![0u8; 1 << 20];
        let (p, n, t) = (buf.as_ptr(), buf.len(), RENDEZVOUS);
        assert!(SingleCopy::Exchanges.applies(p, n, n, t, true));
        assert!(!SingleCopy::Exchanges.applies(p, n, n, t, false), "a one-way transfer goes through the ring");
        assert!(!SingleCopy::Exchanges.applies(p, 4096, 4096, t, true), "below the threshold");
        assert!(SingleCopy::Always.applies(p, n, n, t, false));
        assert!(!SingleCopy::Registered.applies(p, n, n, t, true), "a plain buffer is not registered");
        assert!(!SingleCopy::Never.applies(p, n, n, t, true));
    }

    /// Under `BRAID_CMA=auto` a channel's exchanges follow its tuner's switch: out
    /// of the sender's memory while it is on, through the ring while it is off. A
    /// one-way send goes through the ring either way.
    #[test]
    fn exchanges_follow_the_tuners_switch() {
        use crate::frame::FrameKind;
        use crate::transport::stream_copy::TunerSwitch;
        let (mut ch, _peer) = shm_pair();
        assert_eq!(ch.single_copy, SingleCopy::Exchanges);
        let switch = TunerSwitch::default();
        ch.time_exchanges(&switch);
        let buf = vec![7u8; 1 << 20];
        let call = super::super::tests::call(0, buf.len());
        for (on, exchange, want) in
            [(true, true, FrameKind::Rendezvous), (false, true, FrameKind::Data), (true, false, FrameKind::Data)]
        {
            switch.set(on);
            super::super::outbound::queue_send(&mut ch, &call, buf.as_ptr(), buf.len(), None, exchange);
            assert!(!ch.out.is_empty());
            assert!(
                ch.out.iter().all(|m| m.kind == want),
                "switch {on}, exchange {exchange}: want every frame {want:?}"
            );
            ch.out.clear();
            ch.link.revoke_exposed();
            ch.exposed = false;
        }
    }

    /// Ranks need not choose alike under `BRAID_CMA=auto`: an exchange where one
    /// side sends single-copy and the other through the ring delivers both ways.
    #[test]
    fn an_exchange_half_single_copy_half_through_the_ring_delivers_both_ways() {
        use crate::executor::channel::{MemKind, MemRegion, PeerChannel};
        use crate::transport::stream_copy::TunerSwitch;
        let (ch, l10) = shm_pair();
        let (mut a, mut b) = (ch, StreamChannel::new(l10));
        let (on, off) = (TunerSwitch::default(), TunerSwitch::default());
        on.set(true);
        a.time_exchanges(&on);
        b.time_exchanges(&off);
        let n = 3 * RENDEZVOUS / 4 + 5;
        let info = super::super::tests::call(0, n);
        let host = |v: &mut Vec<f32>| MemRegion { ptr: v.as_mut_ptr().cast(), len: v.len() * 4, kind: MemKind::Host };
        let (mut from_a, mut from_b): (Vec<f32>, Vec<f32>) =
            ((0..n).map(|i| i as f32).collect(), (0..n).map(|i| -(i as f32)).collect());
        let (mut into_a, mut into_b) = (vec![0f32; n], vec![0f32; n]);
        a.post_recv(host(&mut into_a), None, None, &info).unwrap();
        b.post_recv(host(&mut into_b), None, None, &info).unwrap();
        a.next_send_is_exchange(true);
        a.post_send(host(&mut from_a), None, &info).unwrap();
        b.next_send_is_exchange(true);
        b.post_send(host(&mut from_b), None, &info).unwrap();
        assert!(a.exposed && !b.exposed, "rank 0 offers its memory, rank 1 writes to the ring");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while a.busy() || b.busy() {
            assert!(std::time::Instant::now() < deadline, "the exchange stalled");
            a.progress(1, &mut [], &info).unwrap();
            b.progress(0, &mut [], &info).unwrap();
        }
        assert_eq!(into_a, from_b);
        assert_eq!(into_b, from_a);
        a.end_call();
        b.end_call();
    }

    const RENDEZVOUS: usize = RENDEZVOUS_BYTES;

    /// Pull `len` bytes at `data` of rank 1 as the receive of a rendezvous frame.
    fn pull(ch: &mut StreamChannel, data: *const u8, len: usize, into: &mut [u8], reduce: bool) -> Result<()> {
        let mut m = InMsg::new(
            into.as_mut_ptr(),
            reduce.then_some(into.as_ptr()),
            len,
            crate::types::DType::U8,
            crate::types::ReduceOp::Max,
        );
        let (d, n) = describe(data, len);
        m.desc[..n].copy_from_slice(&d[..n]);
        m.desc_got = n;
        let call = super::super::tests::call(0, len);
        pull_from_peer(ch, &mut m, 1, &call)
    }

    #[test]
    fn a_pull_after_the_peer_revoked_fails_instead_of_reading_the_reused_memory() {
        let (mut ch, mut owner) = shm_pair();
        let len = 256 << 10;
        let mut plain = vec![3u8; len];
        let mut registered = crate::registered::SharedBuffer::<u8>::new(len).unwrap();
        registered.fill(3);
        for (what, buf) in [("plain (CMA)", &mut plain[..]), ("registered", &mut registered[..])] {
            for reduce in [false, true] {
                let data = buf.as_ptr();
                // SAFETY: revoked below before `buf` is rewritten.
                unsafe { owner.expose(data as usize, len) };
                let mut into = vec![1u8; len];
                pull(&mut ch, data, len, &mut into, reduce).unwrap();
                assert!(into.iter().all(|&b| b == 3), "{what}: the exposed bytes read wrong");
                // The owner's call ends early, and its caller reuses the buffer.
                owner.revoke_exposed();
                buf.fill(0xEE);
                into.fill(1);
                let r = pull(&mut ch, data, len, &mut into, reduce);
                let fresh = into.iter().filter(|&&b| b == 0xEE).count();
                match r {
                    Err(Error::PeerLost { peer: 1, detail, .. }) => assert!(detail.contains("expose"), "{detail}"),
                    other => panic!("{what}, reduce {reduce}: {other:?} ({fresh} bytes of the reused memory read)"),
                }
                buf.fill(3);
            }
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..DESC_MAX + 8), want in any::<usize>()) {
            let _ = parse_descriptor(&bytes, want);
        }

        #[test]
        fn arbitrary_fixed_parts_are_accepted_only_when_consistent(
            head in proptest::array::uniform25(any::<u8>()),
            name in proptest::option::of(name_strategy()),
            want in any::<usize>(),
        ) {
            let mut b = head.to_vec();
            b[24] = name.as_ref().map_or(head[24], |n| n.len() as u8);
            if let Some(n) = &name {
                b.extend_from_slice(n.as_bytes());
            }
            if let Ok(d) = parse_descriptor(&b, want) {
                prop_assert_eq!(d.len, want);
                prop_assert!(d.addr.checked_add(d.len).is_some());
                prop_assert!(d.offset.checked_add(d.len).is_some());
                prop_assert_eq!(DESC_FIXED + d.name.map_or(0, str::len), b.len());
                prop_assert!(d.name.is_none_or(|n| n.starts_with("braid-reg-")));
            }
        }

        #[test]
        fn every_valid_descriptor_round_trips(
            addr in 1usize..usize::MAX / 2,
            len in 0usize..usize::MAX / 2,
            reg in proptest::option::of((name_strategy(), 0usize..usize::MAX / 2)),
        ) {
            let (d, n) = encode_descriptor(addr, len, reg.as_ref().map(|(name, off)| (name.as_str(), *off)));
            let got = parse_descriptor(&d[..n], len).unwrap();
            prop_assert_eq!(got, Desc {
                addr,
                len,
                offset: reg.as_ref().map_or(0, |r| r.1),
                name: reg.as_ref().map(|r| r.0.as_str()),
            });
        }
    }
}
