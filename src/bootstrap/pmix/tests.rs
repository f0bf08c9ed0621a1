use super::*;
use std::mem::offset_of;
use std::process::Command;

/// Where libpmix-dev puts the header: Debian's multiarch directory, else the
/// usual include directory.
fn header_dir() -> Option<std::path::PathBuf> {
    let multiarch = std::fs::read_dir("/usr/lib").ok()?.flatten().map(|e| e.path().join("pmix2/include"));
    let mut candidates = multiarch.chain([std::path::PathBuf::from("/usr/include")]);
    candidates.find(|d| d.join("pmix_common.h").is_file())
}

#[test]
fn published_values_round_trip() {
    let p = Published {
        id: "abc123".into(),
        addrs: vec!["10.0.0.1:4000".parse().unwrap(), "[fd00::2]:4000".parse().unwrap()],
    };
    assert_eq!(p.encode(), "braid-store v1 abc123 10.0.0.1:4000,[fd00::2]:4000");
    assert_eq!(Published::decode(&p.encode()).unwrap(), p);
}

#[test]
fn published_values_from_a_peer_are_bounded_and_checked() {
    let many = vec!["1.2.3.4:5"; MAX_ADDRS + 1].join(",");
    let e = Published::decode(&format!("braid-store v1 id {many}")).unwrap_err();
    assert!(e.contains("at most 32"), "{e}");
    let long = format!("braid-store v1 id 1.2.3.4:5{}", " ".repeat(MAX_VALUE));
    assert!(Published::decode(&long).unwrap_err().contains("bytes"));
    for bad in [
        "",
        "braid-store v2 id 1.2.3.4:5",
        "braid-store v1 id",
        "braid-store v1  1.2.3.4:5",
        "braid-store v1 id host:5",
        "braid-store v1 id 1.2.3.4:99999",
        "braid-store v1 id 1.2.3.4:5 extra",
    ] {
        assert!(Published::decode(bad).is_err(), "accepted `{bad}`");
    }
}

#[test]
fn store_urls_name_the_namespace_and_the_fallback() {
    assert_eq!(parse_url("pmix:983498753"), Some(("983498753", None)));
    assert_eq!(parse_url("pmix:ns;else=local:ompi-1"), Some(("ns", Some("local:ompi-1"))));
    assert_eq!(parse_url("tcp://h:1"), None);
}

#[test]
fn rank_0_publishes_every_interface_then_loopback() {
    let addrs = local_addresses(4321);
    assert!(!addrs.is_empty() && addrs.len() <= MAX_ADDRS);
    assert!(addrs.iter().all(|a| a.port() == 4321));
    assert!(addrs.last().unwrap().ip().is_loopback());
    assert_eq!(addrs.iter().filter(|a| a.ip().is_loopback()).count(), 1);
}

#[test]
fn a_missing_library_is_named() {
    let e = Api::load("libpmix-that-does-not-exist.so.2").err().unwrap();
    assert!(e.contains("libpmix-that-does-not-exist.so.2"), "{e}");
}

#[test]
fn a_client_skips_addresses_that_are_not_this_jobs_store() {
    let key = JobKey::none();
    let ours = bind_wildcard(key.clone(), 2).unwrap();
    let other = bind_wildcard(key.clone(), 2).unwrap();
    let port = |s: &TcpStoreServer| s.local_addr().port();
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    TcpStore::connect(&at(port(&ours)).to_string(), key.clone(), Duration::from_secs(5))
        .unwrap()
        .set(ID_KEY, b"ours")
        .unwrap();
    TcpStore::connect(&at(port(&other)).to_string(), key.clone(), Duration::from_secs(5))
        .unwrap()
        .set(ID_KEY, b"theirs")
        .unwrap();
    // A closed port, another job's store, then ours.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let p = Published { id: "ours".into(), addrs: vec![closed, at(port(&other)), at(port(&ours))] };
    let deadline = Instant::now() + Duration::from_secs(10);
    let store = connect_published(&p, key.clone(), deadline, Duration::from_secs(5)).unwrap();
    assert_eq!(store.get(ID_KEY).unwrap().as_deref(), Some(&b"ours"[..]));
    let only_wrong = Published { id: "ours".into(), addrs: vec![closed, at(port(&other))] };
    let e = connect_published(&only_wrong, key, deadline, Duration::from_secs(5)).err().unwrap();
    assert!(e.contains("not this job's") && e.contains(&closed.to_string()), "{e}");
}

/// Compile a C program against the installed header and compare every size and
/// offset braid relies on. Needs a C compiler and libpmix-dev (CI installs both).
#[test]
fn layouts_match_the_header() {
    let dir = header_dir();
    let cc = Command::new("cc").arg("--version").output().is_ok_and(|o| o.status.success());
    let Some(dir) = dir.filter(|_| cc) else {
        let why = "needs a C compiler and pmix_common.h (apt install gcc libpmix-dev)";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipped: {why}");
        return;
    };
    let header = dir.join("pmix_common.h");
    let scratch = std::env::temp_dir().join(format!("braid-pmix-layout-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let src = scratch.join("layout.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <stddef.h>
#include <pmix_common.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %d %d %d %d %d %d %d %u\n",
        sizeof(pmix_proc_t), offsetof(pmix_proc_t, rank), sizeof(pmix_value_t),
        offsetof(pmix_value_t, data), sizeof(pmix_info_t), offsetof(pmix_info_t, flags),
        offsetof(pmix_info_t, value), PMIX_MAX_NSLEN, PMIX_MAX_KEYLEN, PMIX_BOOL,
        PMIX_STRING, PMIX_INT, PMIX_GLOBAL, PMIX_SUCCESS, (unsigned)PMIX_RANK_WILDCARD);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = scratch.join("layout");
    let built = Command::new("cc").arg(format!("-I{}", dir.display())).arg(&src).arg("-o").arg(&exe).output().unwrap();
    assert!(built.status.success(), "cc: {}", String::from_utf8_lossy(&built.stderr));
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&scratch);
    let got: Vec<u64> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(|s| s.parse().unwrap()).collect();
    let ours: Vec<u64> = vec![
        std::mem::size_of::<PmixProc>() as u64,
        offset_of!(PmixProc, rank) as u64,
        std::mem::size_of::<PmixValue>() as u64,
        offset_of!(PmixValue, data) as u64,
        std::mem::size_of::<PmixInfo>() as u64,
        offset_of!(PmixInfo, flags) as u64,
        offset_of!(PmixInfo, value) as u64,
        PMIX_MAX_NSLEN as u64,
        PMIX_MAX_KEYLEN as u64,
        u64::from(PMIX_BOOL),
        u64::from(PMIX_STRING),
        u64::from(PMIX_INT),
        u64::from(PMIX_GLOBAL),
        PMIX_SUCCESS as u64,
        u64::from(PMIX_RANK_WILDCARD),
    ];
    assert_eq!(got, ours, "braid's PMIx declarations disagree with {}", header.display());
}
