//! Bucket planning: which consecutive requests share one collective. Pure (no I/O,
//! no clock), so every rank that submitted the same requests in the same order
//! plans the same buckets, and the tests check it without a communicator.

use std::ops::Range;

use crate::types::{DType, ReduceOp};

/// What planning needs to know of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Element type.
    pub dtype: DType,
    /// Reduce op.
    pub op: ReduceOp,
    /// Bytes of the tensor.
    pub bytes: usize,
}

/// Split `entries` (in submission order) into buckets: maximal runs of one dtype
/// and op whose bytes stay within `threshold`. A tensor larger than the threshold
/// goes alone, and a threshold of 0 puts every tensor alone (fusion off). Keeping
/// submission order (rather than packing best-fit) is what lets every rank agree
/// without exchanging anything but the cut.
pub fn buckets(entries: &[Entry], threshold: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0usize;
    for (i, e) in entries.iter().enumerate() {
        if i > start {
            let first = &entries[start];
            let same_kind = first.dtype == e.dtype && first.op == e.op;
            if !same_kind || bytes.saturating_add(e.bytes) > threshold {
                out.push(start..i);
                start = i;
                bytes = 0;
            }
        }
        bytes = bytes.saturating_add(e.bytes);
    }
    if start < entries.len() {
        out.push(start..entries.len());
    }
    out
}

/// A 62-bit fingerprint of a run of requests (FNV-1a over dtype, op and length):
/// ranks compare it before trusting a bucket, since two different layouts of the
/// same total size would otherwise reduce into each other silently. 62 bits so
/// that it and its negation both fit an `i64`.
pub fn fingerprint(entries: &[Entry]) -> i64 {
    fingerprint_with(entries, &[])
}

/// [`fingerprint`] over `settings` too (the fuser's bucket and piece sizes, which
/// decide its calls as much as the entries do).
pub fn fingerprint_with(entries: &[Entry], settings: &[u64]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    settings.iter().for_each(|s| s.to_le_bytes().into_iter().for_each(&mut eat));
    for e in entries {
        eat(e.dtype as u8);
        eat(e.op as u8);
        (e.bytes as u64).to_le_bytes().into_iter().for_each(&mut eat);
    }
    (h >> 2) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(dtype: DType, op: ReduceOp, bytes: usize) -> Entry {
        Entry { dtype, op, bytes }
    }

    #[test]
    fn buckets_cut_at_threshold_and_kind_changes() {
        let f = |b| e(DType::F32, ReduceOp::Sum, b);
        let list = [f(4), f(4), f(8), e(DType::F64, ReduceOp::Sum, 8), e(DType::F64, ReduceOp::Max, 8), f(20), f(4)];
        assert_eq!(buckets(&list, 16), vec![0..3, 3..4, 4..5, 5..6, 6..7]);
        assert_eq!(buckets(&list, 8), vec![0..2, 2..3, 3..4, 4..5, 5..6, 6..7]);
        assert_eq!(buckets(&list, 1 << 20), vec![0..3, 3..4, 4..5, 5..7]);
    }

    #[test]
    fn zero_threshold_puts_every_tensor_alone() {
        let list: Vec<Entry> = (1..6).map(|b| e(DType::I32, ReduceOp::Sum, b * 4)).collect();
        assert_eq!(buckets(&list, 0), (0..5).map(|i| i..i + 1).collect::<Vec<_>>());
        assert!(buckets(&[], 0).is_empty());
    }

    #[test]
    fn buckets_cover_every_entry_once_in_order() {
        // A pseudo-random mix: the ranges tile 0..n, and no bucket mixes kinds or
        // passes the threshold unless it holds one tensor.
        let mut x: u64 = 7;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as usize
        };
        let kinds = [DType::F32, DType::F16, DType::I64];
        let list: Vec<Entry> = (0..500).map(|_| e(kinds[next() % 3], ReduceOp::Sum, 1 + next() % 5000)).collect();
        for threshold in [0, 100, 4096, 1 << 20] {
            let b = buckets(&list, threshold);
            assert_eq!(b.first().map(|r| r.start), Some(0));
            assert_eq!(b.last().map(|r| r.end), Some(list.len()));
            for w in b.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            for r in &b {
                let run = &list[r.clone()];
                assert!(run.iter().all(|x| x.dtype == run[0].dtype && x.op == run[0].op));
                let total: usize = run.iter().map(|x| x.bytes).sum();
                assert!(run.len() == 1 || total <= threshold, "{r:?} has {total} bytes over {threshold}");
            }
        }
    }

    #[test]
    fn fingerprint_tells_layouts_of_one_size_apart() {
        let f = |b| e(DType::F32, ReduceOp::Sum, b);
        let a = fingerprint(&[f(4), f(8)]);
        assert_ne!(a, fingerprint(&[f(8), f(4)]));
        assert_ne!(a, fingerprint(&[f(12)]));
        assert_ne!(a, fingerprint(&[e(DType::I32, ReduceOp::Sum, 4), f(8)]));
        assert_eq!(a, fingerprint(&[f(4), f(8)]));
        assert!(a >= 0 && a.checked_neg().is_some());
    }
}
