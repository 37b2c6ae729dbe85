//! A sidecar's outbound side: `virtualOutbound`, the per-port listeners and routes, the service
//! clusters and the special clusters.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mesh_proto::envoy::pb::envoy::config::cluster::v3::{
    cluster::{ClusterDiscoveryType, DiscoveryType, LbPolicy},
    Cluster,
};
use mesh_proto::envoy::pb::envoy::config::core::v3::BindConfig;
use mesh_proto::envoy::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use mesh_proto::envoy::pb::envoy::config::route::v3::{
    route, route_match, DirectResponseAction, Route, RouteConfiguration, RouteMatch, VirtualHost,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{CodecType, RouteSpecifier},
    HttpConnectionManager, Rds,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy;
use mesh_proto::type_url;

use super::super::any::{ads_source, bool_value, duration, pack, u32_value};
use super::super::inputs::{BoundService, Flavor, Protocol, ServicePort, WaypointInputs};
use super::super::listeners::{
    connect_originate, fault_filter, network_filter, router, socket_address, tcp_chain_filter,
};
use super::super::routes::{default_route, RouteError, ServiceRoutes};
use super::super::{clusters, destination_rule, names};
use super::Builder;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const OUTBOUND_PORT: u16 = mesh_capture::OUTBOUND_CAPTURE_PORT;
const BLACKHOLE_CHAIN: &str = "virtualOutbound-blackhole";
const CATCHALL_CHAIN: &str = "virtualOutbound-catchall-tcp";
const ALLOW_ANY: &str = "allow_any";
const BLOCK_ALL: &str = "block_all";
/// The ports of the proxy's own listeners (admin, capture, HBONE, the agent's status and
/// readiness, DNS, Prometheus). A service port among them (a waypoint's HBONE or status port)
/// gets no wildcard HTTP listener, which would take the proxy's own address: it is proxied as
/// TCP on the service's addresses.
const PROXY_PORTS: [u16; 8] = [
    15000,
    OUTBOUND_PORT,
    mesh_capture::INBOUND_CAPTURE_PORT,
    mesh_capture::HBONE_PORT,
    15020,
    15021,
    mesh_capture::DNS_CAPTURE_PORT,
    15090,
];

pub(super) fn generate(inputs: &WaypointInputs, out: &mut Builder, errors: &mut Vec<RouteError>) {
    let registry_only = matches!(
        inputs.flavor,
        Flavor::Sidecar {
            registry_only: true,
            ..
        }
    );
    let hashes = destination_rule::hash_policy_index(inputs);
    let routes: Vec<ServiceRoutes> = (inputs.services.iter())
        .map(|svc| ServiceRoutes::build(inputs, svc, &hashes, errors))
        .collect();
    for cluster in special_clusters() {
        out.put(type_url::CLUSTER, &cluster.name.clone(), &cluster);
    }
    for cluster in clusters::service_clusters(inputs, errors) {
        out.put(type_url::CLUSTER, &cluster.name.clone(), &cluster);
    }
    for cla in clusters::waypoint_endpoints(inputs) {
        out.put(type_url::ENDPOINT, &cla.cluster_name.clone(), &cla);
    }
    out.put(
        type_url::LISTENER,
        names::VIRTUAL_OUTBOUND,
        &virtual_outbound(registry_only),
    );
    if matches!(
        inputs.flavor,
        Flavor::Sidecar {
            send_hbone: true,
            ..
        }
    ) {
        // HBONE to endpoints that take it: the same plumbing as a waypoint's.
        out.put(
            type_url::LISTENER,
            names::CONNECT_ORIGINATE,
            &connect_originate(),
        );
        let cluster = clusters::connect_originate(&inputs.trust_domain);
        out.put(type_url::CLUSTER, names::CONNECT_ORIGINATE, &cluster);
    }
    // HTTP ports: one listener and one route configuration per port number.
    let mut http_ports: BTreeMap<u16, Vec<VirtualHost>> = BTreeMap::new();
    let mut domains_seen: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    for (svc, svc_routes) in inputs.services.iter().zip(&routes) {
        for port in &svc.ports {
            let reserved = PROXY_PORTS.contains(&port.port);
            match (port.protocol, svc_routes.by_port.get(&port.port)) {
                (Protocol::Tcp, _) | (_, None) => tcp_listeners(inputs, svc, port, svc_routes, out),
                _ if reserved => tcp_listeners(inputs, svc, port, svc_routes, out),
                (_, Some(rc)) => {
                    let seen = domains_seen.entry(port.port).or_default();
                    let domains: Vec<String> = domains(inputs, svc, port.port)
                        .into_iter()
                        .filter(|d| seen.insert(d.clone()))
                        .collect();
                    if domains.is_empty() {
                        continue;
                    }
                    let routes = rc.virtual_hosts.iter().flat_map(|v| v.routes.clone());
                    http_ports.entry(port.port).or_default().push(VirtualHost {
                        name: format!("{}:{}", svc.hostname, port.port),
                        domains,
                        routes: routes.collect(),
                        ..VirtualHost::default()
                    });
                }
            }
        }
    }
    for (port, mut hosts) in http_ports {
        hosts.push(catch_all_host(registry_only));
        let name = port.to_string();
        let rc = RouteConfiguration {
            name: name.clone(),
            virtual_hosts: hosts,
            validate_clusters: Some(bool_value(false)),
            ..RouteConfiguration::default()
        };
        out.put(type_url::ROUTE, &name, &rc);
        let listener = http_listener(port, &rc.virtual_hosts, &inputs.access_log_file);
        out.put(type_url::LISTENER, &listener.name.clone(), &listener);
    }
}

/// The last virtual host of every port: unknown hosts pass through (`allow_any`), or under
/// `REGISTRY_ONLY` get 502 (`block_all`), as Istio answers them.
fn catch_all_host(registry_only: bool) -> VirtualHost {
    let (name, route) = if registry_only {
        let route = Route {
            name: BLOCK_ALL.to_string(),
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                ..RouteMatch::default()
            }),
            action: Some(route::Action::DirectResponse(DirectResponseAction {
                status: 502,
                ..DirectResponseAction::default()
            })),
            ..Route::default()
        };
        (BLOCK_ALL, route)
    } else {
        let route = Route {
            name: ALLOW_ANY.to_string(),
            ..default_route(names::PASSTHROUGH_CLUSTER)
        };
        (ALLOW_ANY, route)
    };
    VirtualHost {
        name: name.to_string(),
        domains: vec!["*".to_string()],
        routes: vec![route],
        ..VirtualHost::default()
    }
}

/// `<vip>_<port>` TCP listeners of one service port, to its TCPRoute's clusters or its own.
fn tcp_listeners(
    inputs: &WaypointInputs,
    svc: &BoundService,
    port: &ServicePort,
    routes: &ServiceRoutes,
    out: &mut Builder,
) {
    let target = (routes.tcp_by_port.get(&port.port).cloned()).unwrap_or_else(|| {
        tcp_proxy::ClusterSpecifier::Cluster(inputs.cluster_name(&svc.hostname, port, None))
    });
    for vip in &svc.vips {
        let listener = tcp_listener(&vip.to_string(), port.port, target.clone());
        out.put(type_url::LISTENER, &listener.name.clone(), &listener);
    }
}

/// The names a client may call `svc` by on `port`: its hostname, for a Kubernetes service the
/// shorter forms (`name.ns.svc`, `name.ns`, and `name` from its own namespace), and its
/// addresses; each bare and with `:port`.
fn domains(inputs: &WaypointInputs, svc: &BoundService, port: u16) -> Vec<String> {
    let mut bare = vec![svc.hostname.clone()];
    let kube_suffix = format!(".{}.svc.{}", svc.namespace, inputs.domain_suffix);
    if svc.hostname == format!("{}{kube_suffix}", svc.name) {
        bare.push(format!("{}.{}.svc", svc.name, svc.namespace));
        bare.push(format!("{}.{}", svc.name, svc.namespace));
        if svc.namespace == inputs.key.namespace {
            bare.push(svc.name.clone());
        }
    }
    bare.extend(svc.vips.iter().map(|v| v.to_string()));
    bare.iter()
        .flat_map(|d| [d.clone(), format!("{d}:{port}")])
        .collect()
}

/// The HTTP connection manager of outbound HTTP on `port` (a sidecar's or a gateway's): routes
/// `route_name` by RDS (`hosts`, for the fault filter), requests logged as the source.
pub(super) fn outbound_hcm(
    port: u16,
    route_name: &str,
    hosts: &[VirtualHost],
    access_log_file: &str,
) -> HttpConnectionManager {
    let mut http_filters: Vec<_> = fault_filter(hosts).into_iter().collect();
    http_filters.push(router());
    HttpConnectionManager {
        stat_prefix: format!("outbound_0.0.0.0_{port}"),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads_source()),
            route_config_name: route_name.to_string(),
        })),
        http_filters,
        normalize_path: Some(bool_value(true)),
        stream_idle_timeout: Some(duration(Duration::ZERO)),
        access_log: super::super::telemetry::sidecar_access_logs(
            access_log_file,
            "source",
            "unknown",
            None,
        ),
        ..HttpConnectionManager::default()
    }
}

/// `0.0.0.0_<port>`: reached from `virtualOutbound` (not bound itself), HTTP with routes `<port>`.
fn http_listener(port: u16, hosts: &[VirtualHost], access_log_file: &str) -> Listener {
    let hcm = outbound_hcm(port, &port.to_string(), hosts, access_log_file);
    Listener {
        name: format!("0.0.0.0_{port}"),
        address: Some(socket_address("0.0.0.0", port)),
        bind_to_port: Some(bool_value(false)),
        filter_chains: vec![FilterChain {
            filters: vec![network_filter(
                "envoy.filters.network.http_connection_manager",
                pack(&hcm),
            )],
            ..FilterChain::default()
        }],
        traffic_direction: TRAFFIC_OUTBOUND,
        ..Listener::default()
    }
}

/// Envoy's `TrafficDirection::OUTBOUND`.
const TRAFFIC_OUTBOUND: i32 =
    mesh_proto::envoy::pb::envoy::config::core::v3::TrafficDirection::Outbound as i32;

/// `<vip>_<port>`: a TCP service address, reached from `virtualOutbound`.
fn tcp_listener(vip: &str, port: u16, target: tcp_proxy::ClusterSpecifier) -> Listener {
    let name = format!("{vip}_{port}");
    let stat = match &target {
        tcp_proxy::ClusterSpecifier::Cluster(c) => c.clone(),
        _ => name.clone(),
    };
    Listener {
        name: name.clone(),
        address: Some(socket_address(vip, port)),
        bind_to_port: Some(bool_value(false)),
        filter_chains: vec![FilterChain {
            filters: vec![tcp_chain_filter(&stat, target)],
            ..FilterChain::default()
        }],
        traffic_direction: TRAFFIC_OUTBOUND,
        ..Listener::default()
    }
}

/// `virtualOutbound` on 15001: where the capture sends the application's connections. Envoy
/// hands each to the listener of its original destination; the rest pass through (or, under
/// `REGISTRY_ONLY`, reach the black hole), and connections to 15001 itself (a loop) always do.
fn virtual_outbound(registry_only: bool) -> Listener {
    let catch_all = if registry_only {
        names::BLACKHOLE_CLUSTER
    } else {
        names::PASSTHROUGH_CLUSTER
    };
    let passthrough = |cluster: &str| {
        tcp_chain_filter(
            cluster,
            tcp_proxy::ClusterSpecifier::Cluster(cluster.to_string()),
        )
    };
    Listener {
        name: names::VIRTUAL_OUTBOUND.to_string(),
        address: Some(socket_address("0.0.0.0", OUTBOUND_PORT)),
        use_original_dst: Some(bool_value(true)),
        filter_chains: vec![
            FilterChain {
                name: BLACKHOLE_CHAIN.to_string(),
                filter_chain_match: Some(FilterChainMatch {
                    destination_port: Some(u32_value(u32::from(OUTBOUND_PORT))),
                    ..FilterChainMatch::default()
                }),
                filters: vec![passthrough(names::BLACKHOLE_CLUSTER)],
                ..FilterChain::default()
            },
            FilterChain {
                name: CATCHALL_CHAIN.to_string(),
                filters: vec![passthrough(catch_all)],
                ..FilterChain::default()
            },
        ],
        traffic_direction: TRAFFIC_OUTBOUND,
        ..Listener::default()
    }
}

/// `PassthroughCluster` (the original destination), `BlackHoleCluster` (no endpoints) and
/// `InboundPassthroughCluster` (the original destination, from 127.0.0.6).
fn special_clusters() -> Vec<Cluster> {
    let original_dst = |name: &str| Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: LbPolicy::ClusterProvided as i32,
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        cleanup_interval: Some(duration(Duration::from_secs(60))),
        ..Cluster::default()
    };
    let mut inbound = original_dst(names::INBOUND_PASSTHROUGH_CLUSTER);
    inbound.upstream_bind_config = Some(inbound_bind());
    vec![
        original_dst(names::PASSTHROUGH_CLUSTER),
        Cluster {
            name: names::BLACKHOLE_CLUSTER.to_string(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
            connect_timeout: Some(duration(CONNECT_TIMEOUT)),
            ..Cluster::default()
        },
        inbound,
    ]
}

/// Connections to the application leave from 127.0.0.6, which the capture lets through.
pub(super) fn inbound_bind() -> BindConfig {
    BindConfig {
        source_address: Some(
            mesh_proto::envoy::pb::envoy::config::core::v3::SocketAddress {
                address: mesh_capture::sidecar::PASSTHROUGH_V4.to_string(),
                port_specifier: Some(
                    mesh_proto::envoy::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(0),
                ),
                ..Default::default()
            },
        ),
        ..BindConfig::default()
    }
}
