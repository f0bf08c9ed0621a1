//! Choosing the network interface and address that TCP links listen on.
//!
//! `BRAID_SOCKET_IFNAME` follows NCCL's `NCCL_SOCKET_IFNAME` syntax:
//!
//! | spec | meaning |
//! |---|---|
//! | `eth,ib` | interfaces whose name starts with `eth` or `ib` |
//! | `^docker,lo` | every interface except those starting with `docker` or `lo` |
//! | `=eth0` | exactly `eth0` |
//! | `^=lo` | every interface except exactly `lo` |
//!
//! Without a spec, a rank listens where it reaches the store from: the source
//! address of its route to the store's server ([`Reason::RouteToStore`]), since the
//! hosts that reach the store reach it there. That route is not used when it starts
//! on loopback while the job spans hosts (the store's host name may map to 127.0.1.1
//! on rank 0's own host), nor when it is of another family than
//! `BRAID_SOCKET_FAMILY` asks for; then, as when no route is known, the first up,
//! non-loopback interface qualifies except virtual bridges and container plumbing
//! ([`DEFAULT_EXCLUDED_PREFIXES`]); when none exists, loopback is used so a single
//! host still works. Without a spec a rank also publishes its other qualifying
//! addresses ([`ListenChoice::others`]), which peers try when the first does not
//! answer.
//!
//! The matching is a pure function ([`choose_listen`], [`choose_address`]) over a
//! list of [`IfaceAddr`], so it is tested without touching the OS;
//! [`list_interfaces`] reads the real list with `getifaddrs`.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::str::FromStr;

use nix::net::if_::InterfaceFlags;

use crate::error::{Error, Result};

/// Name prefixes skipped when no interface spec is given: container bridges,
/// virtual ethernet pairs and overlay devices, whose addresses other hosts
/// usually cannot reach.
pub const DEFAULT_EXCLUDED_PREFIXES: &[&str] = &[
    "docker",
    "veth",
    "virbr",
    "br-",
    "cni",
    "flannel",
    "cali",
    "weave",
    "vxlan",
    "kube-ipvs",
    "lxc",
    "lxdbr",
    "cilium",
    "podman",
    "tunl",
    "dummy",
];

/// One IP address of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfaceAddr {
    /// Interface name (`eth0`, `lo`).
    pub name: String,
    /// The address.
    pub addr: IpAddr,
    /// IPv6 scope id (the interface index), needed to bind or reach a link-local address; 0 otherwise.
    pub scope_id: u32,
    /// The interface is administratively up.
    pub up: bool,
    /// The interface is a loopback device.
    pub loopback: bool,
}

impl IfaceAddr {
    /// The socket address of this interface address with `port` (carrying the scope id for IPv6).
    pub fn socket_addr(&self, port: u16) -> SocketAddr {
        match self.addr {
            IpAddr::V4(a) => SocketAddr::new(IpAddr::V4(a), port),
            IpAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(a, port, 0, self.scope_id)),
        }
    }

    fn link_local(&self) -> bool {
        matches!(self.addr, IpAddr::V6(a) if is_v6_link_local(&a))
    }
}

fn is_v6_link_local(a: &Ipv6Addr) -> bool {
    // fe80::/10 (Ipv6Addr::is_unicast_link_local is stable only from 1.84; rust-version is 1.80).
    (a.segments()[0] & 0xffc0) == 0xfe80
}

/// An address family restriction (`BRAID_SOCKET_FAMILY` in NCCL's spelling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrFamily {
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
}

impl FromStr for AddrFamily {
    type Err = Error;
    fn from_str(s: &str) -> Result<AddrFamily> {
        match s.trim().to_ascii_lowercase().as_str() {
            "af_inet" | "inet" | "ipv4" | "v4" | "4" => Ok(AddrFamily::V4),
            "af_inet6" | "inet6" | "ipv6" | "v6" | "6" => Ok(AddrFamily::V6),
            other => Err(Error::Config(format!("unknown address family `{other}` (expected AF_INET or AF_INET6)"))),
        }
    }
}

/// A parsed interface spec (NCCL syntax, see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfaceSpec {
    /// A leading `^`: the names are excluded, everything else matches.
    pub exclude: bool,
    /// A leading `=` (after any `^`): names match exactly instead of by prefix.
    pub exact: bool,
    /// The names or prefixes.
    pub names: Vec<String>,
}

impl IfaceSpec {
    /// Parse `eth,ib`, `^docker`, `=eth0` or `^=lo`.
    pub fn parse(spec: &str) -> Result<IfaceSpec> {
        let mut rest = spec.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names: Vec<String> = rest.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
        if names.is_empty() {
            return Err(Error::Config(format!(
                "BRAID_SOCKET_IFNAME=`{spec}` names no interface (try eth, ^docker or =eth0)"
            )));
        }
        Ok(IfaceSpec { exclude, exact, names })
    }

    /// Whether interface `name` is selected by this spec.
    pub fn matches(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) });
        hit != self.exclude
    }
}

/// Most addresses one rank publishes (the chosen one and its alternatives).
pub const MAX_PUBLISHED: usize = 8;

/// Why a listening address was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The source address of this rank's route to the store.
    RouteToStore,
    /// `BRAID_SOCKET_IFNAME` selected it.
    IfnameRule,
    /// The default rule: the first up interface that is neither loopback nor
    /// container plumbing.
    DefaultRule,
    /// No other interface is usable: loopback (a single host).
    LoopbackOnly,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::RouteToStore => "the source address of the route to the store",
            Reason::IfnameRule => "BRAID_SOCKET_IFNAME",
            Reason::DefaultRule => "the first up interface that is not loopback or container plumbing",
            Reason::LoopbackOnly => "loopback, the only usable interface",
        })
    }
}

/// Where a rank listens, why, and what else it can be reached at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenChoice {
    /// The address published first.
    pub chosen: IfaceAddr,
    pub reason: Reason,
    /// Why the route to the store was not used, when one was known.
    pub route_refused: Option<String>,
    /// Other addresses of the chosen family that the default rule admits, in the
    /// system's order (at most [`MAX_PUBLISHED`] - 1; none with a spec or on loopback).
    pub others: Vec<IfaceAddr>,
}

impl fmt::Display for ListenChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {} ({})", self.chosen.addr, self.chosen.name, self.reason)?;
        if let Some(why) = &self.route_refused {
            write!(f, "; not the route to the store: {why}")?;
        }
        if !self.others.is_empty() {
            let others: Vec<String> = self.others.iter().map(|i| format!("{} on {}", i.addr, i.name)).collect();
            write!(f, "; also reachable at {}", others.join(", "))?;
        }
        Ok(())
    }
}

fn family_ok(family: Option<AddrFamily>, addr: IpAddr) -> bool {
    match family {
        None => true,
        Some(AddrFamily::V4) => addr.is_ipv4(),
        Some(AddrFamily::V6) => addr.is_ipv6(),
    }
}

/// Up addresses that the default rule admits: not loopback, not container plumbing.
fn default_candidates(ifaces: &[IfaceAddr], family: Option<AddrFamily>) -> impl Iterator<Item = &IfaceAddr> {
    ifaces.iter().filter(move |i| {
        i.up && family_ok(family, i.addr)
            && !i.loopback
            && !DEFAULT_EXCLUDED_PREFIXES.iter().any(|p| i.name.starts_with(p))
    })
}

/// Choose where a rank listens (see the module docs): with `spec`, as
/// [`choose_address`] does; without, at `route` (this rank's source address toward
/// the store) unless it is loopback while `spans_hosts`, of the wrong family or on
/// no interface, else by the default rule.
pub fn choose_listen(
    ifaces: &[IfaceAddr],
    spec: Option<&str>,
    family: Option<AddrFamily>,
    route: Option<IpAddr>,
    spans_hosts: bool,
) -> Result<ListenChoice> {
    if let Some(text) = spec.map(str::trim).filter(|s| !s.is_empty()) {
        let chosen = choose_address(ifaces, Some(text), family)?;
        return Ok(ListenChoice { chosen, reason: Reason::IfnameRule, route_refused: None, others: Vec::new() });
    }
    let mut route_refused = None;
    let mut routed = None;
    if let Some(ip) = route {
        if !family_ok(family, ip) {
            route_refused = Some(format!("it starts at {ip}, and BRAID_SOCKET_FAMILY asks for {}", family.unwrap()));
        } else if ip.is_loopback() && spans_hosts {
            route_refused = Some(format!(
                "it starts on loopback ({ip}), which other hosts cannot reach (does the store's host name map \
                 to a loopback address such as 127.0.1.1 in this host's /etc/hosts?)"
            ));
        } else {
            match ifaces.iter().find(|i| i.up && i.addr == ip) {
                Some(i) => routed = Some(i.clone()),
                None => route_refused = Some(format!("it starts at {ip}, an address of no up interface here")),
            }
        }
    }
    let (chosen, reason) = match routed {
        Some(i) => (i, Reason::RouteToStore),
        None => {
            let i = choose_address(ifaces, None, family)?;
            let reason = if i.loopback { Reason::LoopbackOnly } else { Reason::DefaultRule };
            (i, reason)
        }
    };
    let mut others: Vec<IfaceAddr> = Vec::new();
    if !chosen.loopback {
        let same_family = if chosen.addr.is_ipv4() { AddrFamily::V4 } else { AddrFamily::V6 };
        for i in default_candidates(ifaces, Some(same_family)) {
            if others.len() + 1 >= MAX_PUBLISHED {
                break;
            }
            if i.addr != chosen.addr && !i.link_local() && !others.iter().any(|o| o.addr == i.addr) {
                others.push(i.clone());
            }
        }
    }
    Ok(ListenChoice { chosen, reason, route_refused, others })
}

/// Pick the address to listen on from `ifaces` (in the system's order).
///
/// Candidates are the up interfaces the spec selects (or, without a spec, the
/// default policy of the module docs), restricted to `family` when given. Among
/// them the first is taken by preference: non-loopback, then IPv4, then IPv6
/// other than link-local, then link-local IPv6 (which carries its scope id).
pub fn choose_address(ifaces: &[IfaceAddr], spec: Option<&str>, family: Option<AddrFamily>) -> Result<IfaceAddr> {
    let candidates: Vec<&IfaceAddr> = match spec.map(str::trim).filter(|s| !s.is_empty()) {
        Some(text) => {
            let parsed = IfaceSpec::parse(text)?;
            ifaces.iter().filter(|i| i.up && family_ok(family, i.addr) && parsed.matches(&i.name)).collect()
        }
        None => {
            let external: Vec<&IfaceAddr> = default_candidates(ifaces, family).collect();
            // A lone host (laptop, CI container with no network) still works over loopback.
            if external.is_empty() {
                ifaces.iter().filter(|i| i.up && family_ok(family, i.addr) && i.loopback).collect()
            } else {
                external
            }
        }
    };
    // min_by_key keeps the first of equal keys, so the system order breaks ties.
    candidates.into_iter().min_by_key(|i| (i.loopback, i.addr.is_ipv6(), i.link_local())).cloned().ok_or_else(|| {
        let what = match spec {
            Some(s) => format!("BRAID_SOCKET_IFNAME=`{s}` matches no up interface"),
            None => "no usable network interface".to_owned(),
        };
        let fam = match family {
            Some(f) => format!(" of family {f}"),
            None => String::new(),
        };
        Error::Config(format!("{what}{fam}; interfaces here: {}", describe(ifaces)))
    })
}

impl fmt::Display for AddrFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddrFamily::V4 => "AF_INET",
            AddrFamily::V6 => "AF_INET6",
        })
    }
}

/// `lo (127.0.0.1, ::1), eth0 (192.0.2.2), ifb0 (down: ...)` for error messages.
fn describe(ifaces: &[IfaceAddr]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for i in ifaces {
        if !names.contains(&i.name.as_str()) {
            names.push(&i.name);
        }
    }
    if names.is_empty() {
        return "none with an IP address".to_owned();
    }
    names
        .iter()
        .map(|n| {
            let of_name: Vec<&IfaceAddr> = ifaces.iter().filter(|i| i.name == *n).collect();
            let addrs: Vec<String> = of_name.iter().map(|i| i.addr.to_string()).collect();
            let down = if of_name.iter().any(|i| i.up) { "" } else { "down: " };
            format!("{n} ({down}{})", addrs.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every IPv4/IPv6 address of every interface of this host, in the system's order.
pub fn list_interfaces() -> Result<Vec<IfaceAddr>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| Error::io("listing network interfaces", e.into()))?;
    let mut out = Vec::new();
    for ifa in addrs {
        let Some(sa) = ifa.address.as_ref() else { continue };
        let (addr, scope_id) = if let Some(v4) = sa.as_sockaddr_in() {
            (IpAddr::V4(v4.ip()), 0)
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            (IpAddr::V6(v6.ip()), v6.scope_id())
        } else {
            continue; // link-layer (AF_PACKET) entries carry no IP
        };
        out.push(IfaceAddr {
            name: ifa.interface_name.clone(),
            addr,
            scope_id,
            up: ifa.flags.contains(InterfaceFlags::IFF_UP),
            loopback: ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifa(name: &str, addr: &str, scope_id: u32) -> IfaceAddr {
        IfaceAddr { name: name.into(), addr: addr.parse().unwrap(), scope_id, up: true, loopback: name == "lo" }
    }

    /// Addresses without scope ids, in the order given.
    fn ifas(list: &[(&str, &str)]) -> Vec<IfaceAddr> {
        list.iter().map(|(name, addr)| ifa(name, addr, 0)).collect()
    }

    fn host() -> Vec<IfaceAddr> {
        vec![
            ifa("lo", "127.0.0.1", 0),
            ifa("eth0", "fe80::1", 2),
            ifa("eth0", "192.0.2.2", 0),
            ifa("eth1", "10.1.0.5", 0),
            ifa("docker0", "172.17.0.1", 0),
            ifa("lo", "::1", 0),
            ifa("eth0", "fd00::2", 0),
        ]
    }

    fn pick(spec: Option<&str>, fam: Option<AddrFamily>) -> String {
        let c = choose_address(&host(), spec, fam).unwrap();
        format!("{} {}", c.name, c.addr)
    }

    #[test]
    fn spec_parsing() {
        assert_eq!(
            IfaceSpec::parse("eth").unwrap(),
            IfaceSpec { exclude: false, exact: false, names: vec!["eth".into()] }
        );
        let s = IfaceSpec::parse("^docker, lo").unwrap();
        assert!(s.exclude && !s.exact);
        assert_eq!(s.names, vec!["docker", "lo"]);
        let s = IfaceSpec::parse("^=lo").unwrap();
        assert!(s.exclude && s.exact);
        assert!(s.matches("lo0") && !s.matches("lo"));
        let s = IfaceSpec::parse("=eth0").unwrap();
        assert!(s.matches("eth0") && !s.matches("eth01") && !s.matches("eth1"));
        assert!(IfaceSpec::parse("^").is_err());
        assert!(IfaceSpec::parse(" , ").is_err());
    }

    #[test]
    fn prefix_match_prefers_ipv4_in_system_order() {
        assert_eq!(pick(Some("eth"), None), "eth0 192.0.2.2");
        assert_eq!(pick(Some("eth1"), None), "eth1 10.1.0.5");
        assert_eq!(pick(Some("eth"), Some(AddrFamily::V6)), "eth0 fd00::2");
    }

    #[test]
    fn exclusion_and_exact() {
        assert_eq!(pick(Some("^docker,lo"), None), "eth0 192.0.2.2");
        assert_eq!(pick(Some("^docker,eth0"), None), "eth1 10.1.0.5");
        assert_eq!(pick(Some("=eth0"), None), "eth0 192.0.2.2");
        assert_eq!(pick(Some("=lo"), Some(AddrFamily::V6)), "lo ::1");
        // `^=lo` excludes exactly `lo`: eth0 comes first among the rest.
        assert_eq!(pick(Some("^=lo"), None), "eth0 192.0.2.2");
        assert_eq!(pick(Some("docker"), None), "docker0 172.17.0.1");
    }

    #[test]
    fn no_match_lists_interfaces() {
        let err = choose_address(&host(), Some("ib"), None).unwrap_err().to_string();
        assert!(err.contains("`ib`") && err.contains("eth0 (fe80::1, 192.0.2.2, fd00::2)"), "{err}");
        assert!(err.contains("lo (127.0.0.1, ::1)") && err.contains("docker0"), "{err}");
        let err = choose_address(&host(), Some("=eth"), None).unwrap_err().to_string();
        assert!(err.contains("matches no up interface"), "{err}");
        let mut down = host();
        down.iter_mut().filter(|i| i.name == "eth1").for_each(|i| i.up = false);
        let err = choose_address(&down, Some("eth1"), None).unwrap_err().to_string();
        assert!(err.contains("eth1 (down: 10.1.0.5)"), "{err}");
    }

    #[test]
    fn default_policy() {
        assert_eq!(pick(None, None), "eth0 192.0.2.2");
        // Only container plumbing and loopback: fall back to loopback, not docker0.
        let only: Vec<IfaceAddr> =
            host().into_iter().filter(|i| i.name == "lo" || i.name.starts_with("docker")).collect();
        assert_eq!(choose_address(&only, None, None).unwrap().addr.to_string(), "127.0.0.1");
        let err = choose_address(&[], None, None).unwrap_err().to_string();
        assert!(err.contains("no usable network interface"), "{err}");
    }

    #[test]
    fn link_local_only_when_alone_and_keeps_scope() {
        let ifs = vec![ifa("lo", "127.0.0.1", 0), ifa("eth0", "fe80::1", 2), ifa("eth0", "fd00::2", 0)];
        assert_eq!(choose_address(&ifs, Some("eth"), Some(AddrFamily::V6)).unwrap().addr.to_string(), "fd00::2");
        let ifs = vec![ifa("lo", "127.0.0.1", 0), ifa("eth0", "fe80::1", 2)];
        let c = choose_address(&ifs, None, None).unwrap();
        assert_eq!(c.socket_addr(7).to_string(), "[fe80::1%2]:7");
        // The text form survives a round trip, scope included (it travels through the store).
        assert_eq!(c.socket_addr(7), "[fe80::1%2]:7".parse::<SocketAddr>().unwrap());
    }

    #[test]
    fn families_parse() {
        assert_eq!("AF_INET".parse::<AddrFamily>().unwrap(), AddrFamily::V4);
        assert_eq!("af_inet6".parse::<AddrFamily>().unwrap(), AddrFamily::V6);
        assert!("AF_UNIX".parse::<AddrFamily>().is_err());
    }

    /// A host with a decoy listed first (routes nowhere), a private address that every
    /// host has (docker0-like, but not named so), and the link to the store's host.
    fn decoyed() -> Vec<IfaceAddr> {
        ifas(&[
            ("lo", "127.0.0.1"),
            ("aaa0", "10.99.0.1"),
            ("dup0", "172.17.0.1"),
            ("eth0", "10.77.0.2"),
            ("eth0", "fd00::2"),
            ("lo", "::1"),
        ])
    }

    fn listen(ifs: &[IfaceAddr], route: Option<&str>, spans: bool, fam: Option<AddrFamily>) -> ListenChoice {
        choose_listen(ifs, None, fam, route.map(|r| r.parse().unwrap()), spans).unwrap()
    }

    fn addrs(list: &[IfaceAddr]) -> Vec<String> {
        list.iter().map(|i| i.addr.to_string()).collect()
    }

    #[test]
    fn the_route_to_the_store_beats_the_first_interface() {
        let c = listen(&decoyed(), Some("10.77.0.2"), true, None);
        assert_eq!((c.chosen.name.as_str(), c.reason), ("eth0", Reason::RouteToStore), "{c}");
        // The others are published as alternatives, the chosen one never twice.
        assert_eq!(addrs(&c.others), ["10.99.0.1", "172.17.0.1"], "{c}");
        let text = c.to_string();
        assert!(text.contains("10.77.0.2 on eth0") && text.contains("route to the store"), "{text}");
        // Without a route the first interface wins, as before.
        let c = listen(&decoyed(), None, true, None);
        assert_eq!((c.chosen.name.as_str(), c.reason), ("aaa0", Reason::DefaultRule), "{c}");
        assert_eq!(addrs(&c.others), ["172.17.0.1", "10.77.0.2"], "{c}");
    }

    #[test]
    fn a_loopback_route_is_refused_when_the_job_spans_hosts() {
        // Rank 0's host name maps to 127.0.1.1 on its own host.
        let c = listen(&decoyed(), Some("127.0.1.1"), true, None);
        assert_eq!(c.reason, Reason::DefaultRule, "{c}");
        assert!(!c.chosen.loopback, "{c}");
        let why = c.route_refused.as_deref().unwrap();
        assert!(why.contains("127.0.1.1") && why.contains("/etc/hosts"), "{why}");
        assert!(c.to_string().contains("not the route to the store"), "{c}");
        // All ranks on this host: loopback is right, and nothing else is published.
        let c = listen(&decoyed(), Some("127.0.0.1"), false, None);
        assert_eq!((c.chosen.addr.to_string().as_str(), c.reason), ("127.0.0.1", Reason::RouteToStore), "{c}");
        assert!(c.others.is_empty(), "{c}");
    }

    #[test]
    fn the_family_restricts_the_route_and_the_alternatives() {
        let c = listen(&decoyed(), Some("10.77.0.2"), true, Some(AddrFamily::V6));
        assert_eq!((c.chosen.addr.to_string().as_str(), c.reason), ("fd00::2", Reason::DefaultRule), "{c}");
        assert!(c.route_refused.as_deref().unwrap().contains("AF_INET6"), "{c}");
        assert!(c.others.is_empty(), "{c}");
        let c = listen(&decoyed(), Some("fd00::2"), true, None);
        assert_eq!((c.chosen.addr.to_string().as_str(), c.reason), ("fd00::2", Reason::RouteToStore), "{c}");
        assert!(c.others.is_empty(), "no IPv4 alternatives to an IPv6 listener: {c}");
    }

    #[test]
    fn a_route_from_no_interface_falls_back_to_the_rules() {
        let c = listen(&decoyed(), Some("192.0.2.99"), true, None);
        assert_eq!(c.reason, Reason::DefaultRule, "{c}");
        assert!(c.route_refused.as_deref().unwrap().contains("192.0.2.99"), "{c}");
    }

    #[test]
    fn a_spec_overrides_the_route_and_publishes_one_address() {
        let c = choose_listen(&decoyed(), Some("=dup0"), None, Some("10.77.0.2".parse().unwrap()), true).unwrap();
        assert_eq!((c.chosen.name.as_str(), c.reason), ("dup0", Reason::IfnameRule), "{c}");
        assert!(c.others.is_empty() && c.route_refused.is_none(), "{c}");
        let err = choose_listen(&decoyed(), Some("ib"), None, None, true).unwrap_err().to_string();
        assert!(err.contains("BRAID_SOCKET_IFNAME=`ib`"), "{err}");
    }

    #[test]
    fn container_veths_are_excluded_by_default() {
        let ifs = ifas(&[
            ("lo", "127.0.0.1"),
            ("lxc9f2e1", "10.0.1.7"),
            ("cilium_host", "10.0.1.1"),
            ("cilium_vxlan", "10.0.1.2"),
            ("lxcbr0", "10.0.3.1"),
            ("eth0", "192.0.2.2"),
        ]);
        let c = listen(&ifs, None, true, None);
        assert_eq!(c.chosen.name, "eth0", "{c}");
        assert!(c.others.is_empty(), "{c}");
        assert_eq!(pick(None, None), "eth0 192.0.2.2");
    }

    #[test]
    fn alternatives_are_capped_and_skip_link_local() {
        let mut ifs = vec![ifa("lo", "127.0.0.1", 0), ifa("eth0", "fd00::1", 0), ifa("eth0", "fe80::1", 2)];
        for n in 0..20 {
            ifs.push(ifa(&format!("eth{}", n + 1), &format!("fd00::{:x}", n + 16), 0));
        }
        let c = listen(&ifs, Some("fd00::1"), true, None);
        assert_eq!(c.others.len(), MAX_PUBLISHED - 1, "{c}");
        assert!(c.others.iter().all(|i| !i.link_local() && i.addr.to_string() != "fd00::1"), "{c}");
    }

    #[test]
    fn real_interfaces_include_loopback() {
        let ifs = list_interfaces().unwrap();
        assert!(ifs.iter().any(|i| i.loopback && i.addr == IpAddr::from([127, 0, 0, 1])), "{ifs:?}");
        assert!(choose_address(&ifs, Some("lo"), Some(AddrFamily::V4)).unwrap().addr.is_loopback());
    }
}
