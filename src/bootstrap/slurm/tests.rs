use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| m.get(k).cloned()
}

#[test]
fn first_hosts_of_slurm_nodelists() {
    for (list, first, count) in [
        ("node[01-04,07]", "node01", 5),
        ("a[1-2],b3", "a1", 3),
        ("gpu-a[01-02]-ib", "gpu-a01-ib", 2),
        ("r[1-2]-n[3-4]", "r1-n3", 4),
        ("single", "single", 1),
        ("n[007-010]", "n007", 4),
        ("n[8-10]", "n8", 3),
        ("host.example.org,other", "host.example.org", 2),
        ("c[5]", "c5", 1),
        (" node[1-2] ", "node1", 2),
    ] {
        assert_eq!(first_host(list).unwrap(), first, "{list}");
        assert_eq!(host_count(list).unwrap(), count, "{list}");
    }
}

#[test]
fn malformed_nodelists_are_refused() {
    for bad in
        ["", "node[1-", "node]1[", "n[[1]]", "n[2-1]", "n[a-b]", "n[]", "a,,b", "n[1-2", "ho st", "n[1-2]x;y", "n[-3]"]
    {
        assert!(first_host(bad).is_err(), "accepted `{bad}`");
    }
    assert!(first_host(&"a".repeat(MAX_NODELIST + 1)).is_err());
}

#[test]
fn a_hostile_nodelist_is_counted_not_expanded() {
    // 10^17 hosts per bracket, three brackets: built lazily, the count saturates.
    let huge = "n[0-99999999999999999]-[0-99999999999999999]-[0-99999999999999999]";
    assert_eq!(first_host(huge).unwrap(), "n0-0-0");
    assert_eq!(host_count(huge).unwrap(), u64::MAX);
    assert!(first_host("n[0-9999999999999999999999]").is_err(), "a bound past 18 digits");
}

/// Expand a list the obvious way (small lists only): the reference for the parser.
fn expand(list: &str) -> Vec<String> {
    let mut hosts = Vec::new();
    for pattern in parse_list(list).unwrap() {
        let mut partial = vec![String::new()];
        for piece in pattern {
            partial = match piece {
                Piece::Text(t) => partial.into_iter().map(|p| p + t).collect(),
                Piece::Ranges(r) => partial
                    .into_iter()
                    .flat_map(|p| {
                        r.iter().flat_map(move |&(lo, hi, w)| {
                            let p = p.clone();
                            (lo..=hi).map(move |n| format!("{p}{n:0w$}"))
                        })
                    })
                    .collect(),
            };
        }
        hosts.extend(partial);
    }
    hosts
}

fn bracket() -> impl Strategy<Value = String> {
    prop::collection::vec((0u64..120, 0u64..5, 1usize..4), 1..4).prop_map(|ranges| {
        let items: Vec<String> = ranges
            .into_iter()
            .map(|(lo, len, w)| if len == 0 { format!("{lo:0w$}") } else { format!("{lo:0w$}-{}", lo + len) })
            .collect();
        format!("[{}]", items.join(","))
    })
}

fn pattern() -> impl Strategy<Value = String> {
    prop::collection::vec(prop_oneof!["[a-z][a-z0-9-]{0,3}", bracket()], 1..4).prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn first_host_and_count_agree_with_full_expansion(list in prop::collection::vec(pattern(), 1..4).prop_map(|p| p.join(","))) {
        let all = expand(&list);
        prop_assert_eq!(&first_host(&list).unwrap(), &all[0]);
        prop_assert_eq!(host_count(&list).unwrap(), all.len() as u64);
    }
}

#[test]
fn ports_come_from_the_reservation_or_the_job_and_step() {
    assert_eq!(reserved_port("12000-12010").unwrap(), 12000);
    assert_eq!(reserved_port("12005").unwrap(), 12005);
    assert_eq!(reserved_port("12001,12003-12004").unwrap(), 12001);
    for bad in ["", "x-1", "0", "70000-70001"] {
        assert!(reserved_port(bad).is_err(), "{bad}");
    }
    let p = derived_port(4242, 0);
    assert_eq!(p, derived_port(4242, 0), "every rank derives the same port");
    assert_ne!(p, derived_port(4242, 1), "the next step of the job moves");
    assert_ne!(p, derived_port(4243, 0), "the next job moves");
    for (job, step) in [(0, 0), (u64::MAX, u64::MAX), (1 << 40, 7), (4294967294, 4294967291)] {
        assert!(DERIVED_PORTS.contains(&derived_port(job, step)), "{job}.{step}");
    }
}

#[test]
fn srun_without_pmix_derives_the_store_from_the_nodelist() {
    let d = slurm_store(
        &env(&[
            ("SLURM_STEP_NODELIST", "node[01-02]"),
            ("SLURM_JOB_NODELIST", "node[01-08]"),
            ("SLURM_STEP_RESV_PORTS", "12000-12010"),
        ]),
        1,
    )
    .unwrap();
    assert_eq!(d.store, "slurm://node01:12000");
    assert!(d.how.contains("SLURM_STEP_NODELIST") && d.how.contains("2 hosts"), "{}", d.how);
    let d =
        slurm_store(&env(&[("SLURM_JOB_NODELIST", "gpu[7-9]"), ("SLURM_JOB_ID", "4242"), ("SLURM_STEP_ID", "3")]), 0)
            .unwrap();
    assert_eq!(d.store, format!("slurm://gpu7:{}", derived_port(4242, 3)));
    assert!(d.how.contains("SLURM_JOB_ID=4242"), "{}", d.how);
    // With PMIx, the nodelist's store is the fallback.
    let d = slurm_store(
        &env(&[
            ("SLURM_JOB_NODELIST", "n1"),
            ("SLURM_JOB_ID", "1"),
            ("PMIX_NAMESPACE", "slurm.pmix.1.0"),
            ("PMIX_RANK", "0"),
        ]),
        0,
    )
    .unwrap();
    assert_eq!(d.store, format!("pmix:slurm.pmix.1.0;else=slurm://n1:{}", derived_port(1, 0)));
}

#[test]
fn srun_without_a_nodelist_or_port_says_what_is_missing() {
    let e = slurm_store(&env(&[("SLURM_JOB_ID", "1")]), 2).unwrap_err().to_string();
    assert!(e.contains("SLURM_STEP_NODELIST") && e.contains("rank 2") && e.contains("BRAID_STORE"), "{e}");
    let e = slurm_store(&env(&[("SLURM_JOB_NODELIST", "n[1-2]")]), 0).unwrap_err().to_string();
    assert!(e.contains("SLURM_JOB_ID") && e.contains("SLURM_STEP_RESV_PORTS"), "{e}");
    let e = slurm_store(&env(&[("SLURM_JOB_NODELIST", "n[1-"), ("SLURM_JOB_ID", "1")]), 0).unwrap_err().to_string();
    assert!(e.contains("SLURM_JOB_NODELIST") && e.contains("unclosed"), "{e}");
}

#[test]
fn host_names_match_short_or_fully_qualified() {
    assert!(same_host("node01", "node01"));
    assert!(same_host("node01", "node01.cluster.example"));
    assert!(same_host("node01.cluster.example", "node01"));
    assert!(same_host("NODE01", "node01"));
    assert!(!same_host("node01", "node011"));
    assert!(!same_host("node01.a", "node01.b"));
    assert!(!same_host("node0", "node01.cluster"));
}

#[test]
fn rank_0_elsewhere_than_the_first_host_says_so() {
    let e =
        connect("no-such-node-xyz:12000", true, 2, JobKey::none(), Duration::from_secs(1)).err().unwrap().to_string();
    assert!(e.contains("rank 0") && e.contains("no-such-node-xyz") && e.contains("BRAID_STORE"), "{e}");
}

#[test]
fn rank_0_on_the_first_host_hosts_the_store_the_others_reach() {
    let me = kernel_host_name();
    let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port();
    // Only the check reads SLURMD_NODENAME; this process's host name is the fallback.
    if std::env::var("SLURMD_NODENAME").is_ok() {
        return;
    }
    let host = connect(&format!("{me}:{port}"), true, 2, JobKey::none(), Duration::from_secs(5)).unwrap();
    host.set("k", b"v").unwrap();
    let other = connect(&format!("127.0.0.1:{port}"), false, 2, JobKey::none(), Duration::from_secs(5)).unwrap();
    assert_eq!(other.get("k").unwrap().as_deref(), Some(&b"v"[..]));
}
