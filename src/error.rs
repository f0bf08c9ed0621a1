//! The one error type. Every variant that arises inside an operation names the
//! rank that saw it, the peer involved, the operation and its sequence number.

use std::fmt;
use std::time::Duration;

use crate::types::CallSig;

/// Where in a job an error happened: which rank, running which call, number `seq`
/// in this communicator's order of collectives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpContext {
    /// The rank that reports the error.
    pub rank: usize,
    /// The call it was running (None outside any call, e.g. during setup).
    pub call: Option<CallSig>,
    /// Sequence number of that call in the communicator (collectives) or on the link (send/recv).
    pub seq: u64,
}

impl fmt::Display for OpContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.call {
            Some(c) => write!(f, "rank {} in {} #{}", self.rank, c, self.seq),
            None => write!(f, "rank {} (setup)", self.rank),
        }
    }
}

/// Every error braid returns.
///
/// Match on the variant to tell a caller's mistake from a peer's failure. Here a
/// receive whose peer never sends runs into the communicator's deadline:
///
/// ```
/// use std::time::Duration;
/// use braid::{Communicator, Config, Error};
/// let mut cfg = Config::new(0, 2);
/// cfg.timeout = Duration::from_millis(50);
/// let comms = Communicator::in_process_with(cfg)?;
/// let mut buf = [0u8; 4];
/// match comms[1].recv(&mut buf, 0) {
///     Err(Error::Timeout { ctx, waiting_on, .. }) => {
///         assert_eq!(ctx.rank, 1);
///         assert_eq!(waiting_on, [0]);
///     }
///     other => panic!("expected a timeout, got {other:?}"),
/// }
/// // Buffers of the wrong size are refused before anything is sent:
/// let e = comms[0].all_gather(&[1u8; 4], &mut [0u8; 5]).unwrap_err();
/// assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
/// # Ok::<(), braid::Error>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller passed an argument that cannot work (sizes, ranks, dtypes).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// Configuration (environment or builder) is missing or malformed.
    #[error("configuration: {0}")]
    Config(String),

    /// Two ranks issued different calls at the same point of their sequences.
    #[error("{ctx}: mismatched collective calls: this rank called {ours}, rank {peer} called {theirs} (#{their_seq})")]
    Mismatch {
        /// Where it was detected.
        ctx: OpContext,
        /// The other rank.
        peer: usize,
        /// This rank's call.
        ours: CallSig,
        /// The peer's call.
        theirs: CallSig,
        /// The peer's sequence number.
        their_seq: u64,
    },

    /// A peer closed its connection or its process died.
    #[error("{ctx}: peer rank {peer} is gone ({detail})")]
    PeerLost {
        /// Where it was detected.
        ctx: OpContext,
        /// The rank that disappeared.
        peer: usize,
        /// What the transport saw (EOF, connection reset, ...).
        detail: String,
    },

    /// A peer failed, or its communicator was aborted, and told us why before stopping.
    #[error("{ctx}: {}", describe_peer_abort(*.peer, .reason))]
    PeerAborted {
        /// Where it was detected.
        ctx: OpContext,
        /// The rank that sent the abort.
        peer: usize,
        /// The error that rank reported.
        reason: String,
    },

    /// A wait passed its deadline.
    #[error(
        "{ctx}: timed out after {timeout:?} waiting for rank(s) {waiting_on:?}{}",
        describe_chains(.chain)
    )]
    Timeout {
        /// Where it was detected.
        ctx: OpContext,
        /// The configured timeout.
        timeout: Duration,
        /// The ranks that had not delivered or accepted data.
        waiting_on: Vec<usize>,
        /// Inside a call: for each rank waited for, whom it waits for in turn, as far
        /// as the ranks answered, and how the chain ends (the rank to look at).
        /// Empty where nobody could be asked (setup).
        chain: Vec<WaitChain>,
    },

    /// A peer sent bytes that are not a valid braid frame.
    #[error("{ctx}: protocol error from rank {peer}: {detail}")]
    Protocol {
        /// Where it was detected.
        ctx: OpContext,
        /// The sender.
        peer: usize,
        /// What was wrong.
        detail: String,
    },

    /// A key-value store operation failed (rendezvous).
    #[error("store: {0}")]
    Store(String),

    /// Operating-system I/O error outside a collective (binding, connecting, spawning).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The communicator failed earlier and can no longer be used.
    #[error("communicator is broken by an earlier error: {0}")]
    Broken(String),

    /// This rank's communicator was aborted ([`crate::Communicator::abort`]): the
    /// call was cut short or never ran, and so will every later call.
    #[error("rank {rank}: {}: {ABORTED_HERE}", describe_call(.call))]
    Aborted {
        /// The rank whose communicator was aborted.
        rank: usize,
        /// The call that was cut short or refused (None: no call, e.g. the abort itself).
        call: Option<CallSig>,
    },

    /// The operation or transport is not available in this build or on this machine.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// A process waiting to join a running job was not taken in: the job closed
    /// joining ([`crate::Communicator::close_joining`]), usually because it ended.
    #[error("joining `{name}` as ticket {ticket}: the job closed joining (it ended) before taking this process in")]
    JoinClosed {
        /// The name the process waited under.
        name: String,
        /// Its place in the queue.
        ticket: u64,
    },

    /// An accelerator (device) operation failed: the driver's error, naming the device.
    #[error("device error: {0}")]
    Device(String),
}

/// How [`Error::Aborted`] ends; a peer's abort reason of that form is a deliberate abort.
const ABORTED_HERE: &str = "the communicator was aborted on this rank";

/// What a peer's abort frame says: `peer` aborted its communicator (its reason is
/// exactly the [`Error::Aborted`] of `peer`), or it failed for `reason`.
fn describe_peer_abort(peer: usize, reason: &str) -> String {
    let during = reason
        .strip_prefix(&format!("rank {peer}: "))
        .and_then(|r| r.strip_suffix(ABORTED_HERE))
        .and_then(|r| r.strip_suffix(": "))
        // A relayed failure has more parts ("rank 1 in ...: rank 2 ...").
        .filter(|call| !call.contains(": "));
    match during {
        Some("abort") => format!("rank {peer} aborted its communicator"),
        Some(call) => format!("rank {peer} aborted its communicator during {call}"),
        None => format!("aborted because rank {peer} failed: {reason}"),
    }
}

fn describe_call(call: &Option<CallSig>) -> String {
    match call {
        Some(c) => c.to_string(),
        None => "abort".to_string(),
    }
}

impl Error {
    /// Wrap an I/O error with a description of what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { what: what.into(), source }
    }

    /// A copy of this error, for handing one failure to every request it ends (an
    /// I/O error's source keeps its kind and message).
    pub fn share(&self) -> Error {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::Config(m) => Error::Config(m.clone()),
            Error::Mismatch { ctx, peer, ours, theirs, their_seq } => {
                Error::Mismatch { ctx: ctx.clone(), peer: *peer, ours: *ours, theirs: *theirs, their_seq: *their_seq }
            }
            Error::PeerLost { ctx, peer, detail } => {
                Error::PeerLost { ctx: ctx.clone(), peer: *peer, detail: detail.clone() }
            }
            Error::PeerAborted { ctx, peer, reason } => {
                Error::PeerAborted { ctx: ctx.clone(), peer: *peer, reason: reason.clone() }
            }
            Error::Timeout { ctx, timeout, waiting_on, chain } => Error::Timeout {
                ctx: ctx.clone(),
                timeout: *timeout,
                waiting_on: waiting_on.clone(),
                chain: chain.clone(),
            },
            Error::Protocol { ctx, peer, detail } => {
                Error::Protocol { ctx: ctx.clone(), peer: *peer, detail: detail.clone() }
            }
            Error::Store(m) => Error::Store(m.clone()),
            Error::Io { what, source } => {
                Error::Io { what: what.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
            }
            Error::Broken(m) => Error::Broken(m.clone()),
            Error::Aborted { rank, call } => Error::Aborted { rank: *rank, call: *call },
            Error::Unsupported(m) => Error::Unsupported(m.clone()),
            Error::JoinClosed { name, ticket } => Error::JoinClosed { name: name.clone(), ticket: *ticket },
            Error::Device(m) => Error::Device(m.clone()),
        }
    }
}

/// braid's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A chain of waits found at a deadline: the first rank is one the timed-out rank
/// waits for, each waits for the next, and `end` says what became of the last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitChain {
    /// The ranks followed, in order (at most the world size of them).
    pub ranks: Vec<usize>,
    /// How the chain ends.
    pub end: ChainEnd,
}

/// What the last rank of a [`WaitChain`] did when asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChainEnd {
    /// It did not answer in time: it is not inside a braid call (stopped, or
    /// busy outside braid), or it is stuck inside one without polling its links.
    Silent,
    /// It could not be asked (why).
    NotAsked(String),
    /// It left or failed while asked (its reason, or how its link ended).
    Left(String),
    /// It answered that it waits for nobody: its call was ending.
    WaitsForNobody,
    /// It waits for this rank, already on the chain (a cycle of waits).
    Cycle(usize),
    /// It waits for the rank that asked (a send of that rank it has not taken, or a
    /// deadlock of the two).
    WaitsForThisRank,
    /// Its answer was not valid (what was wrong).
    Invalid(String),
}

impl fmt::Display for WaitChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((first, rest)) = self.ranks.split_first() else { return Ok(()) };
        write!(f, "rank {first}")?;
        for (i, r) in rest.iter().enumerate() {
            let which = if i == 0 { "" } else { ", which" };
            write!(f, "{which} waits for rank {r}")?;
        }
        f.write_str(if rest.is_empty() { " " } else { ", which " })?;
        match &self.end {
            ChainEnd::Silent => f.write_str("did not answer (stopped, or stuck outside braid)"),
            ChainEnd::NotAsked(why) => write!(f, "could not be asked ({why})"),
            ChainEnd::Left(why) => write!(f, "stopped waiting: {why}"),
            ChainEnd::WaitsForNobody => f.write_str("waits for nobody (its call was ending)"),
            ChainEnd::Cycle(r) => write!(f, "waits for rank {r} (a cycle: these ranks wait for each other)"),
            ChainEnd::WaitsForThisRank => f.write_str("waits for this rank"),
            ChainEnd::Invalid(why) => write!(f, "gave an invalid answer ({why})"),
        }
    }
}

/// The chains of a timeout, as they follow its "waiting for rank(s) [..]".
pub(crate) fn describe_chains(chains: &[WaitChain]) -> String {
    let mut s = String::new();
    for (i, c) in chains.iter().enumerate() {
        s.push_str(if i == 0 { ": " } else { "; " });
        s.push_str(&c.to_string());
    }
    s
}
