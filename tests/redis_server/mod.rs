//! A throwaway `redis-server` for tests: loopback only, no persistence, its own
//! port and directory, killed when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh server may take to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
}

/// The `redis-server` binary: on PATH, or where Debian puts it.
fn binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("redis-server")).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path.into_iter().chain([PathBuf::from("/usr/bin/redis-server")]).find(|p| p.is_file())
}

impl RedisServer {
    /// Start a server, or None (after printing why) when `redis-server` is not
    /// installed. Under CI=true a missing server fails the test instead: CI
    /// installs it (.ci/run), so its absence is a broken set-up, not a skip.
    pub fn start() -> Option<RedisServer> {
        let Some(bin) = binary() else {
            let why = "redis-server is not installed (apt-get install redis-server)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{why}: CI must have it to test the Redis store");
            }
            eprintln!("skipping: {why}");
            return None;
        };
        // The port is picked free and then released, so another process may take
        // it before the server binds: try a few.
        let mut last = String::new();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let dir = std::env::temp_dir().join(format!("braid-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let child = Command::new(&bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--daemonize", "no", "--dir"])
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
            let mut server = RedisServer { child: Some(child), port, dir };
            match server.await_ready() {
                Ok(()) => return Some(server),
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start on a free loopback port in 5 tries: {last}");
    }

    fn await_ready(&mut self) -> Result<(), String> {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return Err(format!("redis-server on port {} exited: {status}", self.port));
            }
            if self.try_command(0, &["PING"]).is_ok_and(|r| r == "+PONG") {
                return Ok(());
            }
            if t0.elapsed() > START_TIMEOUT {
                return Err(format!("redis-server on port {} did not answer PING in {START_TIMEOUT:?}", self.port));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:PORT/` followed by `rest` (a database and/or a query).
    pub fn url(&self, rest: &str) -> String {
        format!("redis://127.0.0.1:{}/{rest}", self.port)
    }

    /// Send one command (in database 0); its reply's first line (`+OK`, `:42`,
    /// `$-1`, `-ERR …`).
    pub fn command(&self, args: &[&str]) -> String {
        self.command_in(0, args)
    }

    /// Send one command in database `db`; its reply's first line.
    pub fn command_in(&self, db: u32, args: &[&str]) -> String {
        self.try_command(db, args).unwrap_or_else(|e| panic!("redis command {args:?}: {e}"))
    }

    fn try_command(&self, db: u32, args: &[&str]) -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], self.port).into(), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let db = db.to_string();
        let mut req = String::new();
        for cmd in [&["SELECT", db.as_str()][..], args] {
            req += &format!("*{}\r\n", cmd.len());
            for a in cmd {
                req += &format!("${}\r\n{a}\r\n", a.len());
            }
        }
        s.write_all(req.as_bytes())?;
        let mut reader = BufReader::new(s);
        let mut line = String::new();
        reader.read_line(&mut line)?; // SELECT's +OK
        line.clear();
        reader.read_line(&mut line)?;
        Ok(line.trim_end().to_owned())
    }

    /// Send `signal` to the server (SIGSTOP to wedge it, SIGCONT to resume it).
    pub fn signal(&self, signal: i32) {
        let pid = self.child.as_ref().expect("the server runs").id() as i32;
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {signal} to redis-server");
    }

    /// SIGKILL the server and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
