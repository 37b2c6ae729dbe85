//! TCPRoute on a waypoint: a TCP service port whose TCPRoute names other services (or several,
//! weighted) sends its connections there instead of to the port's own endpoints.

use mesh_api::{HttpBackendRef, TcpRoute};
use mesh_proto::envoy::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::{
    weighted_cluster::ClusterWeight, ClusterSpecifier, WeightedCluster,
};

use super::any::object_name;
use super::inputs::{BoundService, Protocol, WaypointInputs};
use super::routes::{parents_name_port, RouteError};

/// Where a TCP port's connections go: one cluster or weighted clusters.
pub type TcpClusters = ClusterSpecifier;

/// The clusters of the first TCPRoute (by name) attached to `svc:port` that has a usable
/// backend; `None` when no TCPRoute applies (the port's own cluster serves it). Only a route's
/// first rule counts: TCPRoute rules have no matches to tell them apart.
pub fn clusters(
    inputs: &WaypointInputs,
    svc: &BoundService,
    port: u16,
    errors: &mut Vec<RouteError>,
) -> Option<TcpClusters> {
    let attached = (svc.tcp_routes.iter())
        .filter(|r| parents_name_port(&r.metadata, &r.spec.parent_refs, svc, port));
    for route in attached {
        if let Some(found) = route_clusters(inputs, route, port, errors) {
            return Some(found);
        }
    }
    None
}

fn route_clusters(
    inputs: &WaypointInputs,
    route: &TcpRoute,
    port: u16,
    errors: &mut Vec<RouteError>,
) -> Option<TcpClusters> {
    let ns = route.metadata.namespace.as_deref().unwrap_or("default");
    let name = object_name(&route.metadata);
    let rule = route.spec.rules.first()?;
    let mut clusters = Vec::new();
    for (k, b) in rule.backend_refs.iter().enumerate() {
        let weight = b.weight.unwrap_or(1);
        if weight == 0 {
            continue;
        }
        match backend(inputs, ns, b, port) {
            Some(cluster) => clusters.push(ClusterWeight {
                name: cluster,
                weight,
                ..ClusterWeight::default()
            }),
            None => errors.push(RouteError::UnknownBackend {
                route_kind: "TCPRoute",
                route: name.clone(),
                field: format!("spec.rules[0].backendRefs[{k}]"),
                backend: format!(
                    "{}/{}:{}",
                    b.namespace.as_deref().unwrap_or(ns),
                    b.name,
                    b.port.unwrap_or(port)
                ),
                waypoint: inputs.key.to_string(),
            }),
        }
    }
    match clusters.len() {
        0 => None,
        1 => clusters.pop().map(|c| ClusterSpecifier::Cluster(c.name)),
        _ => Some(ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters,
        })),
    }
}

/// The TCP cluster of a backendRef: a service bound to this waypoint, on a TCP port it has.
fn backend(inputs: &WaypointInputs, ns: &str, b: &HttpBackendRef, port: u16) -> Option<String> {
    if !b.is_service() {
        return None;
    }
    let ns = b.namespace.as_deref().unwrap_or(ns);
    let port = b.port.unwrap_or(port);
    let svc = inputs.service(ns, &b.name)?;
    let p = svc
        .ports
        .iter()
        .find(|p| p.port == port && p.protocol == Protocol::Tcp)?;
    Some(inputs.cluster_name(&svc.hostname, p, None))
}
