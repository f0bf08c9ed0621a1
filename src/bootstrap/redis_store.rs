//! A Redis server as the rendezvous store (feature `redis`), for sites that already
//! run one: `BRAID_STORE=redis://[USER[:PASSWORD]@]HOST[:PORT][/DB][?prefix=P&ttl=T]`.
//!
//! - `prefix`: every key is stored as `P/KEY`, so jobs sharing one server keep
//!   apart. Give each job its own (the scheduler's job id); two jobs on one prefix
//!   are caught by the communicator's rank claims and the second fails at once.
//! - `ttl`: every key expires this long after it was last written (default 24h;
//!   `ttl=0` never), so a crashed job leaves nothing behind for good. Units as
//!   `BRAID_TIMEOUT`: `90`, `500ms`, `30m`, `12h`.
//! - USER and PASSWORD are percent-decoded, are sent as Redis `AUTH`, and never
//!   appear in a log line or an error message ([`redact_store_url`]).
//!
//! The job key (`BRAID_JOB_KEY`) cannot be proven to Redis: Redis knows nothing of
//! it, and anyone who can reach the server with its credentials can read and write
//! the job's keys. Guard the server with Redis's own `AUTH`/ACLs (and its network
//! exposure); the job key still guards every link between ranks.
//!
//! Every command has a deadline: connecting (TCP and the `AUTH`/`SELECT`
//! handshake) and each request must finish within the store's timeout
//! (`BRAID_TIMEOUT`), so a dead or wedged server gives an error, never a hang.
//! `wait` polls (`EXISTS`) with a backoff from 2 ms up to 100 ms; Redis has no
//! blocking "wait for key" that would not tie up a server connection per waiter.
//!
//! Connections are pooled. A request on a pooled connection that finds it
//! dropped (the server closed an idle client, or restarted) is sent once more
//! on a fresh connection when repeating it is harmless: everything but `add`,
//! which may have been applied before the connection broke.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

use crate::bootstrap::store::{redact_store_url, Store};
use crate::error::{Error, Result};

const SCHEME: &str = "redis://";
const DEFAULT_PORT: u16 = 6379;
const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
const POLL_FIRST: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(100);
/// First and longest pause between tries to reach a server that is not up yet.
const CONNECT_FIRST_BACKOFF: Duration = Duration::from_millis(10);
const CONNECT_MAX_BACKOFF: Duration = Duration::from_millis(500);
/// Connections kept open between calls.
const MAX_IDLE_CONNS: usize = 4;

/// What a `redis://` URL names.
#[derive(Clone, PartialEq, Eq)]
struct RedisTarget {
    host: String,
    port: u16,
    db: i64,
    user: Option<String>,
    password: Option<String>,
    /// Empty: keys are stored as given.
    prefix: String,
    /// None: keys never expire.
    ttl: Option<Duration>,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("db", &self.db)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// Parse a `redis://` store URL. Errors show the URL with its password hidden.
fn parse_url(url: &str) -> Result<RedisTarget> {
    let bad = |why: &str| {
        Error::Config(format!(
            "store URL `{}`: {why} (expected redis://[USER[:PASSWORD]@]HOST[:PORT][/DB][?prefix=P&ttl=T])",
            redact_store_url(url)
        ))
    };
    if url.starts_with("rediss://") {
        return Err(bad("TLS (rediss://) is not supported by this build; reach Redis over a trusted network"));
    }
    let rest = url.strip_prefix(SCHEME).ok_or_else(|| bad("not a redis:// URL"))?;
    if rest.contains('#') {
        return Err(bad("a fragment (#…) means nothing here"));
    }
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => (None, None),
        Some(u) => {
            let (user, pass) = match u.split_once(':') {
                Some((user, pass)) => (user, Some(pass)),
                None => (u, None),
            };
            let user = percent_decode(user).ok_or_else(|| bad("the user name is not valid percent-encoded UTF-8"))?;
            let pass = pass
                .map(|p| percent_decode(p).ok_or_else(|| bad("the password is not valid percent-encoded UTF-8")))
                .transpose()?;
            (Some(user).filter(|u| !u.is_empty()), pass)
        }
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(|| bad("`[` without `]` around an IPv6 host"))?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':').ok_or_else(|| bad("junk after the IPv6 host"))?)),
        }
    } else {
        match hostport.split_once(':') {
            Some((_, p)) if p.contains(':') => return Err(bad("an IPv6 host must be in brackets, as [::1]")),
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| bad("the port is not 1-65535"))?,
    };
    let db = match path.trim_start_matches('/') {
        "" => 0,
        d => d.parse::<u32>().map_err(|_| bad("the database (the path) is not a number"))? as i64,
    };
    let mut target =
        RedisTarget { host: host.to_owned(), port, db, user, password, prefix: String::new(), ttl: Some(DEFAULT_TTL) };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value =
            percent_decode(value).ok_or_else(|| bad(&format!("`{name}` is not valid percent-encoded UTF-8")))?;
        match name {
            "prefix" => target.prefix = value.trim_end_matches('/').to_owned(),
            "ttl" if value.trim() == "0" => target.ttl = None,
            "ttl" => {
                let ttl = crate::config::parse_duration(&value).map_err(|e| bad(&format!("ttl: {e}")))?;
                target.ttl = Some(ttl.max(Duration::from_millis(1)));
            }
            other => return Err(bad(&format!("unknown option `{other}` (known: prefix, ttl)"))),
        }
    }
    Ok(target)
}

/// Decode `%XX` escapes; None when one is malformed or the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A client of a Redis server holding the job's keys; `Send + Sync`, share it in
/// an `Arc`. See the module docs for the URL, the prefix, the TTL and deadlines.
pub struct RedisStore {
    /// The URL with its password hidden, for messages.
    shown: String,
    /// The password, so that no message quotes it even if a server echoes it.
    password: Option<String>,
    client: redis::Client,
    prefix: String,
    ttl: Option<Duration>,
    /// Deadline of connecting and of every command.
    timeout: Duration,
    idle: Mutex<Vec<redis::Connection>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("url", &self.shown).finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connect to the server named by `url` (see the module docs), retrying with
    /// backoff while nothing listens there yet; fails once `timeout` passes, or at
    /// once when the URL is malformed or the server refuses the credentials.
    /// `timeout` also bounds every later command.
    pub fn connect(url: &str, timeout: Duration) -> Result<RedisStore> {
        let target = parse_url(url)?;
        let shown = redact_store_url(url);
        let mut settings = RedisConnectionInfo::default().set_db(target.db);
        if let Some(user) = &target.user {
            settings = settings.set_username(user);
        }
        if let Some(password) = &target.password {
            settings = settings.set_password(password);
        }
        let info = ConnectionAddr::Tcp(target.host.clone(), target.port)
            .into_connection_info()
            .map(|i| i.set_redis_settings(settings))
            .and_then(redis::Client::open)
            .map_err(|e| Error::Config(format!("store {shown}: {e}")))?;
        let store = RedisStore {
            shown,
            password: target.password,
            client: info,
            prefix: target.prefix,
            ttl: target.ttl,
            // Zero is not a socket timeout (it means none, or is refused).
            timeout: timeout.max(Duration::from_millis(1)),
            idle: Mutex::new(Vec::new()),
        };
        let conn = store.open_until(Instant::now() + store.timeout)?;
        store.idle().push(conn);
        tracing::debug!(url = %store.shown, prefix = %store.prefix, ttl = ?store.ttl, "redis store connected");
        Ok(store)
    }

    /// The URL with its password hidden.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// The key prefix (empty when keys are stored as given).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How long a key lives after its last write (None: forever).
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    fn full_key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<redis::Connection>> {
        // The pool stays valid whatever a panicking thread was doing with it.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> Error {
        let mut msg = format!("redis store {}: {what}: {e}", self.shown);
        if let Some(p) = self.password.as_deref().filter(|p| !p.is_empty()) {
            msg = msg.replace(p, "***");
        }
        Error::Store(msg)
    }

    /// One connection attempt, with the deadline on every later command set.
    fn open(&self, timeout: Duration) -> redis::RedisResult<redis::Connection> {
        let conn = self.client.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(self.timeout))?;
        conn.set_write_timeout(Some(self.timeout))?;
        Ok(conn)
    }

    /// Connect, retrying while the server is not up yet, until `deadline`.
    fn open_until(&self, deadline: Instant) -> Result<redis::Connection> {
        let mut backoff = CONNECT_FIRST_BACKOFF;
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            match self.open(left) {
                Ok(conn) => return Ok(conn),
                Err(e) if e.is_connection_refusal() && Instant::now() + backoff < deadline => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(CONNECT_MAX_BACKOFF);
                }
                Err(e) => {
                    return Err(self.error(
                        &format!(
                            "connecting (within {:?}; is redis-server running there, and the credentials right?)",
                            self.timeout
                        ),
                        e,
                    ))
                }
            }
        }
    }

    /// Run `op` on a pooled connection (or a new one). When a pooled connection
    /// turns out dropped and `repeatable`, run it once more on a fresh connection.
    fn with_conn<T>(
        &self,
        what: &str,
        repeatable: bool,
        op: impl Fn(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let pooled = self.idle().pop();
        let was_pooled = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.open(self.timeout).map_err(|e| self.error(&format!("{what}: connecting"), e))?,
        };
        let result = match op(&mut conn) {
            Err(e) if was_pooled && repeatable && e.is_connection_dropped() => {
                tracing::debug!(url = %self.shown, "redis connection dropped ({e}); retrying {what} once");
                conn = self.open(self.timeout).map_err(|e| self.error(&format!("{what}: reconnecting"), e))?;
                op(&mut conn)
            }
            r => r,
        };
        match result {
            Ok(v) => {
                let mut idle = self.idle();
                if idle.len() < MAX_IDLE_CONNS {
                    idle.push(conn);
                }
                Ok(v)
            }
            // A failed connection's state is unknown: it is dropped, not pooled.
            Err(e) if e.is_timeout() => Err(self.error(&format!("{what}: no reply within {:?}", self.timeout), e)),
            Err(e) => Err(self.error(what, e)),
        }
    }

    fn ttl_ms(&self) -> Option<u64> {
        self.ttl.map(|t| t.as_millis().clamp(1, u64::MAX as u128) as u64)
    }
}

impl Store for RedisStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.full_key(key)).arg(value);
        if let Some(ms) = self.ttl_ms() {
            cmd.arg("PX").arg(ms);
        }
        self.with_conn(&format!("SET {}", self.full_key(key)), true, |c| cmd.query::<()>(c))
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let full = self.full_key(key);
        self.with_conn(&format!("GET {full}"), true, |c| redis::cmd("GET").arg(&full).query::<Option<Vec<u8>>>(c))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut missing: Vec<String> = keys.iter().map(|k| self.full_key(k)).collect();
        let mut pause = POLL_FIRST;
        loop {
            if missing.is_empty() {
                return Ok(());
            }
            let mut pipe = redis::pipe();
            for k in &missing {
                pipe.cmd("EXISTS").arg(k);
            }
            let present: Vec<i64> = self.with_conn("EXISTS (waiting for keys)", true, |c| pipe.query(c))?;
            let mut present = present.into_iter();
            missing.retain(|_| present.next() != Some(1));
            if missing.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Store(format!(
                    "redis store {}: timed out after {timeout:?} waiting for keys {missing:?} (does every rank use the same BRAID_STORE, prefix included?)",
                    self.shown
                )));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let full = self.full_key(key);
        let what = format!("INCRBY {full}");
        match self.ttl_ms() {
            // INCRBY keeps a key's TTL, so it is set again (in one transaction)
            // to count from this write, as SET's does.
            Some(ms) => self.with_conn(&what, false, |c| {
                let (n,): (i64,) = redis::pipe()
                    .atomic()
                    .cmd("INCRBY")
                    .arg(&full)
                    .arg(delta)
                    .cmd("PEXPIRE")
                    .arg(&full)
                    .arg(ms)
                    .ignore()
                    .query(c)?;
                Ok(n)
            }),
            None => self.with_conn(&what, false, |c| redis::cmd("INCRBY").arg(&full).arg(delta).query(c)),
        }
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let full = self.full_key(key);
        self.with_conn(&format!("DEL {full}"), true, |c| redis::cmd("DEL").arg(&full).query::<i64>(c)).map(|n| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(host: &str, port: u16) -> RedisTarget {
        RedisTarget {
            host: host.into(),
            port,
            db: 0,
            user: None,
            password: None,
            prefix: String::new(),
            ttl: Some(DEFAULT_TTL),
        }
    }

    #[test]
    fn urls_parse_into_host_port_db_credentials_prefix_and_ttl() {
        assert_eq!(parse_url("redis://cache").unwrap(), target("cache", 6379));
        assert_eq!(parse_url("redis://10.1.2.3:7000/").unwrap(), target("10.1.2.3", 7000));
        assert_eq!(parse_url("redis://[::1]:6380").unwrap(), target("::1", 6380));
        assert_eq!(parse_url("redis://[fe80::1]").unwrap(), target("fe80::1", 6379));
        let t = parse_url("redis://alice:p%40ss%3Aw0rd@r.example:1234/3?prefix=job%2F7/&ttl=90m").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.db), ("r.example", 1234, 3));
        assert_eq!(t.user.as_deref(), Some("alice"));
        assert_eq!(t.password.as_deref(), Some("p@ss:w0rd"));
        assert_eq!(t.prefix, "job/7", "decoded, trailing slash dropped");
        assert_eq!(t.ttl, Some(Duration::from_secs(90 * 60)));
        // Password only (Redis's default user), and no expiry.
        let t = parse_url("redis://:s3cret@h/?ttl=0").unwrap();
        assert_eq!((t.user, t.password.as_deref(), t.ttl), (None, Some("s3cret"), None));
        // An `@` in the password unescaped: the last `@` ends the credentials.
        assert_eq!(parse_url("redis://u:a@b@h:1").unwrap().password.as_deref(), Some("a@b"));
    }

    #[test]
    fn malformed_urls_are_refused_naming_the_fault_without_the_password() {
        for (url, why) in [
            ("redis://", "no host"),
            ("redis://:pw@:6379", "no host"),
            ("redis://h:0", "port"),
            ("redis://h:99999", "port"),
            ("redis://h:x", "port"),
            ("redis://::1:6379", "brackets"),
            ("redis://[::1", "without `]`"),
            ("redis://h/zero", "database"),
            ("redis://h/-1", "database"),
            ("redis://h?ttl=soon", "ttl"),
            ("redis://h?ttl=-5", "ttl"),
            ("redis://h?prefx=a", "unknown option `prefx`"),
            ("redis://u:pw@h#frag", "fragment"),
            ("redis://u:%zz@h", "password"),
            ("rediss://u:pw@h", "TLS"),
            ("tcp://h:1", "not a redis:// URL"),
        ] {
            let msg = parse_url(url).expect_err(url).to_string();
            assert!(msg.contains(why), "{url}: {msg}");
            assert!(!msg.contains("pw@"), "{url}: the password leaked: {msg}");
            assert!(matches!(parse_url(url), Err(Error::Config(_))), "{url}");
        }
    }

    #[test]
    fn debug_output_hides_the_password() {
        let t = parse_url("redis://u:hunter2@h").unwrap();
        let shown = format!("{t:?}");
        assert!(!shown.contains("hunter2") && shown.contains("***"), "{shown}");
    }

    #[test]
    fn an_unreachable_server_fails_within_the_timeout_without_the_password() {
        // A port nothing listens on: bind one, learn it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let t0 = Instant::now();
        let err = RedisStore::connect(&format!("redis://u:hunter2@127.0.0.1:{port}"), Duration::from_millis(300))
            .expect_err("nothing listens there");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        let msg = err.to_string();
        assert!(msg.contains(&format!("redis://u:***@127.0.0.1:{port}")), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
        assert!(msg.contains("is redis-server running"), "{msg}");
    }
}
