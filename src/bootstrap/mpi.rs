//! Stores for jobs started by `mpirun`/`mpiexec` without `BRAID_STORE`.
//!
//! - With PMIx (`PMIX_NAMESPACE` and `PMIX_RANK` set, as Open MPI 4+ and Slurm's
//!   `--mpi=pmix` do): the store is `pmix:NAMESPACE` ([`crate::bootstrap::pmix`]).
//! - Open MPI on one host (`OMPI_COMM_WORLD_LOCAL_SIZE == OMPI_COMM_WORLD_SIZE`):
//!   `local:ID`, a private store on this host, ID from the job id; also the fallback
//!   of `pmix:` when `libpmix.so.2` cannot be loaded.
//! - Open MPI across hosts without PMIx, and MPICH / Intel MPI (`PMI_RANK`) without
//!   PMIx: an error at once, with the `BRAID_STORE` to pass.
//!
//! The private store (`local:ID`): rank 0 hosts a [`TcpStoreServer`] on loopback,
//! and writes where it listens (the `braid-store v1 ID ADDR` line PMIx would carry)
//! to a file `store` in the directory `braid-UID-ID` under `/dev/shm` (else the
//! temporary directory). The directory is made with mode 0700, opened without
//! following links, and refused unless this user owns it and nobody else may enter
//! it; the file is read and written relative to it, never through a link. Each other
//! rank reads the file, connects, checks the random id, and says it joined; once all
//! have, rank 0 removes the file and the directory. A file left by an earlier job
//! with the same id (its rank 0 died) names a port nobody serves or another id: a
//! rank keeps reading until this job's rank 0 replaces it.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::JobKey;
use crate::bootstrap::hosted_store::HostedStore;
use crate::bootstrap::pmix::{self, Published, MAX_VALUE};
use crate::bootstrap::store::Store;
use crate::bootstrap::tcp_store::{StoreLimits, TcpStore, TcpStoreServer};
use crate::error::{Error, Result};

/// The hint every multi-host failure ends with.
pub const MPIRUN_HINT: &str =
    "pass the store to every rank: `mpirun -x BRAID_STORE=tcp://HOST:PORT ...` (HOST: rank 0's host, PORT: a free port there)";
const STORE_FILE: &str = "store";
/// Longest job id accepted in a directory name.
const MAX_ID: usize = 128;

/// What a launcher's variables said about the store, for the debug log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    /// The store URL.
    pub store: String,
    /// How it was found, in words.
    pub how: String,
}

/// The PMIx store URL when PMIx's variables are set, with `fallback` after `;else=`.
pub fn pmix_url(get: &impl Fn(&str) -> Option<String>, fallback: Option<&str>) -> Option<String> {
    let ns = get("PMIX_NAMESPACE").filter(|s| !s.is_empty())?;
    get("PMIX_RANK")?;
    Some(match fallback {
        Some(f) => format!("pmix:{ns};else={f}"),
        None => format!("pmix:{ns}"),
    })
}

/// A job id as it may appear in a directory name: letters, digits, `-`, `_`, `.`,
/// not starting with `.`, at most [`MAX_ID`] bytes.
fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The store of an Open MPI job without `BRAID_STORE` (see the module docs).
pub fn ompi_store(
    get: &impl Fn(&str) -> Option<String>,
    rank: usize,
    world: usize,
    local_size: Option<usize>,
) -> Result<Derived> {
    let one_host = local_size == Some(world);
    let job = get("OMPI_MCA_ess_base_jobid").map(|s| s.trim().to_string());
    // Random per mpirun: a job id (a hash of mpirun's host and pid) can come back.
    let salt = get("OMPI_MCA_orte_precondition_transports").map(|s| s.trim().to_string());
    let local = match (&job, &salt) {
        (Some(j), Some(s)) if safe_id(j) && safe_id(s) => Some(format!("local:ompi-{j}-{s}")),
        (Some(j), None) if safe_id(j) => Some(format!("local:ompi-{j}")),
        _ => None,
    }
    .filter(|_| one_host);
    let sizes = format!(
        "OMPI_COMM_WORLD_SIZE={world}, OMPI_COMM_WORLD_LOCAL_SIZE={}",
        local_size.map_or("unset".into(), |n| n.to_string())
    );
    if let Some(url) = pmix_url(get, local.as_deref()) {
        let how = format!(
            "launcher mpi (Open MPI) with PMIx: rank 0 publishes the store through PMIx{}",
            if local.is_some() { ", or a private store on this host if libpmix.so.2 cannot be loaded" } else { "" }
        );
        return Ok(Derived { store: url, how });
    }
    if let Some(url) = local {
        return Ok(Derived {
            store: url,
            how: format!("launcher mpi (Open MPI) without PMIx, one host ({sizes}): a private store on this host keyed by the job id"),
        });
    }
    let why = if one_host {
        format!("one host, but no usable job id (OMPI_MCA_ess_base_jobid={job:?})")
    } else {
        format!("the job may span hosts ({sizes})")
    };
    Err(Error::Config(format!(
        "rank {rank}: launcher mpi (Open MPI, OMPI_COMM_WORLD_RANK) without PMIx (PMIX_NAMESPACE, PMIX_RANK unset) and without BRAID_STORE; {why}: {MPIRUN_HINT}"
    )))
}

/// The store of an MPICH / Intel MPI job (`PMI_RANK`) without `BRAID_STORE`.
pub fn mpich_store(get: &impl Fn(&str) -> Option<String>, rank: usize) -> Result<Derived> {
    if let Some(url) = pmix_url(get, None) {
        return Ok(Derived {
            store: url,
            how: "launcher mpi (PMI_RANK) with PMIx: rank 0 publishes the store through PMIx".into(),
        });
    }
    Err(Error::Config(format!(
        "rank {rank}: launcher mpi (MPICH or Intel MPI: PMI_RANK, PMI_SIZE) without PMIx (PMIX_NAMESPACE unset) and without BRAID_STORE: \
         pass the store to every rank: `mpiexec -genv BRAID_STORE tcp://HOST:PORT ...` (HOST: rank 0's host, PORT: a free port there)"
    )))
}

fn io_err(what: impl Into<String>, e: std::io::Error) -> Error {
    Error::io(what.into(), e)
}

fn cstr(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::Config(format!("path {} has a NUL byte", p.display())))
}

/// Where private stores live: `/dev/shm` when it is a directory, else the
/// temporary directory.
fn base_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Make (if absent) and open `dir`, refusing a link, a non-directory, or one that
/// another user owns or others may enter.
pub(crate) fn open_private_dir(dir: &Path) -> Result<OwnedFd> {
    let c = cstr(dir)?;
    // SAFETY: valid C string; mkdir creates nothing through a final symlink.
    if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(io_err(format!("creating the private store directory {}", dir.display()), e));
        }
    }
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid C string and flags.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(io_err(format!("opening the private store directory {} (a link is refused)", dir.display()), e));
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: live fd, valid buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io_err(format!("inspecting {}", dir.display()), std::io::Error::last_os_error()));
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if st.st_uid != me || st.st_mode & 0o077 != 0 {
        return Err(Error::Config(format!(
            "refusing the private store directory {}: owned by uid {} with mode {:o} (must be uid {me}, mode 0700); remove it",
            dir.display(),
            st.st_uid,
            st.st_mode & 0o7777
        )));
    }
    Ok(fd)
}

/// Read `name` in `dir` (not through a link), at most [`MAX_VALUE`] bytes; None when absent.
fn read_in(dir: &OwnedFd, name: &str) -> Result<Option<String>> {
    use std::io::Read;
    let c = CString::new(name).expect("file names have no NUL");
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: live directory fd, valid name.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::NotFound {
            Ok(None)
        } else {
            Err(io_err(format!("reading {name}"), e))
        };
    }
    // SAFETY: fd was just opened and is owned here.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut buf = Vec::new();
    file.take(MAX_VALUE as u64 + 1).read_to_end(&mut buf).map_err(|e| io_err(format!("reading {name}"), e))?;
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// Write `text` to `name` in `dir` atomically (a temporary file renamed over it).
fn write_in(dir: &OwnedFd, name: &str, text: &str) -> Result<()> {
    use std::io::Write;
    let tmp = format!(".{name}.{}", std::process::id());
    let ctmp = CString::new(tmp.as_str()).expect("no NUL");
    let cname = CString::new(name).expect("no NUL");
    // SAFETY: live directory fd, valid name; removing a leftover of ours.
    unsafe { libc::unlinkat(dir.as_raw_fd(), ctmp.as_ptr(), 0) };
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: as above.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), ctmp.as_ptr(), flags, 0o600) };
    if fd < 0 {
        return Err(io_err(format!("creating {tmp}"), std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just opened and is owned here.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(text.as_bytes()).map_err(|e| io_err(format!("writing {tmp}"), e))?;
    // SAFETY: both names relative to the same live directory fd.
    if unsafe { libc::renameat(dir.as_raw_fd(), ctmp.as_ptr(), dir.as_raw_fd(), cname.as_ptr()) } != 0 {
        return Err(io_err(format!("renaming {tmp} to {name}"), std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether `url` names a private store; returns its id.
pub fn parse_local_url(url: &str) -> Option<&str> {
    url.strip_prefix("local:")
}

/// The directory of private store `id` for this user.
pub fn local_dir(id: &str) -> Result<PathBuf> {
    if !safe_id(id) {
        return Err(Error::Config(format!("private store id `{}` is not a safe file name", id.escape_debug())));
    }
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    Ok(base_dir().join(format!("braid-{uid}-{id}")))
}

/// This rank's number as the launcher gave it, for messages.
pub(crate) fn rank_label(vars: &[&str]) -> String {
    vars.iter().find_map(|v| std::env::var(v).ok()).map_or_else(|| "?".into(), |r| r.trim().to_string())
}

/// Connect to (`rank0`: host) the private store `id` of a one-host job.
pub fn connect_local(
    id: &str,
    rank0: bool,
    world_size: usize,
    key: JobKey,
    timeout: Duration,
) -> Result<Arc<dyn Store>> {
    let dir = local_dir(id)?;
    let deadline = Instant::now() + timeout;
    // Each other rank adds 1 once connected; the one that completes the count says so.
    let joined = |nonce: &str| format!("braid-local/{nonce}/joined");
    let all_joined = |nonce: &str| format!("braid-local/{nonce}/all-joined");
    if rank0 {
        let fd = open_private_dir(&dir)?;
        let server = TcpStoreServer::bind_with("127.0.0.1:0", key.clone(), StoreLimits::for_world(world_size))?;
        let client = TcpStore::connect(&server.local_addr().to_string(), key, timeout)?;
        let nonce = pmix::random_id();
        client.set(pmix::ID_KEY, nonce.as_bytes())?;
        let published = Published { id: nonce.clone(), addrs: vec![server.local_addr()] };
        write_in(&fd, STORE_FILE, &published.encode())?;
        tracing::debug!(dir = %dir.display(), addr = %server.local_addr(), "hosting the private store of this one-host job");
        let waited = if world_size > 1 { client.wait(&[&all_joined(&nonce)], timeout) } else { Ok(()) };
        // Whether or not every rank came, the file has served its purpose.
        let name = CString::new(STORE_FILE).expect("no NUL");
        // SAFETY: live directory fd, valid name.
        unsafe { libc::unlinkat(fd.as_raw_fd(), name.as_ptr(), 0) };
        drop(fd);
        let _ = std::fs::remove_dir(&dir);
        if let Err(e) = waited {
            let came = client.get(&joined(&nonce)).ok().flatten().map(|v| String::from_utf8_lossy(&v).into_owned());
            return Err(Error::Store(format!(
                "rank 0 (launcher mpi, one host, private store {}): {} of the {} other ranks connected within {timeout:?} ({e}); \
                 do all ranks run braid? Or set BRAID_STORE=tcp://HOST:PORT for every rank",
                dir.display(),
                came.as_deref().unwrap_or("none"),
                world_size - 1
            )));
        }
        return Ok(Arc::new(HostedStore::new(client, server)));
    }
    let mut last = String::from("rank 0 has not written it yet");
    let mut pause = Duration::from_millis(5);
    while Instant::now() < deadline {
        let fd = open_private_dir(&dir)?;
        match read_in(&fd, STORE_FILE)? {
            None => {}
            Some(text) => match Published::decode(text.trim_end()) {
                Err(e) => last = e,
                Ok(p) => {
                    let until = deadline.min(Instant::now() + Duration::from_secs(3));
                    match pmix::connect_published(&p, key.clone(), until, timeout) {
                        Ok(store) => {
                            if store.add(&joined(&p.id), 1)? == world_size as i64 - 1 {
                                store.set(&all_joined(&p.id), b"1")?;
                            }
                            return Ok(Arc::new(store));
                        }
                        Err(e) => last = e,
                    }
                }
            },
        }
        drop(fd);
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
    let rank = rank_label(&["OMPI_COMM_WORLD_RANK", "PMIX_RANK"]);
    Err(Error::Store(format!(
        "rank {rank} (launcher mpi, one host, private store {}): rank 0's store did not answer within {timeout:?} ({last}); \
         is rank 0 running braid? Or set BRAID_STORE=tcp://HOST:PORT for every rank",
        dir.join(STORE_FILE).display()
    )))
}

#[cfg(test)]
mod tests;
