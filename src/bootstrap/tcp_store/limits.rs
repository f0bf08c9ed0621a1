//! What a TCP store server allows its clients: the caps below which it serves
//! and the deadlines after which it closes a connection. Kept apart from the
//! server so that admission ([`super::admit`]) and the server both read them
//! without importing each other.

use std::time::Duration;

/// What a [`TcpStoreServer`](super::TcpStoreServer) allows its clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Connections that proved the job key, at most. One that arrives while this
    /// many are open is closed before the server's hello, with a log line; the
    /// client retries with backoff within its timeout. (Connections proving the
    /// key at that moment may pass it by up to `max_unproven`.)
    pub max_connections: usize,
    /// Connections still proving the job key, at most. They hold a socket but
    /// no thread, and never count toward `max_connections`; past this budget the
    /// oldest is closed, so a flood of silent strangers evicts itself, not the
    /// clients that answer within a round trip.
    pub max_unproven: usize,
    /// A connection that has not proven the job key this long after it was
    /// accepted is closed (a real client answers within one round trip).
    pub proof_deadline: Duration,
    /// Bytes of keys plus values stored at most; a SET or ADD past it fails naming the cap.
    pub max_stored_bytes: usize,
    /// Each request, from its first byte, must arrive within this.
    pub read_deadline: Duration,
    /// A connection with no request for this long is closed (clients reconnect).
    pub idle_timeout: Duration,
    /// The longest a WAIT may block; longer timeouts are cut to it.
    pub max_wait: Duration,
}

impl Default for StoreLimits {
    /// 4096 connections, 256 unproven with a 5 s proof deadline, 1 GiB stored,
    /// 30 s read deadline, 10 min idle, 1 h WAIT.
    fn default() -> StoreLimits {
        StoreLimits {
            max_connections: 4096,
            max_unproven: 256,
            proof_deadline: Duration::from_secs(5),
            max_stored_bytes: 1 << 30,
            read_deadline: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(600),
            max_wait: Duration::from_secs(3600),
        }
    }
}

impl StoreLimits {
    /// Connections the cap allows per rank of the job: a client keeps two pooled,
    /// and rarely has more than two in use at once.
    pub const CONNS_PER_RANK: usize = 4;

    /// The defaults, with room for a job of `world_size` ranks:
    /// [`StoreLimits::CONNS_PER_RANK`] connections each, never fewer than the default 4096.
    pub fn for_world(world_size: usize) -> StoreLimits {
        let d = StoreLimits::default();
        StoreLimits { max_connections: d.max_connections.max(world_size.saturating_mul(Self::CONNS_PER_RANK)), ..d }
    }
}
