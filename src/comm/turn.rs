//! Issue-order ticketing shared by sync callers and the async worker, and abort.
//!
//! Every call takes a ticket when issued and runs when its turn comes. The turn
//! passes on however the call ends — returned, failed or unwound by a panic — and
//! [`Shared::abort`] wakes every thread waiting for its turn, so no caller can be
//! left waiting on one that will never come.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};

use super::engine::Engine;
use crate::error::{Error, Result};
use crate::types::CallSig;

/// Ticketing, the engine and the abort flag of one rank's communicator.
pub(super) struct Shared {
    pub(super) rank: usize,
    pub(super) engine: Mutex<Engine>,
    next_ticket: AtomicU64,
    /// The ticket now being served. Read without a lock when a call starts (the
    /// common case: its turn has come), advanced only by the call being served.
    serving: AtomicU64,
    /// Threads blocked on `turn`, so passing the turn wakes someone only when needed.
    waiting: AtomicUsize,
    /// Held while a thread decides to wait and while the turn's waiters are woken,
    /// so no wakeup falls between a waiter's last look and its sleep.
    wait_lock: Mutex<()>,
    turn: Condvar,
    /// The flag the engine and the executor read; set once, never cleared.
    pub(super) aborted: Arc<crate::executor::CallFlags>,
    /// The engine's flight recorder, readable while a call holds the engine.
    pub(super) recorder: Option<Arc<crate::recorder::FlightRecorder>>,
    /// The engine's counters, readable while a call holds the engine.
    pub(super) metrics: Option<Arc<crate::recorder::metrics::Metrics>>,
    /// Whether the engine writes a timeline (`BRAID_TIMELINE`).
    pub(super) timeline_on: bool,
}

/// Passes the turn on when dropped: after the call returns and while it unwinds.
struct PassTurn<'a>(&'a Shared);

impl Drop for PassTurn<'_> {
    fn drop(&mut self) {
        // SeqCst on both sides (here and in `wait_for_turn`): either this load sees
        // the waiter's count, or the waiter's look at `serving` sees this increment.
        self.0.serving.fetch_add(1, Ordering::SeqCst);
        // Waking costs a system call: only when a thread waits for its turn.
        if self.0.waiting.load(Ordering::SeqCst) > 0 {
            drop(self.0.wait_lock.lock().unwrap_or_else(|e| e.into_inner()));
            self.0.turn.notify_all();
        }
    }
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_string()
    }
}

impl Shared {
    pub(super) fn new(engine: Engine, aborted: Arc<crate::executor::CallFlags>) -> Shared {
        Shared {
            rank: engine.rank,
            recorder: engine.recorder.clone(),
            metrics: engine.metrics.clone(),
            timeline_on: engine.timeline.is_some(),
            engine: Mutex::new(engine),
            next_ticket: AtomicU64::new(0),
            serving: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            wait_lock: Mutex::new(()),
            turn: Condvar::new(),
            aborted,
        }
    }

    pub(super) fn take_ticket(&self) -> u64 {
        self.next_ticket.fetch_add(1, Ordering::SeqCst)
    }

    /// The engine, whoever held it last (a panic there is handled by `in_turn`).
    /// Have large calls tune the shared-memory ring writers' stores.
    pub(super) fn set_stream_tuner(&self, tuner: crate::transport::stream_copy::CallTuner) {
        self.lock_engine().stream_tuner = Some(tuner);
    }

    pub(super) fn lock_engine(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn aborted_error(&self, call: Option<CallSig>) -> Error {
        Error::Aborted { rank: self.rank, call }
    }

    /// Wait for `ticket`'s turn, run `f` on the engine, pass the turn on. Every
    /// ticket taken must come through here exactly once, or later calls would wait
    /// for it forever — unless the communicator is aborted: then every call
    /// returns [`Error::Aborted`] at once and the order no longer matters.
    ///
    /// When `f` panics the engine is marked broken (its queues and links are in an
    /// unknown state), the turn passes on and the panic continues in the caller.
    pub(super) fn in_turn<R>(
        &self,
        ticket: u64,
        call: Option<CallSig>,
        f: impl FnOnce(&mut Engine) -> Result<R>,
    ) -> Result<R> {
        // A call whose turn has come (the common case) takes no lock to see it.
        if self.serving.load(Ordering::Acquire) != ticket || self.aborted.load(Ordering::Relaxed) {
            self.wait_for_turn(ticket, call)?;
        }
        let _pass = PassTurn(self);
        let mut engine = self.lock_engine();
        match catch_unwind(AssertUnwindSafe(|| f(&mut engine))) {
            Ok(r) => {
                // An abort that came while the call was not in the executor (or
                // just as it finished) still reaches the peers.
                engine.notice_abort();
                r
            }
            Err(payload) => {
                let text = panic_text(payload.as_ref());
                engine.unwound(&text);
                drop(engine);
                resume_unwind(payload)
            }
        }
    }

    /// Block until `ticket` is served, or the communicator is aborted.
    #[cold]
    fn wait_for_turn(&self, ticket: u64, call: Option<CallSig>) -> Result<()> {
        let mut guard = self.wait_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let r = loop {
            // Read under `wait_lock`, which abort() takes after setting the flag and
            // a passing turn takes before waking: no wakeup is lost before the wait.
            if self.aborted.load(Ordering::SeqCst) {
                break Err(self.aborted_error(call));
            }
            if self.serving.load(Ordering::SeqCst) == ticket {
                break Ok(());
            }
            guard = self.turn.wait(guard).unwrap_or_else(|e| e.into_inner());
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// Abort: later calls and calls waiting for their turn return
    /// [`Error::Aborted`] at once, the call in flight within its executor's next
    /// pass, and the peers are sent an abort frame.
    pub(super) fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        drop(self.wait_lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.turn.notify_all();
        // Idle engine: tell the peers now. A busy one tells them when its call
        // returns (`in_turn` above); never wait for it here.
        match self.engine.try_lock() {
            Ok(mut e) => e.notice_abort(),
            Err(TryLockError::Poisoned(p)) => p.into_inner().notice_abort(),
            Err(TryLockError::WouldBlock) => {}
        }
    }

    /// Whether [`Shared::abort`] was called.
    pub(super) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Relaxed)
    }
}
