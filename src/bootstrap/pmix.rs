//! Meeting through PMIx, the process-management interface that `mpirun` (Open MPI),
//! `srun --mpi=pmix` (Slurm) and PRRTE already run for their ranks.
//!
//! Store URL `pmix:NAMESPACE`, optionally followed by `;else=URL`: rank 0 (the
//! launcher's rank 0 in that PMIx namespace) hosts a [`TcpStoreServer`] on a free
//! port of every interface, publishes where it listens with `PMIx_Put` (key
//! `braid.store.N`, the N-th store of this process, global scope), `PMIx_Commit` and
//! a `PMIx_Fence` that collects the data; every other rank takes part in the fence,
//! then reads the address with `PMIx_Get` and connects. When `libpmix.so.2` cannot be
//! loaded the `else` URL is used if there is one (a one-host private store, or the
//! store derived from Slurm's nodelist), and otherwise the error says how to pass the
//! store by hand.
//!
//! The library is loaded at run time (`dlopen`), never linked: a build needs no
//! PMIx, and a rank started elsewhere never loads it. `BRAID_PMIX_LIBRARY` names
//! another file than `libpmix.so.2` (PMIx installed outside the loader's path).
//!
//! The published value, `braid-store v1 ID ADDR,ADDR,...`, is read as untrusted: at
//! most [`MAX_VALUE`] bytes and [`MAX_ADDRS`] socket addresses. Rank 0 publishes its
//! interfaces' addresses, loopback last; a rank tries them in turn (a short connect
//! each) and keeps the first whose store holds the same random `ID` under
//! [`ID_KEY`], so an address that exists on every host (docker0's) cannot capture it.
//!
//! PMIx is initialised once per process and finalised at exit, so a launcher that
//! counts finalised ranks sees every rank finalise.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::auth::JobKey;
use crate::bootstrap::hosted_store::HostedStore;
use crate::bootstrap::store::Store;
use crate::bootstrap::tcp_store::{StoreLimits, TcpStore, TcpStoreServer};
use crate::error::{Error, Result};

/// The library's soname: the ABI of PMIx 2 to 5.
pub const LIBRARY: &str = "libpmix.so.2";
/// Longest published value read back.
pub const MAX_VALUE: usize = 4096;
/// Most addresses read back from the published value.
pub const MAX_ADDRS: usize = 32;
/// Key, in the store rank 0 hosts, holding the random id it published.
pub const ID_KEY: &str = "braid-pmix/id";
/// How long a rank tries one published address before the next.
const TRY_ADDR: Duration = Duration::from_millis(1500);

// The layouts below are those of Debian's libpmix-dev 4.2 (`pmix_common.h`); the
// test `layouts_match_the_header` compiles a C program against the header, when
// both exist, and compares.
const PMIX_MAX_NSLEN: usize = 255;
const PMIX_MAX_KEYLEN: usize = 511;
const PMIX_SUCCESS: c_int = 0;
const PMIX_BOOL: u16 = 1;
const PMIX_STRING: u16 = 3;
const PMIX_INT: u16 = 6;
const PMIX_GLOBAL: u8 = 3;
const PMIX_RANK_WILDCARD: u32 = u32::MAX - 1;

/// `pmix_proc_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct PmixProc {
    nspace: [c_char; PMIX_MAX_NSLEN + 1],
    rank: u32,
}

/// The part of `pmix_value_t`'s union braid reads and writes; the rest (24 bytes in
/// all: `pmix_envar_t` is the largest member) is padding here.
#[repr(C)]
#[derive(Clone, Copy)]
union PmixData {
    flag: bool,
    integer: c_int,
    string: *mut c_char,
    _largest: [u64; 3],
}

/// `pmix_value_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct PmixValue {
    kind: u16,
    data: PmixData,
}

/// `pmix_info_t`.
#[repr(C)]
struct PmixInfo {
    key: [c_char; PMIX_MAX_KEYLEN + 1],
    flags: u32,
    value: PmixValue,
}

const _: () = assert!(std::mem::size_of::<PmixProc>() == 260);
const _: () = assert!(std::mem::size_of::<PmixValue>() == 32);
const _: () = assert!(std::mem::size_of::<PmixInfo>() == 552);

impl PmixProc {
    fn new(nspace: &[c_char; PMIX_MAX_NSLEN + 1], rank: u32) -> PmixProc {
        PmixProc { nspace: *nspace, rank }
    }
}

impl PmixInfo {
    fn new(key: &str, value: PmixValue) -> PmixInfo {
        let mut k = [0 as c_char; PMIX_MAX_KEYLEN + 1];
        for (slot, b) in k.iter_mut().zip(key.bytes().take(PMIX_MAX_KEYLEN)) {
            *slot = b as c_char;
        }
        PmixInfo { key: k, flags: 0, value }
    }
    fn flag(key: &str, on: bool) -> PmixInfo {
        PmixInfo::new(key, PmixValue { kind: PMIX_BOOL, data: PmixData { flag: on } })
    }
    fn int(key: &str, v: c_int) -> PmixInfo {
        PmixInfo::new(key, PmixValue { kind: PMIX_INT, data: PmixData { integer: v } })
    }
}

type InitFn = unsafe extern "C" fn(*mut PmixProc, *mut PmixInfo, usize) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const PmixInfo, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut PmixValue) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const PmixProc, usize, *const PmixInfo, usize) -> c_int;
type GetFn = unsafe extern "C" fn(*const PmixProc, *const c_char, *const PmixInfo, usize, *mut *mut PmixValue) -> c_int;
type ValueDestructFn = unsafe extern "C" fn(*mut PmixValue);
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The entry points braid calls, resolved from the loaded library (never unloaded:
/// PMIx runs a progress thread of its own).
struct Api {
    init: InitFn,
    finalize: FinalizeFn,
    put: PutFn,
    commit: CommitFn,
    fence: FenceFn,
    get: GetFn,
    value_destruct: ValueDestructFn,
    error_string: ErrorStringFn,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown reason".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Api {
    /// Load `library` and resolve the entry points.
    fn load(library: &str) -> std::result::Result<Api, String> {
        let name = CString::new(library).map_err(|_| format!("`{library}` contains a NUL byte"))?;
        // SAFETY: dlopen with a valid C string; RTLD_GLOBAL so the library's own
        // plugins, which it loads in turn, resolve its symbols.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(dl_error());
        }
        let sym = |s: &str| -> std::result::Result<*mut c_void, String> {
            let c = CString::new(s).expect("symbol names have no NUL");
            // SAFETY: handle is a live dlopen handle, c a valid C string.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            if p.is_null() {
                Err(format!("{library} has no `{s}` ({})", dl_error()))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol has the C signature its type declares (pmix.h, PMIx 4).
        unsafe {
            Ok(Api {
                init: std::mem::transmute::<*mut c_void, InitFn>(sym("PMIx_Init")?),
                finalize: std::mem::transmute::<*mut c_void, FinalizeFn>(sym("PMIx_Finalize")?),
                put: std::mem::transmute::<*mut c_void, PutFn>(sym("PMIx_Put")?),
                commit: std::mem::transmute::<*mut c_void, CommitFn>(sym("PMIx_Commit")?),
                fence: std::mem::transmute::<*mut c_void, FenceFn>(sym("PMIx_Fence")?),
                get: std::mem::transmute::<*mut c_void, GetFn>(sym("PMIx_Get")?),
                value_destruct: std::mem::transmute::<*mut c_void, ValueDestructFn>(sym("PMIx_Value_destruct")?),
                error_string: std::mem::transmute::<*mut c_void, ErrorStringFn>(sym("PMIx_Error_string")?),
            })
        }
    }

    fn describe(&self, status: c_int) -> String {
        // SAFETY: PMIx_Error_string returns a static string for any status.
        let s = unsafe { (self.error_string)(status) };
        if s.is_null() {
            format!("status {status}")
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            format!("{} ({status})", unsafe { CStr::from_ptr(s) }.to_string_lossy())
        }
    }

    fn check(&self, what: &str, status: c_int) -> std::result::Result<(), String> {
        if status == PMIX_SUCCESS {
            Ok(())
        } else {
            Err(format!("{what} failed: {}", self.describe(status)))
        }
    }
}

/// This process's PMIx client: the library and who PMIx says we are.
struct Session {
    api: Api,
    me: PmixProc,
}

// SAFETY: the PMIx client API is thread-safe (it serialises through its own
// progress thread); `me` is plain data.
unsafe impl Send for Session {}
// SAFETY: as above.
unsafe impl Sync for Session {}

impl Session {
    fn namespace(&self) -> String {
        // SAFETY: PMIx_Init wrote a NUL-terminated namespace (the array's last byte
        // stays 0 whatever it wrote before it).
        unsafe { CStr::from_ptr(self.me.nspace.as_ptr()) }.to_string_lossy().into_owned()
    }
}

/// Why PMIx cannot be used here: its library is missing, or the launcher's server
/// did not take this client.
#[derive(Clone, Debug)]
enum Unusable {
    Missing(String),
    Refused(String),
}

static SESSION: OnceLock<std::result::Result<Arc<Session>, Unusable>> = OnceLock::new();
/// Stores this process has met through PMIx so far: each gets its own key.
static EXCHANGES: AtomicUsize = AtomicUsize::new(0);

extern "C" fn finalize_at_exit() {
    if let Some(Ok(s)) = SESSION.get() {
        // SAFETY: the session was initialised; PMIx_Finalize takes no info here.
        unsafe { (s.api.finalize)(std::ptr::null(), 0) };
    }
}

/// Load the library and initialise PMIx once per process.
fn session() -> std::result::Result<Arc<Session>, Unusable> {
    SESSION
        .get_or_init(|| {
            let library = std::env::var("BRAID_PMIX_LIBRARY").ok().filter(|s| !s.is_empty());
            let library = library.as_deref().unwrap_or(LIBRARY);
            let api = Api::load(library).map_err(|e| Unusable::Missing(format!("cannot load {library}: {e}")))?;
            let mut me = PmixProc { nspace: [0; PMIX_MAX_NSLEN + 1], rank: 0 };
            // SAFETY: `me` is a valid pmix_proc_t to fill; no info.
            let status = unsafe { (api.init)(&mut me, std::ptr::null_mut(), 0) };
            api.check("PMIx_Init", status).map_err(Unusable::Refused)?;
            me.nspace[PMIX_MAX_NSLEN] = 0;
            // SAFETY: registering a plain extern "C" fn.
            unsafe { libc::atexit(finalize_at_exit) };
            Ok(Arc::new(Session { api, me }))
        })
        .clone()
}

/// What rank 0 publishes: a random id and its addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// Random id also stored under [`ID_KEY`] in the store.
    pub id: String,
    /// Where the store listens, in the order to try them.
    pub addrs: Vec<SocketAddr>,
}

impl Published {
    /// `braid-store v1 ID ADDR,ADDR,...`
    pub fn encode(&self) -> String {
        let addrs: Vec<String> = self.addrs.iter().map(|a| a.to_string()).collect();
        format!("braid-store v1 {} {}", self.id, addrs.join(","))
    }

    /// Parse a published value, refusing anything longer than [`MAX_VALUE`], with
    /// more than [`MAX_ADDRS`] addresses or not in the format.
    pub fn decode(text: &str) -> std::result::Result<Published, String> {
        if text.len() > MAX_VALUE {
            return Err(format!("published store address is {} bytes (at most {MAX_VALUE})", text.len()));
        }
        let bad = || format!("published store address `{}` is not `braid-store v1 ID ADDR,...`", text.escape_debug());
        let mut parts = text.split(' ');
        if parts.next() != Some("braid-store") || parts.next() != Some("v1") {
            return Err(bad());
        }
        let id = parts.next().filter(|id| !id.is_empty() && id.len() <= 64).ok_or_else(bad)?;
        let list = parts.next().ok_or_else(bad)?;
        if parts.next().is_some() {
            return Err(bad());
        }
        let items: Vec<&str> = list.split(',').collect();
        if items.len() > MAX_ADDRS {
            return Err(format!("published store address lists {} addresses (at most {MAX_ADDRS})", items.len()));
        }
        let addrs = items
            .iter()
            .map(|a| a.parse::<SocketAddr>().map_err(|_| bad()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if addrs.is_empty() {
            return Err(bad());
        }
        Ok(Published { id: id.to_string(), addrs })
    }
}

/// The addresses rank 0's store can be reached at from other hosts: every address
/// of every interface that is up (IPv4 first, IPv6 link-local left out: it needs a
/// scope), loopback last for ranks on its own host.
pub fn local_addresses(port: u16) -> Vec<SocketAddr> {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifa in addrs {
            if !ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP) {
                continue;
            }
            let Some(a) = ifa.address else { continue };
            if let Some(s) = a.as_sockaddr_in() {
                let ip = s.ip();
                if !ip.is_loopback() {
                    v4.push(SocketAddr::new(IpAddr::V4(ip), port));
                }
            } else if let Some(s) = a.as_sockaddr_in6() {
                let ip = s.ip();
                if !ip.is_loopback() && (ip.segments()[0] & 0xffc0) != 0xfe80 {
                    v6.push(SocketAddr::new(IpAddr::V6(ip), port));
                }
            }
        }
    }
    let mut all: Vec<SocketAddr> = v4.into_iter().chain(v6).collect();
    all.dedup();
    all.truncate(MAX_ADDRS - 1);
    all.push(SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), port));
    all
}

/// Run `f` on its own thread and give up after `timeout`: a PMIx call that never
/// returns (a rank that never joins the fence) must not hang the caller. On
/// timeout the thread is left blocked; the caller fails and the process exits.
fn with_deadline<T: Send + 'static>(
    timeout: Duration,
    what: String,
    f: impl FnOnce() -> std::result::Result<T, String> + Send + 'static,
) -> std::result::Result<T, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("braid-pmix".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| format!("spawning the PMIx thread: {e}"))?;
    rx.recv_timeout(timeout).map_err(|_| format!("{what} did not finish within {timeout:?}"))?
}

/// Rank 0 publishes `value` under `key`, then every rank fences (collecting the
/// data) and the others read it back.
fn exchange(
    session: Arc<Session>,
    key: String,
    value: Option<String>,
    timeout: Duration,
) -> std::result::Result<String, String> {
    let secs = c_int::try_from(timeout.as_secs().max(1)).unwrap_or(c_int::MAX);
    with_deadline(timeout, format!("the PMIx fence of rank {}", session.me.rank), move || {
        let api = &session.api;
        let ckey = CString::new(key.clone()).map_err(|_| "key has a NUL".to_string())?;
        if let Some(v) = &value {
            let text = CString::new(v.as_str()).map_err(|_| "value has a NUL".to_string())?;
            let mut val = PmixValue { kind: PMIX_STRING, data: PmixData { string: text.as_ptr() as *mut c_char } };
            // SAFETY: PMIx_Put copies the value before returning.
            api.check("PMIx_Put", unsafe { (api.put)(PMIX_GLOBAL, ckey.as_ptr(), &mut val) })?;
            // SAFETY: no arguments.
            api.check("PMIx_Commit", unsafe { (api.commit)() })?;
        }
        let info = [PmixInfo::flag("pmix.collect", true), PmixInfo::int("pmix.timeout", secs)];
        let all = PmixProc::new(&session.me.nspace, PMIX_RANK_WILDCARD);
        // SAFETY: one valid proc (the whole namespace) and two valid infos.
        api.check("PMIx_Fence", unsafe { (api.fence)(&all, 1, info.as_ptr(), info.len()) })?;
        if let Some(v) = value {
            return Ok(v);
        }
        let root = PmixProc::new(&session.me.nspace, 0);
        let get_info = [PmixInfo::int("pmix.timeout", secs)];
        let mut out: *mut PmixValue = std::ptr::null_mut();
        // SAFETY: valid proc, key and info; PMIx allocates `out` on success.
        api.check("PMIx_Get of rank 0's store address", unsafe {
            (api.get)(&root, ckey.as_ptr(), get_info.as_ptr(), get_info.len(), &mut out)
        })?;
        if out.is_null() {
            return Err("PMIx_Get returned no value".into());
        }
        // SAFETY: `out` is a pmix_value_t PMIx allocated; read it, then release it
        // as PMIX_VALUE_RELEASE does (destruct, then free).
        unsafe {
            let v = &*out;
            let text = if v.kind == PMIX_STRING && !v.data.string.is_null() {
                let bytes = CStr::from_ptr(v.data.string).to_bytes();
                Ok(String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_VALUE + 1)]).into_owned())
            } else {
                Err(format!("rank 0 published a value of PMIx type {} instead of a string", v.kind))
            };
            (api.value_destruct)(out);
            libc::free(out as *mut c_void);
            text
        }
    })
}

/// Whether `url` names the PMIx store; returns the namespace and fallback URL.
pub fn parse_url(url: &str) -> Option<(&str, Option<&str>)> {
    let rest = url.strip_prefix("pmix:")?;
    Some(match rest.split_once(";else=") {
        Some((ns, fallback)) => (ns, Some(fallback)),
        None => (rest, None),
    })
}

/// How [`connect`] opens its fallback URL: the URL dispatcher
/// ([`crate::bootstrap::connect_store`]), passed in by that dispatcher so that
/// this module, which it calls, does not call back up into it.
pub(crate) type OpenUrl = fn(&str, bool, usize, JobKey, Duration) -> Result<Arc<dyn Store>>;

/// Connect to the store of a job started with PMIx (see the module docs).
/// `rank0` says whether braid's rank is 0, which must agree with PMIx's rank;
/// `fallback` is used when PMIx cannot be loaded, opened with `open`.
pub fn connect(
    namespace: &str,
    fallback: Option<&str>,
    rank0: bool,
    world_size: usize,
    key: JobKey,
    timeout: Duration,
    open: OpenUrl,
) -> Result<Arc<dyn Store>> {
    // Connecting to the launcher's PMIx server gets the same deadline as the fence.
    let unusable = match with_deadline(timeout, "PMIx_Init".into(), || Ok(session())) {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(u)) => Err(u),
        Err(late) => Err(Unusable::Refused(late)),
    };
    let session = match unusable {
        Ok(s) => s,
        Err(u) => {
            let why = match &u {
                Unusable::Missing(m) | Unusable::Refused(m) => m.clone(),
            };
            if let Some(url) = fallback {
                tracing::info!(namespace, "PMIx is not usable ({why}); using the store derived without it: {url}");
                return open(url, rank0, world_size, key, timeout);
            }
            let fix = match u {
                Unusable::Missing(_) => {
                    "install libpmix2 (Debian/Ubuntu: apt install libpmix2), set BRAID_PMIX_LIBRARY to the libpmix.so of your MPI, or"
                }
                Unusable::Refused(_) => "the launcher's PMIx server did not take this process (are the PMIX_* variables left from another job?);",
            };
            let rank = std::env::var("PMIX_RANK").unwrap_or_else(|_| "?".into());
            return Err(Error::Config(format!(
                "rank {rank}: launched with PMIx (PMIX_NAMESPACE={namespace}) but {why}; {fix} \
                 pass the store to every rank: `mpirun -x BRAID_STORE=tcp://HOST:PORT ...` \
                 (`srun --export=ALL,BRAID_STORE=tcp://HOST:PORT ...`), HOST:PORT a free port on rank 0's host"
            )));
        }
    };
    let rank = session.me.rank as usize;
    let ns = session.namespace();
    if (rank == 0) != rank0 {
        return Err(Error::Config(format!(
            "rank {rank} of PMIx namespace {ns}: the launcher's rank variables disagree with PMIx about which rank is 0; set BRAID_RANK and BRAID_STORE"
        )));
    }
    let n = EXCHANGES.fetch_add(1, Ordering::Relaxed);
    let pmix_key = format!("braid.store.{n}");
    let fail = |what: String| {
        Error::Store(format!(
            "rank {rank} (launcher PMIx, namespace {ns}): {what}; every rank of the job must start braid, or set BRAID_STORE=tcp://HOST:PORT for all"
        ))
    };
    if rank == 0 {
        let server = bind_wildcard(key.clone(), world_size)?;
        let port = server.local_addr().port();
        let id = random_id();
        let local = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), port);
        let client = TcpStore::connect(&local.to_string(), key, timeout)?;
        client.set(ID_KEY, id.as_bytes())?;
        let published = Published { id, addrs: local_addresses(port) };
        tracing::debug!(rank, namespace = %ns, key = %pmix_key, value = %published.encode(), "publishing the store through PMIx");
        exchange(session, pmix_key, Some(published.encode()), timeout).map_err(fail)?;
        return Ok(Arc::new(HostedStore::new(client, server)));
    }
    let deadline = Instant::now() + timeout;
    let text = exchange(session, pmix_key.clone(), None, timeout).map_err(fail)?;
    let published = Published::decode(&text).map_err(|e| fail(format!("PMIx key {pmix_key}: {e}")))?;
    tracing::debug!(rank, namespace = %ns, value = %text, "read rank 0's store address through PMIx");
    let store = connect_published(&published, key, deadline, timeout).map_err(fail)?;
    Ok(Arc::new(store))
}

/// Listen on every interface (IPv6 and IPv4 where the host has IPv6, else IPv4),
/// on a free port.
pub(crate) fn bind_wildcard(key: JobKey, world_size: usize) -> Result<TcpStoreServer> {
    let limits = StoreLimits::for_world(world_size);
    TcpStoreServer::bind_with("[::]:0", key.clone(), limits.clone())
        .or_else(|_| TcpStoreServer::bind_with("0.0.0.0:0", key, limits))
}

/// 128 random bits, hex.
pub(crate) fn random_id() -> String {
    crate::auth::challenge().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Try each published address in turn until one answers as the store that holds
/// the published id.
/// The client returned keeps `timeout` for its round trips.
pub(crate) fn connect_published(
    p: &Published,
    key: JobKey,
    deadline: Instant,
    timeout: Duration,
) -> std::result::Result<TcpStore, String> {
    let mut why = Vec::new();
    for addr in &p.addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        if let Err(e) = TcpStream::connect_timeout(addr, left.min(TRY_ADDR)) {
            why.push(format!("{addr}: {e}"));
            continue;
        }
        let probe = match TcpStore::connect(&addr.to_string(), key.clone(), left.min(TRY_ADDR * 2)) {
            Ok(s) => s,
            Err(e) => {
                why.push(format!("{addr}: {e}"));
                continue;
            }
        };
        match probe.get(ID_KEY) {
            Ok(Some(id)) if id == p.id.as_bytes() => {
                drop(probe);
                return TcpStore::connect(&addr.to_string(), key, timeout).map_err(|e| e.to_string());
            }
            Ok(_) => why.push(format!("{addr}: a store, but not this job's")),
            Err(e) => why.push(format!("{addr}: {e}")),
        }
    }
    Err(format!("no address rank 0 published reached its store: {}", why.join("; ")))
}

#[cfg(test)]
mod tests;
