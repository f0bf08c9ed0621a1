//! What every part of the executor knows of the call it runs: its identity and
//! deadline ([`CallInfo`]), how it waits ([`WaitPolicy`]), the flags the threads
//! around it share ([`CallFlags`]), and how a failed link becomes an error. The
//! channels, the stream channel and the wait-chain questions all read these; this
//! file imports none of them.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::defaults::DEFAULT_SPIN;
use crate::error::{Error, OpContext};
use crate::types::{CallSig, DType, ReduceOp};

/// How long a rank that fails or closes keeps trying to hand its peers an abort
/// or goodbye frame through full links, all links together.
pub const CONTROL_GRACE: Duration = Duration::from_millis(200);
/// How a rank waits when no link can make progress.
#[derive(Clone, Copy, Debug)]
pub struct WaitPolicy {
    /// Keep polling links without sleeping for this long after the last progress.
    pub spin: Duration,
    /// Yield the CPU between polls while spinning (more ranks than cores).
    pub yield_while_spinning: bool,
}

impl WaitPolicy {
    /// `local_ranks` ranks of this host sharing `cores` CPUs between them (0:
    /// unknown, taken as the machine's), polling for `spin`: yield while spinning
    /// when the ranks outnumber the cores.
    pub fn new(local_ranks: usize, cores: usize, spin: Duration) -> WaitPolicy {
        let cores = crate::placement::cpus_or_online(cores);
        WaitPolicy { spin, yield_while_spinning: local_ranks > cores }
    }

    /// Threads of this process: they share its affinity.
    pub fn for_ranks(local_ranks: usize) -> WaitPolicy {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        WaitPolicy::new(local_ranks, cores, DEFAULT_SPIN)
    }

    /// The same policy polling for `spin`.
    pub fn with_spin(self, spin: Duration) -> WaitPolicy {
        WaitPolicy { spin, ..self }
    }
}

/// Everything the executor needs to know about the call.
pub struct CallInfo {
    /// Reporting context (rank, call, sequence number).
    pub ctx: OpContext,
    /// The call's signature, checked against every incoming data frame.
    pub sig: CallSig,
    /// Sequence number carried in outgoing frames.
    pub send_seq: u64,
    /// Sequence number expected in incoming frames.
    pub recv_seq: u64,
    /// Communicator id and epoch, carried and checked.
    pub comm_id: u32,
    /// Communicator epoch.
    pub epoch: u8,
    /// Element type and combining operator for receive-reduce steps.
    pub dtype: DType,
    /// Reduce operator (Avg combines as Sum and is finalised by the caller).
    pub reduce_op: ReduceOp,
    /// No-progress deadline.
    pub timeout: Duration,
    /// How to wait.
    pub wait: WaitPolicy,
    /// The communicator's abort flag (set from another thread to abort the call:
    /// checked once per pass of the transfer loop, which then returns
    /// [`Error::Aborted`]) and the call's progress for the flight recorder.
    pub flags: Arc<CallFlags>,
}

/// A timed round of a call: (round, when it started).
pub type RoundMark = (u32, Instant);
/// When a peer's transfers of a timed round completed: (round, peer, when).
pub type PeerMark = (u32, usize, Instant);

/// What the threads around a communicator's calls share with them: the abort flag
/// (the `AtomicBool` this derefs to), and where the current call is, for the
/// flight recorder to read while the call waits. One allocation per communicator
/// whose handle every call already carries, so the progress costs a call a store
/// per round and nothing more.
#[derive(Debug, Default)]
pub struct CallFlags {
    aborted: AtomicBool,
    round: std::sync::atomic::AtomicU32,
    /// Whom the current call waited on when it last went idle (written off the hot path).
    waiting: std::sync::Mutex<Vec<usize>>,
    /// Whether `waiting` holds anything (so a call that never waited takes no lock).
    waited: AtomicBool,
    /// Whether rounds are timed for the timeline (`BRAID_TIMELINE`), and their
    /// start times while they are.
    marking: AtomicBool,
    marks: std::sync::Mutex<Vec<RoundMark>>,
    /// While rounds are timed: when each peer's transfers of a round completed
    /// (round, peer, time).
    peer_marks: std::sync::Mutex<Vec<PeerMark>>,
}

impl std::ops::Deref for CallFlags {
    type Target = AtomicBool;
    fn deref(&self) -> &AtomicBool {
        &self.aborted
    }
}

impl CallFlags {
    /// The current call enters round `k` (0 starts a call: it waits on nobody yet).
    #[inline]
    pub fn set_round(&self, k: usize) {
        self.round.store(k as u32, Ordering::Relaxed);
        if self.marking.load(Ordering::Relaxed) {
            if let Ok(mut m) = self.marks.lock() {
                m.push((k as u32, Instant::now()));
            }
        }
    }
    /// Time every round from now on (the timeline is on).
    pub(crate) fn time_rounds(&self) {
        self.marking.store(true, Ordering::Relaxed);
    }
    /// Whether rounds are timed.
    pub(crate) fn marking(&self) -> bool {
        self.marking.load(Ordering::Relaxed)
    }
    /// The current round's transfers with `peer` completed now (rounds are timed).
    pub(super) fn mark_peer_done(&self, peer: usize) {
        let round = self.round.load(Ordering::Relaxed);
        if let Ok(mut m) = self.peer_marks.lock() {
            m.push((round, peer, Instant::now()));
        }
    }
    /// Hand `f` the rounds timed since the last call of this, with their start
    /// times, and when each peer's transfers of each of them completed; then forget
    /// them (keeping the lists' room, so a call with a timeline allocates nothing).
    pub(crate) fn with_marks<R>(&self, f: impl FnOnce(&[RoundMark], &[PeerMark]) -> R) -> R {
        let mut rounds = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        let mut peers = self.peer_marks.lock().unwrap_or_else(|p| p.into_inner());
        let r = f(&rounds, &peers);
        rounds.clear();
        peers.clear();
        r
    }
    /// The current call went idle waiting on `peers`.
    pub fn set_waiting(&self, peers: &[usize]) {
        if let Ok(mut w) = self.waiting.lock() {
            w.clear();
            w.extend_from_slice(peers);
            self.waited.store(true, Ordering::Relaxed);
        }
    }
    /// The current call's round and whom it waited on.
    pub fn progress(&self) -> (usize, Vec<usize>) {
        let waiting = self.waiting.lock().map(|w| w.clone()).unwrap_or_default();
        (self.round.load(Ordering::Relaxed) as usize, waiting)
    }
    /// A new call starts.
    pub(crate) fn start_call(&self) {
        self.round.store(0, Ordering::Relaxed);
        // Only a call that waited idle wrote the list: the lock is taken only then.
        // (The call's thread is the only writer of both: no read-modify-write.)
        if self.waited.load(Ordering::Relaxed) {
            self.waited.store(false, Ordering::Relaxed);
            if let Ok(mut w) = self.waiting.lock() {
                w.clear();
            }
        }
    }
}

/// The error a failed link gives a call: the peer is lost, with what its link said.
pub(crate) fn peer_error(call: &CallInfo, peer: usize, said_goodbye: bool, e: io::Error) -> Error {
    let detail = if said_goodbye {
        "it closed its communicator".to_string()
    } else if e.kind() == io::ErrorKind::UnexpectedEof {
        "connection closed: the process exited or was killed".to_string()
    } else {
        e.to_string()
    };
    Error::PeerLost { ctx: call.ctx.clone(), peer, detail }
}
