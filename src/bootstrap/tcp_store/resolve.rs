//! Where the tcp store's server is, seen from this process: splitting `HOST:PORT`,
//! resolving `HOST` within a deadline, deciding whether rank 0 hosts the server (as
//! torch's TCPStore master does: on the wildcard address, whatever `HOST` resolves
//! to here), and the local address of the route to it.
//!
//! Name resolution goes through the system resolver (`getaddrinfo`), which has no
//! deadline of its own and may wait out a DNS server that does not answer; it runs on
//! a helper thread that is abandoned at the deadline.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::mpsc;
use std::time::Duration;

use crate::error::{Error, Result};

/// `HOST:PORT` or `[V6]:PORT` split into host and port; the host is not resolved.
pub(crate) fn split_host_port(addr: &str) -> Result<(&str, u16)> {
    let bad = |why: &str| Error::Config(format!("tcp store address `{addr}` is not HOST:PORT: {why}"));
    let no_port = || bad(&format!("it has no port: add one (`{addr}:29500`, rank 0 serves the store there)"));
    // `[V6]` alone has colons but no port.
    let (host, port) = addr.rsplit_once(':').filter(|_| !addr.ends_with(']')).ok_or_else(no_port)?;
    if port.is_empty() {
        return Err(no_port());
    }
    let host = match host.strip_prefix('[') {
        Some(inner) => inner.strip_suffix(']').ok_or_else(|| bad("unclosed `[`"))?,
        None if host.contains(':') => return Err(bad("an IPv6 address needs brackets: [ADDR]:PORT")),
        None => host,
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    let port = port.parse::<u16>().map_err(|_| bad(&format!("port `{port}` is not a number below 65536")))?;
    Ok((host, port))
}

/// Resolve `addr` (`HOST:PORT`) within `limit`. A resolver still busy at the limit
/// is left to finish on its own; the answer is then a `TimedOut` error.
pub(super) fn resolve_within(addr: &str, limit: Duration) -> io::Result<Vec<SocketAddr>> {
    // A literal address needs no resolver (and no thread).
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok(vec![sa]);
    }
    let (tx, rx) = mpsc::channel();
    let owned = addr.to_owned();
    let spawned = std::thread::Builder::new().name("braid-resolve".into()).spawn(move || {
        let _ = tx.send(owned.to_socket_addrs().map(Vec::from_iter));
    });
    if let Err(e) = spawned {
        return Err(io::Error::other(format!("cannot start a resolver thread: {e}")));
    }
    match rx.recv_timeout(limit) {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("the resolver gave no answer within {limit:?}"))),
    }
}

/// Whether `ip` is an address of this host: loopback, the wildcard, or one that a
/// socket can be bound to here (the kernel's own test, whatever the interfaces).
pub(crate) fn is_local_ip(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    std::net::TcpListener::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Whether rank 0 hosts the store named `addr`, and why (for the log).
pub(super) enum Hosting {
    /// Host it: `HOST` is this machine (by name or address), or does not resolve
    /// yet (a Kubernetes service name resolves once the pod is ready; torch's
    /// master binds the wildcard address regardless of what `MASTER_ADDR` names).
    Here(String),
    /// `HOST` resolves, and to no address of this machine: a server elsewhere.
    Elsewhere(Vec<SocketAddr>),
}

/// Decide whether this process, asked to host the store at `addr`, should.
pub(super) fn hosting(addr: &str, host: &str, limit: Duration) -> Hosting {
    if let Some(name) = own_hostname().filter(|n| n.eq_ignore_ascii_case(host) || short(n) == host) {
        return Hosting::Here(format!("`{host}` is this host's name ({name})"));
    }
    match resolve_within(addr, limit) {
        Err(e) => Hosting::Here(format!("`{host}` does not resolve here yet ({e}); rank 0 hosts the store regardless")),
        Ok(addrs) if addrs.is_empty() => Hosting::Here(format!("`{host}` resolves to nothing here yet")),
        Ok(addrs) => match addrs.iter().find(|sa| is_local_ip(sa.ip())) {
            Some(sa) => Hosting::Here(format!("`{host}` resolves to {}, an address of this host", sa.ip())),
            None => Hosting::Elsewhere(addrs),
        },
    }
}

fn short(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

fn own_hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..end]).ok().filter(|s| !s.is_empty()).map(str::to_owned)
}

/// The local address the kernel would use to reach the first of `targets` it has a
/// route to: a UDP socket's connect picks the route and source address without
/// sending a packet.
pub(crate) fn route_source(targets: &[SocketAddr]) -> Option<IpAddr> {
    targets.iter().find_map(|t| {
        let any: IpAddr = if t.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
        let sock = UdpSocket::bind(SocketAddr::new(any, 0)).ok()?;
        sock.connect(t).ok()?;
        sock.local_addr().ok().map(|a| a.ip()).filter(|ip| !ip.is_unspecified())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_split() {
        assert_eq!(split_host_port("master:29500").unwrap(), ("master", 29500));
        assert_eq!(split_host_port("10.0.0.1:1").unwrap(), ("10.0.0.1", 1));
        assert_eq!(split_host_port("[fd00::1]:80").unwrap(), ("fd00::1", 80));
        for bad in ["master", "master:", "master:70000", ":80", "fd00::1:80", "[fd00::1:80", "m:-1"] {
            let err = split_host_port(bad).unwrap_err();
            assert!(matches!(err, Error::Config(_)) && err.to_string().contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn an_address_without_a_port_says_so() {
        for bad in ["master", "master:", "[fd00::1]", "10.0.0.1"] {
            let err = split_host_port(bad).unwrap_err().to_string();
            assert!(err.contains("has no port"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_store_url_without_a_port_fails_at_once_on_a_rank_that_is_not_rank_0() {
        let key = crate::auth::JobKey::from_text("k");
        let url = "tcp://localhost";
        let err = crate::bootstrap::connect_store(url, false, 2, key, Duration::from_secs(30)).err().unwrap();
        assert!(matches!(err, Error::Config(_)) && err.to_string().contains("has no port"), "{err}");
    }

    #[test]
    fn local_addresses_are_told_from_remote_ones() {
        assert!(is_local_ip("127.0.0.1".parse().unwrap()));
        assert!(is_local_ip("127.0.1.1".parse().unwrap()));
        assert!(is_local_ip("0.0.0.0".parse().unwrap()));
        // TEST-NET-3: assigned to no host.
        assert!(!is_local_ip("203.0.113.7".parse().unwrap()));
    }

    #[test]
    fn rank_zero_hosts_for_its_own_name_loopback_and_unresolved_names() {
        let name = own_hostname().expect("gethostname");
        assert!(matches!(hosting(&format!("{name}:1"), &name, Duration::from_secs(5)), Hosting::Here(_)));
        assert!(matches!(hosting("127.0.1.1:1", "127.0.1.1", Duration::from_secs(5)), Hosting::Here(_)));
        // `.invalid` never resolves (RFC 6761).
        match hosting("braid-master.invalid:1", "braid-master.invalid", Duration::from_secs(5)) {
            Hosting::Here(why) => assert!(why.contains("does not resolve"), "{why}"),
            Hosting::Elsewhere(a) => panic!("resolved to {a:?}"),
        }
        match hosting("203.0.113.7:1", "203.0.113.7", Duration::from_secs(5)) {
            Hosting::Elsewhere(a) => assert_eq!(a, vec!["203.0.113.7:1".parse().unwrap()]),
            Hosting::Here(why) => panic!("hosted: {why}"),
        }
    }

    #[test]
    fn the_route_to_loopback_starts_on_loopback() {
        let src = route_source(&["127.0.0.1:9".parse().unwrap()]).unwrap();
        assert!(src.is_loopback(), "{src}");
        assert_eq!(route_source(&[]), None);
    }
}
