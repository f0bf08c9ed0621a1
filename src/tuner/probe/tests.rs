//! Probe tests: fingerprints, clamping, the cache and model texts, and the
//! agreement protocol over fake links between threads.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::*;
use crate::algorithm::Algorithm;
use crate::bootstrap::{MemStore, PrefixStore};
use std::path::Path;

use crate::tuner::cache::{cache_path, decode_cache, encode_cache, fingerprint_from};

/// A fresh directory under the system's temporary one.
fn temp_dir(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "braid-probe-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const CPUINFO: &str = "processor\t: 0\nmodel name\t: Test CPU @ 2.0GHz\nflags\t\t: fpu\n\n\
                       processor\t: 1\nmodel name\t: Test CPU @ 2.0GHz\n";

#[test]
fn fingerprints_name_cpu_memory_kernel_and_version() {
    let fp = fingerprint_from(CPUINFO, "MemTotal:       8000000 kB\nMemFree: 1 kB\n", "6.1.0-test\n");
    assert_eq!(
        fp,
        format!("cpu=Test CPU @ 2.0GHz;cpus=2;mem=8000000 kB;kernel=6.1.0-test;braid={}", env!("CARGO_PKG_VERSION"))
    );
    assert_ne!(fp, fingerprint_from(CPUINFO, "MemTotal: 16000000 kB\n", "6.1.0-test"), "more memory");
    assert_ne!(fp, fingerprint_from(CPUINFO, "MemTotal:       8000000 kB\n", "6.2.0"), "another kernel");
    let one_cpu = CPUINFO.split("\n\n").next().unwrap();
    assert!(fingerprint_from(one_cpu, "", "k").contains("cpus=1;mem=unknown"));
    // Nothing readable still gives a fingerprint (and no separator or newline leaks in).
    let fp = fingerprint_from("", "", "a;b\nc");
    assert!(fp.starts_with("cpu=unknown;cpus=") && fp.contains("kernel=a b c;"), "{fp}");
    let here = host_fingerprint();
    assert!(here.contains(&format!("braid={}", env!("CARGO_PKG_VERSION"))) && !here.contains('\n'), "{here}");
}

#[test]
fn measured_values_stay_near_the_defaults_and_nonsense_falls_back() {
    assert_eq!(sane(5.0, 1.0), 5.0);
    assert_eq!(sane(50.0, 1.0), 10.0);
    assert_eq!(sane(0.01, 1.0), 0.1);
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(sane(bad, 2.0), 2.0, "{bad}");
        assert_eq!(sane_far(bad, 3.5), 3.5, "{bad}");
    }
    assert_eq!((sane_far(0.5, 3.5), sane_far(2.0, 3.5), sane_far(20.0, 3.5)), (1.0, 2.0, 8.0));
    let d = CostModel::default().cost(LinkClass::SharedMemory);
    let m = Measured {
        alpha: d.alpha * 2.0,
        beta: f64::NAN,
        gamma: Some(d.gamma * 1000.0),
        far: None,
        busy_round: None,
        algo_far: Default::default(),
    };
    let c = measured_cost(LinkClass::SharedMemory, &m);
    assert_eq!((c.alpha, c.beta, c.gamma, c.far), (d.alpha * 2.0, d.beta, d.gamma * 10.0, d.far));
    assert_eq!((c.duplex, c.per_host), (d.duplex, d.per_host), "kept from the defaults");
    let t = CostModel::default().cost(LinkClass::Tcp);
    let c = measured_cost(
        LinkClass::Tcp,
        &Measured { alpha: 1e-5, beta: 1e-9, gamma: None, far: None, busy_round: None, algo_far: Default::default() },
    );
    assert_eq!((c.alpha, c.beta, c.gamma, c.far), (1e-5, 1e-9, t.gamma, t.far));
    // A 1 Gbit/s link (what the emulated hosts measured) keeps its own speed; a
    // 100 Mbit/s one too; only past 100x of the default is it clamped.
    let wire = |beta| {
        let m = Measured { alpha: 1e-5, beta, gamma: None, far: None, busy_round: None, algo_far: Default::default() };
        measured_cost(LinkClass::Tcp, &m).beta
    };
    assert_eq!(wire(8.585874557495117e-9), 8.585874557495117e-9);
    assert_eq!(wire(8e-8), 8e-8);
    assert_eq!(wire(1.0), t.beta * 100.0);
    assert_eq!(wire(f64::NAN), t.beta);
    // Memory links keep the narrower bounds.
    let shm = |beta| {
        let m = Measured { alpha: 1e-6, beta, gamma: None, far: None, busy_round: None, algo_far: Default::default() };
        measured_cost(LinkClass::SharedMemory, &m).beta
    };
    assert_eq!(shm(d.beta * 50.0), d.beta * 10.0);
}

#[test]
fn measured_text_round_trips_and_rejects_garbage() {
    let m = Measured {
        alpha: 4.5e-7,
        beta: 1.0 / 48e9,
        gamma: Some(1.0 / 41e9),
        far: None,
        busy_round: None,
        algo_far: Default::default(),
    };
    assert_eq!(m.to_string().parse::<Measured>().unwrap(), m);
    // Per-algorithm factors travel by name; out-of-bounds ones are clamped.
    let mut with_algos = m;
    with_algos.algo_far.set(Algorithm::Tree, 0.7);
    with_algos.algo_far.set(Algorithm::Direct, 1.0 / 3.0);
    let text = with_algos.to_string();
    assert!(text.contains(" algo.tree=0.7"), "{text}");
    assert_eq!(text.parse::<Measured>().unwrap(), with_algos);
    with_algos.algo_far.set_near(Algorithm::HalvingDoubling, 1.3);
    with_algos.algo_far.set_at(Algorithm::Doubling, AlgoFar::MID, 2.5);
    with_algos.algo_far.set_latency(Algorithm::Direct, 1.75);
    let text = with_algos.to_string();
    assert!(text.contains(" lat.direct=1.75"), "{text}");
    assert!(text.contains(" near.halving-doubling=1.3"), "{text}");
    assert!(text.contains(" mid.doubling=2.5"), "{text}");
    assert_eq!(text.parse::<Measured>().unwrap(), with_algos);
    let clamped: Measured = "alpha=1e-6 beta=2e-11 algo.doubling=40 near.tree=0.01".parse().unwrap();
    assert_eq!(clamped.algo_far.get(Algorithm::Doubling), AlgoFar::BOUNDS.1);
    assert_eq!(clamped.algo_far.get_near(Algorithm::Tree), AlgoFar::BOUNDS.0);
    for bad in [
        "",
        "alpha=1",
        "alpha=1 beta=x",
        "alpha=1 beta=inf",
        "alpha=1 beta=2 zeta=3",
        "alpha=NaN beta=1",
        "junk",
        "alpha=1 beta=2 algo.spiral=1",
        "alpha=1 beta=2 algo.tree=x",
        "alpha=1 beta=2 near.spiral=1",
        "alpha=1 beta=2 near.tree=",
        "alpha=1 beta=2 mid.ring=one",
        "alpha=1 beta=2 lat.spiral=1",
    ] {
        assert!(bad.parse::<Measured>().is_err(), "{bad}");
    }
    // A noisy measurement (a negative difference of medians) parses, and its cost
    // falls back to the default instead of failing every rank's set-up.
    let noisy: Measured = "alpha=1e-6 beta=-2.3e-11".parse().unwrap();
    let d = CostModel::default().cost(LinkClass::SharedMemory);
    assert_eq!(measured_cost(LinkClass::SharedMemory, &noisy).beta, d.beta);
}

#[test]
fn the_cache_round_trips_per_key_and_treats_bad_files_as_misses() {
    let dir = temp_dir("cache").join("nested");
    let m = Measured {
        alpha: 1e-6,
        beta: 2e-11,
        gamma: Some(3e-11),
        far: Some(2.5),
        busy_round: None,
        algo_far: Default::default(),
    };
    let key = local_key(LinkClass::SharedMemory, "cpu=x", 2, 1);
    assert_eq!(read_cache(&dir, LinkClass::SharedMemory, &key), None, "no directory yet");
    let path = write_cache(&dir, LinkClass::SharedMemory, &key, &m).unwrap();
    assert_eq!(path, cache_path(&dir, LinkClass::SharedMemory, &key));
    assert_eq!(read_cache(&dir, LinkClass::SharedMemory, &key), Some(m));
    // Another host (or version) is another key: a miss, also when it lands in the same file.
    let other = local_key(LinkClass::SharedMemory, "cpu=y", 2, 1);
    assert_eq!(read_cache(&dir, LinkClass::SharedMemory, &other), None);
    assert!(decode_cache(&std::fs::read_to_string(&path).unwrap(), &other).unwrap_err().contains("key differs"));
    assert_eq!(remote_key(LinkClass::Tcp, "a", "b"), remote_key(LinkClass::Tcp, "b", "a"));
    // Corrupted, truncated, oversized: misses.
    for bad in [&b"garbage"[..], b"braid tuner cache 1\nkey ", &vec![b'x'; 70 << 10], b"\xff\xfe"] {
        std::fs::write(&path, bad).unwrap();
        assert_eq!(read_cache(&dir, LinkClass::SharedMemory, &key), None);
    }
    let text = encode_cache(&key, &m).replace("alpha=0.000001", "alpha=0");
    assert!(decode_cache(&text, &key).is_err());
    // No temporary file is left behind.
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn the_model_text_round_trips_bit_for_bit() {
    let mut model = CostModel::default();
    let d = model.cost(LinkClass::SharedMemory);
    model.set(LinkClass::SharedMemory, LinkCost { alpha: 1.0 / 3.0 * 1e-6, beta: 0.1 / 7e9, far: 2.75, ..d });
    model.algo_far.set(Algorithm::HalvingDoubling, 1.0 / 7.0 * 3.0);
    model.algo_far.set_near(Algorithm::Doubling, 1.0 / 7.0 * 9.0);
    let p = Probed { model, source: ProbeSource::Measured };
    assert_eq!(decode_model(&encode_model(&p)).unwrap(), p);
    assert!(decode_model(&encode_model(&p).replace("algo.halving-doubling", "algo.x")).is_err());
    assert!(decode_model(&encode_model(&p).replace("near.doubling", "near.x")).is_err());
    let text = encode_model(&p);
    let bad = text.replace(&format!("near.doubling={}", 1.0 / 7.0 * 9.0), "near.doubling=-1");
    assert!(decode_model(&bad).unwrap_err().contains("near.doubling"), "the error names the field");
    let builtin = Probed { model: CostModel::default(), source: ProbeSource::Cache };
    assert_eq!(decode_model(&encode_model(&builtin)).unwrap(), builtin);
    let text = encode_model(&p);
    assert!(decode_model(&text.replace("source measured", "source x")).is_err());
    assert!(decode_model(&text.replace(" far=2.75", "")).is_err(), "a missing field");
    assert!(decode_model(&text.replace("far=2.75", "far=NaN")).is_err());
    assert!(decode_model(&text.lines().take(4).collect::<Vec<_>>().join("\n")).is_err());
}

#[test]
fn pairs_follow_the_host_layout() {
    assert_eq!(Pairs::of(&[]), Pairs::default());
    assert_eq!(Pairs::of(&[0]), Pairs::default());
    assert_eq!(Pairs::of(&[0, 0, 0]), Pairs { local: Some((0, 1)), remote: None });
    assert_eq!(Pairs::of(&[0, 1]), Pairs { local: None, remote: Some((0, 1)) });
    assert_eq!(Pairs::of(&[0, 1, 0, 1]), Pairs { local: Some((0, 2)), remote: Some((0, 1)) });
    assert_eq!(Pairs::of(&[0, 1, 1]), Pairs { local: Some((1, 2)), remote: Some((0, 1)) });
    assert_eq!(Pairs::of(&[0, 1, 2, 2]), Pairs { local: Some((2, 3)), remote: Some((0, 1)) });
}

/// Links between threads: byte vectors over channels; same host is shared memory.
struct FakeLinks {
    rank: usize,
    hosts: Vec<usize>,
    tx: Vec<Sender<Vec<u8>>>,
    rx: Vec<Mutex<Receiver<Vec<u8>>>>,
    fail: bool,
}

impl Exchange for FakeLinks {
    fn send(&self, buf: &[u8], peer: usize) -> Result<()> {
        if self.fail {
            return Err(Error::Unsupported("fake link down".into()));
        }
        self.tx[peer].send(buf.to_vec()).map_err(|_| Error::Store("peer gone".into()))
    }
    fn recv(&self, buf: &mut [u8], peer: usize) -> Result<()> {
        let got = self.rx[peer].lock().unwrap().recv().map_err(|_| Error::Store("peer gone".into()))?;
        buf.copy_from_slice(&got);
        Ok(())
    }
    fn class_to(&self, peer: usize) -> Option<LinkClass> {
        (peer != self.rank).then(|| {
            if self.hosts[peer] == self.hosts[self.rank] {
                LinkClass::SharedMemory
            } else {
                LinkClass::Tcp
            }
        })
    }
}

/// Run the probe on one thread per rank; `fail` makes that rank's links fail.
fn run(hosts: &[usize], dir: &Path, fail: Option<usize>) -> Vec<Result<Probed>> {
    let n = hosts.len();
    let mut txs: Vec<Vec<Option<Sender<Vec<u8>>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    let mut rxs: Vec<Vec<Option<Receiver<Vec<u8>>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for (a, row) in txs.iter_mut().enumerate() {
        for (b, slot) in row.iter_mut().enumerate() {
            let (t, r) = channel();
            *slot = Some(t);
            rxs[b][a] = Some(r);
        }
    }
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let handles: Vec<_> = txs
        .into_iter()
        .zip(rxs)
        .enumerate()
        .map(|(rank, (tx, rx))| {
            let links = FakeLinks {
                rank,
                hosts: hosts.to_vec(),
                tx: tx.into_iter().map(Option::unwrap).collect(),
                rx: rx.into_iter().map(|r| Mutex::new(r.unwrap())).collect(),
                fail: fail == Some(rank),
            };
            let (store, dir, hosts) = (store.clone(), dir.to_path_buf(), hosts.to_vec());
            std::thread::spawn(move || {
                let scoped = PrefixStore::new("braid/test", store);
                let setup = ProbeSetup {
                    rank,
                    hosts: &hosts,
                    store: &scoped,
                    timeout: Duration::from_secs(20),
                    cache_dir: Some(dir),
                };
                agree(&setup, &links)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn all_same(results: Vec<Result<Probed>>) -> Probed {
    let got: Vec<Probed> = results.into_iter().map(Result::unwrap).collect();
    assert!(got.iter().all(|p| *p == got[0]), "ranks disagree: {got:?}");
    got[0].clone()
}

#[test]
fn one_host_measures_then_reads_the_cache_and_every_rank_agrees() {
    let dir = temp_dir("agree1");
    let first = all_same(run(&[0, 0, 0], &dir, None));
    assert_eq!(first.source, ProbeSource::Measured);
    assert_ne!(first.model.cost(LinkClass::SharedMemory), CostModel::default().cost(LinkClass::SharedMemory));
    assert_eq!(first.model.cost(LinkClass::Tcp), CostModel::default().cost(LinkClass::Tcp), "no second host");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "one cache file");
    let second = all_same(run(&[0, 0, 0], &dir, None));
    assert_eq!(second, Probed { source: ProbeSource::Cache, ..first });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_hosts_measure_both_classes_with_the_pairs_that_have_them() {
    let dir = temp_dir("agree2");
    // Rank 0 is alone on its host: ranks 1 and 2 measure shared memory, 0 and 1 TCP.
    let p = all_same(run(&[0, 1, 1], &dir, None));
    assert_eq!(p.source, ProbeSource::Measured);
    let d = CostModel::default();
    assert_ne!(p.model.cost(LinkClass::SharedMemory), d.cost(LinkClass::SharedMemory));
    let tcp = p.model.cost(LinkClass::Tcp);
    assert_ne!(tcp, d.cost(LinkClass::Tcp));
    assert_eq!((tcp.gamma, tcp.far), (d.cost(LinkClass::Tcp).gamma, 1.0), "not measured for the network");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "a file per class");
    assert_eq!(all_same(run(&[0, 1, 1], &dir, None)).source, ProbeSource::Cache);
    // One host alone has no pair: built in, without any store traffic.
    assert_eq!(all_same(run(&[0], &dir, None)).source, ProbeSource::Builtin);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_measurement_fails_every_rank_naming_rank_and_step() {
    let dir = temp_dir("fail");
    let results = run(&[0, 0, 0], &dir, Some(0));
    let errors: Vec<String> = results.into_iter().map(|r| r.unwrap_err().to_string()).collect();
    assert!(errors[0].contains("rank 0: tuner probe, measuring the local class (shm)"), "{}", errors[0]);
    assert!(errors[0].contains("fake link down"), "{}", errors[0]);
    // Rank 2 only waits for the model, and learns why from rank 0.
    assert!(errors[2].contains("rank 2: tuner probe, waiting for rank 0's model"), "{}", errors[2]);
    assert!(errors[2].contains("rank 0 failed"), "{}", errors[2]);
    let _ = std::fs::remove_dir_all(&dir);
}
