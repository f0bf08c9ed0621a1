//! Tests of the byte ring: wrapping, peeking, rewinds, and counters a bad peer forges.

use super::*;

#[test]
fn header_layout_is_fixed() {
    assert_eq!(RING_HEADER_BYTES, 384);
    assert_eq!(std::mem::align_of::<RingHeader>(), RING_ALIGN);
}

#[test]
fn gathers_writes_and_wraps_around() {
    let (mut w, mut r) = heap_ring(10);
    assert!(r.is_empty());
    assert_eq!(w.write(&[b"abc", b"defgh"]).unwrap(), 8);
    assert_eq!(w.free(), 2);
    // Only a prefix of the second buffer fits, and nothing of the third.
    assert_eq!(w.write(&[b"ij", b"kl"]).unwrap(), 2);
    assert_eq!(w.write(&[b"x"]).unwrap(), 0);
    let mut out = [0u8; 7];
    assert_eq!(r.read(&mut out).unwrap(), 7);
    assert_eq!(&out, b"abcdefg");
    assert_eq!(w.write(&[b"klmnopqrs"]).unwrap(), 7);
    let mut out = [0u8; 20];
    assert_eq!(r.read(&mut out).unwrap(), 10);
    assert_eq!(&out[..10], b"hijklmnopq");
    assert!(r.is_empty());
}

#[test]
fn peek_shows_contiguous_bytes_until_consumed() {
    let (mut w, mut r) = heap_ring(10);
    assert_eq!(r.peek(100).unwrap(), b"");
    assert_eq!(w.write(&[b"abcdefgh"]).unwrap(), 8);
    assert_eq!(r.peek(3).unwrap(), b"abc");
    r.consume(6);
    assert_eq!(w.write(&[b"ijklmn"]).unwrap(), 6);
    // The filled part wraps: a peek stops at the end of the data area.
    assert_eq!(r.peek(100).unwrap(), b"ghij");
    r.consume(4);
    assert_eq!(r.peek(100).unwrap(), b"klmn");
    // Consuming more than is buffered releases only what is there.
    r.consume(100);
    assert!(r.is_empty());
    assert_eq!(w.free(), 10);
}

#[test]
fn dropping_an_end_closes_it() {
    let (w, r) = heap_ring(16);
    assert!(!r.is_writer_closed());
    drop(w);
    assert!(r.is_writer_closed());
    let (w, r) = heap_ring(16);
    drop(r);
    assert!(w.is_reader_closed());
}

#[test]
fn attaching_checks_the_region() {
    let layout = Layout::from_size_align(1024, RING_ALIGN).unwrap();
    // SAFETY: non-zero size; freed below.
    let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).unwrap();
    let keep: Arc<dyn Send + Sync> = Arc::new(());
    // SAFETY: valid, aligned memory of 1024 bytes that outlives the attempts.
    unsafe {
        assert!(RingReader::attach(ptr, 1024, keep.clone()).is_err(), "not initialised");
        init(ptr, 1024 - RING_HEADER_BYTES + 1);
        assert!(RingReader::attach(ptr, 1024, keep.clone()).is_err(), "capacity too big");
        init(ptr, 1024 - RING_HEADER_BYTES);
        assert_eq!(RingReader::attach(ptr, 1024, keep).unwrap().capacity(), 1024 - RING_HEADER_BYTES);
        alloc::dealloc(ptr.as_ptr(), layout);
    }
}

#[test]
fn a_head_beyond_the_capacity_or_going_back_is_invalid_data() {
    let (mut w, mut r) = heap_ring(64);
    assert_eq!(w.write(&[b"abcd"]).unwrap(), 4);
    // The writer (a bad peer) claims far more than the ring holds.
    r.view.hdr().head.0.head.store(1 << 50, Ordering::Release);
    let mut out = [0u8; 200];
    assert_eq!(r.read(&mut out).unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert_eq!(r.peek(200).unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert!(!r.is_empty(), "a corrupt ring must not look empty (the caller would wait forever)");
    // Nothing was consumed by the failed reads.
    assert_eq!(r.tail.get(), 0);
    r.view.hdr().head.0.head.store(4, Ordering::Release);
    assert_eq!(r.read(&mut out[..2]).unwrap(), 2);
    assert_eq!(&out[..2], b"ab");
    // Now a head behind what the reader already saw (and behind its tail).
    r.view.hdr().head.0.head.store(1, Ordering::Release);
    assert_eq!(r.read(&mut out).unwrap_err().kind(), io::ErrorKind::InvalidData);
    r.view.hdr().head.0.head.store(3, Ordering::Release);
    let e = r.read(&mut out).unwrap_err();
    assert!(e.to_string().contains("moved from 4 to 3"), "{e}");
}

#[test]
fn a_tail_beyond_the_head_or_going_back_is_invalid_data() {
    let (mut w, mut r) = heap_ring(64);
    assert_eq!(w.write(&[b"abcdefgh"]).unwrap(), 8);
    let mut out = [0u8; 4];
    assert_eq!(r.read(&mut out).unwrap(), 4);
    // A write that fits the free space already known does not look at the
    // reader's counter (head 9, last seen tail 0: 55 bytes known free).
    assert_eq!(w.write(&[b"i"]).unwrap(), 1);
    let big = [7u8; 58];
    // The reader (a bad peer) claims to have read bytes never written: seen as
    // soon as a write needs more room than is known free.
    w.view.hdr().tail.0.store(100, Ordering::Release);
    assert_eq!(w.write(&[&big]).unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert_eq!(w.free(), 0);
    // The true counter (4) frees enough room for the big write: head 67.
    w.view.hdr().tail.0.store(4, Ordering::Release);
    assert_eq!(w.write(&[&big]).unwrap(), 58);
    // ...or moves its counter backwards (1 byte known free, 2 wanted).
    w.view.hdr().tail.0.store(2, Ordering::Release);
    assert_eq!(w.write(&[b"xy"]).unwrap_err().kind(), io::ErrorKind::InvalidData);
    w.view.hdr().tail.0.store(4, Ordering::Release);
    assert_eq!(w.write(&[b"xy"]).unwrap(), 1);
}

#[test]
fn a_capacity_rewritten_after_attach_is_not_used() {
    let (mut w, mut r) = heap_ring(16);
    // The peer rewrites the capacity in the header: both ends keep the one they checked.
    w.view.hdr().meta.0.capacity.store(1 << 40, Ordering::Relaxed);
    let big = vec![9u8; 1 << 20];
    assert_eq!(w.write(&[&big]).unwrap(), 16);
    let mut out = vec![0u8; 1 << 20];
    assert_eq!(r.read(&mut out).unwrap(), 16);
    assert_eq!((w.capacity(), r.capacity()), (16, 16));
}

#[test]
fn attaching_refuses_counters_that_do_not_fit() {
    let layout = Layout::from_size_align(1024, RING_ALIGN).unwrap();
    // SAFETY: non-zero size; freed below.
    let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).unwrap();
    let keep: Arc<dyn Send + Sync> = Arc::new(());
    // SAFETY: valid, aligned memory of 1024 bytes that outlives the attempts; the
    // header is only touched through its atomics.
    unsafe {
        init(ptr, 100);
        let hdr = ptr.cast::<RingHeader>();
        hdr.as_ref().head.0.head.store(500, Ordering::Relaxed);
        assert_eq!(RingReader::attach(ptr, 1024, keep.clone()).err().unwrap().kind(), io::ErrorKind::InvalidData);
        hdr.as_ref().tail.0.store(600, Ordering::Relaxed);
        assert!(RingWriter::attach(ptr, 1024, keep.clone()).is_err(), "tail past head");
        hdr.as_ref().head.0.head.store(u64::MAX, Ordering::Relaxed);
        hdr.as_ref().tail.0.store(u64::MAX, Ordering::Relaxed);
        assert!(RingWriter::attach(ptr, 1024, keep.clone()).is_err(), "counters near wrapping");
        hdr.as_ref().tail.0.store(600, Ordering::Relaxed);
        hdr.as_ref().head.0.head.store(650, Ordering::Relaxed);
        assert_eq!(RingReader::attach(ptr, 1024, keep).unwrap().available(), 50);
        alloc::dealloc(ptr.as_ptr(), layout);
    }
}

#[test]
fn back_and_forth_messages_reuse_the_start_of_the_ring() {
    let (mut w, mut r) = heap_ring(1 << 20);
    let mut out = vec![0u8; 2048];
    for i in 0..2000u32 {
        let msg = vec![(i % 251) as u8; 2048];
        assert_eq!(w.write(&[&msg]).unwrap(), 2048);
        // Never further in than the rewind point plus one message.
        assert!(w.head % (1 << 20) <= REWIND_AFTER + 2048, "write {i} at {}", w.head);
        assert_eq!(r.read(&mut out).unwrap(), 2048);
        assert_eq!(out, msg, "message {i}");
    }
    assert!(r.is_empty());
    assert_eq!(w.free(), 1 << 20);
}

#[test]
fn a_rewind_is_followed_by_peek_and_by_the_free_space() {
    let (mut w, mut r) = heap_ring(64 << 10);
    let first: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
    assert_eq!(w.write(&[&first]).unwrap(), first.len());
    let mut out = vec![0u8; first.len()];
    assert_eq!(r.read(&mut out).unwrap(), first.len());
    assert_eq!(out, first);
    // Empty and past the rewind point: the next bytes start the data area again,
    // and all of it but those bytes is free before the reader has looked.
    assert_eq!(w.write(&[b"hello ", b"world"]).unwrap(), 11);
    assert_eq!(w.head, (64 << 10) + 11);
    assert_eq!(w.free(), (64 << 10) - 11);
    assert_eq!(r.available(), 11);
    assert_eq!(r.peek(5).unwrap(), b"hello");
    r.consume(6);
    let mut rest = [0u8; 16];
    assert_eq!(r.read(&mut rest).unwrap(), 5);
    assert_eq!(&rest[..5], b"world");
    assert_eq!(w.free(), 64 << 10);
}

#[test]
fn a_writer_with_bytes_still_buffered_does_not_rewind() {
    let (mut w, mut r) = heap_ring(64 << 10);
    let big = vec![3u8; 20_000];
    assert_eq!(w.write(&[&big]).unwrap(), big.len());
    let mut out = vec![0u8; 10];
    assert_eq!(r.read(&mut out).unwrap(), 10);
    assert_eq!(w.write(&[b"x"]).unwrap(), 1);
    assert_eq!(w.head, 20_001, "continues where it was: the reader is behind");
    let mut out = vec![0u8; 20_000];
    assert_eq!(r.read(&mut out).unwrap(), 19_991);
    assert!(out[..19_990].iter().all(|&b| b == 3) && out[19_990] == b'x');
}

#[test]
fn a_forged_skip_is_invalid_data_not_a_read_elsewhere() {
    let (mut w, mut r) = heap_ring(64 << 10);
    let big = vec![5u8; 20_000];
    assert_eq!(w.write(&[&big]).unwrap(), big.len());
    let mut out = vec![0u8; 20_000];
    assert_eq!(r.read(&mut out).unwrap(), 20_000);
    // A bad writer claims a rewind where the reader stands but a head short of
    // where bytes resume.
    let side = &r.view.hdr().head.0;
    side.skip_from.store(20_000, Ordering::Relaxed);
    side.head.store(20_100, Ordering::Release);
    assert_eq!(r.read(&mut out).unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert_eq!(r.peek(10).unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert!(!r.is_empty());
    assert_eq!(r.tail.get(), 20_000, "nothing consumed");
    drop(w);
}

#[test]
fn a_tail_inside_the_rewind_gap_is_invalid_data_not_free_space() {
    let cap = 64usize << 10;
    let (mut w, mut r) = heap_ring(cap);
    let first = vec![1u8; 20_000];
    assert_eq!(w.write(&[&first]).unwrap(), first.len());
    let mut out = vec![0u8; cap];
    assert_eq!(r.read(&mut out).unwrap(), first.len());
    // The writer rewinds at 20 000 (bytes resume at 64 Ki) and fills the ring
    // before the reader has looked: head 128 Ki, the reader still at 20 000.
    let fill: Vec<u8> = (0..cap).map(|i| i as u8).collect();
    assert_eq!(w.write(&[&fill]).unwrap(), cap);
    assert_eq!((w.skip_from, w.head), (20_000, 2 * cap as u64));
    assert_eq!(w.free(), 0);
    // A bad reader claims a tail between the rewind and where bytes resume: no
    // reader can stand there, and it would count 111 071 bytes buffered in a
    // ring of 65 536.
    r.view.hdr().tail.0.store(20_001, Ordering::Release);
    assert_eq!(w.free(), 0);
    let e = w.write(&[b"y"]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("broke the protocol"), "{e}");
    assert_eq!(w.head, 2 * cap as u64, "nothing written into the full ring");
    // With the true counter back, the ring is still full and holds what was written.
    r.view.hdr().tail.0.store(20_000, Ordering::Release);
    assert_eq!(w.write(&[b"y"]).unwrap(), 0);
    assert_eq!(r.read(&mut out).unwrap(), cap);
    assert_eq!(out, fill);
}

#[test]
fn a_writer_attaching_ignores_a_skip_no_writer_could_have_made() {
    let layout = Layout::from_size_align(region_len(1000), RING_ALIGN).unwrap();
    // SAFETY: non-zero size; freed below.
    let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).unwrap();
    let keep: Arc<dyn Send + Sync> = Arc::new(());
    // SAFETY: valid, aligned memory that outlives the ends; header via atomics.
    unsafe {
        init(ptr, 1000);
        let hdr = ptr.cast::<RingHeader>();
        // 100 bytes buffered (200..300), and a skip at the reader's 200 that
        // would resume at 1000, past the head.
        hdr.as_ref().head.0.head.store(300, Ordering::Relaxed);
        hdr.as_ref().tail.0.store(200, Ordering::Relaxed);
        hdr.as_ref().head.0.skip_from.store(200, Ordering::Relaxed);
        let w = RingWriter::attach(ptr, layout.size(), keep.clone()).unwrap();
        assert_eq!(w.free(), 900);
        drop(w);
        alloc::dealloc(ptr.as_ptr(), layout);
    }
}

#[test]
fn threads_streaming_messages_of_any_size_through_rewinds_and_wraps() {
    let (mut w, mut r) = heap_ring(48 << 10);
    const TOTAL: u64 = 8 << 20;
    let writer = std::thread::spawn(move || {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = 0u64;
        let mut buf = Vec::new();
        while next < TOTAL {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % (40 << 10)).min(TOTAL - next) as usize;
            buf.clear();
            buf.extend((next..next + len as u64).map(|i| (i % 253) as u8));
            let mut off = 0;
            while off < len {
                off += w.write(&[&buf[off..]]).unwrap();
                std::hint::spin_loop();
            }
            next += len as u64;
            // Now and then let the reader drain the ring, so the next write
            // finds it empty and rewinds while the reader is still busy.
            if seed.is_multiple_of(4) {
                while w.free() < 48 << 10 {
                    std::thread::yield_now();
                }
            }
        }
        w
    });
    let mut got = 0u64;
    let mut out = vec![0u8; 5000];
    let mut step = 1usize;
    while got < TOTAL {
        step = step % 4999 + 1;
        let n = if step.is_multiple_of(3) {
            let seen = r.peek(step).unwrap();
            let n = seen.len();
            out[..n].copy_from_slice(seen);
            r.consume(n);
            n
        } else {
            r.read(&mut out[..step]).unwrap()
        };
        for (k, b) in out[..n].iter().enumerate() {
            assert_eq!(*b, ((got + k as u64) % 253) as u8, "byte {}", got + k as u64);
        }
        got += n as u64;
    }
    let w = writer.join().unwrap();
    assert!(w.skip_from != 0 && w.skip_from != u64::MAX, "the run rewound at least once");
    assert!(r.is_empty());
}
