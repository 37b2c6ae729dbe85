//! Waypoint clusters and their EDS endpoints.

use std::time::Duration;

use mesh_proto::envoy::pb::envoy::config::cluster::v3::{
    cluster::{
        ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbConfig, LbPolicy,
        OriginalDstLbConfig, TransportSocketMatch,
    },
    Cluster,
};
use mesh_proto::envoy::pb::envoy::config::core::v3::{
    address, socket_address::PortSpecifier, transport_socket, Address, EnvoyInternalAddress,
    Http1ProtocolOptions, Http2ProtocolOptions, HttpProtocolOptions as CommonOptions, Metadata,
    SocketAddress, TransportSocket,
};
use mesh_proto::envoy::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint as EnvoyEndpoint, LbEndpoint,
    LocalityLbEndpoints,
};
use mesh_proto::envoy::pb::envoy::extensions::transport_sockets::internal_upstream::v3::{
    internal_upstream_transport::MetadataValueSource, InternalUpstreamTransport,
};
use mesh_proto::envoy::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use mesh_proto::envoy::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::{
        explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions,
    },
    HttpProtocolOptions,
};
use mesh_proto::envoy::pb::envoy::r#type::metadata::v3::{metadata_kind, MetadataKind};
use mesh_proto::envoy::pb::google::protobuf::{value::Kind as ValueKind, Struct, Value};

use super::any::{ads_source, duration, object_name, pack, stable_map, u32_value};
use super::destination_rule::{self, ClusterPolicy, Reporter};
use super::inputs::{BoundService, Flavor, Protocol, ServicePort, WaypointInputs};
use super::routes::RouteError;
use super::{names, tls, HBONE_PORT};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle HBONE connection to a pod is kept (Istio's `hboneIdleTimeout` default).
const HBONE_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// Every cluster of a waypoint: the three internal plumbing clusters, then one per bound
/// service port and one per port and DestinationRule subset.
pub fn waypoint_clusters(inputs: &WaypointInputs, errors: &mut Vec<RouteError>) -> Vec<Cluster> {
    let mut out = vec![
        internal_static(names::MAIN_INTERNAL, names::MAIN_INTERNAL),
        internal_static(names::ENCAP, names::CONNECT_ORIGINATE),
        connect_originate(&inputs.trust_domain),
    ];
    out.extend(service_clusters(inputs, errors));
    out
}

/// One cluster per service port and one per port and DestinationRule subset, named and reached
/// as `inputs.flavor` says.
pub fn service_clusters(inputs: &WaypointInputs, errors: &mut Vec<RouteError>) -> Vec<Cluster> {
    let mut out = Vec::new();
    for svc in &inputs.services {
        let rule = svc.destination_rule.as_deref();
        let rule_name = rule.map(|r| object_name(&r.metadata)).unwrap_or_default();
        for port in &svc.ports {
            let mut report = Reporter {
                rule: rule_name.clone(),
                field: format!("spec (port {})", port.port),
                errors: &mut *errors,
            };
            out.push(port_cluster(inputs, svc, port, None, &mut report));
            for (i, subset) in destination_rule::subsets(rule).iter().enumerate() {
                report.field = format!("spec.subsets[{i}] (port {})", port.port);
                out.push(port_cluster(inputs, svc, port, Some(subset), &mut report));
            }
        }
    }
    out
}

/// EDS for every service-port cluster (and subset cluster).
pub fn waypoint_endpoints(inputs: &WaypointInputs) -> Vec<ClusterLoadAssignment> {
    inputs
        .services
        .iter()
        .flat_map(|svc| {
            let subsets = destination_rule::subsets(svc.destination_rule.as_deref());
            svc.ports.iter().flat_map(move |p| {
                std::iter::once(load_assignment(inputs, svc, p, None)).chain(
                    subsets
                        .iter()
                        .map(move |s| load_assignment(inputs, svc, p, Some(s))),
                )
            })
        })
        .collect()
}

/// The name of the cluster for a service port (and subset).
pub fn service_cluster(
    inputs: &WaypointInputs,
    svc: &BoundService,
    port: &ServicePort,
    subset: Option<&str>,
) -> String {
    inputs.cluster_name(&svc.hostname, port, subset)
}

/// A STATIC cluster whose one endpoint is the internal listener `listener`.
pub(super) fn internal_static(name: &str, listener: &str) -> Cluster {
    Cluster {
        transport_socket: Some(internal_upstream(false)),
        ..static_cluster(name, internal_address(listener, ""))
    }
}

/// A STATIC cluster whose one endpoint is `address`.
pub(super) fn static_cluster(name: &str, address: Address) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.to_string(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![lb_endpoint(address, None)],
                ..LocalityLbEndpoints::default()
            }],
            ..ClusterLoadAssignment::default()
        }),
        ..Cluster::default()
    }
}

/// HBONE to a pod's ztunnel: the original destination with port 15008, HTTP/2 CONNECT, TLS.
pub(super) fn connect_originate(trust_domain: &str) -> Cluster {
    let mut cluster = Cluster {
        name: names::CONNECT_ORIGINATE.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: LbPolicy::ClusterProvided as i32,
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        cleanup_interval: Some(duration(Duration::from_secs(60))),
        lb_config: Some(LbConfig::OriginalDstLbConfig(OriginalDstLbConfig {
            upstream_port_override: Some(u32_value(u32::from(HBONE_PORT))),
            ..OriginalDstLbConfig::default()
        })),
        transport_socket: Some(tls::hbone_client(trust_domain)),
        ..Cluster::default()
    };
    cluster
        .typed_extension_protocol_options
        .insert(HTTP_PROTOCOL_OPTIONS.to_string(), pack(&h2_options(true)));
    cluster
}

pub(super) fn h2_options(allow_connect: bool) -> HttpProtocolOptions {
    HttpProtocolOptions {
        common_http_protocol_options: allow_connect.then(|| CommonOptions {
            idle_timeout: Some(duration(HBONE_IDLE_TIMEOUT)),
            ..CommonOptions::default()
        }),
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions {
                    allow_connect,
                    ..Http2ProtocolOptions::default()
                })),
            },
        )),
        ..HttpProtocolOptions::default()
    }
}

/// HTTP/1.1 to the application with `common` connection options (a DestinationRule's).
fn h1_options(common: CommonOptions) -> HttpProtocolOptions {
    HttpProtocolOptions {
        common_http_protocol_options: Some(common),
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                    Http1ProtocolOptions::default(),
                )),
            },
        )),
        ..HttpProtocolOptions::default()
    }
}

/// A service port's EDS cluster (and subset's) with the DestinationRule's policy for that port:
/// a waypoint's `inbound-vip|<port>|<http|tcp>[/<subset>]|<host>` reaches pods through
/// `connect_originate`; a sidecar's `outbound|<port>|<subset>|<host>` reaches them directly,
/// with Istio mutual TLS to the endpoints that have a sidecar (see [`sidecar_transport`]).
fn port_cluster(
    inputs: &WaypointInputs,
    svc: &BoundService,
    port: &ServicePort,
    subset: Option<&mesh_api::Subset>,
    report: &mut Reporter<'_>,
) -> Cluster {
    let protocol = port.protocol;
    let name = service_cluster(inputs, svc, port, subset.map(|s| s.name.as_str()));
    let mut cluster = Cluster {
        name: name.clone(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ads_source()),
            service_name: name,
        }),
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        ..Cluster::default()
    };
    let policy = ClusterPolicy::resolve(svc.destination_rule.as_deref(), subset, port.port);
    match inputs.flavor {
        Flavor::Waypoint => {
            cluster.transport_socket = Some(internal_upstream(true));
            if let Some(mode @ ("SIMPLE" | "MUTUAL")) = policy.tls_mode() {
                report.error(
                    "trafficPolicy.tls.mode",
                    format!("{mode} (TLS from the waypoint to the application) is not supported on waypoints; the traffic stays inside HBONE's mutual TLS"),
                );
            }
        }
        Flavor::Sidecar { send_hbone, .. } => match origination(svc, policy.tls, report) {
            Some(tls) => cluster.transport_socket = Some(tls::origination_client(&tls)),
            None => sidecar_transport(
                &mut cluster,
                inputs,
                (svc, port),
                policy.tls_mode(),
                send_hbone,
            ),
        },
    }
    let common = destination_rule::apply(&mut cluster, &policy, report);
    let options = match (protocol.upstream_h2(), protocol == Protocol::Tcp, common) {
        (true, _, common) => Some(HttpProtocolOptions {
            common_http_protocol_options: common,
            ..h2_options(false)
        }),
        (false, false, Some(common)) => Some(h1_options(common)),
        _ => None,
    };
    if let Some(options) = options {
        cluster
            .typed_extension_protocol_options
            .insert(HTTP_PROTOCOL_OPTIONS.to_string(), pack(&options));
    }
    cluster
}

/// The TLS a sidecar originates for DestinationRule `SIMPLE` or `MUTUAL` (to every endpoint, in
/// place of auto mutual TLS and HBONE): SNI `sni` or the host; the server verified against
/// `caCertificates` (else the system bundle) and `subjectAltNames` (else the SNI), unless
/// `insecureSkipVerify`; `MUTUAL` presents `clientCertificate` and `privateKey`.
/// `credentialName` (a Secret the agent would serve) is reported as not supported.
fn origination(
    svc: &BoundService,
    tls: Option<&mesh_api::ClientTlsSettings>,
    report: &mut Reporter<'_>,
) -> Option<tls::Origination> {
    let tls = tls?;
    let mutual = match tls.mode.as_deref() {
        Some("SIMPLE") => false,
        Some("MUTUAL") => true,
        _ => return None,
    };
    if tls.credential_name.is_some() {
        report.error(
            "trafficPolicy.tls.credentialName",
            "reading client certificates from a Secret is not supported; use clientCertificate, privateKey and caCertificates (files in the proxy)".into(),
        );
    }
    let client_cert = match (&tls.client_certificate, &tls.private_key) {
        (Some(c), Some(k)) if mutual => Some((c.clone(), k.clone())),
        _ if mutual && tls.credential_name.is_none() => {
            report.error(
                "trafficPolicy.tls",
                "MUTUAL needs clientCertificate and privateKey; the proxy originates TLS without a client certificate".into(),
            );
            None
        }
        _ => None,
    };
    let sni = tls.sni.clone().unwrap_or_else(|| svc.hostname.clone());
    let verify = tls.insecure_skip_verify != Some(true);
    let sans = match tls.subject_alt_names.is_empty() {
        true => vec![sni.clone()],
        false => tls.subject_alt_names.clone(),
    };
    Some(tls::Origination {
        ca_file: verify.then(|| {
            (tls.ca_certificates.clone()).unwrap_or_else(|| tls::SYSTEM_CA_BUNDLE.to_string())
        }),
        crl_file: tls.ca_crl.clone().filter(|_| verify),
        sans,
        sni,
        client_cert,
    })
}

/// How a sidecar reaches a service port's endpoints, by transport socket match on each
/// endpoint's metadata: with `send_hbone`, `tunnel: http` endpoints (that take HBONE and have
/// no sidecar) through `connect_originate`; then as Istio's auto mutual TLS decides: with a
/// DestinationRule's `ISTIO_MUTUAL` always Istio mutual TLS, with `DISABLE` always plain;
/// otherwise Istio mutual TLS to `tlsMode: istio` endpoints (pods with a sidecar) and plain to
/// the rest. The peer must present one of the service's workloads' SPIFFE identities; the SNI
/// is `outbound_.<port>_.<subset>_.<host>`.
fn sidecar_transport(
    cluster: &mut Cluster,
    inputs: &WaypointInputs,
    (svc, port): (&BoundService, &ServicePort),
    tls_mode: Option<&str>,
    send_hbone: bool,
) {
    let mut sans: Vec<&str> = svc.endpoints.iter().map(|e| e.principal.as_str()).collect();
    sans.sort_unstable();
    sans.dedup();
    let subset = cluster.name.split('|').nth(2).unwrap_or_default();
    let sni = format!("outbound_.{}_.{subset}_.{}", port.port, svc.hostname);
    let mtls = tls::istio_mutual_client(&inputs.trust_domain, &sni, &sans);
    let matching = |name: &str, key_value: Option<(&str, &str)>, socket| TransportSocketMatch {
        name: name.to_string(),
        r#match: Some(key_value.map_or_else(Struct::default, |kv| string_struct(&[kv]))),
        transport_socket: Some(socket),
    };
    let mut matches = Vec::new();
    if send_hbone {
        matches.push(matching(
            names::HBONE_MATCH,
            Some((names::TUNNEL_KEY, names::TUNNEL_HTTP)),
            internal_upstream(true),
        ));
    }
    match tls_mode {
        Some("ISTIO_MUTUAL") => matches.push(matching(names::TLS_MODE_ISTIO_MATCH, None, mtls)),
        Some("DISABLE") => {
            matches.push(matching(names::TLS_MODE_DISABLED_MATCH, None, raw_buffer()))
        }
        _ => {
            let istio = (names::TLS_MODE_KEY, names::TLS_MODE_ISTIO);
            matches.push(matching(names::TLS_MODE_ISTIO_MATCH, Some(istio), mtls));
            matches.push(matching(names::TLS_MODE_DISABLED_MATCH, None, raw_buffer()));
        }
    }
    cluster.transport_socket_matches = matches;
}

/// The endpoints of one service port (those of a subset: whose labels match). A waypoint's are
/// internal addresses of `connect_originate` carrying `ip:targetPort` as the original
/// destination; a sidecar's are `ip:targetPort` with the endpoint's TLS mode.
fn load_assignment(
    inputs: &WaypointInputs,
    svc: &BoundService,
    service_port: &ServicePort,
    subset: Option<&mesh_api::Subset>,
) -> ClusterLoadAssignment {
    let port = service_port.port;
    let name = service_cluster(inputs, svc, service_port, subset.map(|s| s.name.as_str()));
    let lb_endpoints = svc
        .endpoints
        .iter()
        .filter(|e| e.healthy)
        .filter(|e| subset.is_none_or(|s| destination_rule::in_subset(s, &e.labels)))
        .filter_map(|e| {
            let target = std::net::SocketAddr::new(e.ip, e.target_port(port)?);
            let id = target.to_string();
            let istio = (
                names::ISTIO_METADATA.to_string(),
                string_struct(&[
                    (names::WORKLOAD_METADATA_KEY, &e.workload),
                    (names::PRINCIPAL_METADATA_KEY, &e.principal),
                ]),
            );
            let (addr, first) = match inputs.flavor {
                Flavor::Waypoint => (
                    internal_address(names::CONNECT_ORIGINATE, &id),
                    original_dst_entry(&id),
                ),
                Flavor::Sidecar { send_hbone, .. } if send_hbone && e.hbone && !e.sidecar => (
                    internal_address(names::CONNECT_ORIGINATE, &id),
                    original_dst_entry(&id),
                ),
                Flavor::Sidecar { .. } => {
                    let mode = if e.sidecar {
                        names::TLS_MODE_ISTIO
                    } else {
                        names::TLS_MODE_DISABLED
                    };
                    (
                        socket_address(target),
                        (
                            names::TRANSPORT_SOCKET_MATCH_METADATA.to_string(),
                            string_struct(&[(names::TLS_MODE_KEY, mode)]),
                        ),
                    )
                }
            };
            let tunnelled = matches!(inputs.flavor, Flavor::Sidecar { .. })
                && first.0 == names::ORIGINAL_DST_METADATA;
            let mut entries = vec![first, istio];
            if tunnelled {
                entries.push((
                    names::TRANSPORT_SOCKET_MATCH_METADATA.to_string(),
                    string_struct(&[(names::TUNNEL_KEY, names::TUNNEL_HTTP)]),
                ));
            }
            let metadata = Metadata {
                filter_metadata: stable_map(entries),
                ..Metadata::default()
            };
            Some(lb_endpoint(addr, Some(metadata)))
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: name,
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints,
            ..LocalityLbEndpoints::default()
        }],
        ..ClusterLoadAssignment::default()
    }
}

pub(super) fn socket_address(addr: std::net::SocketAddr) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: addr.ip().to_string(),
            port_specifier: Some(PortSpecifier::PortValue(u32::from(addr.port()))),
            ..SocketAddress::default()
        })),
    }
}

fn raw_buffer() -> TransportSocket {
    TransportSocket {
        name: "envoy.transport_sockets.raw_buffer".to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack(
            &RawBuffer {},
        ))),
    }
}

fn internal_address(listener: &str, endpoint_id: &str) -> Address {
    Address {
        address: Some(address::Address::EnvoyInternalAddress(EnvoyInternalAddress {
            endpoint_id: endpoint_id.to_string(),
            address_name_specifier: Some(
                mesh_proto::envoy::pb::envoy::config::core::v3::envoy_internal_address::AddressNameSpecifier::ServerListenerName(
                    listener.to_string(),
                ),
            ),
        })),
    }
}

fn lb_endpoint(address: Address, metadata: Option<Metadata>) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(EnvoyEndpoint {
            address: Some(address),
            ..EnvoyEndpoint::default()
        })),
        metadata,
        ..LbEndpoint::default()
    }
}

/// `envoy.filters.listener.original_dst: {local: "<ip:port>"}`.
/// A struct of string fields.
fn string_struct(fields: &[(&str, &str)]) -> Struct {
    let fields = stable_map(fields.iter().map(|(k, v)| {
        let value = Value {
            kind: Some(ValueKind::StringValue(v.to_string())),
        };
        (k.to_string(), value)
    }));
    Struct { fields }
}

/// The `envoy.filters.listener.original_dst` metadata entry of an endpoint.
fn original_dst_entry(local: &str) -> (String, Struct) {
    (
        names::ORIGINAL_DST_METADATA.to_string(),
        string_struct(&[("local", local)]),
    )
}

/// The internal-upstream transport (raw buffer inside); with `passthrough`, the endpoint's
/// original-destination metadata travels to the internal listener.
fn internal_upstream(passthrough: bool) -> TransportSocket {
    let passthrough_metadata = if passthrough {
        vec![MetadataValueSource {
            kind: Some(MetadataKind {
                kind: Some(metadata_kind::Kind::Host(metadata_kind::Host {})),
            }),
            name: names::ORIGINAL_DST_METADATA.to_string(),
        }]
    } else {
        Vec::new()
    };
    let transport = InternalUpstreamTransport {
        passthrough_metadata,
        transport_socket: Some(raw_buffer()),
    };
    TransportSocket {
        name: "envoy.transport_sockets.internal_upstream".to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack(&transport))),
    }
}
