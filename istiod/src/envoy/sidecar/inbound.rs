//! A sidecar's inbound side: `virtualInbound` on 15006 and the `inbound|<port>||` clusters.

use std::collections::BTreeMap;
use std::time::Duration;

use mesh_proto::envoy::pb::envoy::config::cluster::v3::{
    cluster::{ClusterDiscoveryType, DiscoveryType, LbPolicy},
    Cluster,
};
use mesh_proto::envoy::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption,
};
use mesh_proto::envoy::pb::envoy::config::listener::v3::{
    listener::InternalListenerConfig, listener::ListenerSpecifier, listener_filter, Filter,
    FilterChain, FilterChainMatch, Listener, ListenerFilter,
};
use mesh_proto::envoy::pb::envoy::config::rbac::v3::{principal, Principal, Rbac};
use mesh_proto::envoy::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use mesh_proto::envoy::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication;
use mesh_proto::envoy::pb::envoy::extensions::filters::http::rbac::v3::Rbac as RbacFilter;
use mesh_proto::envoy::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{
        CodecType, ForwardClientCertDetails, RouteSpecifier, SetCurrentClientCertDetails,
    },
    HttpConnectionManager, HttpFilter,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use mesh_proto::envoy::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy;
use mesh_proto::envoy::pb::envoy::r#type::matcher::v3::filter_state_matcher;
use mesh_proto::type_url;
use serde::Serialize;

use super::super::any::{bool_value, duration, pack, u32_value};
use super::super::inputs::{Protocol, WaypointPolicy, WaypointRequestAuthn};
use super::super::listeners::{
    connect_terminate, http_filter, network_filter, original_dst_filter, router, socket_address,
    tcp_chain_filter,
};
use super::super::routes::{default_route, RouteError};
use super::super::{clusters, jwt, names, rbac, tls};
use super::{Builder, SidecarError, SidecarKey};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const INBOUND_PORT: u16 = mesh_capture::INBOUND_CAPTURE_PORT;
const HTTP_ALPN: &[&str] = &["h2", "http/1.1"];
const XFCC: &str = "x-forwarded-client-cert";

/// How a port accepts peers, as PeerAuthentication says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PeerMode {
    /// Istio mutual TLS only.
    Strict,
    /// Istio mutual TLS or plain text.
    Permissive,
    /// Plain text (TLS passes through to the application).
    Disable,
}

/// A port the workload serves (a target port of a service that selects it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InboundPort {
    pub port: u16,
    pub protocol: Protocol,
    /// The hostname of the (first) service the port serves, for telemetry.
    pub service: Option<String>,
    /// Where accepted connections go.
    pub endpoint: InboundEndpoint,
}

/// Where a sidecar hands an inbound port's connections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InboundEndpoint {
    /// Their original destination (the pod's address and the port).
    OriginalDestination,
    /// A fixed address (a Sidecar ingress listener's `defaultEndpoint`).
    Socket(std::net::SocketAddr),
    /// A unix domain socket (`defaultEndpoint: unix://<path>`).
    Unix(String),
}

/// What one sidecar's inbound side depends on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SidecarInputs {
    pub key: SidecarKey,
    pub trust_domain: String,
    /// Sorted by port.
    pub ports: Vec<InboundPort>,
    /// The workload's mode, and the ports that differ (`portLevelMtls`).
    pub mode: PeerMode,
    pub port_modes: BTreeMap<u16, PeerMode>,
    /// The PeerAuthentication whose `portLevelMtls` gave `port_modes` (`namespace/name`).
    pub port_modes_from: Option<String>,
    /// Whether its sidecar accepts HBONE on 15008 (`connect_terminate`, `main_internal`).
    pub hbone: bool,
    /// The access log file (empty: none); requests also go to the agent's access log service.
    pub access_log_file: String,
    /// AuthorizationPolicies and RequestAuthentications that select the workload.
    #[serde(skip)]
    pub policies: Vec<WaypointPolicy>,
    #[serde(skip)]
    pub request_authns: Vec<WaypointRequestAuthn>,
}

impl SidecarInputs {
    fn mode_of(&self, port: u16) -> PeerMode {
        self.port_modes.get(&port).copied().unwrap_or(self.mode)
    }
}

/// How a chain's peer is known: Istio mutual TLS on the connection, the HBONE tunnel it came
/// through (recorded in filter state by `connect_terminate`), or not at all.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Peer {
    Tls,
    Hbone,
    Plain,
}

/// The filters the chains of one listener end with, and the chains built so far.
struct Chains<'a> {
    inputs: &'a SidecarInputs,
    http_filters: Vec<HttpFilter>,
    tcp_rbac: Vec<Filter>,
    chains: Vec<FilterChain>,
}

impl<'a> Chains<'a> {
    /// With `http_rbac` and `tcp_rbac` in the form the listener's peer needs.
    fn new(
        inputs: &'a SidecarInputs,
        jwt: Option<&JwtAuthentication>,
        http_rbac: &[(String, RbacFilter)],
        tcp_rbac: &[(String, NetworkRbac)],
    ) -> Chains<'a> {
        let mut http_filters: Vec<HttpFilter> = (jwt.iter())
            .map(|config| http_filter(jwt::JWT_FILTER, pack(*config)))
            .chain(
                http_rbac
                    .iter()
                    .map(|(name, config)| http_filter(name, pack(config))),
            )
            .collect();
        http_filters.push(router());
        Chains {
            inputs,
            http_filters,
            tcp_rbac: (tcp_rbac.iter())
                .map(|(name, config)| network_filter(name, pack(config)))
                .collect(),
            chains: Vec::new(),
        }
    }
}

pub(super) fn generate(inputs: &SidecarInputs, out: &mut Builder, errors: &mut Vec<RouteError>) {
    let mut policy_errors = Vec::new();
    let mut authn_errors = Vec::new();
    let jwt = jwt::filter(&inputs.request_authns, &mut authn_errors);
    // Principals as a waypoint checks them (the HBONE peer, in filter state), and as the
    // mutual-TLS chains check them (the connection's certificate).
    let hbone_http_rbac = rbac::http_filters(&inputs.policies, &mut policy_errors);
    let hbone_tcp_rbac = if inputs.ports.iter().any(|p| p.protocol == Protocol::Tcp) {
        rbac::tcp_filters(&inputs.policies, &mut policy_errors)
    } else {
        Vec::new()
    };
    let mut http_rbac = hbone_http_rbac.clone();
    let mut tcp_rbac = hbone_tcp_rbac.clone();
    for (_, f) in &mut http_rbac {
        f.rules.iter_mut().for_each(peer_from_connection);
    }
    for (_, f) in &mut tcp_rbac {
        f.rules.iter_mut().for_each(peer_from_connection);
    }
    errors.extend(authn_errors.into_iter().map(RouteError::Authn));
    let mut seen = Vec::new();
    for e in policy_errors {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    errors.extend(seen.into_iter().map(RouteError::Policy));
    if let Some(policy) = &inputs.port_modes_from {
        for port in inputs.port_modes.keys() {
            if !inputs.ports.iter().any(|p| p.port == *port) {
                errors.push(RouteError::Sidecar(SidecarError::UnknownMtlsPort {
                    policy: policy.clone(),
                    port: *port,
                    workload: inputs.key.to_string(),
                }));
            }
        }
    }
    let mut chains = Chains::new(inputs, jwt.as_ref(), &http_rbac, &tcp_rbac);
    chains.loop_guard();
    for port in &inputs.ports {
        chains.port(port);
        let cluster = inbound_cluster(port);
        out.put(type_url::CLUSTER, &cluster.name.clone(), &cluster);
    }
    chains.passthrough();
    let listener = Listener {
        name: names::VIRTUAL_INBOUND.to_string(),
        address: Some(socket_address("0.0.0.0", INBOUND_PORT)),
        listener_filters: vec![original_dst_filter(), tls_inspector()],
        filter_chains: chains.chains,
        traffic_direction: mesh_proto::envoy::pb::envoy::config::core::v3::TrafficDirection::Inbound
            as i32,
        ..Listener::default()
    };
    out.put(type_url::LISTENER, names::VIRTUAL_INBOUND, &listener);
    if inputs.hbone {
        let mut hbone = Chains::new(inputs, jwt.as_ref(), &hbone_http_rbac, &hbone_tcp_rbac);
        hbone_inbound(&mut hbone, out);
    }
}

/// HBONE in, as a waypoint takes it: `connect_terminate` on 15008 terminates the tunnel (the
/// peer's identity into filter state) and hands each stream to the internal listener
/// `main_internal`, whose chains are the workload's ports (the peer already authenticated, so
/// whatever the PeerAuthentication mode) and the passthrough.
fn hbone_inbound(chains: &mut Chains<'_>, out: &mut Builder) {
    let terminate = connect_terminate(&chains.inputs.trust_domain);
    out.put(type_url::LISTENER, names::CONNECT_TERMINATE, &terminate);
    let cluster = clusters::internal_static(names::MAIN_INTERNAL, names::MAIN_INTERNAL);
    out.put(type_url::CLUSTER, names::MAIN_INTERNAL, &cluster);
    for port in &chains.inputs.ports {
        let cluster = names::inbound_cluster(port.port);
        let filters = chains.filters(port, &cluster, Peer::Hbone);
        chains.chains.push(FilterChain {
            name: format!("0.0.0.0_{}", port.port),
            filter_chain_match: Some(port_match(Some(port.port))),
            filters,
            ..FilterChain::default()
        });
    }
    let passthrough = chains.tcp_filters(names::INBOUND_PASSTHROUGH_CLUSTER);
    chains.chains.push(FilterChain {
        name: names::INBOUND_PASSTHROUGH_CLUSTER.to_string(),
        filters: passthrough,
        ..FilterChain::default()
    });
    let listener = Listener {
        name: names::MAIN_INTERNAL.to_string(),
        listener_specifier: Some(ListenerSpecifier::InternalListener(
            InternalListenerConfig {},
        )),
        listener_filters: vec![original_dst_filter()],
        filter_chains: std::mem::take(&mut chains.chains),
        traffic_direction: mesh_proto::envoy::pb::envoy::config::core::v3::TrafficDirection::Inbound
            as i32,
        ..Listener::default()
    };
    out.put(type_url::LISTENER, names::MAIN_INTERNAL, &listener);
}

impl Chains<'_> {
    /// Connections to 15006 itself would loop: refused.
    fn loop_guard(&mut self) {
        self.chains.push(FilterChain {
            name: "virtualInbound-blackhole".to_string(),
            filter_chain_match: Some(port_match(Some(INBOUND_PORT))),
            filters: vec![blackhole()],
            ..FilterChain::default()
        });
    }

    /// The filters of a declared port's chain towards `inbound|<port>||`.
    fn filters(&self, port: &InboundPort, cluster: &str, peer: Peer) -> Vec<Filter> {
        if port.protocol != Protocol::Tcp {
            return vec![self.hcm(port.port, port.service.as_deref(), cluster, peer)];
        }
        self.tcp_filters(cluster)
    }

    /// A TCP chain's filters: the network RBAC filters, then a TCP proxy to `cluster`.
    fn tcp_filters(&self, cluster: &str) -> Vec<Filter> {
        let mut f = self.tcp_rbac.clone();
        f.push(tcp_chain_filter(
            cluster,
            tcp_proxy::ClusterSpecifier::Cluster(cluster.to_string()),
        ));
        f
    }

    /// A declared port: its protocol's filters towards `inbound|<port>||`.
    fn port(&mut self, port: &InboundPort) {
        let cluster = names::inbound_cluster(port.port);
        let name = format!("0.0.0.0_{}", port.port);
        let filters = |mtls: bool, this: &Chains<'_>| {
            let peer = if mtls { Peer::Tls } else { Peer::Plain };
            this.filters(port, &cluster, peer)
        };
        let alpn: &[&str] = if port.protocol != Protocol::Tcp {
            HTTP_ALPN
        } else {
            &[]
        };
        self.by_mode(
            self.inputs.mode_of(port.port),
            Some(port.port),
            &name,
            alpn,
            &filters,
        );
    }

    /// Undeclared ports: straight to the application, as the workload's mode allows.
    fn passthrough(&mut self) {
        let filters =
            |_mtls: bool, this: &Chains<'_>| this.tcp_filters(names::INBOUND_PASSTHROUGH_CLUSTER);
        self.by_mode(self.inputs.mode, None, "virtualInbound", &[], &filters);
    }

    /// The chains of one port (or of all undeclared ones) for `mode`: STRICT terminates Istio
    /// mutual TLS and refuses anything else; PERMISSIVE terminates it when the client offers
    /// Istio's ALPN and passes the rest on as plain text; DISABLE passes everything on.
    fn by_mode(
        &mut self,
        mode: PeerMode,
        port: Option<u16>,
        name: &str,
        alpn: &[&str],
        filters: &dyn Fn(bool, &Chains<'_>) -> Vec<Filter>,
    ) {
        let tls_match = |application_protocols: Vec<String>| FilterChainMatch {
            transport_protocol: "tls".to_string(),
            application_protocols,
            ..port_match(port)
        };
        let mtls_chain = |m: FilterChainMatch, this: &Chains<'_>| FilterChain {
            name: format!("{name}-mtls"),
            filter_chain_match: Some(m),
            filters: filters(true, this),
            transport_socket: Some(tls::istio_mutual_server(&this.inputs.trust_domain, alpn)),
            ..FilterChain::default()
        };
        match mode {
            PeerMode::Strict => {
                self.chains.push(mtls_chain(tls_match(Vec::new()), self));
                self.chains.push(FilterChain {
                    name: format!("{name}-refused"),
                    filter_chain_match: Some(port_match(port)),
                    filters: vec![blackhole()],
                    ..FilterChain::default()
                });
            }
            PeerMode::Permissive => {
                let istio = tls::ISTIO_INBOUND_ALPN
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                self.chains.push(mtls_chain(tls_match(istio), self));
                self.chains.push(FilterChain {
                    name: name.to_string(),
                    filter_chain_match: Some(port_match(port)),
                    filters: filters(false, self),
                    ..FilterChain::default()
                });
            }
            PeerMode::Disable => self.chains.push(FilterChain {
                name: name.to_string(),
                filter_chain_match: Some(port_match(port)),
                filters: filters(false, self),
                ..FilterChain::default()
            }),
        }
    }

    /// The HTTP connection manager of a declared HTTP port: JWT, RBAC, the router to the
    /// port's cluster; the client's identity travels in `x-forwarded-client-cert`.
    fn hcm(&self, port: u16, service: Option<&str>, cluster: &str, peer: Peer) -> Filter {
        let mtls = peer == Peer::Tls;
        // Through HBONE the identities are in filter state, not on this (internal) connection.
        let hbone_xfcc = (peer == Peer::Hbone).then(|| HeaderValueOption {
            header: Some(HeaderValue {
                key: XFCC.to_string(),
                value: format!(
                    "By=%FILTER_STATE({}:PLAIN)%;URI=%FILTER_STATE({}:PLAIN)%",
                    names::FS_LOCAL_PRINCIPAL,
                    names::FS_PEER_PRINCIPAL
                ),
                ..HeaderValue::default()
            }),
            append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            ..HeaderValueOption::default()
        });
        let hcm = HttpConnectionManager {
            stat_prefix: format!("inbound_0.0.0.0_{port}"),
            codec_type: CodecType::Auto as i32,
            route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
                name: cluster.to_string(),
                validate_clusters: Some(bool_value(false)),
                virtual_hosts: vec![VirtualHost {
                    name: format!("inbound|http|{port}"),
                    domains: vec!["*".to_string()],
                    routes: vec![default_route(cluster)],
                    ..VirtualHost::default()
                }],
                request_headers_to_add: hbone_xfcc.into_iter().collect(),
                ..RouteConfiguration::default()
            })),
            http_filters: self.http_filters.clone(),
            normalize_path: Some(bool_value(true)),
            forward_client_cert_details: if mtls {
                ForwardClientCertDetails::AppendForward as i32
            } else {
                ForwardClientCertDetails::Sanitize as i32
            },
            set_current_client_cert_details: mtls.then(|| SetCurrentClientCertDetails {
                subject: Some(bool_value(true)),
                dns: true,
                uri: true,
                ..SetCurrentClientCertDetails::default()
            }),
            stream_idle_timeout: Some(duration(Duration::ZERO)),
            access_log: super::super::telemetry::sidecar_access_logs(
                &self.inputs.access_log_file,
                "destination",
                if peer == Peer::Plain {
                    "none"
                } else {
                    "mutual_tls"
                },
                service,
            ),
            ..HttpConnectionManager::default()
        };
        network_filter("envoy.filters.network.http_connection_manager", pack(&hcm))
    }
}

fn port_match(port: Option<u16>) -> FilterChainMatch {
    FilterChainMatch {
        destination_port: port.map(|p| u32_value(u32::from(p))),
        ..FilterChainMatch::default()
    }
}

fn blackhole() -> Filter {
    tcp_chain_filter(
        names::BLACKHOLE_CLUSTER,
        tcp_proxy::ClusterSpecifier::Cluster(names::BLACKHOLE_CLUSTER.to_string()),
    )
}

pub(super) fn tls_inspector() -> ListenerFilter {
    ListenerFilter {
        name: "envoy.filters.listener.tls_inspector".to_string(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack(
            &TlsInspector::default(),
        ))),
        ..ListenerFilter::default()
    }
}

/// `inbound|<port>||`: the connection's original destination (the pod's own address and
/// port), or the port's fixed endpoint, reached from 127.0.0.6.
fn inbound_cluster(port: &InboundPort) -> Cluster {
    let name = names::inbound_cluster(port.port);
    let fixed = |address| Cluster {
        upstream_bind_config: Some(super::outbound::inbound_bind()),
        ..clusters::static_cluster(&name, address)
    };
    let mut cluster = match &port.endpoint {
        InboundEndpoint::OriginalDestination => Cluster {
            name: name.clone(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32,
            )),
            lb_policy: LbPolicy::ClusterProvided as i32,
            connect_timeout: Some(duration(CONNECT_TIMEOUT)),
            cleanup_interval: Some(duration(Duration::from_secs(60))),
            upstream_bind_config: Some(super::outbound::inbound_bind()),
            ..Cluster::default()
        },
        InboundEndpoint::Socket(addr) if addr.ip().is_loopback() && addr.is_ipv6() => {
            // 127.0.0.6 cannot reach ::1: the kernel picks the source.
            clusters::static_cluster(&name, clusters::socket_address(*addr))
        }
        InboundEndpoint::Socket(addr) => fixed(clusters::socket_address(*addr)),
        InboundEndpoint::Unix(path) => clusters::static_cluster(&name, pipe_address(path)),
    };
    if port.protocol.upstream_h2() {
        cluster.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_string(),
            pack(&clusters::h2_options(false)),
        );
    }
    cluster
}

fn pipe_address(path: &str) -> mesh_proto::envoy::pb::envoy::config::core::v3::Address {
    use mesh_proto::envoy::pb::envoy::config::core::v3::{address, Address, Pipe};
    Address {
        address: Some(address::Address::Pipe(Pipe {
            path: path.to_string(),
            ..Pipe::default()
        })),
    }
}

/// A waypoint matches principals on the identity HBONE carried (filter state); a sidecar on
/// the certificate of the connection itself.
fn peer_from_connection(rules: &mut Rbac) {
    for policy in rules.policies.values_mut() {
        policy.principals.iter_mut().for_each(rewrite_principal);
    }
}

fn rewrite_principal(p: &mut Principal) {
    use principal::Identifier;
    match &mut p.identifier {
        Some(Identifier::AndIds(set) | Identifier::OrIds(set)) => {
            set.ids.iter_mut().for_each(rewrite_principal)
        }
        Some(Identifier::NotId(inner)) => rewrite_principal(inner),
        Some(Identifier::FilterState(fs)) if fs.key == names::FS_PEER_PRINCIPAL => {
            let matcher = match fs.matcher.take() {
                Some(filter_state_matcher::Matcher::StringMatch(m)) => Some(m),
                _ => None,
            };
            p.identifier = Some(Identifier::Authenticated(principal::Authenticated {
                principal_name: matcher,
            }));
        }
        _ => {}
    }
}
