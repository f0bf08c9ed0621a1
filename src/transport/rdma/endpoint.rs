//! The endpoint record a rank publishes under `rdma/{rank}` of the communicator's
//! store: for every peer it links with over verbs, the queue pair that peer must
//! connect to and the receive ring it may write.
//!
//! ```text
//! 0 magic "BRV1"   4 world u32   then `world` entries of ENTRY_LEN bytes:
//!  0 present u8  1 mtu u8 (ibv_mtu code 1..=5)  2 reserved u16 (zero)
//!  4 lid u16     6 reserved u16 (zero)
//!  8 qpn u32    12 psn u32     16 gid [u8; 16]
//! 32 ring address u64   40 ring rkey u32   44 slots u32   48 slot payload u32
//! 52 reserved u32 (zero)
//! ```
//! Little-endian. The store is untrusted input: a record is accepted only with the
//! exact length, the magic, zero reserved bytes, in-range fields and the ring
//! layout this rank uses.

use super::protocol::RingSpec;

const MAGIC: &[u8; 4] = b"BRV1";
/// Bytes of one entry.
pub const ENTRY_LEN: usize = 56;
const FIXED: usize = 8;

/// How a peer's queue pair and ring are reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Local identifier of the port (InfiniBand; zero on RoCE).
    pub lid: u16,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number (24 bits).
    pub psn: u32,
    /// Global identifier of the port (RoCE, or routed InfiniBand).
    pub gid: [u8; 16],
    /// Active MTU of the port, as an `ibv_mtu` code (1: 256 bytes .. 5: 4096).
    pub mtu: u8,
    /// Address of the receive ring the peer writes.
    pub ring_addr: u64,
    /// Remote key of the ring's memory region.
    pub rkey: u32,
    /// Ring layout: slots.
    pub slots: u32,
    /// Ring layout: slot payload bytes.
    pub payload_bytes: u32,
}

/// The record of a rank with `entries[p]` for every peer `p` it links with.
pub fn encode(entries: &[Option<Endpoint>]) -> Vec<u8> {
    let mut b = Vec::with_capacity(FIXED + entries.len() * ENTRY_LEN);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in entries {
        let mut x = [0u8; ENTRY_LEN];
        if let Some(e) = e {
            x[0] = 1;
            x[1] = e.mtu;
            x[4..6].copy_from_slice(&e.lid.to_le_bytes());
            x[8..12].copy_from_slice(&e.qpn.to_le_bytes());
            x[12..16].copy_from_slice(&e.psn.to_le_bytes());
            x[16..32].copy_from_slice(&e.gid);
            x[32..40].copy_from_slice(&e.ring_addr.to_le_bytes());
            x[40..44].copy_from_slice(&e.rkey.to_le_bytes());
            x[44..48].copy_from_slice(&e.slots.to_le_bytes());
            x[48..52].copy_from_slice(&e.payload_bytes.to_le_bytes());
        }
        b.extend_from_slice(&x);
    }
    b
}

/// The entry for rank `me` in the record `raw` that a peer published, checked
/// against the world size and this rank's ring layout. The error says what is wrong.
pub fn decode_for(raw: &[u8], world: usize, me: usize, spec: &RingSpec) -> Result<Endpoint, String> {
    if raw.len() != FIXED + world * ENTRY_LEN || &raw[..4] != MAGIC {
        return Err(format!(
            "an endpoint record of {} bytes (a record for {world} ranks is {} bytes starting with {MAGIC:?})",
            raw.len(),
            FIXED + world * ENTRY_LEN
        ));
    }
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    if u32_at(raw, 4) as usize != world {
        return Err(format!("an endpoint record for {} ranks in a world of {world}", u32_at(raw, 4)));
    }
    if me >= world {
        return Err(format!("rank {me} is not below world size {world}"));
    }
    let x = &raw[FIXED + me * ENTRY_LEN..FIXED + (me + 1) * ENTRY_LEN];
    if x[0] != 1 {
        return Err(format!("no queue pair for rank {me} in the record"));
    }
    if x[2..4] != [0, 0] || x[6..8] != [0, 0] || x[52..56] != [0; 4] {
        return Err("reserved bytes of the endpoint record are not zero".into());
    }
    let e = Endpoint {
        lid: u16::from_le_bytes([x[4], x[5]]),
        qpn: u32_at(x, 8),
        psn: u32_at(x, 12),
        gid: x[16..32].try_into().expect("16 bytes"),
        mtu: x[1],
        ring_addr: u64::from_le_bytes(x[32..40].try_into().expect("8 bytes")),
        rkey: u32_at(x, 40),
        slots: u32_at(x, 44),
        payload_bytes: u32_at(x, 48),
    };
    if e.qpn >= 1 << 24 || e.psn >= 1 << 24 {
        return Err(format!("queue pair number {:#x} or sequence number {:#x} exceeds 24 bits", e.qpn, e.psn));
    }
    if !(1..=5).contains(&e.mtu) {
        return Err(format!("MTU code {} (1 to 5)", e.mtu));
    }
    if e.slots as usize != spec.slots || e.payload_bytes as usize != spec.payload_bytes {
        return Err(format!(
            "a receive ring of {} slots of {} bytes where this rank uses {} of {}",
            e.slots, e.payload_bytes, spec.slots, spec.payload_bytes
        ));
    }
    if e.ring_addr == 0 || e.ring_addr.checked_add(spec.ring_bytes() as u64).is_none() {
        return Err(format!("a receive ring at address {:#x}", e.ring_addr));
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(qpn: u32) -> Endpoint {
        Endpoint {
            lid: 7,
            qpn,
            psn: 0x12345,
            gid: [9; 16],
            mtu: 5,
            ring_addr: 0x7f00_0000_1000,
            rkey: 0xdead,
            slots: RingSpec::DEFAULT.slots as u32,
            payload_bytes: RingSpec::DEFAULT.payload_bytes as u32,
        }
    }

    #[test]
    fn records_round_trip_per_peer() {
        let raw = encode(&[None, Some(sample(11)), Some(sample(12))]);
        assert_eq!(raw.len(), 8 + 3 * ENTRY_LEN);
        let spec = RingSpec::DEFAULT;
        assert_eq!(decode_for(&raw, 3, 1, &spec), Ok(sample(11)));
        assert_eq!(decode_for(&raw, 3, 2, &spec), Ok(sample(12)));
        assert!(decode_for(&raw, 3, 0, &spec).unwrap_err().contains("no queue pair for rank 0"));
    }

    #[test]
    fn forged_records_are_refused_with_the_reason() {
        let spec = RingSpec::DEFAULT;
        let good = encode(&[Some(sample(1)), None]);
        let mutate = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            decode_for(&b, 2, 0, &spec).unwrap_err()
        };
        assert!(decode_for(&good[..good.len() - 1], 2, 0, &spec).unwrap_err().contains("record of"));
        assert!(decode_for(&good, 3, 0, &spec).unwrap_err().contains("record of"));
        assert!(mutate(0, b'X').contains("record of"));
        assert!(mutate(4, 9).contains("for 9 ranks"));
        assert!(mutate(8 + 2, 1).contains("reserved"));
        assert!(mutate(8 + 52, 1).contains("reserved"));
        assert!(mutate(8 + 11, 1).contains("24 bits"));
        assert!(mutate(8 + 1, 6).contains("MTU"));
        assert!(mutate(8 + 44, 9).contains("9 slots"));
        let mut zero_ring = sample(1);
        zero_ring.ring_addr = 0;
        assert!(decode_for(&encode(&[Some(zero_ring)]), 1, 0, &spec).unwrap_err().contains("address 0x0"));
        let mut wrap = sample(1);
        wrap.ring_addr = u64::MAX - 10;
        assert!(decode_for(&encode(&[Some(wrap)]), 1, 0, &spec).is_err());
        assert!(decode_for(&good, 2, 2, &spec).unwrap_err().contains("not below"));
    }
}
