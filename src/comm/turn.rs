//! Issue-order ticketing shared by sync callers and the async worker, and abort.
//!
//! Every call takes a ticket when issued and runs when its turn comes. The turn
//! passes on however the call ends — returned, failed or unwound by a panic — and
//! [`Shared::abort`] wakes every thread waiting for its turn, so no caller can be
//! left waiting on one that will never come.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};

use super::engine::Engine;
use crate::error::{Error, Result};
use crate::types::CallSig;

/// Ticketing, the engine and the abort flag of one rank's communicator.
pub(super) struct Shared {
    pub(super) rank: usize,
    pub(super) engine: Mutex<Engine>,
    next_ticket: AtomicU64,
    /// (ticket now being served, threads waiting for their turn).
    serving: Mutex<(u64, usize)>,
    turn: Condvar,
    /// The flag the engine and the executor read; set once, never cleared.
    pub(super) aborted: Arc<AtomicBool>,
}

/// Passes the turn on when dropped: after the call returns and while it unwinds.
struct PassTurn<'a>(&'a Shared);

impl Drop for PassTurn<'_> {
    fn drop(&mut self) {
        let waiting = {
            let mut serving = self.0.serving.lock().unwrap_or_else(|e| e.into_inner());
            serving.0 += 1;
            serving.1
        };
        // Waking costs a system call: only when a thread waits for its turn.
        if waiting > 0 {
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
    pub(super) fn new(engine: Engine, aborted: Arc<AtomicBool>) -> Shared {
        Shared {
            rank: engine.rank,
            engine: Mutex::new(engine),
            next_ticket: AtomicU64::new(0),
            serving: Mutex::new((0, 0)),
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
        let mut serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            // Read under `serving`, which abort() takes after setting the flag: no
            // wakeup is lost between this check and the wait.
            if self.aborted.load(Ordering::Relaxed) {
                return Err(self.aborted_error(call));
            }
            if serving.0 == ticket {
                break;
            }
            serving.1 += 1;
            serving = self.turn.wait(serving).unwrap_or_else(|e| e.into_inner());
            serving.1 -= 1;
        }
        drop(serving);
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

    /// Abort: later calls and calls waiting for their turn return
    /// [`Error::Aborted`] at once, the call in flight within its executor's next
    /// pass, and the peers are sent an abort frame.
    pub(super) fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        drop(self.serving.lock().unwrap_or_else(|e| e.into_inner()));
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
