//! Waypoint listeners: `connect_terminate` (HBONE in), `main_internal` (per-service chains),
//! `connect_originate` (HBONE out).

use std::time::Duration;

use mesh_proto::envoy::pb::envoy::config::core::v3::{
    address, data_source, socket_address::PortSpecifier, Address, DataSource, Http2ProtocolOptions,
    KeepaliveSettings, SocketAddress, SubstitutionFormatString,
};
use mesh_proto::envoy::pb::envoy::config::listener::v3::{
    filter, listener::ConnectionBalanceConfig, listener::InternalListenerConfig,
    listener::ListenerSpecifier, listener_filter, Filter, FilterChain, Listener, ListenerFilter,
};
use mesh_proto::envoy::pb::envoy::config::route::v3::{
    route::Action, route_action::ClusterSpecifier, route_action::UpgradeConfig,
    route_match::PathSpecifier, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::common::set_filter_state::v3::{
    filter_state_value, FilterStateValue,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::http::router::v3::Router;
use mesh_proto::envoy::pb::envoy::extensions::filters::http::set_filter_state::v3::Config as SetFilterState;
use mesh_proto::envoy::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use mesh_proto::envoy::pb::envoy::extensions::filters::network::direct_response::v3::Config as DirectResponse;
use mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{CodecType, RouteSpecifier, UpgradeConfig as HcmUpgrade},
    http_filter, HttpConnectionManager, HttpFilter,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy, TcpProxy,
};
use mesh_proto::envoy::pb::envoy::extensions::matching::common_inputs::network::v3::{
    DestinationIpInput, DestinationPortInput,
};
use mesh_proto::envoy::pb::google::protobuf::StringValue;
use mesh_proto::envoy::pb::xds::r#type::matcher::v3::{
    matcher::{matcher_tree, MatcherTree, MatcherType, OnMatch},
    Matcher,
};

use super::any::{duration, pack, stable_map, u32_value};
use super::inputs::{Protocol, WaypointInputs};
use super::routes::ServiceRoutes;
use super::{names, tls, HBONE_PORT};

/// HBONE streams per connection, as istiod configures waypoints.
const MAX_CONCURRENT_STREAMS: u32 = 100;
const BLACKHOLE_CHAIN: &str = "blackhole";

pub fn waypoint_listeners(inputs: &WaypointInputs, routes: &[ServiceRoutes]) -> Vec<Listener> {
    vec![
        connect_terminate(&inputs.trust_domain),
        main_internal(inputs, routes),
        connect_originate(),
    ]
}

pub(super) fn network_filter(
    name: &str,
    config: mesh_proto::envoy::pb::google::protobuf::Any,
) -> Filter {
    Filter {
        name: name.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(config)),
    }
}

pub(super) fn http_filter(
    name: &str,
    config: mesh_proto::envoy::pb::google::protobuf::Any,
) -> HttpFilter {
    HttpFilter {
        name: name.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(config)),
        ..HttpFilter::default()
    }
}

pub(super) fn router() -> HttpFilter {
    http_filter("envoy.filters.http.router", pack(&Router::default()))
}

pub(super) fn original_dst_filter() -> ListenerFilter {
    ListenerFilter {
        name: "envoy.filters.listener.original_dst".to_string(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack(
            &OriginalDst::default(),
        ))),
        ..ListenerFilter::default()
    }
}

/// One `set_filter_state` entry shared once with the upstream (the internal connection).
fn state(key: &str, factory: Option<&str>, format: &str) -> FilterStateValue {
    FilterStateValue {
        key: Some(filter_state_value::Key::ObjectKey(key.to_string())),
        factory_key: factory.unwrap_or_default().to_string(),
        shared_with_upstream: filter_state_value::SharedWithUpstream::Once as i32,
        value: Some(filter_state_value::Value::FormatString(
            SubstitutionFormatString {
                format: Some(
                    mesh_proto::envoy::pb::envoy::config::core::v3::substitution_format_string::Format::TextFormatSource(
                        DataSource {
                            specifier: Some(data_source::Specifier::InlineString(format.to_string())),
                            ..DataSource::default()
                        },
                    ),
                ),
                ..SubstitutionFormatString::default()
            },
        )),
        ..FilterStateValue::default()
    }
}

pub(super) fn connect_terminate(trust_domain: &str) -> Listener {
    let hashable = Some("envoy.hashable_string");
    let set_state = SetFilterState {
        on_request_headers: vec![
            state(names::FS_ORIGINAL_DST_LOCAL, None, "%REQ(:AUTHORITY)%"),
            state(
                names::FS_ORIGINAL_DST_REMOTE,
                None,
                "%DOWNSTREAM_REMOTE_ADDRESS%",
            ),
            state(names::FS_CONNECT_AUTHORITY, hashable, "%REQ(:AUTHORITY)%"),
            state(
                names::FS_PEER_PRINCIPAL,
                hashable,
                "%DOWNSTREAM_PEER_URI_SAN%",
            ),
            state(
                names::FS_LOCAL_PRINCIPAL,
                hashable,
                "%DOWNSTREAM_LOCAL_URI_SAN%",
            ),
        ],
        ..SetFilterState::default()
    };
    let connect_route = Route {
        name: "connect".to_string(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::ConnectMatcher(Default::default())),
            ..RouteMatch::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(names::MAIN_INTERNAL.to_string())),
            upgrade_configs: vec![UpgradeConfig {
                upgrade_type: "CONNECT".to_string(),
                connect_config: Some(Default::default()),
                ..UpgradeConfig::default()
            }],
            ..RouteAction::default()
        })),
        ..Route::default()
    };
    let hcm = HttpConnectionManager {
        stat_prefix: names::CONNECT_TERMINATE.to_string(),
        codec_type: CodecType::Http2 as i32,
        route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
            name: "default".to_string(),
            virtual_hosts: vec![VirtualHost {
                name: "default".to_string(),
                domains: vec!["*".to_string()],
                routes: vec![connect_route],
                ..VirtualHost::default()
            }],
            ..RouteConfiguration::default()
        })),
        http_filters: vec![http_filter("connect_authority", pack(&set_state)), router()],
        http2_protocol_options: Some(Http2ProtocolOptions {
            allow_connect: true,
            max_concurrent_streams: Some(u32_value(MAX_CONCURRENT_STREAMS)),
            connection_keepalive: Some(KeepaliveSettings {
                interval: Some(duration(Duration::from_secs(10))),
                timeout: Some(duration(Duration::from_secs(20))),
                ..KeepaliveSettings::default()
            }),
            ..Http2ProtocolOptions::default()
        }),
        upgrade_configs: vec![HcmUpgrade {
            upgrade_type: "CONNECT".to_string(),
            ..HcmUpgrade::default()
        }],
        stream_idle_timeout: Some(duration(Duration::ZERO)),
        ..HttpConnectionManager::default()
    };
    Listener {
        name: names::CONNECT_TERMINATE.to_string(),
        address: Some(socket_address("0.0.0.0", HBONE_PORT)),
        connection_balance_config: Some(ConnectionBalanceConfig {
            balance_type: Some(
                mesh_proto::envoy::pb::envoy::config::listener::v3::listener::connection_balance_config::BalanceType::ExactBalance(
                    Default::default(),
                ),
            ),
        }),
        filter_chains: vec![FilterChain {
            name: names::CONNECT_TERMINATE.to_string(),
            filters: vec![network_filter(
                "envoy.filters.network.http_connection_manager",
                pack(&hcm),
            )],
            transport_socket: Some(tls::hbone_server(trust_domain)),
            ..FilterChain::default()
        }],
        ..Listener::default()
    }
}

pub(super) fn socket_address(ip: &str, port: u16) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(u32::from(port))),
            ..SocketAddress::default()
        })),
    }
}

/// The per-service chains, chosen by destination VIP, then port.
fn main_internal(inputs: &WaypointInputs, routes: &[ServiceRoutes]) -> Listener {
    let mut chains = Vec::new();
    let mut by_ip: std::collections::BTreeMap<String, Vec<(u16, String)>> = Default::default();
    for (svc, svc_routes) in inputs.services.iter().zip(routes) {
        for port in &svc.ports {
            let cluster = names::vip_cluster(port.port, port.protocol.family(), &svc.hostname);
            let filter = match (port.protocol, svc_routes.by_port.get(&port.port)) {
                (Protocol::Tcp, _) | (_, None) => None,
                (_, Some(rc)) => Some(http_chain_filter(
                    &cluster,
                    rc.clone(),
                    svc_routes,
                    &inputs.access_log_file,
                )),
            };
            let filters = match filter {
                Some(hcm) => vec![hcm],
                None => {
                    let mut f: Vec<Filter> = svc_routes
                        .rbac_tcp
                        .iter()
                        .map(|(name, config)| network_filter(name, pack(config)))
                        .collect();
                    let target = (svc_routes.tcp_by_port.get(&port.port).cloned())
                        .unwrap_or_else(|| tcp_proxy::ClusterSpecifier::Cluster(cluster.clone()));
                    f.push(tcp_chain_filter(&cluster, target));
                    f
                }
            };
            chains.push(FilterChain {
                name: cluster.clone(),
                filters,
                ..FilterChain::default()
            });
            for vip in &svc.vips {
                by_ip
                    .entry(vip.to_string())
                    .or_default()
                    .push((port.port, cluster.clone()));
            }
        }
    }
    Listener {
        name: names::MAIN_INTERNAL.to_string(),
        listener_specifier: Some(ListenerSpecifier::InternalListener(
            InternalListenerConfig {},
        )),
        listener_filters: vec![original_dst_filter()],
        filter_chains: chains,
        filter_chain_matcher: (!by_ip.is_empty()).then(|| chain_matcher(&by_ip)),
        default_filter_chain: Some(FilterChain {
            name: BLACKHOLE_CHAIN.to_string(),
            filters: vec![network_filter(
                "envoy.filters.network.direct_response",
                pack(&DirectResponse::default()),
            )],
            ..FilterChain::default()
        }),
        ..Listener::default()
    }
}

/// Destination IP (exact) -> destination port (exact) -> chain name.
fn chain_matcher(by_ip: &std::collections::BTreeMap<String, Vec<(u16, String)>>) -> Matcher {
    let ip_map = stable_map(by_ip.iter().map(|(ip, ports)| {
            let port_map = stable_map(
                ports
                    .iter()
                    .map(|(port, chain)| (port.to_string(), chain_action(chain))),
            );
            let port_matcher = Matcher {
                matcher_type: Some(MatcherType::MatcherTree(MatcherTree {
                    input: Some(input("port", pack(&DestinationPortInput::default()))),
                    tree_type: Some(matcher_tree::TreeType::ExactMatchMap(
                        matcher_tree::MatchMap { map: port_map },
                    )),
                })),
                ..Matcher::default()
            };
            (
                ip.clone(),
                OnMatch {
                    on_match: Some(
                        mesh_proto::envoy::pb::xds::r#type::matcher::v3::matcher::on_match::OnMatch::Matcher(
                            Box::new(port_matcher),
                        ),
                    ),
                    ..OnMatch::default()
                },
            )
    }));
    Matcher {
        matcher_type: Some(MatcherType::MatcherTree(MatcherTree {
            input: Some(input("ip", pack(&DestinationIpInput::default()))),
            tree_type: Some(matcher_tree::TreeType::ExactMatchMap(
                matcher_tree::MatchMap { map: ip_map },
            )),
        })),
        ..Matcher::default()
    }
}

fn input(
    name: &str,
    config: mesh_proto::envoy::pb::google::protobuf::Any,
) -> mesh_proto::envoy::pb::xds::core::v3::TypedExtensionConfig {
    mesh_proto::envoy::pb::xds::core::v3::TypedExtensionConfig {
        name: name.to_string(),
        typed_config: Some(config),
    }
}

fn chain_action(chain: &str) -> OnMatch {
    OnMatch {
        on_match: Some(
            mesh_proto::envoy::pb::xds::r#type::matcher::v3::matcher::on_match::OnMatch::Action(
                input(
                    chain,
                    pack(&StringValue {
                        value: chain.to_string(),
                    }),
                ),
            ),
        ),
        ..OnMatch::default()
    }
}

pub(super) fn tcp_chain_filter(cluster: &str, target: tcp_proxy::ClusterSpecifier) -> Filter {
    let proxy = TcpProxy {
        stat_prefix: cluster.to_string(),
        cluster_specifier: Some(target),
        ..TcpProxy::default()
    };
    network_filter("envoy.filters.network.tcp_proxy", pack(&proxy))
}

/// A service port's HTTP connection manager: JWT authentication, then RBAC (as Istio orders
/// them), faults, the router.
fn http_chain_filter(
    cluster: &str,
    route_config: RouteConfiguration,
    svc_routes: &ServiceRoutes,
    access_log_file: &str,
) -> Filter {
    let jwt =
        (svc_routes.jwt.iter()).map(|config| http_filter(super::jwt::JWT_FILTER, pack(config)));
    let rbac = (svc_routes.rbac.iter()).map(|(name, config)| http_filter(name, pack(config)));
    let mut http_filters: Vec<HttpFilter> = jwt.chain(rbac).collect();
    http_filters.extend(fault_filter(&route_config.virtual_hosts));
    http_filters.push(router());
    let hcm = HttpConnectionManager {
        stat_prefix: cluster.to_string(),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(RouteSpecifier::RouteConfig(route_config)),
        http_filters,
        normalize_path: Some(super::any::bool_value(true)),
        access_log: super::telemetry::http_access_logs(
            access_log_file,
            cluster.rsplit('|').next().unwrap_or_default(),
        ),
        ..HttpConnectionManager::default()
    };
    network_filter("envoy.filters.network.http_connection_manager", pack(&hcm))
}

/// The fault filter, when a route of `hosts` injects faults: empty here, each route's faults
/// are its per-filter config.
pub(super) fn fault_filter(hosts: &[VirtualHost]) -> Option<HttpFilter> {
    let faults = hosts.iter().flat_map(|v| &v.routes).any(|r| {
        r.typed_per_filter_config
            .contains_key(super::virtual_service::FAULT_FILTER)
    });
    faults.then(|| {
        let config =
            mesh_proto::envoy::pb::envoy::extensions::filters::http::fault::v3::HttpFault::default(
            );
        http_filter(super::virtual_service::FAULT_FILTER, pack(&config))
    })
}

pub(super) fn connect_originate() -> Listener {
    let proxy = TcpProxy {
        stat_prefix: names::CONNECT_ORIGINATE.to_string(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(
            names::CONNECT_ORIGINATE.to_string(),
        )),
        tunneling_config: Some(tcp_proxy::TunnelingConfig {
            hostname: "%DOWNSTREAM_LOCAL_ADDRESS%".to_string(),
            ..tcp_proxy::TunnelingConfig::default()
        }),
        ..TcpProxy::default()
    };
    Listener {
        name: names::CONNECT_ORIGINATE.to_string(),
        listener_specifier: Some(ListenerSpecifier::InternalListener(
            InternalListenerConfig {},
        )),
        listener_filters: vec![original_dst_filter()],
        filter_chains: vec![FilterChain {
            name: names::CONNECT_ORIGINATE.to_string(),
            filters: vec![network_filter(
                "envoy.filters.network.tcp_proxy",
                pack(&proxy),
            )],
            ..FilterChain::default()
        }],
        ..Listener::default()
    }
}
