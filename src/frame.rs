//! Wire frames: a fixed 40-byte header in front of every message on every link.
//!
//! ```text
//!  0 magic u16 "BR"   2 version u8   3 kind u8 (data, abort, goodbye, rendezvous, ack, wait query, wait reply)
//!  4 communicator id u32
//!  8 sequence number u64 (collectives: per communicator; send/recv: per peer)
//! 16 op u8  17 dtype u8  18 reduce op u8  19 epoch u8
//! 20 root (rooted collectives) / tag (send/recv) u32
//! 24 count u64
//! 32 payload length u32   36 algorithm u8 (bit 7: reproducible mode)   37 reserved (3 bytes, zero)
//! ```
//! Little-endian. Every data frame repeats the call's signature, so a rank that
//! receives a frame of another call reports both calls instead of corrupting data.
//! A send's frames carry its tag where collectives carry the root: the peer a
//! send names is the rank that receives the frame, which knows who it is.
//!
//! The payload of a data or rendezvous frame is followed by zero bytes up to a
//! multiple of [`PAYLOAD_ALIGN`] (not counted in the length field). With the header
//! a multiple of it too, every payload starts 8-aligned in the stream, so a
//! receiver can reduce straight out of a shared ring with aligned vector loads.
//! Control frames (abort, goodbye, ack, wait query and reply) are not padded.

use crate::types::{CallSig, DType, OpKind, ReduceOp};

/// Header length in bytes.
pub const HEADER_LEN: usize = 40;
/// Protocol version; bumped when the header or the framing changes.
pub const VERSION: u8 = 4;
/// Data and rendezvous payloads are padded to a multiple of this many bytes.
pub const PAYLOAD_ALIGN: usize = 8;
const _: () = assert!(HEADER_LEN.is_multiple_of(PAYLOAD_ALIGN));

/// Zero bytes that follow a payload of `len` bytes in a frame of `kind`.
pub const fn padding(kind: FrameKind, len: usize) -> usize {
    match kind {
        FrameKind::Data | FrameKind::Rendezvous => (PAYLOAD_ALIGN - len % PAYLOAD_ALIGN) % PAYLOAD_ALIGN,
        _ => 0,
    }
}
const MAGIC: u16 = u16::from_le_bytes(*b"BR");

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A segment of a collective or send/recv.
    Data = 1,
    /// The sender failed; the payload is its error message (UTF-8).
    Abort = 2,
    /// The sender closed its communicator in an orderly way.
    Goodbye = 3,
    /// Single copy: instead of the data, where to read it in the sender's memory
    /// (payload: address u64, length u64). Answered with an [`FrameKind::Ack`].
    Rendezvous = 4,
    /// The receiver finished reading the sender's memory for the oldest
    /// unacknowledged rendezvous on this link.
    Ack = 5,
    /// The sender timed out waiting for the receiver and asks whom the receiver
    /// waits for (no payload). Answered with a [`FrameKind::WaitReply`] by a rank
    /// inside a call; see `executor::wait_chain`.
    WaitQuery = 6,
    /// The answer to a [`FrameKind::WaitQuery`]: the sender's call (sequence number
    /// and signature in the header) and the ranks it waits for (payload: u32 each).
    WaitReply = 7,
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub kind: FrameKind,
    /// Communicator id.
    pub comm_id: u32,
    /// Communicator epoch (bumped when a communicator is rebuilt).
    pub epoch: u8,
    /// Sequence number.
    pub seq: u64,
    /// The call this frame belongs to (meaningful for data frames).
    pub sig: CallSig,
    /// Payload bytes following the header.
    pub len: u32,
}

impl Header {
    /// Encode into the fixed wire layout.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.comm_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16] = self.sig.op as u8;
        b[17] = self.sig.dtype as u8;
        b[18] = self.sig.reduce_op as u8;
        b[19] = self.epoch;
        let root_or_tag = if self.sig.op.point_to_point() { self.sig.tag } else { self.sig.root };
        b[20..24].copy_from_slice(&root_or_tag.to_le_bytes());
        b[24..32].copy_from_slice(&self.sig.count.to_le_bytes());
        b[32..36].copy_from_slice(&self.len.to_le_bytes());
        b[36] = self.sig.algo;
        b
    }

    /// Decode, rejecting anything that is not a braid frame of this version.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(format!("bad magic {:02x?} (not a braid frame)", &b[0..4]));
        }
        if b[2] != VERSION {
            return Err(format!("protocol version {} (this build speaks {VERSION})", b[2]));
        }
        let kind = match b[3] {
            1 => FrameKind::Data,
            2 => FrameKind::Abort,
            3 => FrameKind::Goodbye,
            4 => FrameKind::Rendezvous,
            5 => FrameKind::Ack,
            6 => FrameKind::WaitQuery,
            7 => FrameKind::WaitReply,
            k => return Err(format!("unknown frame kind {k}")),
        };
        let op = OpKind::from_code(b[16]).ok_or_else(|| format!("unknown op code {}", b[16]))?;
        let dtype = DType::from_code(b[17]).ok_or_else(|| format!("unknown dtype code {}", b[17]))?;
        let reduce_op = ReduceOp::from_code(b[18]).ok_or_else(|| format!("unknown reduce op code {}", b[18]))?;
        let algo = b[36] & !crate::types::REPRODUCIBLE;
        if algo != 0 && crate::algorithm::Algorithm::from_code(algo).is_none() {
            return Err(format!("unknown algorithm code {}", b[36]));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        // A send/recv's peer is not on the wire (it is the receiving rank): 0 here.
        let (root, tag) = if op.point_to_point() { (0, u32_at(20)) } else { (u32_at(20), 0) };
        Ok(Header {
            kind,
            comm_id: u32_at(4),
            epoch: b[19],
            seq: u64_at(8),
            sig: CallSig { op, dtype, count: u64_at(24), root, reduce_op, algo: b[36], tag },
            len: u32_at(32),
        })
    }

    /// A control frame (abort or goodbye) with a payload of `len` bytes.
    pub fn control(kind: FrameKind, comm_id: u32, epoch: u8, len: u32) -> Header {
        Header { kind, comm_id, epoch, seq: 0, sig: CallSig::new(OpKind::Barrier, DType::U8, 0, 0, ReduceOp::Sum), len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_and_rendezvous_payloads_are_padded_to_eight_bytes() {
        assert_eq!(padding(FrameKind::Data, 0), 0);
        assert_eq!(padding(FrameKind::Data, 1), 7);
        assert_eq!(padding(FrameKind::Data, 194), 6);
        assert_eq!(padding(FrameKind::Rendezvous, 25), 7);
        assert_eq!(padding(FrameKind::Data, 1 << 20), 0);
        assert_eq!(padding(FrameKind::Abort, 3), 0);
        assert_eq!(padding(FrameKind::Ack, 0), 0);
    }

    #[test]
    fn round_trip_and_garbage() {
        let h = Header {
            kind: FrameKind::Data,
            comm_id: 0xdead_beef,
            epoch: 3,
            seq: 1 << 40,
            sig: CallSig::new(OpKind::Reduce, DType::BF16, 12345, 7, ReduceOp::Max),
            len: 65536,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(Header::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = h.encode();
        bad[2] = 9;
        assert!(Header::decode(&bad).unwrap_err().contains("version"));
        let mut bad = h.encode();
        bad[17] = 200;
        assert!(Header::decode(&bad).unwrap_err().contains("dtype"));
    }

    /// A send's frame carries its tag (all 32 bits) where a collective carries its
    /// root; its peer is the rank that reads the frame, so it is not on the wire.
    #[test]
    fn a_send_carries_its_tag_and_a_broadcast_its_root() {
        let send = CallSig::new(OpKind::Send, DType::F32, 9, 5, ReduceOp::Sum).with_tag(0xfeed_beef);
        let h = Header { kind: FrameKind::Data, comm_id: 1, epoch: 0, seq: 4, sig: send, len: 36 };
        let got = Header::decode(&h.encode()).unwrap().sig;
        assert_eq!((got.tag, got.root, got.count), (0xfeed_beef, 0, 9));
        let bcast = CallSig::new(OpKind::Broadcast, DType::F32, 9, 5, ReduceOp::Sum).with_tag(7);
        let h = Header { sig: bcast, ..h };
        let got = Header::decode(&h.encode()).unwrap().sig;
        assert_eq!((got.tag, got.root), (0, 5), "only send/recv carry a tag");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn kind() -> impl Strategy<Value = FrameKind> {
            prop_oneof![
                Just(FrameKind::Data),
                Just(FrameKind::Abort),
                Just(FrameKind::Goodbye),
                Just(FrameKind::Rendezvous),
                Just(FrameKind::Ack),
                Just(FrameKind::WaitQuery),
                Just(FrameKind::WaitReply),
            ]
        }

        fn code<T: Copy + std::fmt::Debug + 'static>(from: fn(u8) -> Option<T>) -> impl Strategy<Value = T> {
            let all: Vec<T> = (0..=u8::MAX).filter_map(from).collect();
            proptest::sample::select(all)
        }

        fn header() -> impl Strategy<Value = Header> {
            let sig = (
                code(OpKind::from_code),
                code(DType::from_code),
                any::<u64>(),
                any::<u32>(),
                code(ReduceOp::from_code),
                0..=crate::algorithm::Algorithm::ALL.len() as u8,
                any::<bool>(),
            )
                .prop_map(|(op, dtype, count, root_or_tag, reduce_op, algo, reproducible)| CallSig {
                    op,
                    dtype,
                    count,
                    // The wire carries a send/recv's tag in place of its peer.
                    root: if op.point_to_point() { 0 } else { root_or_tag },
                    reduce_op,
                    algo: algo | if reproducible { crate::types::REPRODUCIBLE } else { 0 },
                    tag: if op.point_to_point() { root_or_tag } else { 0 },
                });
            (kind(), any::<u32>(), any::<u8>(), any::<u64>(), sig, any::<u32>())
                .prop_map(|(kind, comm_id, epoch, seq, sig, len)| Header { kind, comm_id, epoch, seq, sig, len })
        }

        proptest! {
            #[test]
            fn every_valid_header_round_trips(h in header()) {
                prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
            }

            #[test]
            fn arbitrary_bytes_never_panic_and_decode_only_what_encodes_back(
                b in proptest::array::uniform32(any::<u8>()),
                tail in any::<[u8; 8]>(),
                framed in any::<bool>(),
            ) {
                let mut raw = [0u8; HEADER_LEN];
                raw[..32].copy_from_slice(&b);
                raw[32..].copy_from_slice(&tail);
                if framed {
                    // Mostly plausible frames, so the decoder's later checks run too.
                    raw[0..2].copy_from_slice(&MAGIC.to_le_bytes());
                    raw[2] = VERSION;
                    raw[3] %= 9;
                    raw[16] %= 16;
                    raw[17] %= 12;
                    raw[18] %= 8;
                    raw[36] %= 16;
                }
                if let Ok(h) = Header::decode(&raw) {
                    // Everything but the reserved bytes is read back exactly.
                    prop_assert_eq!(&h.encode()[..37], &raw[..37]);
                }
            }

            #[test]
            fn a_valid_header_with_one_bad_identity_byte_is_rejected(h in header(), at in 0usize..4, x in any::<u8>()) {
                let mut raw = h.encode();
                prop_assume!(raw[at] != x);
                raw[at] = x;
                // Magic, version and kind: any change is refused, except one kind for another.
                let other_kind = at == 3 && (1..=7).contains(&x);
                prop_assert_eq!(Header::decode(&raw).is_ok(), other_kind);
            }
        }
    }
}
