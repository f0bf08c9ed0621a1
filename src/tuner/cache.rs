//! The probe's per-host cache: the host fingerprint that keys it, where it lives
//! (`BRAID_CACHE_DIR`), and its small text files (see [`super::probe`], "The cache").

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::cost::LinkClass;
use super::measured::Measured;

/// A description of this host's hardware and software: CPU model and count,
/// total memory, kernel release, braid's version. Read once per process.
pub fn host_fingerprint() -> String {
    static FP: OnceLock<String> = OnceLock::new();
    FP.get_or_init(|| {
        let read = |p: &str| read_bounded(Path::new(p), 8 << 20).unwrap_or_default();
        let kernel = read("/proc/sys/kernel/osrelease");
        let kernel = if kernel.trim().is_empty() { uname_release() } else { kernel };
        fingerprint_from(&read("/proc/cpuinfo"), &read("/proc/meminfo"), &kernel)
    })
    .clone()
}

/// The fingerprint from the texts of `/proc/cpuinfo`, `/proc/meminfo` and the
/// kernel release.
pub(crate) fn fingerprint_from(cpuinfo: &str, meminfo: &str, kernel: &str) -> String {
    let field = |line: &str, name: &str| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == name).then(|| v.trim().to_string())
    };
    let model = ["model name", "Model", "cpu model", "CPU part"]
        .iter()
        .find_map(|n| cpuinfo.lines().find_map(|l| field(l, n)))
        .unwrap_or_else(|| "unknown".into());
    let listed = cpuinfo.lines().filter(|l| field(l, "processor").is_some()).count();
    let cpus = if listed > 0 { listed } else { std::thread::available_parallelism().map_or(0, |n| n.get()) };
    let mem = meminfo.lines().find_map(|l| field(l, "MemTotal")).unwrap_or_else(|| "unknown".into());
    let clean = |s: &str| s.chars().map(|c| if c.is_control() || c == ';' { ' ' } else { c }).collect::<String>();
    format!(
        "cpu={};cpus={cpus};mem={};kernel={};braid={}",
        clean(&model),
        clean(&mem),
        clean(kernel.trim()),
        env!("CARGO_PKG_VERSION")
    )
}

fn uname_release() -> String {
    nix::sys::utsname::uname().map_or_else(|_| "unknown".into(), |u| u.release().to_string_lossy().into_owned())
}

/// The cache key of the local class on the host with fingerprint `fp`.
pub fn local_key(class: LinkClass, fp: &str, ranks_on_host: usize, hosts: usize) -> String {
    // A world on one host fits the costs to its own all-reduce (see `calibrate`),
    // and how many ranks share the cores changes them: one entry per shape.
    format!("local {class} host={fp} ranks={ranks_on_host} hosts={hosts}")
}

/// Number of hosts of a layout numbered by lowest rank.
pub(crate) fn num_hosts(hosts: &[usize]) -> usize {
    hosts.iter().max().map_or(1, |m| m + 1)
}

/// The cache key of the remote class between the hosts with fingerprints `a` and `b`.
pub(crate) fn remote_key(class: LinkClass, a: &str, b: &str) -> String {
    let (a, b) = if a <= b { (a, b) } else { (b, a) };
    format!("remote {class} hosts={a} | {b}")
}

/// `$BRAID_CACHE_DIR`, else `$XDG_CACHE_HOME/braid`, else `$HOME/.cache/braid`. The
/// variable is read here too, not only by [`crate::Config::from_env`], because the
/// cache belongs to the host: communicators built in code share it.
pub fn default_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("BRAID_CACHE_DIR") {
        return Some(dir);
    }
    match var("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        Some(x) => Some(x.join("braid")),
        None => var("HOME").map(|h| h.join(".cache").join("braid")),
    }
}

/// Cache files are this small; a larger one is not ours.
const CACHE_MAX_BYTES: u64 = 64 << 10;
const CACHE_HEADER: &str = "braid tuner cache 1";

fn fnv64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The file holding the entry of `key` for `class` in `dir`.
pub(crate) fn cache_path(dir: &Path, class: LinkClass, key: &str) -> PathBuf {
    dir.join(format!("tuner-{class}-{:016x}.txt", fnv64(key)))
}

fn read_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("larger than {max} bytes")));
    }
    Ok(text)
}

/// The cache file's text for `key`.
pub(crate) fn encode_cache(key: &str, m: &Measured) -> String {
    format!("{CACHE_HEADER}\nkey {key}\n{m}\n")
}

/// The entry in `text` if it is one for `key`.
pub(crate) fn decode_cache(text: &str, key: &str) -> std::result::Result<Measured, String> {
    let mut lines = text.lines();
    if lines.next() != Some(CACHE_HEADER) {
        return Err("not a braid tuner cache file (header)".into());
    }
    match lines.next().and_then(|l| l.strip_prefix("key ")) {
        Some(k) if k == key => {}
        Some(_) => return Err("the key differs (another host or version)".into()),
        None => return Err("no key line".into()),
    }
    let values = lines.next().ok_or("no values")?;
    if lines.any(|l| !l.trim().is_empty()) {
        return Err("trailing lines".into());
    }
    // What this host wrote was sanitised: a value that is not positive means the
    // file was damaged, so it is a miss (unlike a peer's fresh measurement).
    let m: Measured = values.parse()?;
    let all = [Some(m.alpha), Some(m.beta), m.gamma, m.far, m.busy_round];
    if all.into_iter().flatten().any(|v| v <= 0.0) {
        return Err("a value is not positive".into());
    }
    Ok(m)
}

/// The cached entry of `key`, or None (missing, unreadable or invalid: a miss).
pub fn read_cache(dir: &Path, class: LinkClass, key: &str) -> Option<Measured> {
    let path = cache_path(dir, class, key);
    let text = match read_bounded(&path, CACHE_MAX_BYTES) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), "tuner cache unreadable ({e}); probing");
            return None;
        }
    };
    match decode_cache(&text, key) {
        Ok(m) => Some(m),
        Err(why) => {
            tracing::warn!(path = %path.display(), "tuner cache entry ignored ({why}); probing");
            None
        }
    }
}

/// Write the entry of `key` atomically (a temporary file renamed into place).
pub(crate) fn write_cache(dir: &Path, class: LinkClass, key: &str, m: &Measured) -> std::io::Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir)?;
    let path = cache_path(dir, class, key);
    let tmp = dir.join(format!(".tuner-{class}.{}.{}.tmp", std::process::id(), SERIAL.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&tmp, encode_cache(key, m)).and_then(|()| std::fs::rename(&tmp, &path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(path)
}
