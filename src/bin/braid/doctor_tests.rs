//! `braid doctor`'s analysis on made-up records: each case names its culprit.
use serde_json::{json, Value};

use super::*;

/// Call `seq` of a 4-rank job: an f32 sum of 1024 elements over a 6-round ring.
fn call(seq: u64, op: &str, state: &str) -> Value {
    let end = if state == "started" { Value::Null } else { json!(1_000 + seq) };
    json!({"seq": seq, "op": op, "dtype": "f32", "reduce_op": "sum", "count": 1024, "root": 0, "tag": 0,
           "algorithm": "ring", "state": state, "round": 5, "rounds": 6, "waiting_on": [],
           "start_us": 1_000 + seq, "end_us": end, "error": null, "error_kind": null, "blamed": []})
}

/// Rank `rank`'s record: `calls`, after all-reduce #0 up to `seq`, done.
fn record(rank: usize, seq: u64, calls: Vec<Value>) -> Record {
    let calls: Vec<Value> = (0..seq).map(|s| call(s, "all-reduce", "done")).chain(calls).collect();
    let v = json!({"braid_flight_record": 1, "rank": rank, "world": 4, "comm": "0000abcd", "epoch": 0,
                   "pid": 100 + rank, "host": "node7", "reason": "timeout", "dumped_at_us": 9_000_000,
                   "capacity": 2000, "dropped": 0, "calls": calls, "some_future_field": {"x": 1}});
    parse(&v.to_string()).unwrap().unwrap()
}

/// Rank `rank` failed in `op` #`seq` at `end_us` with an error of `kind` naming `blamed`.
fn failed(rank: usize, seq: u64, op: &str, kind: &str, blamed: &[usize], end_us: u64) -> Record {
    let mut c = call(seq, op, "failed");
    c["round"] = json!(2);
    c["waiting_on"] = json!(blamed);
    c["end_us"] = json!(end_us);
    c["error_kind"] = json!(kind);
    c["blamed"] = json!(blamed);
    c["error"] = json!(format!("rank {rank} in {op}(dtype=f32, count=1024) via ring #{seq}: {kind} {blamed:?}\nmore"));
    record(rank, seq, vec![c])
}

fn culprit_line(r: &Report) -> &str {
    let mut lines = r.groups.iter().flat_map(|g| &g.lines);
    lines.find(|l| l.starts_with("culprit: ")).unwrap_or_else(|| panic!("no culprit line:\n{}", r.text()))
}

/// The one group's culprit and call, checking the exit status says a fault.
fn named(r: &Report) -> (Option<usize>, Option<(String, u64)>) {
    assert_eq!((r.exit, r.groups.len()), (1, 1), "{}", r.text());
    (r.groups[0].culprit, r.groups[0].call.clone())
}

fn call_named(op: &str, seq: u64) -> Option<(String, u64)> {
    Some((op.to_string(), seq))
}

#[test]
fn doctor_names_a_stopped_rank() {
    let ar = |rank, kind, blamed: &[usize], t| failed(rank, 5, "all-reduce", kind, blamed, t);
    let mut r1 = ar(1, "timeout", &[2], 5_000_000);
    r1.calls[5].chain_end = Some("silent".into());
    // Rank 0 got rank 1's abort: it names rank 1, weakly.
    let records = [ar(0, "peer-aborted", &[1], 5_000_200), r1, ar(3, "timeout", &[2], 5_000_100)];
    let r = diagnose(&records);
    assert_eq!(named(&r), (Some(2), call_named("all-reduce", 5)));
    let expected = "\
braid doctor: communicator 0000abcd (epoch 0), 4 ranks, records from 3 (no record: rank 2)
culprit: rank 2 is stopped or hung (it left no record): ranks 1, 3 waited on it in all-reduce #5; \
it did not answer the wait query
  rank 0: all-reduce #5 failed in round 3 of 6, waiting on 1: peer-aborted [1]
  rank 1: all-reduce #5 failed in round 3 of 6, waiting on 2: timeout [2]
  rank 2: no record
  rank 3: all-reduce #5 failed in round 3 of 6, waiting on 2: timeout [2]
never arrived at all-reduce #5: rank 2 (no record)
";
    assert_eq!(r.text(), expected);

    // Rank 0 waited on rank 3, but its wait chain ended at the silent rank 2, and
    // rank 1 got rank 3's abort: rank 3 is waited on, rank 2 is the one named.
    let mut r0 = ar(0, "timeout", &[2], 5_000_000);
    r0.calls[5].waiting_on = vec![3];
    let records = [r0, ar(1, "peer-aborted", &[3], 5_000_300), ar(3, "timeout", &[2], 5_000_100)];
    let r = diagnose(&records);
    assert_eq!(named(&r), (Some(2), call_named("all-reduce", 5)));
    assert!(culprit_line(&r).contains("stopped or hung"), "{}", r.text());
}

#[test]
fn doctor_names_a_rank_that_skipped_a_broadcast() {
    // Everyone called all-reduce #0, then rank 2 the all-reduce the others call after the broadcast.
    let (bc, ar) = ("broadcast", "all-reduce");
    let calls = [(bc, "peer-aborted", 1), (bc, "mismatch", 2), (ar, "mismatch", 1), (bc, "mismatch", 2)];
    let records: Vec<Record> = (0..4).map(|r| failed(r, 1, calls[r].0, calls[r].1, &[calls[r].2], 2_000)).collect();
    let r = diagnose(&records);
    assert_eq!(named(&r), (Some(2), call_named("all-reduce", 1)));
    assert_eq!(
        culprit_line(&r),
        "culprit: rank 2 called all-reduce #1 where ranks 0, 1, 3 called broadcast #1 \
         (it skipped broadcast #1, or called out of order)"
    );
    assert!(r.groups[0].never_arrived.is_empty(), "{}", r.text());
}

#[test]
fn doctor_names_a_rank_that_called_another_collective() {
    let (ar, ag) = ("all-reduce", "all-gather");
    let calls = [(ar, "peer-aborted", 1), (ar, "mismatch", 2), (ag, "mismatch", 1), (ar, "mismatch", 2)];
    let records: Vec<Record> = (0..4).map(|r| failed(r, 3, calls[r].0, calls[r].1, &[calls[r].2], 4_000)).collect();
    let r = diagnose(&records);
    assert_eq!(named(&r), (Some(2), call_named("all-gather", 3)));
    assert_eq!(culprit_line(&r), "culprit: rank 2 called all-gather #3 where ranks 0, 1, 3 called all-reduce #3");

    // The same op with another count: the line says what differs.
    let mut records = records;
    records[2].calls[3].sig.op = "all-reduce".into();
    records[1].calls[3].sig.count = 512;
    let r = diagnose(&records);
    assert_eq!(named(&r), (Some(1), call_named("all-reduce", 3)));
    assert!(culprit_line(&r)
        .contains("called all-reduce #3 (count 512) where ranks 0, 2, 3 called all-reduce #3 (count 1024)"));
}

#[test]
fn doctor_names_a_killed_rank() {
    let ar = |rank, kind, blamed: &[usize], t| failed(rank, 4, "all-reduce", kind, blamed, t);
    let records = [ar(0, "peer-aborted", &[3], 200), ar(1, "peer-lost", &[2], 0), ar(3, "peer-lost", &[2], 100)];
    let r = diagnose(&records);
    assert_eq!(named(&r), (Some(2), call_named("all-reduce", 4)));
    assert_eq!(culprit_line(&r), "culprit: rank 2 died: ranks 1, 3 lost its connection during all-reduce #4");

    // Rank 3 lost rank 2 first and left; ranks 0 and 1 then lost rank 3. Counted
    // plainly rank 3 is named twice, but it had failed, naming 2, before they did.
    let records = [ar(0, "peer-lost", &[3], 200), ar(1, "peer-lost", &[3], 300), ar(3, "peer-lost", &[2], 0)];
    let r = diagnose(&records);
    assert_eq!(named(&r), (Some(2), call_named("all-reduce", 4)));
    assert_eq!(culprit_line(&r), "culprit: rank 2 died: rank 3 lost its connection during all-reduce #4");

    // Rank 0 was still in #3 (waiting on rank 2's last round) when it lost it.
    let records = [
        failed(0, 3, "all-reduce", "peer-lost", &[2], 0),
        ar(1, "peer-aborted", &[0], 100),
        ar(3, "peer-lost", &[2], 0),
    ];
    let r = diagnose(&records);
    assert_eq!(named(&r), (Some(2), call_named("all-reduce", 4)));
    let line = "culprit: rank 2 died: ranks 0, 3 lost its connection during all-reduce #4 (rank 0 in all-reduce #3)";
    assert_eq!(culprit_line(&r), line);
}

#[test]
fn doctor_says_where_a_present_culprit_is() {
    // Rank 2 sat outside braid after #4, and was dumped by SIGTERM.
    let stuck = |rank, t| failed(rank, 5, "all-reduce", "timeout", &[2], t);
    let r = diagnose(&[stuck(0, 5_000_000), stuck(1, 5_000_100), record(2, 5, vec![]), stuck(3, 5_000_200)]);
    assert_eq!(named(&r), (Some(2), call_named("all-reduce", 5)));
    let line = culprit_line(&r);
    assert!(
        line.starts_with("culprit: rank 2: ranks 0, 1, 3 waited on it in all-reduce #5; it never arrived"),
        "{line}"
    );
    assert!(line.ends_with("its last call is all-reduce #4 (done) (pid 102 on node7)"), "{line}");
    assert_eq!(r.groups[0].never_arrived, vec![2]);
}

#[test]
fn doctor_breaks_a_two_rank_tie_by_the_skipped_call() {
    let two = |rank, seq, op| Record { world: 2, ..failed(rank, seq, op, "mismatch", &[1 - rank], 2_000) };
    let r = diagnose(&[two(0, 1, "broadcast"), two(1, 1, "all-reduce")]);
    assert_eq!(named(&r), (Some(1), call_named("all-reduce", 1)));
    assert!(culprit_line(&r).starts_with("culprit: rank 1 called all-reduce #1 where rank 0 called broadcast #1"));
    // Neither call is next to the other's and the errors name both: no culprit, a fault.
    let r = diagnose(&[two(0, 0, "broadcast"), two(1, 0, "all-gather")]);
    assert_eq!(named(&r), (None, None));
    assert!(r.text().contains("ranks disagree at #0: rank 0 called broadcast #0, rank 1 called all-gather #0"));
    assert!(!r.text().contains("culprit:"), "{}", r.text());
}

#[test]
fn doctor_finds_a_healthy_job_healthy() {
    let mut records: Vec<Record> = (0..4).map(|r| record(r, 10, vec![])).collect();
    // A send's per-link sequence number is no collective's.
    let send = Sig { op: "send".into(), ..Sig::default() };
    records[1].calls.push(Call { seq: 3, sig: send, state: "done".into(), ..Call::default() });
    let r = diagnose(&records);
    assert_eq!(r.exit, 0, "{}", r.text());
    let healthy = "braid doctor: no fault found in 4 records (communicator 0000abcd, epoch 0, 4 ranks, \
                   every rank's last call done)\n";
    assert_eq!(r.text(), healthy);
    assert!(r.groups[0].healthy && r.groups[0].culprit.is_none());
    // Without rank 0's record it is not.
    assert_eq!(diagnose(&records[1..]).exit, 1);
    // Another communicator's records are another report.
    let other = |rank, kind, blamed: &[usize]| Record {
        comm: "0000beef".into(),
        ..failed(rank, 1, "all-reduce", kind, blamed, 2_000)
    };
    records.extend([other(0, "peer-lost", &[1]), other(2, "peer-lost", &[1]), other(3, "peer-aborted", &[2])]);
    let r = diagnose(&records);
    assert_eq!((r.exit, r.groups.len()), (1, 2), "{}", r.text());
    assert!(r.groups[0].healthy && r.groups[0].lines[0].contains("communicator 0000abcd"));
    assert!(r.groups[1].lines[0].starts_with("braid doctor: communicator 0000beef"), "{}", r.text());
    assert_eq!(r.groups[1].culprit, Some(1), "{}", r.text());
}

#[test]
fn doctor_reads_a_directory_and_skips_what_is_no_record() {
    let dir = std::env::temp_dir().join(format!("braid-doctor-unit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let code = |dir: &Path| main(DoctorArgs { dir: dir.to_path_buf() });
    assert_eq!(code(&dir), 2, "an empty directory holds no records");
    assert_eq!(code(&dir.join("absent")), 2, "a directory that is not there");
    std::fs::write(dir.join("broken.json"), "{\"braid_flight_record\": 1, \"rank\": ").unwrap();
    std::fs::write(dir.join("other.json"), "{\"ranks\": 4}").unwrap();
    std::fs::write(dir.join("norank.json"), "{\"braid_flight_record\": 1, \"calls\": []}").unwrap();
    std::fs::write(dir.join("notes.txt"), "not json at all").unwrap();
    assert_eq!(code(&dir), 2, "files that are no records");
    for rank in 0..4 {
        let v = json!({"braid_flight_record": 1, "rank": rank, "world": 4, "comm": "0000abcd",
                       "calls": [call(0, "barrier", "done"), {"op": "barrier"}]});
        std::fs::write(dir.join(format!("braid-0000abcd-e0-rank{rank}.json")), v.to_string()).unwrap();
    }
    let (records, notes) = load(&dir).unwrap();
    assert_eq!((records.len(), records[0].calls.len()), (4, 1), "a call without seq is left out");
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(notes[0].starts_with("skipping broken.json: not valid JSON"), "{notes:?}");
    assert!(notes[1].starts_with("skipping norank.json: no whole-number field `rank`"), "{notes:?}");
    assert!(notes[2].starts_with("skipping other.json: not a flight record"), "{notes:?}");
    assert_eq!(code(&dir), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
