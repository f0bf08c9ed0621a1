//! Records on signals: SIGUSR1 writes every live communicator's record into its
//! trace directory and the process goes on; SIGTERM, SIGINT, SIGHUP and SIGQUIT,
//! each when nothing else in the process handles it, write them and then end the
//! process as the signal does. (SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT end a
//! process before any thread could write: a record needs a signal that waits.)
//!
//! Nothing runs in a signal handler: `signal-hook` turns each signal into a byte on
//! a pipe, and one watcher thread, started with the first recorder that has a
//! trace directory, reads it and writes the records.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::FlightRecorder;

/// Every recorder with a trace directory, for the watcher to find.
fn registry() -> &'static Mutex<Vec<Weak<FlightRecorder>>> {
    static LIVE: OnceLock<Mutex<Vec<Weak<FlightRecorder>>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new()))
}

/// Have `recorder` written on SIGUSR1 and the fatal signals of `FATAL` (when it
/// has a trace directory), starting the watcher the first time.
pub fn watch(recorder: &Arc<FlightRecorder>) {
    if recorder.dir().is_none() {
        return;
    }
    if let Ok(mut live) = registry().lock() {
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(recorder));
    }
    static WATCHER: OnceLock<()> = OnceLock::new();
    WATCHER.get_or_init(start_watcher);
}

/// Write every live recorder's record, naming `reason`; how many were written.
pub fn dump_all(reason: &str) -> usize {
    let live: Vec<Arc<FlightRecorder>> =
        registry().lock().map(|l| l.iter().filter_map(Weak::upgrade).collect()).unwrap_or_default();
    live.iter().filter(|r| matches!(r.dump(reason), Some(Ok(_)))).count()
}

/// Whether `signal`'s disposition is the default one (nobody else handles it).
fn is_default(signal: libc::c_int) -> bool {
    // SAFETY: a query (null new action) into a zeroed struct we own.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
    }
}

/// Signals that end a process by default, with their record reasons.
const FATAL: [(libc::c_int, &str); 4] = [
    (libc::SIGTERM, "signal SIGTERM"),
    (libc::SIGINT, "signal SIGINT"),
    (libc::SIGHUP, "signal SIGHUP"),
    (libc::SIGQUIT, "signal SIGQUIT"),
];

fn start_watcher() {
    use signal_hook::consts::SIGUSR1;
    // A process that handles one of them itself (a Python interpreter's SIGINT, a
    // server's SIGTERM) keeps its own handling: braid then writes no record on it.
    let fatal: Vec<(libc::c_int, &'static str)> = FATAL.into_iter().filter(|&(s, _)| is_default(s)).collect();
    let signals: Vec<libc::c_int> = std::iter::once(SIGUSR1).chain(fatal.iter().map(|f| f.0)).collect();
    let mut iter = match signal_hook::iterator::Signals::new(&signals) {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!("flight recorder: cannot watch signals: {e}");
            return;
        }
    };
    let spawned = std::thread::Builder::new().name("braid-signals".into()).spawn(move || {
        for signal in iter.forever() {
            let ends = fatal.iter().find(|f| f.0 == signal);
            let name = ends.map_or("signal SIGUSR1", |f| f.1);
            let n = dump_all(name);
            tracing::info!("flight recorder: {name}: {n} record(s) written");
            if ends.is_some() {
                // As if braid had never handled it: the default action ends the process.
                let _ = signal_hook::low_level::emulate_default_handler(signal);
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("flight recorder: cannot start the signal watcher: {e}");
    }
}
