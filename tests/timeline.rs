//! Issue 37, acceptance 2: a timeline of the digits MLP trained with the mirrored
//! strategy on 4 replicas is valid Trace Event JSON (checked against the format's
//! rules here), with a span per strategy step and per fusion bucket around the
//! collectives and one per peer inside each round, and `braid timeline` draws it. One test in this binary: it sets
//! `BRAID_TIMELINE`, which the strategy reads from the environment.

#[path = "../examples/digits/mlp.rs"]
mod mlp;

use std::collections::HashMap;
use std::process::Command;

use braid::strategy::{CrossReplica, Mirrored, Strategy};
use serde_json::Value;

/// The Trace Event Format's rules for what braid writes: an array of complete
/// events (`X`: a name, a category, a time stamp, a non-negative duration, integer
/// process and thread ids, optional arguments object) and metadata events (`M`:
/// `process_name` with `args.name`). The number of complete events.
fn check_trace_events(text: &str, what: &str) -> usize {
    let events: Vec<Value> = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not a JSON array: {e}"));
    let mut spans = 0;
    for e in &events {
        let o = e.as_object().unwrap_or_else(|| panic!("{what}: an event is not an object: {e}"));
        match o.get("ph").and_then(Value::as_str) {
            Some("X") => {
                assert!(o.get("name").is_some_and(Value::is_string), "{what}: {e}");
                assert!(o.get("cat").is_some_and(Value::is_string), "{what}: {e}");
                assert!(o.get("ts").is_some_and(Value::is_number), "{what}: {e}");
                assert!(o.get("dur").and_then(Value::as_f64).is_some_and(|d| d >= 0.0), "{what}: {e}");
                assert!(
                    o.get("pid").is_some_and(Value::is_u64) && o.get("tid").is_some_and(Value::is_u64),
                    "{what}: {e}"
                );
                assert!(o.get("args").is_none_or(Value::is_object), "{what}: {e}");
                spans += 1;
            }
            Some("M") => {
                assert_eq!(o.get("name").and_then(Value::as_str), Some("process_name"), "{what}: {e}");
                assert!(o.get("args").and_then(|a| a.get("name")).is_some_and(Value::is_string), "{what}: {e}");
            }
            other => panic!("{what}: phase {other:?} in {e}"),
        }
    }
    // Every round lies inside a call of its lane, every fusion bucket inside a
    // strategy step and around an all-reduce (to a microsecond: wall-clock
    // microseconds since 1970 in an f64 resolve a quarter of one).
    nested(&events, "round", "call", what);
    nested(&events, "transfer", "round", what);
    nested(&events, "fusion", "strategy", what);
    let calls: Vec<Value> = events.iter().filter(|e| e["name"] == "all-reduce").cloned().collect();
    for b in events.iter().filter(|e| e["cat"] == "fusion") {
        assert!(calls.iter().any(|c| within(c, b)), "{what}: a fusion bucket around no all-reduce: {b}");
    }
    spans
}

/// Whether span `inner` lies inside span `outer`, in the same lane.
fn within(inner: &Value, outer: &Value) -> bool {
    let at = |e: &Value| (e["ts"].as_f64().unwrap(), e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap());
    let ((s, e), (os, oe)) = (at(inner), at(outer));
    inner["pid"] == outer["pid"] && inner["tid"] == outer["tid"] && os <= s + 1.0 && e <= oe + 1.0
}

/// Every span of category `inner` lies inside one of category `outer`.
fn nested(events: &[Value], inner: &str, outer: &str, what: &str) {
    let outers: Vec<&Value> = events.iter().filter(|e| e["cat"] == outer).collect();
    for i in events.iter().filter(|e| e["cat"] == inner) {
        assert!(outers.iter().any(|o| within(i, o)), "{what}: a {inner} span outside every {outer} span: {i}");
    }
}

#[test]
fn mirrored_training_on_4_replicas_leaves_a_valid_timeline_that_braid_draws() {
    let dir = std::env::temp_dir().join(format!("braid-timeline-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("BRAID_TIMELINE", dir.join("digits.json"));
    let all = mlp::load(&mlp::default_path()).expect("digits data");
    let (train, test) = mlp::split(&all, 7);
    {
        let mut m = Mirrored::new(4, mlp::init(7), CrossReplica::AllReduce).unwrap();
        let plan = mlp::Schedule { from: 0, epochs: 1, global_batch: 32, seed: 7, lr: 0.1 };
        mlp::train(&mut m as &mut dyn Strategy, (&train, &test), plan, |_, _| Ok(())).expect("training");
    } // The replicas' communicators close their timelines here.
    std::env::remove_var("BRAID_TIMELINE");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    assert_eq!(files.len(), 4, "one file per replica: {files:?}");
    let mut per_rank = HashMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let spans = check_trace_events(&text, &f.display().to_string());
        let v: Vec<Value> = serde_json::from_str(&text).unwrap();
        let count = |cat: &str| v.iter().filter(|e| e["cat"] == cat).count();
        let (calls, steps, buckets) = (count("call"), count("strategy"), count("fusion"));
        assert!(calls > 10, "{}: {calls} calls", f.display());
        // Every all-reduce round of 4 replicas moves data with some peer.
        assert!(count("transfer") >= calls, "{}: {} peer transfers", f.display(), count("transfer"));
        // 1797 digits, a seventh held out, batches of 32: at least 40 steps an epoch,
        // each with at least one bucket of gradients.
        assert!(steps >= 40 && buckets >= steps, "{}: {steps} steps, {buckets} buckets", f.display());
        per_rank.insert(v[0]["pid"].as_u64().unwrap(), (spans, calls, steps));
    }
    assert_eq!(per_rank.len(), 4, "{per_rank:?}");
    let calls: Vec<usize> = (0..4).map(|r| per_rank[&r].1).collect();
    assert!(calls.iter().all(|&c| c == calls[0]), "every replica made the same calls: {calls:?}");
    let steps: Vec<usize> = (0..4).map(|r| per_rank[&r].2).collect();
    assert!(steps.iter().all(|&c| c == steps[0]), "every replica took the same steps: {steps:?}");
    let svg = dir.join("digits.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_braid")).arg("timeline").arg(&dir).arg("-o").arg(&svg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let picture = std::fs::read_to_string(&svg).unwrap();
    let drawn = picture.matches("<title>").count();
    let total: usize = per_rank.values().map(|p| p.0).sum();
    assert_eq!(drawn, total, "every span drawn");
    for r in 0..4 {
        assert!(picture.contains(&format!(">rank {r}<")), "lane of rank {r}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
