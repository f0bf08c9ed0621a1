//! The flight recorder through the public API: what a rank's record says after
//! mismatched calls, while a call waits for a peer that never comes, and that it
//! can be turned off.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use braid::{Communicator, Config, Error, ReduceOp};
use serde_json::Value;

fn trace_dir(case: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("braid-flight-{case}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn comms(world: usize, dir: Option<PathBuf>, calls: usize) -> Vec<Communicator> {
    let mut cfg = Config::new(0, world);
    cfg.timeout = Duration::from_secs(5);
    cfg.trace_dir = dir;
    cfg.trace_buffer = calls;
    Communicator::in_process_with(cfg).unwrap()
}

fn last_call(record: &Value) -> &Value {
    record["calls"].as_array().and_then(|c| c.last()).expect("a call")
}

/// Rank 2 calls all-gather where ranks 0 and 1 call all-reduce: every rank's call
/// fails, and every rank writes a record whose last call is that one (#1, after a
/// first all-reduce that completed), failed, with what its error says.
#[test]
fn mismatched_calls_leave_a_record_on_every_rank() {
    let dir = trace_dir("mismatch");
    let world = 3;
    let handles: Vec<_> = comms(world, Some(dir.clone()), 100)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let mut buf = vec![1.0f32; 64];
                c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                let second = if c.rank() == 2 {
                    let mut out = vec![0.0f32; 64 * 3];
                    c.all_gather(&buf, &mut out)
                } else {
                    c.all_reduce_in_place(&mut buf, ReduceOp::Sum)
                };
                (c.id(), second.is_err())
            })
        })
        .collect();
    let results: Vec<(u32, bool)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results.iter().all(|&(_, failed)| failed), "{results:?}");
    for (rank, (comm_id, _)) in results.iter().enumerate() {
        let path = dir.join(format!("braid-{comm_id:08x}-e0-rank{rank}.json"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!((v["rank"].as_u64(), v["world"].as_u64()), (Some(rank as u64), Some(world as u64)));
        let calls = v["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2, "rank {rank}: {text}");
        assert_eq!((calls[0]["seq"].as_u64(), calls[0]["state"].as_str()), (Some(0), Some("done")));
        let c = last_call(&v);
        let op = if rank == 2 { "all-gather" } else { "all-reduce" };
        assert_eq!((c["seq"].as_u64(), c["op"].as_str(), c["state"].as_str()), (Some(1), Some(op), Some("failed")));
        let kind = c["error_kind"].as_str().unwrap();
        assert!(["mismatch", "peer-aborted"].contains(&kind), "rank {rank}: {c}");
        assert!(!c["error"].as_str().unwrap().is_empty());
        assert_eq!(v["reason"].as_str(), Some(kind), "a failure's record says why it was written");
        if kind == "mismatch" {
            let theirs = &c["mismatch"]["theirs"]["op"];
            assert_ne!(theirs.as_str(), Some(op), "rank {rank}: {c}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A call waiting for a peer that never calls: the record, read from another
/// thread while the call waits, shows it started and waiting on that peer; after
/// an abort it shows it failed, aborted.
#[test]
fn a_record_read_during_a_hang_names_the_peer_waited_on() {
    let mut all = comms(2, None, 16);
    let _idle = all.pop().unwrap();
    let waiting = Arc::new(all.pop().unwrap());
    let caller = {
        let c = waiting.clone();
        std::thread::spawn(move || {
            let mut buf = vec![1.0f32; 16];
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        })
    };
    // Past the spin phase (20 ms by default), the wait is recorded.
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    let record = loop {
        let v: Value = serde_json::from_str(&waiting.flight_record().unwrap()).unwrap();
        let started = v["calls"].as_array().is_some_and(|c| !c.is_empty());
        if (started && last_call(&v)["waiting_on"] == serde_json::json!([1])) || std::time::Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let c = last_call(&record);
    assert_eq!((c["op"].as_str(), c["state"].as_str()), (Some("all-reduce"), Some("started")), "{c}");
    assert_eq!(c["waiting_on"], serde_json::json!([1]), "{c}");
    assert!(c["end_us"].is_null());
    assert_eq!(record["reason"], "on demand");
    waiting.abort();
    assert!(matches!(caller.join().unwrap(), Err(Error::Aborted { .. })));
    let v: Value = serde_json::from_str(&waiting.flight_record().unwrap()).unwrap();
    let c = last_call(&v);
    assert_eq!((c["state"].as_str(), c["error_kind"].as_str()), (Some("failed"), Some("aborted")), "{c}");
}

#[test]
fn the_recorder_can_be_off() {
    let all = comms(1, None, 0);
    assert!(all[0].flight_record().is_none());
    assert!(matches!(all[0].dump_flight_record(Some(&trace_dir("off"))), Err(Error::Unsupported(_))));
    let on = comms(1, None, 4);
    let err = on[0].dump_flight_record(None).unwrap_err();
    assert!(err.to_string().contains("BRAID_TRACE_DIR"), "{err}");
}

#[test]
fn the_trace_variables_are_read_and_checked() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        Config::from_lookup(move |k| {
            pairs.iter().find(|(key, _)| *key == k).map(|(_, v)| v.to_string()).or_else(|| match k {
                "BRAID_RANK" => Some("0".into()),
                "BRAID_WORLD_SIZE" => Some("1".into()),
                _ => None,
            })
        })
    };
    let cfg = env(&[("BRAID_TRACE_BUFFER", "50"), ("BRAID_TRACE_DIR", "/tmp/x")]).unwrap();
    assert_eq!((cfg.trace_buffer, cfg.trace_dir), (50, Some(PathBuf::from("/tmp/x"))));
    assert_eq!(env(&[]).unwrap().trace_buffer, braid::recorder::DEFAULT_CALLS);
    let bad = env(&[("BRAID_TRACE_BUFFER", "lots")]).unwrap_err().to_string();
    assert!(bad.contains("BRAID_TRACE_BUFFER"), "{bad}");
}
