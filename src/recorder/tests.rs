use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::*;
use crate::error::OpContext;
use crate::executor::{CallFlags, WaitChain};

fn recorder(calls: usize) -> FlightRecorder {
    let who = Identity { rank: 1, world: 4, comm_id: 0xabcd, epoch: 0 };
    FlightRecorder::new(who, calls, None, Default::default()).expect("a recorder")
}

fn sig(op: OpKind, count: u64) -> CallSig {
    CallSig::new(op, DType::F32, count, 0, ReduceOp::Sum).with_algorithm(Algorithm::Ring)
}

fn parse(r: &FlightRecorder) -> Value {
    serde_json::from_str(&r.to_json("test")).expect("valid JSON")
}

fn ctx(seq: u64) -> OpContext {
    OpContext { rank: 1, call: Some(sig(OpKind::AllReduce, 8)), seq }
}

#[test]
fn no_calls_no_recorder() {
    let who = Identity { rank: 0, world: 1, comm_id: 1, epoch: 0 };
    assert!(FlightRecorder::new(who, 0, None, Default::default()).is_none());
}

#[test]
fn a_call_is_recorded_with_its_signature_progress_and_outcome() {
    let flags: Arc<CallFlags> = Default::default();
    let who = Identity { rank: 1, world: 4, comm_id: 0xabcd, epoch: 0 };
    let r = FlightRecorder::new(who, 8, None, flags.clone()).unwrap();
    let i = r.begin(0, &sig(OpKind::AllReduce, 1000), 6);
    flags.set_round(3);
    flags.set_waiting(&[2]);
    let v = parse(&r);
    assert_eq!((v["rank"].as_u64(), v["world"].as_u64(), v["comm"].as_str()), (Some(1), Some(4), Some("0000abcd")));
    let c = &v["calls"][0];
    assert_eq!(c["op"], "all-reduce");
    assert_eq!(
        (c["count"].as_u64(), c["dtype"].as_str(), c["algorithm"].as_str()),
        (Some(1000), Some("f32"), Some("ring"))
    );
    assert_eq!((c["state"].as_str(), c["round"].as_u64(), c["rounds"].as_u64()), (Some("started"), Some(3), Some(6)));
    assert_eq!(c["waiting_on"], serde_json::json!([2]));
    assert!(c["end_us"].is_null() && c["start_us"].as_u64().unwrap() > 1_700_000_000_000_000);
    r.end(i, Ok(()));
    let c = &parse(&r)["calls"][0];
    assert_eq!((c["state"].as_str(), c["round"].as_u64()), (Some("done"), Some(5)));
    assert!(c["end_us"].as_u64().unwrap() >= c["start_us"].as_u64().unwrap());
    assert_eq!(c["waiting_on"], serde_json::json!([]), "a finished call waits on nobody");
}

#[test]
fn the_ring_keeps_the_last_calls_and_counts_the_dropped() {
    let r = recorder(3);
    for seq in 0..5 {
        let i = r.begin(seq, &sig(OpKind::Broadcast, seq * 10), 2);
        r.end(i, Ok(()));
    }
    let v = parse(&r);
    let seqs: Vec<u64> = v["calls"].as_array().unwrap().iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [2, 3, 4]);
    assert_eq!((v["dropped"].as_u64(), v["capacity"].as_u64()), (Some(2), Some(3)));
    assert_eq!(v["calls"][2]["count"].as_u64(), Some(40));
}

#[test]
fn a_rooted_calls_agreement_and_data_share_one_record() {
    let r = recorder(8);
    let s = sig(OpKind::Broadcast, 4);
    let i = r.begin(7, &s, 2);
    r.end(i, Ok(()));
    let j = r.begin(7, &s, 5);
    assert_eq!(i, j);
    let v = parse(&r);
    assert_eq!(v["calls"].as_array().unwrap().len(), 1);
    assert_eq!((v["calls"][0]["state"].as_str(), v["calls"][0]["rounds"].as_u64()), (Some("started"), Some(5)));
    // The next call gets its own.
    r.end(j, Ok(()));
    assert_ne!(r.begin(8, &s, 2), j);
}

#[test]
fn a_timeout_blames_the_silent_end_of_its_chain() {
    let r = recorder(8);
    let i = r.begin(5, &sig(OpKind::AllReduce, 8), 6);
    r.round_peers(
        i,
        &crate::algorithm::Schedule { algorithm: Algorithm::Ring, rounds: vec![], scratch_bytes: 0, finalize: vec![] },
    );
    let e = Error::Timeout {
        ctx: ctx(5),
        timeout: Duration::from_secs(2),
        waiting_on: vec![0],
        chain: vec![WaitChain { ranks: vec![0, 3, 2], end: ChainEnd::Silent }],
    };
    r.end(i, Err(&e));
    let c = &parse(&r)["calls"][0];
    assert_eq!((c["state"].as_str(), c["error_kind"].as_str()), (Some("failed"), Some("timeout")));
    assert_eq!(c["blamed"], serde_json::json!([2]));
    assert_eq!(c["chain_end"], "silent");
    assert_eq!(c["error"].as_str(), Some(e.to_string().as_str()));
    assert_eq!(c["peers"], serde_json::json!([]));
    // A chain that ends in a cycle blames whom this rank waited on.
    let i = r.begin(6, &sig(OpKind::AllReduce, 8), 6);
    let e = Error::Timeout {
        ctx: ctx(6),
        timeout: Duration::from_secs(2),
        waiting_on: vec![0],
        chain: vec![WaitChain { ranks: vec![0, 3], end: ChainEnd::Cycle(0) }],
    };
    r.end(i, Err(&e));
    assert_eq!(parse(&r)["calls"][1]["blamed"], serde_json::json!([0]));
}

#[test]
fn a_mismatch_names_the_peer_and_its_call() {
    let r = recorder(8);
    let i = r.begin(3, &sig(OpKind::AllReduce, 8), 6);
    let theirs = CallSig::new(OpKind::AllGather, DType::F32, 8, 0, ReduceOp::Sum);
    let e = Error::Mismatch { ctx: ctx(3), peer: 2, ours: sig(OpKind::AllReduce, 8), theirs, their_seq: 3 };
    r.end(i, Err(&e));
    let c = &parse(&r)["calls"][0];
    assert_eq!((c["error_kind"].as_str(), c["blamed"].clone()), (Some("mismatch"), serde_json::json!([2])));
    assert_eq!(c["mismatch"]["theirs"]["op"], "all-gather");
    assert_eq!((c["mismatch"]["peer"].as_u64(), c["mismatch"]["their_seq"].as_u64()), (Some(2), Some(3)));
}

#[test]
fn error_text_is_escaped() {
    let r = recorder(2);
    let i = r.begin(0, &sig(OpKind::Barrier, 0), 1);
    let e =
        Error::PeerLost { ctx: ctx(0), peer: 3, detail: "quote \" backslash \\ newline \n tab \t bell \u{7}".into() };
    r.end(i, Err(&e));
    let c = &parse(&r)["calls"][0];
    assert_eq!(c["error"].as_str(), Some(e.to_string().as_str()));
    assert_eq!((c["error_kind"].as_str(), c["blamed"].clone()), (Some("peer-lost"), serde_json::json!([3])));
}

/// A reader on another thread (a dump while the engine works) sees whole calls:
/// every call's count is its sequence number times 3, whatever it interrupted.
#[test]
fn a_concurrent_reader_sees_only_whole_calls() {
    use std::sync::atomic::AtomicBool;
    let r = Arc::new(recorder(4));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (r, stop) = (r.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let i = r.begin(seq, &sig(OpKind::AllReduce, seq * 3), (seq % 7) as usize);
                r.end(i, Ok(()));
                seq += 1;
            }
            seq
        })
    };
    let mut seen = 0;
    for _ in 0..20_000 {
        let v = parse(&r);
        for c in v["calls"].as_array().unwrap() {
            assert_eq!(c["count"].as_u64().unwrap(), c["seq"].as_u64().unwrap() * 3, "{c}");
            assert_eq!(c["rounds"].as_u64().unwrap(), c["seq"].as_u64().unwrap() % 7, "{c}");
            seen += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(seen > 0 && written > 0);
}

#[test]
fn a_dump_replaces_the_file_whole() {
    let dir = std::env::temp_dir().join(format!("braid-recorder-test-{}", std::process::id()));
    let who = Identity { rank: 3, world: 4, comm_id: 0x12, epoch: 1 };
    let r = FlightRecorder::new(who, 4, Some(dir.clone()), Default::default()).unwrap();
    let i = r.begin(0, &sig(OpKind::AllReduce, 8), 2);
    r.end(i, Ok(()));
    let path = r.dump("first").unwrap().unwrap();
    assert_eq!(path, dir.join("braid-00000012-e1-rank3.json"));
    r.begin(1, &sig(OpKind::AllReduce, 8), 2);
    r.dump("second").unwrap().unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!((v["reason"].as_str(), v["calls"].as_array().unwrap().len()), (Some("second"), 2));
    let leftovers = std::fs::read_dir(&dir).unwrap().count();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(leftovers, 1, "nothing but the record is left");
}
