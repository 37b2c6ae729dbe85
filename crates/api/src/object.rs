//! The closed set of objects the mesh reads, their keys and their decoding.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{
    ApiError, AuthorizationPolicy, Deployment, DestinationRule, EndpointSlice, Gateway,
    GatewayClass, GrpcRoute, HttpRoute, IstioGateway, Namespace, Node, ObjectMeta,
    PeerAuthentication, Pod, RequestAuthentication, Secret, Service, ServiceAccount, ServiceEntry,
    Sidecar, TcpRoute, VirtualService, WorkloadEntry,
};

/// The kinds of object the mesh reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    Namespace,
    Pod,
    Service,
    ServiceEntry,
    WorkloadEntry,
    AuthorizationPolicy,
    PeerAuthentication,
    Gateway,
    HttpRoute,
    Deployment,
    ServiceAccount,
    GatewayClass,
    VirtualService,
    DestinationRule,
    GrpcRoute,
    TcpRoute,
    Node,
    EndpointSlice,
    RequestAuthentication,
    Sidecar,
    /// `networking.istio.io` Gateway (the Gateway API's is [`Kind::Gateway`]).
    IstioGateway,
    /// Core v1 Secret (TLS credentials of gateways, `credentialName`).
    Secret,
}

impl Kind {
    /// Every kind, in a stable order.
    pub const ALL: [Kind; 22] = [
        Kind::Namespace,
        Kind::Pod,
        Kind::Service,
        Kind::ServiceEntry,
        Kind::WorkloadEntry,
        Kind::AuthorizationPolicy,
        Kind::PeerAuthentication,
        Kind::Gateway,
        Kind::HttpRoute,
        Kind::Deployment,
        Kind::ServiceAccount,
        Kind::GatewayClass,
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::GrpcRoute,
        Kind::TcpRoute,
        Kind::Node,
        Kind::EndpointSlice,
        Kind::RequestAuthentication,
        Kind::Sidecar,
        Kind::IstioGateway,
        Kind::Secret,
    ];

    /// Every kind with its `apiVersion`, for messages (`v1 Namespace, v1 Pod, ...`).
    pub fn names() -> String {
        Kind::ALL
            .iter()
            .map(|k| format!("{} {}", k.api_version(), k.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The Kubernetes `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::ServiceEntry => "ServiceEntry",
            Kind::WorkloadEntry => "WorkloadEntry",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::PeerAuthentication => "PeerAuthentication",
            Kind::Gateway => "Gateway",
            Kind::HttpRoute => "HTTPRoute",
            Kind::Deployment => "Deployment",
            Kind::ServiceAccount => "ServiceAccount",
            Kind::GatewayClass => "GatewayClass",
            Kind::VirtualService => "VirtualService",
            Kind::DestinationRule => "DestinationRule",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::TcpRoute => "TCPRoute",
            Kind::Node => "Node",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::RequestAuthentication => "RequestAuthentication",
            Kind::Sidecar => "Sidecar",
            Kind::IstioGateway => "Gateway",
            Kind::Secret => "Secret",
        }
    }

    /// API groups (without version) this kind is served under.
    fn group(self) -> &'static str {
        match self {
            Kind::Namespace
            | Kind::Pod
            | Kind::Service
            | Kind::ServiceAccount
            | Kind::Node
            | Kind::Secret => "",
            Kind::Deployment => "apps",
            Kind::EndpointSlice => "discovery.k8s.io",
            Kind::ServiceEntry
            | Kind::WorkloadEntry
            | Kind::VirtualService
            | Kind::DestinationRule
            | Kind::Sidecar
            | Kind::IstioGateway => "networking.istio.io",
            Kind::AuthorizationPolicy | Kind::PeerAuthentication | Kind::RequestAuthentication => {
                "security.istio.io"
            }
            Kind::Gateway
            | Kind::HttpRoute
            | Kind::GatewayClass
            | Kind::GrpcRoute
            | Kind::TcpRoute => "gateway.networking.k8s.io",
        }
    }

    /// Versions accepted for this kind's group.
    fn versions(self) -> &'static [&'static str] {
        match self {
            // Experimental channel only.
            Kind::TcpRoute => return &["v1alpha2"],
            Kind::GrpcRoute => return &["v1", "v1alpha2"],
            _ => {}
        }
        match self.group() {
            "" | "apps" | "discovery.k8s.io" => &["v1"],
            "networking.istio.io" => &["v1", "v1beta1", "v1alpha3"],
            "gateway.networking.k8s.io" => &["v1", "v1beta1"],
            _ => &["v1", "v1beta1"],
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Namespace | Kind::GatewayClass | Kind::Node)
    }

    /// The `apiVersion` objects of this kind are written with.
    pub fn api_version(self) -> String {
        match (self.group(), self.versions().first()) {
            ("", Some(v)) => (*v).to_string(),
            (group, Some(v)) => format!("{group}/{v}"),
            (group, None) => format!("{group}/v1"),
        }
    }

    /// Finds the kind for an `apiVersion`/`kind` pair.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind && k.group() == group && k.versions().contains(&version))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identity of an object: kind, namespace (empty for cluster-scoped kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.kind, self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// One typed object.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    Namespace(Box<Namespace>),
    Pod(Box<Pod>),
    Service(Box<Service>),
    ServiceEntry(Box<ServiceEntry>),
    WorkloadEntry(Box<WorkloadEntry>),
    AuthorizationPolicy(Box<AuthorizationPolicy>),
    PeerAuthentication(Box<PeerAuthentication>),
    Gateway(Box<Gateway>),
    HttpRoute(Box<HttpRoute>),
    Deployment(Box<Deployment>),
    ServiceAccount(Box<ServiceAccount>),
    GatewayClass(Box<GatewayClass>),
    VirtualService(Box<VirtualService>),
    DestinationRule(Box<DestinationRule>),
    GrpcRoute(Box<GrpcRoute>),
    TcpRoute(Box<TcpRoute>),
    Node(Box<Node>),
    EndpointSlice(Box<EndpointSlice>),
    RequestAuthentication(Box<RequestAuthentication>),
    Sidecar(Box<Sidecar>),
    IstioGateway(Box<IstioGateway>),
    Secret(Box<Secret>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Namespace(_) => Kind::Namespace,
            Object::Pod(_) => Kind::Pod,
            Object::Service(_) => Kind::Service,
            Object::ServiceEntry(_) => Kind::ServiceEntry,
            Object::WorkloadEntry(_) => Kind::WorkloadEntry,
            Object::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            Object::PeerAuthentication(_) => Kind::PeerAuthentication,
            Object::Gateway(_) => Kind::Gateway,
            Object::HttpRoute(_) => Kind::HttpRoute,
            Object::Deployment(_) => Kind::Deployment,
            Object::ServiceAccount(_) => Kind::ServiceAccount,
            Object::GatewayClass(_) => Kind::GatewayClass,
            Object::VirtualService(_) => Kind::VirtualService,
            Object::DestinationRule(_) => Kind::DestinationRule,
            Object::GrpcRoute(_) => Kind::GrpcRoute,
            Object::TcpRoute(_) => Kind::TcpRoute,
            Object::Node(_) => Kind::Node,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::RequestAuthentication(_) => Kind::RequestAuthentication,
            Object::Sidecar(_) => Kind::Sidecar,
            Object::IstioGateway(_) => Kind::IstioGateway,
            Object::Secret(_) => Kind::Secret,
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Namespace(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::ServiceEntry(o) => &o.metadata,
            Object::WorkloadEntry(o) => &o.metadata,
            Object::AuthorizationPolicy(o) => &o.metadata,
            Object::PeerAuthentication(o) => &o.metadata,
            Object::Gateway(o) => &o.metadata,
            Object::HttpRoute(o) => &o.metadata,
            Object::Deployment(o) => &o.metadata,
            Object::ServiceAccount(o) => &o.metadata,
            Object::GatewayClass(o) => &o.metadata,
            Object::VirtualService(o) => &o.metadata,
            Object::DestinationRule(o) => &o.metadata,
            Object::GrpcRoute(o) => &o.metadata,
            Object::TcpRoute(o) => &o.metadata,
            Object::Node(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::RequestAuthentication(o) => &o.metadata,
            Object::Sidecar(o) => &o.metadata,
            Object::IstioGateway(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
        }
    }

    /// The object's key. A namespaced object without `metadata.namespace` is in `default`,
    /// as `kubectl apply` would put it.
    pub fn key(&self) -> ObjectKey {
        let meta = self.metadata();
        let kind = self.kind();
        let namespace = if kind.namespaced() {
            meta.namespace.clone().unwrap_or_else(|| "default".into())
        } else {
            String::new()
        };
        ObjectKey::new(kind, namespace, meta.name.clone().unwrap_or_default())
    }

    /// Decodes one document (already parsed to JSON values) into a typed object.
    ///
    /// Fills in `metadata.namespace = default` for namespaced objects that omit it.
    pub fn from_value(value: serde_json::Value) -> Result<Object, ApiError> {
        let api_version = type_field(&value, "apiVersion")?;
        let kind_str = type_field(&value, "kind")?;
        let kind =
            Kind::from_type(&api_version, &kind_str).ok_or_else(|| ApiError::UnsupportedKind {
                api_version: api_version.clone(),
                kind: kind_str.clone(),
            })?;
        let name = value
            .pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .filter(|n| !n.is_empty())
            .ok_or(ApiError::MissingName { kind })?
            .to_string();
        let mut obj = match kind {
            Kind::Namespace => Object::Namespace(decode(kind, &name, value)?),
            Kind::Pod => Object::Pod(decode(kind, &name, value)?),
            Kind::Service => Object::Service(decode(kind, &name, value)?),
            Kind::ServiceEntry => Object::ServiceEntry(decode(kind, &name, value)?),
            Kind::WorkloadEntry => Object::WorkloadEntry(decode(kind, &name, value)?),
            Kind::AuthorizationPolicy => Object::AuthorizationPolicy(decode(kind, &name, value)?),
            Kind::PeerAuthentication => Object::PeerAuthentication(decode(kind, &name, value)?),
            Kind::Gateway => Object::Gateway(decode(kind, &name, value)?),
            Kind::HttpRoute => Object::HttpRoute(decode(kind, &name, value)?),
            Kind::Deployment => Object::Deployment(decode(kind, &name, value)?),
            Kind::ServiceAccount => Object::ServiceAccount(decode(kind, &name, value)?),
            Kind::GatewayClass => Object::GatewayClass(decode(kind, &name, value)?),
            Kind::VirtualService => Object::VirtualService(decode(kind, &name, value)?),
            Kind::DestinationRule => Object::DestinationRule(decode(kind, &name, value)?),
            Kind::GrpcRoute => Object::GrpcRoute(decode(kind, &name, value)?),
            Kind::TcpRoute => Object::TcpRoute(decode(kind, &name, value)?),
            Kind::Node => Object::Node(decode(kind, &name, value)?),
            Kind::EndpointSlice => Object::EndpointSlice(decode(kind, &name, value)?),
            Kind::RequestAuthentication => {
                Object::RequestAuthentication(decode(kind, &name, value)?)
            }
            Kind::Sidecar => Object::Sidecar(decode(kind, &name, value)?),
            Kind::IstioGateway => Object::IstioGateway(decode(kind, &name, value)?),
            Kind::Secret => Object::Secret(decode(kind, &name, value)?),
        };
        if kind.namespaced() {
            let meta = obj.metadata_mut();
            if meta.namespace.as_deref().is_none_or(str::is_empty) {
                meta.namespace = Some("default".into());
            }
        }
        Ok(obj)
    }

    /// This object with the `status` of `overlay` (the same key, read from a status store), for
    /// the kinds whose status the mesh writes or reads: Gateway, Deployment and Service. `None`
    /// for other kinds or a mismatched overlay.
    pub fn with_status_of(&self, overlay: &Object) -> Option<Object> {
        let merged = match (self, overlay) {
            (Object::Gateway(o), Object::Gateway(s)) => {
                let mut o = o.clone();
                o.status = s.status.clone();
                Object::Gateway(o)
            }
            (Object::Deployment(o), Object::Deployment(s)) => {
                let mut o = o.clone();
                o.status = s.status.clone();
                Object::Deployment(o)
            }
            (Object::Service(o), Object::Service(s)) => {
                let mut o = o.clone();
                o.status = s.status.clone();
                Object::Service(o)
            }
            _ => return None,
        };
        Some(merged)
    }

    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Object::Namespace(o) => &mut o.metadata,
            Object::Pod(o) => &mut o.metadata,
            Object::Service(o) => &mut o.metadata,
            Object::ServiceEntry(o) => &mut o.metadata,
            Object::WorkloadEntry(o) => &mut o.metadata,
            Object::AuthorizationPolicy(o) => &mut o.metadata,
            Object::PeerAuthentication(o) => &mut o.metadata,
            Object::Gateway(o) => &mut o.metadata,
            Object::HttpRoute(o) => &mut o.metadata,
            Object::Deployment(o) => &mut o.metadata,
            Object::ServiceAccount(o) => &mut o.metadata,
            Object::GatewayClass(o) => &mut o.metadata,
            Object::VirtualService(o) => &mut o.metadata,
            Object::DestinationRule(o) => &mut o.metadata,
            Object::GrpcRoute(o) => &mut o.metadata,
            Object::TcpRoute(o) => &mut o.metadata,
            Object::Node(o) => &mut o.metadata,
            Object::EndpointSlice(o) => &mut o.metadata,
            Object::RequestAuthentication(o) => &mut o.metadata,
            Object::Sidecar(o) => &mut o.metadata,
            Object::IstioGateway(o) => &mut o.metadata,
            Object::Secret(o) => &mut o.metadata,
        }
    }
}

fn type_field(value: &serde_json::Value, field: &'static str) -> Result<String, ApiError> {
    value
        .get(field)
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .ok_or(ApiError::MissingTypeField { field })
}

/// Deserializes with the failing field's path (e.g. `spec.ports[0].port`) in the error.
fn decode<T: serde::de::DeserializeOwned>(
    kind: Kind,
    name: &str,
    value: serde_json::Value,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|err| ApiError::InvalidField {
        kind,
        name: name.to_string(),
        path: err.path().to_string(),
        message: err.inner().to_string(),
    })
}
