//! What the waypoint generators read: plain data assembled by the model, no Kubernetes types
//! except the Gateway API route objects themselves.

use std::net::IpAddr;
use std::sync::Arc;

use mesh_api::{
    AuthorizationPolicy, DestinationRule, GrpcRoute, HttpRoute, RequestAuthentication, TcpRoute,
};
use serde::Serialize;

/// A waypoint: the Gateway's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct WaypointKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for WaypointKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How a service port is proxied, as Istio decides it from `appProtocol` or the port name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 (and HTTP/2 with prior knowledge or upgrade: the codec detects it).
    Http,
    /// HTTP/2 to the application.
    Http2,
    Grpc,
    /// Opaque TCP (also TLS, MySQL, Mongo, ...).
    Tcp,
}

impl Protocol {
    /// `appProtocol` wins over the port name's prefix (`http-web`, `grpc`, `tcp-db`); the
    /// default for an unnamed port is HTTP, which Istio sniffs (the HTTP codec then serves both
    /// HTTP/1.1 and HTTP/2 clients).
    pub fn detect(app_protocol: Option<&str>, port_name: Option<&str>) -> Protocol {
        let classify = |p: &str| -> Option<Protocol> {
            let p = p.to_ascii_lowercase();
            let p = p.strip_prefix("kubernetes.io/").unwrap_or(&p).to_string();
            match p.as_str() {
                "http" | "http1" | "http/1.1" => Some(Protocol::Http),
                "http2" | "h2c" | "h2" => Some(Protocol::Http2),
                "grpc" | "grpc-web" => Some(Protocol::Grpc),
                "tcp" | "tls" | "https" | "mysql" | "mongo" | "redis" => Some(Protocol::Tcp),
                _ => None,
            }
        };
        if let Some(p) = app_protocol.and_then(classify) {
            return p;
        }
        port_name
            .and_then(|n| classify(n.split('-').next().unwrap_or(n)))
            .unwrap_or(Protocol::Http)
    }

    /// `http` or `tcp`: the protocol part of cluster and chain names.
    pub fn family(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            _ => "http",
        }
    }

    /// Whether the upstream (the application) speaks HTTP/2.
    pub fn upstream_h2(self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc)
    }
}

/// One port of a bound service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServicePort {
    pub port: u16,
    pub name: Option<String>,
    pub protocol: Protocol,
}

/// One pod (or WorkloadEntry) behind a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    pub ip: IpAddr,
    /// Service port -> the port the workload listens on.
    pub target_ports: Vec<(u16, u16)>,
    pub healthy: bool,
    /// The workload's labels (for DestinationRule subsets and route backends).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Who it is, for telemetry: `workload;namespace;canonical service;canonical
    /// revision;cluster` (Istio's endpoint metadata format) and its SPIFFE identity.
    pub workload: String,
    pub principal: String,
    /// Whether the workload has a sidecar (its pod's `security.istio.io/tlsMode` label is
    /// `istio`): a sidecar calls it with Istio mutual TLS.
    pub sidecar: bool,
    /// Whether it takes HBONE on 15008 (an ambient pod, or a sidecar that listens for it).
    pub hbone: bool,
}

impl Endpoint {
    /// The workload port serving `service_port` (the service port itself when unmapped).
    pub fn target_port(&self, service_port: u16) -> Option<u16> {
        self.target_ports
            .iter()
            .find(|(sp, _)| *sp == service_port)
            .map(|(_, tp)| if *tp == 0 { service_port } else { *tp })
    }
}

/// A service whose traffic goes through the waypoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoundService {
    pub namespace: String,
    pub name: String,
    /// `<name>.<namespace>.svc.<suffix>` (or a ServiceEntry host).
    pub hostname: String,
    pub vips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    pub endpoints: Vec<Endpoint>,
    /// HTTPRoutes whose parentRefs name this service, ordered by name.
    #[serde(skip)]
    pub routes: Vec<Arc<HttpRoute>>,
    /// GRPCRoutes whose parentRefs name this service, ordered by name (HTTP ports).
    #[serde(skip)]
    pub grpc_routes: Vec<Arc<GrpcRoute>>,
    /// TCPRoutes whose parentRefs name this service, ordered by name (TCP ports).
    #[serde(skip)]
    pub tcp_routes: Vec<Arc<TcpRoute>>,
    /// The DestinationRule in force for the host, merged as Istio merges several (subsets of
    /// all of them, the first traffic policy).
    pub destination_rule: Option<Arc<DestinationRule>>,
    /// VirtualServices whose `hosts` name the service (used when no HTTPRoute attaches).
    pub virtual_services: Vec<Arc<mesh_api::VirtualService>>,
    /// AuthorizationPolicies attached to this service or to the waypoint (by `targetRefs`).
    #[serde(skip)]
    pub policies: Vec<WaypointPolicy>,
    /// RequestAuthentications attached the same way: the JWTs the waypoint checks.
    #[serde(skip)]
    pub request_authns: Vec<WaypointRequestAuthn>,
}

/// An Istio policy in force on a waypoint for a service.
#[derive(Debug, Clone, PartialEq)]
pub struct Attached<T> {
    /// `namespace/name`.
    pub key: String,
    pub policy: Arc<T>,
}

/// An AuthorizationPolicy in force on a waypoint for a service.
pub type WaypointPolicy = Attached<AuthorizationPolicy>;
/// A RequestAuthentication in force on a waypoint for a service.
pub type WaypointRequestAuthn = Attached<RequestAuthentication>;

/// Whose proxy the services are configured for; it decides the names of their clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// A waypoint: `inbound-vip|<port>|<http|tcp>[/<subset>]|<host>`, reached through HBONE.
    #[default]
    Waypoint,
    /// A sidecar's outbound side: `outbound|<port>|<subset>|<host>`, reached directly, or
    /// with `send_hbone` through HBONE where the endpoint takes it and has no sidecar;
    /// `registry_only`: destinations it has no configuration for reach the black hole.
    Sidecar {
        send_hbone: bool,
        registry_only: bool,
    },
}

/// Everything one waypoint's configuration depends on (or, with [`Flavor::Sidecar`], the
/// outbound side of a sidecar: the services it may call).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaypointInputs {
    pub key: WaypointKey,
    pub flavor: Flavor,
    pub trust_domain: String,
    pub domain_suffix: String,
    /// The access log file (empty: none).
    pub access_log_file: String,
    /// Sorted by hostname.
    pub services: Vec<BoundService>,
}

impl WaypointInputs {
    /// The cluster of `hostname`'s `port` (and DestinationRule `subset`), named for the flavor.
    pub fn cluster_name(&self, hostname: &str, port: &ServicePort, subset: Option<&str>) -> String {
        use super::names;
        match (self.flavor, subset) {
            (Flavor::Waypoint, None) => {
                names::vip_cluster(port.port, port.protocol.family(), hostname)
            }
            (Flavor::Waypoint, Some(s)) => {
                names::vip_subset_cluster(port.port, port.protocol.family(), s, hostname)
            }
            (Flavor::Sidecar { .. }, s) => {
                names::outbound_cluster(port.port, s.unwrap_or(""), hostname)
            }
        }
    }

    /// The bound service with this `namespace` and `name`, if any.
    pub fn service(&self, namespace: &str, name: &str) -> Option<&BoundService> {
        self.services
            .iter()
            .find(|s| s.namespace == namespace && s.name == name)
    }
}
