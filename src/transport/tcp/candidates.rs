//! A rank's published addresses, and the order and deadlines its peers try them in.
//!
//! A rank publishes `ADDR:PORT[,ADDR:PORT...]` (at most [`MAX_PUBLISHED`]): the
//! address it chose first, then its other qualifying addresses (see
//! [`crate::transport::ifaces::choose_listen`]). A peer tries them in order, each
//! attempt (connect and handshake) bounded by a short deadline, and moves on when
//! one is refused, unreachable, silent, or answers with a handshake that is not the
//! expected rank's of this communicator: identical private addresses (docker0's
//! 172.17.0.1) exist on every host, so reaching *an* address proves nothing until
//! the handshake does.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::transport::ifaces::MAX_PUBLISHED;

/// First deadline of one attempt at one address; doubled (to [`MAX_ATTEMPT`]) each
/// time a whole pass over a peer's addresses ran into it, so a peer that is only
/// slow (a full accept queue makes a connect wait for a SYN retransmit) still gets in.
pub(super) const FIRST_ATTEMPT: Duration = Duration::from_secs(1);
pub(super) const MAX_ATTEMPT: Duration = Duration::from_secs(8);

/// The store value for `addrs`.
pub(super) fn encode(addrs: &[SocketAddr]) -> String {
    addrs.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",")
}

/// A published value: one to [`MAX_PUBLISHED`] socket addresses (more are ignored).
pub(super) fn decode(text: &str) -> Result<Vec<SocketAddr>, String> {
    let mut out = Vec::new();
    for part in text.split(',').take(MAX_PUBLISHED) {
        let part = part.trim();
        let addr = part.parse::<SocketAddr>().map_err(|_| {
            let shown: String = part.chars().take(64).collect();
            format!("`{shown}` is not a socket address")
        })?;
        if addr.port() == 0 {
            return Err(format!("`{addr}` has port 0"));
        }
        out.push(addr);
    }
    Ok(out)
}

/// The attempts at one lower rank.
#[derive(Default)]
pub(super) struct Attempts {
    /// Index of the address to try next (modulo the list's length).
    next: usize,
    /// Failures since the last full pass over the list.
    failed_in_pass: usize,
    /// Passes in which an attempt ran into its deadline.
    slow_passes: u32,
    timed_out_in_pass: bool,
    /// When the attempt in flight started.
    started: Option<Instant>,
    /// The last failure at each address tried, for the timeout's report.
    failures: Vec<(SocketAddr, String)>,
}

impl Attempts {
    /// The address to try now out of `list`.
    pub fn current(&self, list: &[SocketAddr]) -> SocketAddr {
        list[self.next % list.len()]
    }

    /// An attempt starts now.
    pub fn start(&mut self, now: Instant) {
        self.started = Some(now);
    }

    /// How long one attempt may take.
    pub fn limit(&self) -> Duration {
        FIRST_ATTEMPT.saturating_mul(1 << self.slow_passes.min(3)).min(MAX_ATTEMPT)
    }

    /// When the attempt in flight runs out, if one is.
    pub fn deadline(&self) -> Option<Instant> {
        self.started.map(|s| s + self.limit())
    }

    /// The attempt at `addr` failed; `n` addresses are published. True when that
    /// ends a pass over all of them (the caller then backs off and reads the
    /// published list again), false when the next address is due at once.
    pub fn failed(&mut self, addr: SocketAddr, why: &str, n: usize, timed_out: bool) -> bool {
        self.started = None;
        if let Some(slot) = self.failures.iter_mut().find(|(a, _)| *a == addr) {
            slot.1 = why.to_owned();
        } else if self.failures.len() < MAX_PUBLISHED * 2 {
            self.failures.push((addr, why.to_owned()));
        }
        self.timed_out_in_pass |= timed_out;
        self.next = (self.next + 1) % n.max(1);
        self.failed_in_pass += 1;
        if self.failed_in_pass < n {
            return false;
        }
        self.failed_in_pass = 0;
        if std::mem::take(&mut self.timed_out_in_pass) {
            self.slow_passes += 1;
        }
        true
    }

    /// `a: why; b: why` over every address tried, for errors.
    pub fn report(&self) -> String {
        self.failures.iter().map(|(a, why)| format!("{a}: {why}")).collect::<Vec<_>>().join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn published_lists_round_trip_and_untrusted_ones_are_bounded() {
        let list = vec![sa("10.0.0.1:5000"), sa("[fd00::1%3]:5000"), sa("172.17.0.1:5000")];
        assert_eq!(decode(&encode(&list)).unwrap(), list);
        // One address, as every earlier release published.
        assert_eq!(decode("10.0.0.1:5000").unwrap(), vec![sa("10.0.0.1:5000")]);
        let long = vec!["10.0.0.1:1"; 100].join(",");
        assert_eq!(decode(&long).unwrap().len(), MAX_PUBLISHED);
        for bad in ["", "10.0.0.1", "10.0.0.1:5000,", "host:5000", "10.0.0.1:0"] {
            assert!(decode(bad).is_err(), "{bad}");
        }
        let err = decode(&format!("{},1", "x".repeat(500))).unwrap_err();
        assert!(err.len() < 120, "{err}");
    }

    #[test]
    fn each_address_is_tried_once_per_pass_and_silence_lengthens_the_deadline() {
        let list = [sa("10.99.0.1:7"), sa("172.17.0.1:7"), sa("10.77.0.1:7")];
        let mut a = Attempts::default();
        assert_eq!(a.limit(), FIRST_ATTEMPT);
        assert_eq!(a.current(&list), list[0]);
        a.start(Instant::now());
        assert!(a.deadline().is_some());
        assert!(!a.failed(list[0], "no answer within 1s", 3, true));
        assert_eq!(a.deadline(), None);
        assert_eq!(a.current(&list), list[1]);
        assert!(!a.failed(list[1], "connection refused", 3, false));
        assert_eq!(a.current(&list), list[2]);
        assert!(a.failed(list[2], "connection refused", 3, false), "a pass over all three ends");
        assert_eq!(a.current(&list), list[0]);
        assert_eq!(a.limit(), FIRST_ATTEMPT * 2);
        // A pass without silence keeps the deadline.
        for addr in list {
            a.failed(addr, "connection refused", 3, false);
        }
        assert_eq!(a.limit(), FIRST_ATTEMPT * 2);
        for _ in 0..10 {
            for addr in list {
                a.failed(addr, "no answer", 3, true);
            }
        }
        assert_eq!(a.limit(), MAX_ATTEMPT);
        let report = a.report();
        assert!(report.contains("10.99.0.1:7: no answer") && report.contains("172.17.0.1:7"), "{report}");
    }
}
