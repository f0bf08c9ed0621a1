use super::*;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| m.get(k).cloned()
}

const JOB: [(&str, &str); 2] =
    [("OMPI_MCA_ess_base_jobid", "983498753"), ("OMPI_MCA_orte_precondition_transports", "f0eac734-d0326c81")];

#[test]
fn open_mpi_with_pmix_meets_through_it_and_falls_back_to_the_private_store_on_one_host() {
    let pmix = [("PMIX_NAMESPACE", "983498753"), ("PMIX_RANK", "1")];
    let one = ompi_store(&env(&[pmix[0], pmix[1], JOB[0], JOB[1]]), 1, 4, Some(4)).unwrap();
    assert_eq!(one.store, "pmix:983498753;else=local:ompi-983498753-f0eac734-d0326c81");
    assert!(one.how.contains("PMIx"), "{}", one.how);
    let many = ompi_store(&env(&[pmix[0], pmix[1], JOB[0], JOB[1]]), 1, 4, Some(2)).unwrap();
    assert_eq!(many.store, "pmix:983498753");
}

#[test]
fn open_mpi_without_pmix_on_one_host_takes_a_private_store_keyed_by_the_job() {
    let d = ompi_store(&env(&JOB), 0, 4, Some(4)).unwrap();
    assert_eq!(d.store, "local:ompi-983498753-f0eac734-d0326c81");
    assert!(d.how.contains("one host") && d.how.contains("mpi"), "{}", d.how);
    // Without mpirun's random salt the job id alone keys it.
    assert_eq!(ompi_store(&env(&JOB[..1]), 0, 2, Some(2)).unwrap().store, "local:ompi-983498753");
}

#[test]
fn open_mpi_across_hosts_without_pmix_fails_with_the_exact_hint() {
    for local in [Some(2), None] {
        let e = ompi_store(&env(&JOB), 3, 4, local).unwrap_err().to_string();
        assert!(e.contains("-x BRAID_STORE=tcp://HOST:PORT"), "{e}");
        assert!(e.contains("rank 3") && e.contains("launcher mpi") && e.contains("PMIX_NAMESPACE"), "{e}");
    }
    // A job id that is not a safe file name is refused, not used as a path.
    let e = ompi_store(&env(&[("OMPI_MCA_ess_base_jobid", "../../etc")]), 0, 2, Some(2)).unwrap_err().to_string();
    assert!(e.contains("job id") && e.contains("-x BRAID_STORE"), "{e}");
}

#[test]
fn mpich_without_pmix_names_the_mpiexec_flag() {
    let e = mpich_store(&env(&[]), 2).unwrap_err().to_string();
    assert!(e.contains("-genv BRAID_STORE") && e.contains("PMI_RANK") && e.contains("rank 2"), "{e}");
    let d = mpich_store(&env(&[("PMIX_NAMESPACE", "kvs_1"), ("PMIX_RANK", "2")]), 2).unwrap();
    assert_eq!(d.store, "pmix:kvs_1");
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("braid-mpi-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_file(&d);
    d
}

#[test]
fn the_private_directory_is_made_0700_and_a_link_or_an_open_one_is_refused() {
    let fresh = scratch("fresh");
    drop(open_private_dir(&fresh).unwrap());
    assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o700);
    let link = scratch("link");
    std::os::unix::fs::symlink(&fresh, &link).unwrap();
    let e = open_private_dir(&link).unwrap_err().to_string();
    assert!(e.contains("link"), "{e}");
    let open = scratch("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = open_private_dir(&open).unwrap_err().to_string();
    assert!(e.contains("mode 755") && e.contains("remove it"), "{e}");
    for d in [&fresh, &open] {
        std::fs::remove_dir_all(d).unwrap();
    }
    std::fs::remove_file(&link).unwrap();
}

#[test]
fn a_link_in_place_of_the_store_file_is_not_followed() {
    let dir = scratch("filelink");
    let fd = open_private_dir(&dir).unwrap();
    let target = scratch("filelink-target");
    std::fs::write(&target, "braid-store v1 x 127.0.0.1:1").unwrap();
    std::os::unix::fs::symlink(&target, dir.join(STORE_FILE)).unwrap();
    assert!(read_in(&fd, STORE_FILE).is_err());
    // Writing replaces the link itself; the file it pointed at is untouched.
    write_in(&fd, STORE_FILE, "new").unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "braid-store v1 x 127.0.0.1:1");
    assert_eq!(read_in(&fd, STORE_FILE).unwrap().as_deref(), Some("new"));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_file(&target).unwrap();
}

fn unique_id(name: &str) -> String {
    format!("test-{}-{name}", std::process::id())
}

#[test]
fn one_host_ranks_meet_in_the_private_store_which_is_then_removed() {
    let id = unique_id("meet");
    let world = 4;
    // A file left by a dead job with the same id: nothing listens at its port.
    let dir = local_dir(&id).unwrap();
    let fd = open_private_dir(&dir).unwrap();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    write_in(&fd, STORE_FILE, &Published { id: "stale".into(), addrs: vec![dead] }.encode()).unwrap();
    drop(fd);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let id = id.clone();
            std::thread::spawn(move || {
                // The others start first and must wait for rank 0.
                if rank == 0 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                let store = connect_local(&id, rank == 0, world, JobKey::none(), Duration::from_secs(20)).unwrap();
                store.set(&format!("r{rank}"), &[rank as u8]).unwrap();
                store.wait(&["r0", "r1", "r2", "r3"], Duration::from_secs(20)).unwrap();
                let sum: u8 = (0..world).map(|r| store.get(&format!("r{r}")).unwrap().unwrap()[0]).sum();
                (rank, sum, store)
            })
        })
        .collect();
    // Each thread returns its store, so rank 0's server outlives every wait.
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (rank, sum, _) in &results {
        assert_eq!(*sum, 6, "rank {rank}");
    }
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn rank_0_says_how_many_ranks_never_came() {
    let id = unique_id("absent");
    let e = connect_local(&id, true, 3, JobKey::none(), Duration::from_millis(500)).err().unwrap().to_string();
    assert!(e.contains("none of the 2 other ranks"), "{e}");
    assert!(e.contains("launcher mpi") && e.contains("BRAID_STORE"), "{e}");
    assert!(!local_dir(&id).unwrap().exists());
}

#[test]
fn a_rank_without_rank_0_fails_within_its_timeout_naming_the_file() {
    let id = unique_id("norank0");
    let t0 = Instant::now();
    let e = connect_local(&id, false, 3, JobKey::none(), Duration::from_millis(400)).err().unwrap().to_string();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(e.contains("launcher mpi") && e.contains(STORE_FILE) && e.contains("rank 0"), "{e}");
    let _ = std::fs::remove_dir_all(local_dir(&id).unwrap());
}
