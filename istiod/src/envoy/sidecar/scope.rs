//! The `Sidecar` resource as one proxy sees it: which services its egress listeners import on
//! which ports, what happens to destinations outside them (outbound traffic policy), and the
//! ports its ingress listeners accept. Also the validation Istio's webhook applies to it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mesh_api::{
    CaptureMode, IstioEgressListener, IstioIngressListener, OutboundTrafficMode, Sidecar,
    SidecarPort,
};
use serde::Serialize;

use super::super::inputs::Protocol;
use super::SidecarError;

/// What one Sidecar resource (or the default, which imports every service) gives a proxy in
/// one namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SidecarScope {
    /// `namespace/name` of the Sidecar in force; `None` for the default.
    pub from: Option<String>,
    /// The proxy's namespace, which `.` in a host stands for.
    namespace: String,
    /// Port-specific listeners first, then at most one catch-all; empty: import everything.
    egress: Vec<Egress>,
    /// Unknown destinations reach the black hole (`REGISTRY_ONLY`) instead of passing through.
    pub registry_only: bool,
    /// The ports the proxy accepts; empty: those of the services selecting the workload.
    pub ingress: Vec<IngressPort>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Egress {
    port: Option<u16>,
    hosts: Vec<Import>,
}

/// One `namespace/dnsName` entry, `.` already resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Import {
    /// `*`, `~` or a namespace.
    namespace: String,
    /// `*`, `*.suffix` or a hostname.
    host: String,
}

/// A port a Sidecar's ingress listener accepts, and where it hands connections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IngressPort {
    pub port: u16,
    pub protocol: Protocol,
    pub endpoint: IngressEndpoint,
}

/// `defaultEndpoint` of an ingress listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IngressEndpoint {
    /// Unset: the connection's original destination.
    OriginalDestination,
    /// `127.0.0.1:<port>` or `[::1]:<port>`.
    Loopback(IpAddr, u16),
    /// `0.0.0.0:<port>` or `[::]:<port>`: the pod's own address.
    PodAddress(u16),
    /// `unix://<path>`.
    Unix(String),
}

impl SidecarScope {
    /// The scope without a Sidecar: every service, unknown destinations as the mesh says.
    pub fn default_for(namespace: &str, registry_only: bool) -> SidecarScope {
        SidecarScope {
            from: None,
            namespace: namespace.to_string(),
            egress: Vec::new(),
            registry_only,
            ingress: Vec::new(),
        }
    }

    /// `sidecar` (named `from`) applied to a proxy in `namespace` (the Sidecar's own, or any
    /// namespace for the root namespace's default). What cannot be applied is left out and
    /// reported in `errors`; `mesh_registry_only` is the mesh config's outbound mode.
    pub fn from_resource(
        sidecar: &Sidecar,
        from: &str,
        namespace: &str,
        mesh_registry_only: bool,
        errors: &mut Vec<SidecarError>,
    ) -> SidecarScope {
        let mut problem = |field: String, problem: String| {
            errors.push(SidecarError::Resource {
                sidecar: from.to_string(),
                field,
                problem,
            })
        };
        let spec = &sidecar.spec;
        let mut egress: Vec<Egress> = Vec::new();
        let mut catch_all: Option<Egress> = None;
        for (i, listener) in spec.egress.iter().enumerate() {
            let field = format!("egress[{i}]");
            let port = match &listener.port {
                None => None,
                Some(p) => match u16::try_from(p.number) {
                    Ok(0) | Err(_) => {
                        problem(
                            format!("{field}.port.number"),
                            format!("port {} (a unix domain socket listener) is not supported; the listener is ignored", p.number),
                        );
                        continue;
                    }
                    Ok(n) => Some(n),
                },
            };
            if let Err(p) = unsupported_capture(&listener.bind, listener.capture_mode) {
                problem(field.clone(), p);
            }
            let mut hosts = Vec::new();
            for (j, h) in listener.hosts.iter().enumerate() {
                match parse_host(h) {
                    Ok((ns, host)) => hosts.push(Import {
                        namespace: if ns == "." { namespace } else { ns }.to_string(),
                        host: host.to_string(),
                    }),
                    Err(p) => problem(
                        format!("{field}.hosts[{j}]"),
                        format!("{p}; the host is ignored"),
                    ),
                }
            }
            let entry = Egress { port, hosts };
            match port {
                Some(_) if egress.iter().any(|e| e.port == port) => problem(
                    format!("{field}.port.number"),
                    "ports on IP bound listeners must be unique; the listener is ignored".into(),
                ),
                Some(_) => egress.push(entry),
                None if catch_all.is_some() => problem(
                    field,
                    "egress can have only one listener with empty port; the listener is ignored"
                        .into(),
                ),
                None => catch_all = Some(entry),
            }
        }
        egress.extend(catch_all);
        let policy = spec.outbound_traffic_policy.as_ref();
        if policy.is_some_and(|p| p.egress_proxy.is_some()) {
            problem(
                "outboundTrafficPolicy.egressProxy".into(),
                "an egress proxy is not supported; unknown destinations pass through directly"
                    .into(),
            );
        }
        let registry_only = policy.map_or(mesh_registry_only, |p| {
            p.mode == OutboundTrafficMode::RegistryOnly
        });
        let mut ingress: Vec<IngressPort> = Vec::new();
        for (i, listener) in spec.ingress.iter().enumerate() {
            let field = format!("ingress[{i}]");
            if let Err(p) = unsupported_capture(&listener.bind, listener.capture_mode) {
                problem(field.clone(), p);
            }
            if listener.tls.is_some() {
                problem(
                    format!("{field}.tls"),
                    "TLS on a sidecar ingress listener is not supported; the port takes the mesh's mutual TLS as PeerAuthentication says".into(),
                );
            }
            match ingress_port(listener) {
                Ok(p) if ingress.iter().any(|q| q.port == p.port) => problem(
                    format!("{field}.port.number"),
                    "ports on IP bound listeners must be unique; the listener is ignored".into(),
                ),
                Ok(p) => ingress.push(p),
                Err(p) => problem(field, format!("{p}; the listener is ignored")),
            }
        }
        SidecarScope {
            from: Some(from.to_string()),
            namespace: namespace.to_string(),
            egress,
            registry_only,
            ingress,
        }
    }

    /// Whether the proxy is configured for `hostname` (a service in `svc_namespace`) on `port`:
    /// the egress listener for that port decides, or else the catch-all one.
    pub fn imports(&self, svc_namespace: &str, hostname: &str, port: u16) -> bool {
        if self.egress.is_empty() {
            return true;
        }
        let listener = (self.egress.iter().find(|e| e.port == Some(port)))
            .or_else(|| self.egress.iter().find(|e| e.port.is_none()));
        listener.is_some_and(|l| l.hosts.iter().any(|i| i.imports(svc_namespace, hostname)))
    }

    /// Whether a VirtualService in `vs_namespace` for `hostname` reaches the proxy: some egress
    /// host names its namespace and the host.
    pub fn imports_virtual_service(&self, vs_namespace: &str, hostname: &str) -> bool {
        self.egress.is_empty()
            || (self.egress.iter().flat_map(|e| &e.hosts))
                .any(|i| i.imports(vs_namespace, hostname))
    }

    /// The egress listeners through which a VirtualService in `vs_namespace` for `hostname`
    /// reaches the proxy, each by the port it listens on (`None`: the catch-all). Empty for the
    /// default scope, which imports every service anyway.
    pub fn virtual_service_listeners(
        &self,
        vs_namespace: &str,
        hostname: &str,
    ) -> Vec<Option<u16>> {
        (self.egress.iter())
            .filter(|e| e.hosts.iter().any(|i| i.imports(vs_namespace, hostname)))
            .map(|e| e.port)
            .collect()
    }

    /// The namespace the scope was resolved for.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}

impl Import {
    fn imports(&self, namespace: &str, hostname: &str) -> bool {
        let ns = self.namespace == "*" || self.namespace == namespace;
        ns && host_matches(&self.host, hostname)
    }
}

/// `pattern` (`*`, `*.suffix` or a name) against a service hostname (itself maybe `*.x`).
pub(super) fn host_matches(pattern: &str, hostname: &str) -> bool {
    if pattern == "*" || pattern.eq_ignore_ascii_case(hostname) {
        return true;
    }
    match pattern.strip_prefix('*') {
        // `*.foo.com` imports `a.foo.com`, `a.b.foo.com` and the wildcard `*.a.foo.com`.
        Some(suffix) => {
            hostname.len() > suffix.len()
                && hostname
                    .get(hostname.len() - suffix.len()..)
                    .is_some_and(|s| s.eq_ignore_ascii_case(suffix))
        }
        None => false,
    }
}

/// `bind` and `captureMode: NONE` need a listener bound in the pod without the capture.
fn unsupported_capture(bind: &str, mode: CaptureMode) -> Result<(), String> {
    if !bind.is_empty() {
        return Err(format!(
            "bind {bind:?} is not supported; the listener takes captured traffic on every address"
        ));
    }
    if mode == CaptureMode::None {
        return Err(
            "captureMode NONE is not supported; the listener takes captured traffic".into(),
        );
    }
    Ok(())
}

fn ingress_port(listener: &IstioIngressListener) -> Result<IngressPort, String> {
    let port = checked_port(&listener.port)?;
    Ok(IngressPort {
        port,
        protocol: Protocol::detect(
            listener.port.protocol.as_deref(),
            Some(listener.port.name.as_str()).filter(|n| !n.is_empty()),
        ),
        endpoint: default_endpoint(&listener.default_endpoint)?,
    })
}

fn checked_port(port: &SidecarPort) -> Result<u16, String> {
    match u16::try_from(port.number) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "port number {} is not between 1 and 65535",
            port.number
        )),
    }
}

/// Parses `defaultEndpoint` as Istio accepts it.
fn default_endpoint(text: &str) -> Result<IngressEndpoint, String> {
    if text.is_empty() {
        return Ok(IngressEndpoint::OriginalDestination);
    }
    if let Some(path) = text.strip_prefix("unix://") {
        return match path {
            "" => Err("defaultEndpoint unix:// needs a socket path".into()),
            p => Ok(IngressEndpoint::Unix(p.to_string())),
        };
    }
    let form = "defaultEndpoint must be of form 127.0.0.1:<port>,0.0.0.0:<port>,[::1]:port,[::]:port,unix://filepath or unset";
    let (host, port) = text.rsplit_once(':').ok_or(form)?;
    let port = match port.parse::<u64>() {
        Err(_) => return Err(format!("defaultEndpoint port ({port}) is not a number")),
        Ok(n) => u16::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("defaultEndpoint port ({port}) is not between 1 and 65535"))?,
    };
    match host.trim_start_matches('[').trim_end_matches(']') {
        "127.0.0.1" => Ok(IngressEndpoint::Loopback(Ipv4Addr::LOCALHOST.into(), port)),
        "::1" => Ok(IngressEndpoint::Loopback(Ipv6Addr::LOCALHOST.into(), port)),
        "0.0.0.0" | "::" | "" => Ok(IngressEndpoint::PodAddress(port)),
        _ => Err(form.into()),
    }
}

/// Splits and checks one egress host (`namespace/dnsName`).
fn parse_host(entry: &str) -> Result<(&str, &str), String> {
    let (ns, host) = entry
        .split_once('/')
        .ok_or_else(|| format!("host {entry:?} must be of form namespace/dnsName"))?;
    if ns.is_empty() || host.is_empty() {
        return Err(format!(
            "host {entry:?}: config namespace and dnsName in host entry cannot be empty"
        ));
    }
    if !matches!(ns, "*" | "." | "~") && !dns_label(ns) {
        return Err(format!("invalid namespace value {ns:?} in sidecar"));
    }
    if host == "*" {
        return Ok((ns, host));
    }
    if !host.contains('.') {
        return Err(format!(
            "host {entry:?}: short names (non FQDN) are not allowed"
        ));
    }
    let rest = host.strip_prefix("*.").unwrap_or(host);
    if rest.contains('*') {
        return Err(format!(
            "host {entry:?}: partial wildcard {host:?} not allowed"
        ));
    }
    if rest.len() > 253 || !rest.split('.').all(dns_label) {
        return Err(format!(
            "host {entry:?}: {host:?} is not a valid domain name"
        ));
    }
    Ok((ns, host))
}

/// A DNS-1123 label: lower-case letters, digits and `-`, alphanumeric at both ends.
fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Checks a Sidecar as Istio's validating webhook does; the error lists every problem.
pub fn validate_sidecar(sidecar: &Sidecar) -> Result<(), String> {
    let spec = &sidecar.spec;
    let mut problems: Vec<String> = Vec::new();
    if let Some(sel) = &spec.workload_selector {
        for (k, v) in &sel.labels {
            if k.is_empty() {
                problems.push("empty key is not supported in selector".into());
            }
            if k.contains('*') || v.contains('*') {
                problems.push("wildcard is not supported in selector".into());
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
    }
    if spec.ingress.is_empty()
        && spec.egress.is_empty()
        && spec.outbound_traffic_policy.is_none()
        && spec.inbound_connection_pool.is_none()
    {
        return Err("sidecar: empty configuration provided".into());
    }
    let mut ingress_ports = Vec::new();
    for (i, listener) in spec.ingress.iter().enumerate() {
        let mut p = |m: String| problems.push(format!("sidecar: ingress[{i}]: {m}"));
        if listener.port.target_port.is_some_and(|t| t > 0) {
            p("targetPort has no impact on Sidecars".into());
        }
        match checked_port(&listener.port) {
            Ok(n) if ingress_ports.contains(&n) => {
                p("ports on IP bound listeners must be unique".into())
            }
            Ok(n) => ingress_ports.push(n),
            Err(e) => p(e),
        }
        if !listener.bind.is_empty() && listener.bind.parse::<IpAddr>().is_err() {
            p(format!("bind {:?} is not a valid IP", listener.bind));
        }
        if let Err(e) = default_endpoint(&listener.default_endpoint) {
            p(e);
        }
    }
    let mut egress_ports = Vec::new();
    let mut unix_binds = Vec::new();
    for (i, listener) in spec.egress.iter().enumerate() {
        let mut p = |m: String| problems.push(format!("sidecar: egress[{i}]: {m}"));
        egress_problems(listener, i + 1 == spec.egress.len(), &mut p);
        match &listener.port {
            Some(port) if port.number == 0 => {
                if unix_binds.contains(&listener.bind) {
                    p("unix domain socket values for listeners must be unique".into());
                }
                unix_binds.push(listener.bind.clone());
            }
            Some(port) if egress_ports.contains(&port.number) => {
                p("ports on IP bound listeners must be unique".into())
            }
            Some(port) => egress_ports.push(port.number),
            None => {}
        }
    }
    if let Some(policy) = &spec.outbound_traffic_policy {
        if policy.egress_proxy.is_some() && policy.mode != OutboundTrafficMode::AllowAny {
            problems.push(
                "sidecar: egress_proxy must be set only with ALLOW_ANY outbound_traffic_policy mode"
                    .into(),
            );
        }
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(problems.join("; ")),
    }
}

fn egress_problems(listener: &IstioEgressListener, last: bool, p: &mut impl FnMut(String)) {
    match &listener.port {
        None if !last => p(
            "the egress listener with empty port should be the last listener in the list".into(),
        ),
        None => {}
        Some(port) => {
            if port.target_port.is_some_and(|t| t > 0) {
                p("targetPort has no impact on Sidecars".into());
            }
            if port.number == 0 {
                if !listener.bind.starts_with("unix://") {
                    p("ports with 0 value must have a unix domain socket bind address".into());
                }
                if listener.capture_mode == CaptureMode::Iptables {
                    p("captureMode must be DEFAULT/NONE for unix domain socket listeners".into());
                }
            } else {
                if let Err(e) = checked_port(port) {
                    p(e);
                }
                if !listener.bind.is_empty() && listener.bind.parse::<IpAddr>().is_err() {
                    p(format!("bind {:?} is not a valid IP", listener.bind));
                }
            }
        }
    }
    if listener.hosts.is_empty() {
        p("egress listener must contain at least one host".into());
    }
    for h in &listener.hosts {
        if let Err(e) = parse_host(h) {
            p(e);
        }
    }
}

#[cfg(test)]
mod tests;
