//! Envoy's bootstrap, in the shape of Istio's `envoy_bootstrap.json`: the node (id, cluster,
//! metadata), admin on 127.0.0.1:15000, delta ADS through the agent's `XDS` socket, SDS through
//! the agent's workload socket, the internal-listener extension, and two static listeners:
//! 15090 (`/stats/prometheus` from the admin) and 15021 (`/healthz/ready` from the agent's
//! status port).

use serde_json::{json, Value};

use crate::config::{self, Config};

/// The bootstrap JSON for `cfg`, with `labels` (the pod's) in the node metadata.
pub fn render(cfg: &Config, labels: &std::collections::BTreeMap<String, String>) -> Value {
    let mut metadata = serde_json::Map::new();
    for (k, v) in &cfg.metadata {
        metadata.insert(k.clone(), v.clone());
    }
    metadata.insert("NAMESPACE".into(), json!(cfg.pod_namespace));
    metadata.insert("NAME".into(), json!(cfg.pod_name));
    metadata.insert("INSTANCE_IPS".into(), json!(cfg.instance_ip.to_string()));
    metadata.insert("SERVICE_ACCOUNT".into(), json!(cfg.service_account));
    metadata.insert("CLUSTER_ID".into(), json!(cfg.cluster_id));
    metadata.insert("ISTIO_VERSION".into(), json!(env!("CARGO_PKG_VERSION")));
    if !labels.is_empty() || !metadata.contains_key("LABELS") {
        metadata.insert("LABELS".into(), json!(labels));
    }
    let pipe = |path: &str| json!({"pipe": {"path": cfg.path(path).display().to_string()}});
    let h2 = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}
        }
    });
    let grpc_cluster = |name: &str, path: &str| {
        json!({
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": h2,
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": pipe(path)}}]}]
            }
        })
    };
    let tcp = |port: u16| json!({"socket_address": {"address": "127.0.0.1", "port_value": port}});
    json!({
        "node": {
            "id": cfg.node_id(),
            "cluster": cfg.service_cluster,
            "metadata": metadata,
        },
        "admin": {"address": tcp(config::ADMIN_PORT)},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": true,
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]
            },
            "cds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
            "lds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}
        },
        "bootstrap_extensions": [{
            "name": "envoy.bootstrap.internal_listener",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"
            }
        }],
        "static_resources": {
            "clusters": [
                grpc_cluster("xds-grpc", config::XDS_SOCKET),
                grpc_cluster("sds-grpc", config::SDS_SOCKET),
                grpc_cluster(config::TELEMETRY_CLUSTER, config::TELEMETRY_SOCKET),
                {
                    "name": "prometheus_stats",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "prometheus_stats",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": tcp(config::ADMIN_PORT)}}]}]
                    }
                },
                {
                    "name": "agent",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "agent",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": tcp(config::STATUS_PORT)}}]}]
                    }
                }
            ],
            "listeners": [
                static_listener(config::PROMETHEUS_PORT, "/stats/prometheus", "prometheus_stats"),
                static_listener(config::READINESS_PORT, "/healthz/ready", "agent"),
            ]
        }
    })
}

/// A listener on `0.0.0.0:<port>` that forwards `path` to `cluster`.
fn static_listener(port: u16, path: &str, cluster: &str) -> Value {
    json!({
        "name": format!("0.0.0.0_{port}"),
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": format!("port_{port}"),
                "codec_type": "AUTO",
                "route_config": {"virtual_hosts": [{
                    "name": "backend",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": path}, "route": {"cluster": cluster, "timeout": "5s"}}]
                }]},
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                }]
            }
        }]}]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ProxyArgs, ProxyType};

    #[test]
    fn node_and_plumbing_as_istio() {
        let cfg = Config::from_vars(
            ProxyType::Waypoint,
            &ProxyArgs::default(),
            [
                ("POD_NAME", "wp-1"),
                ("POD_NAMESPACE", "shop"),
                ("INSTANCE_IP", "10.1.0.9"),
            ],
            "/w".into(),
        )
        .expect("config");
        let labels = [(
            "gateway.networking.k8s.io/gateway-name".to_string(),
            "waypoint".to_string(),
        )]
        .into();
        let b = render(&cfg, &labels);
        assert_eq!(
            b["node"]["id"],
            "waypoint~10.1.0.9~wp-1.shop~shop.svc.cluster.local"
        );
        assert_eq!(
            b["node"]["metadata"]["LABELS"]["gateway.networking.k8s.io/gateway-name"],
            "waypoint"
        );
        assert_eq!(
            b["dynamic_resources"]["ads_config"]["api_type"],
            "DELTA_GRPC"
        );
        assert_eq!(
            b["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"]
                [0]["endpoint"]["address"]["pipe"]["path"],
            "/w/etc/istio/proxy/XDS"
        );
    }
}
