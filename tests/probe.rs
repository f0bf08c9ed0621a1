//! The tuner's start-up probe over real shared-memory links: every rank installs
//! the same measured model, rank 0 caches it per host, a later communicator reads
//! the cache instead of measuring, and a corrupted cache is measured again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use braid::bootstrap::{MemStore, Store};
use braid::tuner::{CostModel, LinkClass, ProbeSource, Tuner};
use braid::Communicator;
use braid::TransportKind;

/// Build a 2-rank shared-memory communicator (ranks are threads) and return each
/// rank's tuner.
fn tuners(cache: &Path, probe: bool) -> Vec<Tuner> {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let (store, cache) = (store.clone(), cache.to_path_buf());
            std::thread::spawn(move || {
                let comm = Communicator::builder(rank, 2)
                    .store(store)
                    .transports(vec![TransportKind::Shm])
                    .timeout(Duration::from_secs(30))
                    .tuner_probe(probe)
                    .cache_dir(cache)
                    .build()
                    .expect("shared-memory communicator");
                // The links still work after the probe.
                let mut v = vec![rank as f32 + 1.0; 1000];
                comm.all_reduce_in_place(&mut v, braid::ReduceOp::Sum).unwrap();
                assert!(v.iter().all(|x| *x == 3.0));
                comm.tuner().0
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

fn cache_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map_or_else(|_| vec![], |d| d.map(|e| e.unwrap().path()).collect())
}

#[test]
fn ranks_agree_on_a_probed_model_that_is_cached_and_reprobed_when_corrupt() {
    let dir = std::env::temp_dir().join(format!("braid-probe-it-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let first = tuners(&dir, true);
    assert_eq!(first[0].source, ProbeSource::Measured);
    assert_eq!(first[0].model, first[1].model, "both ranks install the same numbers");
    assert_eq!(first[1].source, ProbeSource::Measured);
    let shm = first[0].model.cost(LinkClass::SharedMemory);
    let default = CostModel::default();
    assert_ne!(shm, default.cost(LinkClass::SharedMemory), "shared memory was measured");
    assert_eq!(first[0].model.cost(LinkClass::Tcp), default.cost(LinkClass::Tcp), "one host: no network probe");
    let d = default.cost(LinkClass::SharedMemory);
    for (v, dv) in [(shm.alpha, d.alpha), (shm.beta, d.beta), (shm.gamma, d.gamma)] {
        assert!(v >= dv * 0.1 * (1.0 - 1e-12) && v <= dv * 10.0 * (1.0 + 1e-12), "{v} vs default {dv}");
    }
    assert!((1.0..=8.0).contains(&shm.far));

    let files = cache_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("tuner-shm-") && name.ends_with(".txt"), "{name}");

    // Same host, same cache: nobody measures, and the numbers are the cached ones.
    let second = tuners(&dir, true);
    for t in &second {
        assert_eq!(t.source, ProbeSource::Cache);
        assert_eq!(t.model, first[0].model);
    }

    // A corrupted file is a miss: measured again, without error, and rewritten.
    std::fs::write(&files[0], b"braid tuner cache 1\nkey nonsense\n\xff").unwrap();
    let third = tuners(&dir, true);
    assert_eq!(third[0].source, ProbeSource::Measured);
    assert_eq!(third[0].model, third[1].model);
    assert!(std::fs::read_to_string(&files[0]).unwrap().starts_with("braid tuner cache 1\nkey local shm host="));

    // Probe off: the built-in model, the cache untouched.
    let off = tuners(&dir, false);
    for t in &off {
        assert_eq!((t.source, t.model), (ProbeSource::Builtin, default));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
