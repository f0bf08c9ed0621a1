//! TensorFlow's `TF_CONFIG`: a JSON cluster spec and this process's task, e.g.
//! `{"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"], "ps": ["h3:2222"]},
//! "task": {"type": "worker", "index": 1}}`.
//!
//! Ranks follow the task types in the order `ps`, `chief`, `worker` (each list in
//! its order), so parameter servers are the first ranks as
//! [`crate::strategy::ParameterServer`] expects, and the chief (else worker 0) is
//! rank 0 of a job without them. Rank 0's address hosts the store. The local rank
//! counts the earlier tasks on the same host, the local size all of them. An `evaluator` runs outside the job:
//! it gets an error, not a rank.

use crate::error::{Error, Result};

/// Task types that join the job, in rank order.
#[cfg(feature = "tf-config")]
const ORDER: [&str; 3] = ["ps", "chief", "worker"];

/// Who this process is, read from a `TF_CONFIG` text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TfTask {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) local_rank: usize,
    /// Tasks on this task's host (this one included).
    pub(crate) local_size: usize,
    /// `tcp://` address of rank 0's task.
    pub(crate) store: String,
}

#[cfg(feature = "tf-config")]
pub(crate) fn parse(text: &str) -> Result<TfTask> {
    let bad = |why: String| Error::Config(format!("TF_CONFIG: {why}"));
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let cluster = v.get("cluster").and_then(|c| c.as_object()).ok_or_else(|| bad("no \"cluster\" object".into()))?;
    let task = v.get("task").ok_or_else(|| bad("no \"task\" object".into()))?;
    let kind = task.get("type").and_then(|t| t.as_str()).ok_or_else(|| bad("no task \"type\"".into()))?;
    let index = task.get("index").and_then(|i| i.as_u64()).ok_or_else(|| bad("no task \"index\"".into()))?;
    if !ORDER.contains(&kind) {
        return Err(bad(format!("task type `{kind}` does not join the job (only {})", ORDER.join(", "))));
    }
    if let Some(other) = cluster.keys().find(|k| !ORDER.contains(&k.as_str()) && k.as_str() != "evaluator") {
        return Err(bad(format!("unknown task type `{other}` in the cluster")));
    }
    let mut tasks: Vec<(&str, usize, &str)> = Vec::new();
    for t in ORDER {
        let Some(list) = cluster.get(t) else { continue };
        let list = list.as_array().ok_or_else(|| bad(format!("cluster \"{t}\" is not a list")))?;
        for (i, addr) in list.iter().enumerate() {
            let addr = addr.as_str().ok_or_else(|| bad(format!("{t} {i}: the address is not a string")))?;
            tasks.push((t, i, addr));
        }
    }
    let rank = tasks
        .iter()
        .position(|&(t, i, _)| t == kind && i as u64 == index)
        .ok_or_else(|| bad(format!("task {kind} {index} is not in the cluster")))?;
    let host = |addr: &str| addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_string();
    let me = host(tasks[rank].2);
    let local_rank = tasks[..rank].iter().filter(|t| host(t.2) == me).count();
    let local_size = tasks.iter().filter(|t| host(t.2) == me).count();
    let store = tasks[0].2;
    if store.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err()) {
        return Err(bad(format!("rank 0's address `{store}` has no port")));
    }
    Ok(TfTask { rank, world: tasks.len(), local_rank, local_size, store: format!("tcp://{store}") })
}

#[cfg(not(feature = "tf-config"))]
pub(crate) fn parse(_text: &str) -> Result<TfTask> {
    Err(Error::Config("TF_CONFIG is set but this braid was built without the `tf-config` feature".into()))
}

#[cfg(all(test, feature = "tf-config"))]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_ps_chief_worker_and_rank_zero_hosts_the_store() {
        let spec = |kind: &str, i: usize| {
            format!(
                r#"{{"cluster": {{"worker": ["h1:2222", "h2:2222", "h1:2223"], "chief": ["h0:2222"], "ps": ["h3:7000"],
                   "evaluator": ["h9:1"]}}, "task": {{"type": "{kind}", "index": {i}}}}}"#
            )
        };
        let t = parse(&spec("ps", 0)).unwrap();
        assert_eq!(t, TfTask { rank: 0, world: 5, local_rank: 0, local_size: 1, store: "tcp://h3:7000".into() });
        assert_eq!(parse(&spec("chief", 0)).unwrap().rank, 1);
        let w2 = parse(&spec("worker", 2)).unwrap();
        assert_eq!((w2.rank, w2.world, w2.local_rank, w2.local_size), (4, 5, 1, 2));
        assert_eq!(parse(&spec("worker", 0)).unwrap().local_rank, 0);
        let e = parse(&spec("evaluator", 0)).unwrap_err().to_string();
        assert!(e.contains("does not join"), "{e}");
        assert!(parse(&spec("worker", 3)).unwrap_err().to_string().contains("not in the cluster"));
    }

    #[test]
    fn malformed_specs_are_errors_naming_the_problem() {
        for (text, says) in [
            ("not json", "not JSON"),
            (r#"{"task": {"type": "worker", "index": 0}}"#, "cluster"),
            (r#"{"cluster": {"worker": ["a:1"]}}"#, "task"),
            (r#"{"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}"#, "not a list"),
            (r#"{"cluster": {"worker": [1]}, "task": {"type": "worker", "index": 0}}"#, "not a string"),
            (r#"{"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}"#, "no port"),
            (r#"{"cluster": {"boss": ["a:1"]}, "task": {"type": "worker", "index": 0}}"#, "unknown task type"),
            (r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}"#, "index"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
