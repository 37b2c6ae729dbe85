//! Gateway proxies (`router` nodes: Istio's ingress gateways) configured from
//! `networking.istio.io` Gateways: per listening port a listener `0.0.0.0_<port>` bound on the
//! pod, HTTP with routes `http.<port>` whose virtual hosts are the hosts the Gateway's servers
//! and the VirtualServices bound to them have in common; clusters and endpoints as a sidecar of
//! the gateway's namespace has them (Istio mutual TLS to sidecars, HBONE to ambient pods).

use std::collections::{BTreeMap, BTreeSet};

use mesh_api::{GatewayServer, VirtualService};
use mesh_proto::envoy::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener,
};
use mesh_proto::envoy::pb::envoy::config::route::v3::{
    virtual_host::TlsRequirementType, RouteConfiguration, VirtualHost,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use mesh_proto::type_url;
use serde::Serialize;

use super::super::any::{bool_value, object_name, pack};
use super::super::inputs::WaypointInputs;
use super::super::listeners::{network_filter, socket_address};
use super::super::routes::RouteError;
use super::super::{names, tls, virtual_service};
use super::inbound::tls_inspector;
use super::outbound::outbound_hcm;
use super::scope::host_matches;
use super::{Builder, SidecarError};

/// One server of a Gateway that selects the proxy, with the port the proxy listens on for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoundServer {
    /// `namespace/name` of its Gateway.
    pub gateway: String,
    /// Its index in the Gateway's `servers`.
    pub index: usize,
    pub server: GatewayServer,
    /// The server's port, or the `targetPort` of the gateway's Service port with that number.
    pub listen_port: u16,
}

/// What a gateway proxy is configured from.
#[derive(Debug, Clone)]
pub struct GatewayInputs<'a> {
    /// The services the proxy may route to, as a sidecar of its namespace sees them.
    pub outbound: &'a WaypointInputs,
    /// The servers of every Gateway selecting the proxy, by Gateway then index.
    pub servers: Vec<BoundServer>,
    /// VirtualServices naming one of those Gateways in `gateways`, oldest first.
    pub virtual_services: Vec<&'a VirtualService>,
    /// The servers' `credentialName`s: the Secret's credential, or why it cannot be used.
    pub credentials: BTreeMap<String, Result<Credential, String>>,
}

/// A TLS credential from a Secret: PEM certificate chain and key, and the CA that client
/// certificates must chain to (`MUTUAL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub cert_chain: Vec<u8>,
    pub key: Vec<u8>,
    pub ca: Option<Vec<u8>>,
}

/// Protocols served as plain-text HTTP.
const HTTP_PROTOCOLS: [&str; 4] = ["HTTP", "HTTP2", "GRPC", "GRPC-WEB"];

/// How a server takes its connections.
enum Termination<'a> {
    /// Plain-text HTTP.
    Plain,
    /// TLS with the certificate of `credentialName`; `MUTUAL` requires a client certificate.
    Tls { credential: &'a str, mutual: bool },
}

pub(super) fn generate(inputs: &GatewayInputs, out: &mut Builder, errors: &mut Vec<RouteError>) {
    let mut by_port: BTreeMap<u16, Vec<(&BoundServer, Termination)>> = BTreeMap::new();
    for s in &inputs.servers {
        let Some(termination) = termination(inputs, s, errors) else {
            continue;
        };
        if !s.server.bind.is_empty() {
            server_problem(
                errors,
                s,
                ".bind",
                format!(
                    "bind {:?} is not supported; the server listens on every address",
                    s.server.bind
                ),
            );
        }
        by_port
            .entry(s.listen_port)
            .or_default()
            .push((s, termination));
    }
    let log = &inputs.outbound.access_log_file;
    // The TLS servers' route names (by server port and port name), unique per Gateway.
    let mut route_names: BTreeSet<String> = BTreeSet::new();
    for (port, servers) in by_port {
        let plain: Vec<&BoundServer> = (servers.iter())
            .filter(|(_, t)| matches!(t, Termination::Plain))
            .map(|(s, _)| *s)
            .collect();
        if !plain.is_empty() {
            for (s, t) in &servers {
                if matches!(t, Termination::Tls { .. }) {
                    server_problem(errors, s, ".port", format!("port {port} is taken by plain-text HTTP servers; a TLS server cannot share it and is ignored"));
                }
            }
            let hosts = virtual_hosts(inputs, &plain, errors);
            let rc = route_config(format!("http.{port}"), hosts, out);
            let listener = Listener {
                name: format!("0.0.0.0_{port}"),
                address: Some(socket_address("0.0.0.0", port)),
                filter_chains: vec![FilterChain {
                    filters: vec![http_filter(port, &rc, log)],
                    ..FilterChain::default()
                }],
                ..Listener::default()
            };
            out.put(type_url::LISTENER, &listener.name.clone(), &listener);
            continue;
        }
        // TLS servers: a filter chain each, chosen by SNI among the server's hosts.
        let mut chains = Vec::new();
        // SNI names (empty: any) taken by a chain of this port.
        let mut taken: BTreeSet<String> = BTreeSet::new();
        let mut any_name = false;
        for (s, t) in &servers {
            let Termination::Tls { credential, mutual } = t else {
                continue;
            };
            let names = sni_names(s);
            let overlaps = if names.is_empty() {
                any_name
            } else {
                names.iter().any(|n| taken.contains(n))
            };
            if overlaps {
                server_problem(errors, s, ".hosts", format!("another TLS server on port {port} already takes one of these hosts; the server is ignored"));
                continue;
            }
            let (name, gw_ns) = s
                .gateway
                .split_once('/')
                .map_or(("", ""), |(ns, n)| (n, ns));
            let port_name = s.server.port.as_ref().map_or("", |p| p.name.as_str());
            let server_port = s.server.port.as_ref().map_or(0, |p| p.number);
            let route_name = format!("https.{server_port}.{port_name}.{name}.{gw_ns}");
            if !route_names.insert(route_name.clone()) {
                server_problem(errors, s, ".port.name", format!("{port_name:?} names another server of this Gateway on port {server_port} too (port names must be unique); the server is ignored"));
                continue;
            }
            if names.is_empty() {
                any_name = true;
            }
            taken.extend(names.iter().cloned());
            let hosts = virtual_hosts(inputs, &[s], errors);
            let rc = route_config(route_name, hosts, out);
            if let Some(Ok(c)) = inputs.credentials.get(*credential) {
                let ca = if *mutual { c.ca.as_deref() } else { None };
                for secret in tls::credential_secrets(credential, &c.cert_chain, &c.key, ca) {
                    out.put(type_url::SECRET, &secret.name.clone(), &secret);
                }
            }
            chains.push(FilterChain {
                filter_chain_match: Some(FilterChainMatch {
                    server_names: names,
                    ..FilterChainMatch::default()
                }),
                transport_socket: Some(tls::gateway_server(credential, *mutual)),
                filters: vec![http_filter(port, &rc, log)],
                ..FilterChain::default()
            });
        }
        if chains.is_empty() {
            continue;
        }
        let listener = Listener {
            name: format!("0.0.0.0_{port}"),
            address: Some(socket_address("0.0.0.0", port)),
            listener_filters: vec![tls_inspector()],
            filter_chains: chains,
            ..Listener::default()
        };
        out.put(type_url::LISTENER, &listener.name.clone(), &listener);
    }
}

/// How `s` terminates connections, or `None` (reported) when the gateway cannot serve it.
fn termination<'a>(
    inputs: &'a GatewayInputs<'_>,
    s: &'a BoundServer,
    errors: &mut Vec<RouteError>,
) -> Option<Termination<'a>> {
    if s.listen_port == 0 {
        server_problem(
            errors,
            s,
            ".port.number",
            "must be a port number from 1 to 65535; the server is ignored".into(),
        );
        return None;
    }
    let protocol = (s.server.port.as_ref())
        .map(|p| p.protocol.to_ascii_uppercase())
        .unwrap_or_default();
    let tls = s.server.tls.as_ref();
    if let Some(t) = tls {
        let unapplied = [
            ("minProtocolVersion", t.min_protocol_version.is_some()),
            ("maxProtocolVersion", t.max_protocol_version.is_some()),
            ("cipherSuites", !t.cipher_suites.is_empty()),
            ("subjectAltNames", !t.subject_alt_names.is_empty()),
        ];
        for (field, set) in unapplied {
            if set {
                server_problem(errors, s, &format!(".tls.{field}"), "is not applied by this gateway (Envoy's defaults hold; MUTUAL accepts any client certificate of the CA)".into());
            }
        }
    }
    let mode = tls
        .and_then(|t| t.mode.as_deref())
        .map(str::to_ascii_uppercase);
    let http = HTTP_PROTOCOLS.contains(&protocol.as_str());
    match (protocol.as_str(), mode.as_deref()) {
        (_, None) if http => Some(Termination::Plain),
        (_, Some(m @ ("SIMPLE" | "MUTUAL"))) if http || protocol == "HTTPS" => {
            let Some(credential) = tls.and_then(|t| t.credential_name.as_deref()) else {
                server_problem(errors, s, ".tls.credentialName", "is required: this gateway takes certificates from Secrets only (serverCertificate files are not supported); the server is ignored".into());
                return None;
            };
            let mutual = m == "MUTUAL";
            match inputs.credentials.get(credential) {
                Some(Ok(c)) if mutual && c.ca.is_none() => {
                    server_problem(errors, s, ".tls.credentialName", format!("Secret {credential} has no CA (ca.crt or cacert, or a Secret {credential}-cacert) for MUTUAL; the server is ignored"));
                    None
                }
                Some(Ok(_)) => Some(Termination::Tls { credential, mutual }),
                Some(Err(why)) => {
                    server_problem(
                        errors,
                        s,
                        ".tls.credentialName",
                        format!("{why}; the server is ignored"),
                    );
                    None
                }
                None => {
                    server_problem(errors, s, ".tls.credentialName", format!("no Secret {credential} in the gateway's namespace; the server is ignored"));
                    None
                }
            }
        }
        ("HTTPS", m) => {
            server_problem(errors, s, ".tls.mode", format!("{:?} is not supported by this gateway (SIMPLE and MUTUAL with credentialName are); the server is ignored", m.unwrap_or("")));
            None
        }
        (_, Some(m)) if http => {
            server_problem(
                errors,
                s,
                ".tls.mode",
                format!("{m:?} on a {protocol} server is not supported; the server is ignored"),
            );
            None
        }
        _ => {
            server_problem(errors, s, ".port.protocol", format!("{protocol:?} servers are not supported by this gateway (HTTP, HTTP2, GRPC, GRPC-WEB and HTTPS are); the server is ignored"));
            None
        }
    }
}

fn server_problem(errors: &mut Vec<RouteError>, s: &BoundServer, field: &str, problem: String) {
    errors.push(RouteError::Sidecar(SidecarError::Gateway {
        gateway: s.gateway.clone(),
        field: format!("spec.servers[{}]{field}", s.index),
        problem,
    }));
}

/// The SNI names a TLS server's chain matches: its hosts without namespace prefixes; none
/// (any name) when one is `*`.
fn sni_names(s: &BoundServer) -> Vec<String> {
    let mut names: Vec<String> = (s.server.hosts.iter())
        .map(|h| {
            h.split_once('/')
                .map_or(h.as_str(), |(_, h)| h)
                .to_ascii_lowercase()
        })
        .collect();
    if names.iter().any(|n| n == "*") {
        return Vec::new();
    }
    names.sort();
    names.dedup();
    names
}

/// Route configuration `name` (host matching without the port, as Istio's gateways), put into
/// `out`.
fn route_config(name: String, hosts: Vec<VirtualHost>, out: &mut Builder) -> RouteConfiguration {
    let rc = RouteConfiguration {
        name,
        virtual_hosts: hosts,
        validate_clusters: Some(bool_value(false)),
        ignore_port_in_host_matching: true,
        ..RouteConfiguration::default()
    };
    out.put(type_url::ROUTE, &rc.name.clone(), &rc);
    rc
}

/// The virtual hosts of one listening port: for each server and each VirtualService bound to
/// its Gateway, the hosts both name (`<host>:<server port>`, first one wins a host); a port with
/// none gets `blackhole:<port>`, whose lack of routes answers 404.
fn virtual_hosts(
    inputs: &GatewayInputs,
    servers: &[&BoundServer],
    errors: &mut Vec<RouteError>,
) -> Vec<VirtualHost> {
    let mut out: Vec<VirtualHost> = Vec::new();
    // Host -> (index in `out`, the VirtualServices merged into it).
    let mut seen: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    for s in servers {
        let server_port = s.server.port.as_ref().map_or(0, |p| p.number);
        let redirect = s.server.tls.as_ref().is_some_and(|t| t.https_redirect);
        let gateway = Some(s.gateway.as_str());
        for vs in &inputs.virtual_services {
            let vs_ns = vs.metadata.namespace.as_deref().unwrap_or("default");
            if !binds(vs, vs_ns, &s.gateway) {
                continue;
            }
            let port = u16::try_from(server_port).unwrap_or(s.listen_port);
            // Converted once, when the first of its hosts is served here.
            let mut routes = None;
            for vs_host in &vs.spec.hosts {
                let vs_host = qualify(vs_host, vs_ns, &inputs.outbound.domain_suffix);
                let Some(host) = (s.server.hosts.iter())
                    .filter_map(|h| server_host(h, vs_ns, &s.gateway))
                    .find_map(|h| intersect(h, &vs_host))
                else {
                    continue;
                };
                let host = host.to_ascii_lowercase();
                let vs_name = object_name(&vs.metadata);
                let converted = routes
                    .get_or_insert_with(|| {
                        virtual_service::routes(inputs.outbound, port, gateway, &[*vs], errors)
                    })
                    .clone();
                match seen.get_mut(&host) {
                    // Several VirtualServices for one host: their routes merge, oldest first,
                    // as Istio merges them on gateways.
                    Some((at, from)) => {
                        if !from.contains(&vs_name) {
                            from.push(vs_name);
                            out[*at].routes.extend(converted);
                        }
                    }
                    None => {
                        seen.insert(host.clone(), (out.len(), vec![vs_name]));
                        out.push(VirtualHost {
                            name: format!("{host}:{server_port}"),
                            domains: vec![host],
                            routes: converted,
                            require_tls: if redirect {
                                TlsRequirementType::All as i32
                            } else {
                                TlsRequirementType::None as i32
                            },
                            ..VirtualHost::default()
                        });
                    }
                }
            }
        }
    }
    // Merged routes: those that match everything go last, so none hides the others.
    for vh in &mut out {
        vh.routes.sort_by_key(catches_all);
    }
    if out.is_empty() {
        let port = servers.first().map_or(0, |s| s.listen_port);
        out.push(VirtualHost {
            name: format!("blackhole:{port}"),
            domains: vec!["*".into()],
            ..VirtualHost::default()
        });
    }
    out
}

/// Whether a route matches every request (prefix `/`, nothing else), as Istio moves such routes
/// behind the others when it merges VirtualServices.
fn catches_all(r: &mesh_proto::envoy::pb::envoy::config::route::v3::Route) -> bool {
    use mesh_proto::envoy::pb::envoy::config::route::v3::route_match::PathSpecifier;
    r.r#match.as_ref().is_some_and(|m| {
        matches!(&m.path_specifier, Some(PathSpecifier::Prefix(p)) if p == "/")
            && m.headers.is_empty()
            && m.query_parameters.is_empty()
    })
}

/// Whether `vs` (in `vs_ns`) names the Gateway `namespace/name` in its `gateways`.
pub fn binds(vs: &VirtualService, vs_ns: &str, gateway: &str) -> bool {
    (vs.spec.gateways.iter()).any(|g| virtual_service::gateway_name(g, vs_ns) == gateway)
}

/// A server host as a VirtualService in `vs_ns` may use it: `ns/host` only for VirtualServices
/// in `ns` (`.` is the Gateway's namespace, `*` any); a bare host for every one.
fn server_host<'a>(host: &'a str, vs_ns: &str, gateway: &str) -> Option<&'a str> {
    match host.split_once('/') {
        None => Some(host),
        Some(("*", h)) => Some(h),
        Some((".", h)) => (gateway.split('/').next() == Some(vs_ns)).then_some(h),
        Some((ns, h)) => (ns == vs_ns).then_some(h),
    }
}

/// A VirtualService host as a full name: a short name (no dot, not `*`) is a service of the
/// VirtualService's namespace.
fn qualify(host: &str, vs_ns: &str, suffix: &str) -> String {
    if host.contains('.') || host.contains('*') {
        host.to_string()
    } else {
        format!("{host}.{vs_ns}.svc.{suffix}")
    }
}

/// The more specific of two host patterns when one covers the other (`*`, `*.suffix` or a
/// name), as Istio intersects server and VirtualService hosts.
fn intersect<'a>(a: &'a str, b: &'a str) -> Option<&'a str> {
    if host_matches(a, b) {
        Some(b)
    } else if host_matches(b, a) {
        Some(a)
    } else {
        None
    }
}

/// The HTTP connection manager of a listener on `port`, with the routes of `rc` by RDS; the
/// client's address is the connection's (a gateway is the edge).
fn http_filter(port: u16, rc: &RouteConfiguration, access_log_file: &str) -> Filter {
    let hcm = HttpConnectionManager {
        use_remote_address: Some(bool_value(true)),
        ..outbound_hcm(port, &rc.name, &rc.virtual_hosts, access_log_file)
    };
    network_filter("envoy.filters.network.http_connection_manager", pack(&hcm))
}

/// Keeps the clusters and endpoints of a sidecar's outbound side (and its HBONE listener),
/// dropping the sidecar's own listeners and routes.
pub(super) fn outbound_part(out: &mut Builder) {
    out.retain(type_url::LISTENER, |name| name == names::CONNECT_ORIGINATE);
    out.retain(type_url::ROUTE, |_| false);
}

#[cfg(test)]
mod tests;
