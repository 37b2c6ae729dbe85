//! What sidecar capture redirects: the settings of Istio's `istio-iptables` (flags `-p -z -u
//! -g -m -i -x -b -d -q -o -c`), parsed from the strings the injector writes into the init
//! container's args or into the pod's `traffic.sidecar.istio.io/*` annotations. Shared by the
//! writers of the rules (`mesh-sidecar-capture`) and the injector, which refuses pods whose
//! annotations would not parse.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::contract::{HBONE_PORT, INBOUND_CAPTURE_PORT, OUTBOUND_CAPTURE_PORT};

/// The uid (and gid) the proxy runs as; its own traffic is never captured.
pub const PROXY_UID: u32 = 1337;
/// The inbound passthrough source: Envoy connects to the app from `127.0.0.6` (`::6`), and
/// those connections are never captured again. The validation probe dials it too.
pub const PASSTHROUGH_V4: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);
pub const PASSTHROUGH_V6: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6);

/// `(loopback, inbound passthrough source)` of IPv4, or of IPv6 when `ipv6`.
pub fn loopback_and_passthrough(ipv6: bool) -> (IpAddr, IpAddr) {
    match ipv6 {
        false => (Ipv4Addr::LOCALHOST.into(), PASSTHROUGH_V4.into()),
        true => (Ipv6Addr::LOCALHOST.into(), PASSTHROUGH_V6.into()),
    }
}

/// An address range: `10.0.0.0/8`, or a bare address (a host range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl Cidr {
    pub fn is_loopback(&self) -> bool {
        self.addr.is_loopback()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl FromStr for Cidr {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Cidr, ConfigError> {
        let bad = || ConfigError::Cidr(s.to_string());
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = match len {
            Some(l) => l.trim().parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix_len > max {
            return Err(bad());
        }

        Ok(Cidr { addr, prefix_len })
    }
}

/// A list flag that may also be `*` (everything) or empty (nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection<T> {
    All,
    Only(Vec<T>),
}

impl<T> Selection<T> {
    pub fn is_empty(&self) -> bool {
        matches!(self, Selection::Only(v) if v.is_empty())
    }
}

/// How inbound connections reach the proxy. Only `REDIRECT` is implemented: `TPROXY` keeps
/// the client's address but needs the proxy to run with extra privileges and policy routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterceptionMode {
    Redirect,
}

impl FromStr for InterceptionMode {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<InterceptionMode, ConfigError> {
        match s.trim() {
            "" | "REDIRECT" => Ok(InterceptionMode::Redirect),
            "TPROXY" => Err(ConfigError::Tproxy),
            other => Err(ConfigError::Mode(other.to_string())),
        }
    }
}

/// Everything the rules depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureConfig {
    /// `-p`: the proxy's outbound listener (15001).
    pub proxy_port: u16,
    /// `-z`: the proxy's inbound listener (15006).
    pub inbound_capture_port: u16,
    /// `-e`: the inbound HBONE port, never captured (15008).
    pub inbound_tunnel_port: u16,
    /// `-u`: uids whose traffic is not captured (the proxy's).
    pub proxy_uids: Vec<u32>,
    /// `-g`: gids whose traffic is not captured (defaults to the uids).
    pub proxy_gids: Vec<u32>,
    pub mode: InterceptionMode,
    /// `-i`: outbound destinations that are captured.
    pub include_outbound_cidrs: Selection<Cidr>,
    /// `-x`: outbound destinations that are not.
    pub exclude_outbound_cidrs: Vec<Cidr>,
    /// `-b`: inbound ports that are captured.
    pub include_inbound_ports: Selection<u16>,
    /// `-d`: inbound ports that are not (only read when `-b` is `*`).
    pub exclude_inbound_ports: Vec<u16>,
    /// `-q`: outbound ports captured whatever their destination.
    pub include_outbound_ports: Vec<u16>,
    /// `-o`: outbound ports never captured.
    pub exclude_outbound_ports: Vec<u16>,
    /// `-c`: interfaces whose traffic is never captured.
    pub exclude_interfaces: Vec<String>,
    /// Add the IPv6 twin of every address rule.
    pub ipv6: bool,
}

impl Default for CaptureConfig {
    /// `istio-iptables` with no flags: nothing captured but the proxy's own loopback rules.
    fn default() -> Self {
        CaptureConfig {
            proxy_port: OUTBOUND_CAPTURE_PORT,
            inbound_capture_port: INBOUND_CAPTURE_PORT,
            inbound_tunnel_port: HBONE_PORT,
            proxy_uids: vec![PROXY_UID],
            proxy_gids: vec![PROXY_UID],
            mode: InterceptionMode::Redirect,
            include_outbound_cidrs: Selection::Only(Vec::new()),
            exclude_outbound_cidrs: Vec::new(),
            include_inbound_ports: Selection::Only(Vec::new()),
            exclude_inbound_ports: Vec::new(),
            include_outbound_ports: Vec::new(),
            exclude_outbound_ports: Vec::new(),
            exclude_interfaces: Vec::new(),
            ipv6: false,
        }
    }
}

/// A setting that cannot be applied; the message names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0:?} is not an IP range (want 10.0.0.0/8, fd00::/8 or a bare address)")]
    Cidr(String),
    #[error("{0:?} is not a port (want a number from 1 to 65535)")]
    Port(String),
    #[error("{0:?} is not a uid or gid")]
    Id(String),
    #[error("interception mode {0:?} is unknown (want REDIRECT)")]
    Mode(String),
    #[error("interception mode TPROXY is not supported; use REDIRECT (the default)")]
    Tproxy,
    #[error("\"*\" is not allowed in {0} (it would exclude every destination)")]
    WildcardExclude(&'static str),
    #[error("{0:?} is not an interface name")]
    Interface(String),
}

fn items(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// A comma-separated port list (`15090,15021`); blanks are ignored.
pub fn parse_ports(list: &str) -> Result<Vec<u16>, ConfigError> {
    items(list)
        .map(|p| match p.parse::<u16>() {
            Ok(port) if port > 0 => Ok(port),
            _ => Err(ConfigError::Port(p.to_string())),
        })
        .collect()
}

/// A port list that may be `*`.
pub fn parse_port_selection(list: &str) -> Result<Selection<u16>, ConfigError> {
    match list.trim() {
        "*" => Ok(Selection::All),
        other => parse_ports(other).map(Selection::Only),
    }
}

/// A comma-separated CIDR list.
pub fn parse_cidrs(list: &str) -> Result<Vec<Cidr>, ConfigError> {
    items(list).map(str::parse).collect()
}

/// A CIDR list that may be `*`.
pub fn parse_cidr_selection(list: &str) -> Result<Selection<Cidr>, ConfigError> {
    match list.trim() {
        "*" => Ok(Selection::All),
        other => parse_cidrs(other).map(Selection::Only),
    }
}

/// A CIDR list where `*` is refused (`-x`).
pub fn parse_exclude_cidrs(list: &str, what: &'static str) -> Result<Vec<Cidr>, ConfigError> {
    if list.trim() == "*" {
        return Err(ConfigError::WildcardExclude(what));
    }
    parse_cidrs(list)
}

/// A comma-separated uid or gid list.
pub fn parse_ids(list: &str) -> Result<Vec<u32>, ConfigError> {
    items(list)
        .map(|id| id.parse().map_err(|_| ConfigError::Id(id.to_string())))
        .collect()
}

/// A comma-separated interface list.
pub fn parse_interfaces(list: &str) -> Result<Vec<String>, ConfigError> {
    items(list)
        .map(|name| {
            let valid = name.len() < nix::libc::IFNAMSIZ
                && !name.contains(['/', ' ', '\0'])
                && name != "."
                && name != "..";
            match valid {
                true => Ok(name.to_string()),
                false => Err(ConfigError::Interface(name.to_string())),
            }
        })
        .collect()
}
