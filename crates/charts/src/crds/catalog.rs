//! The Istio CRDs the base chart installs: names, versions and columns as Istio's own, and
//! which of the project's API types gives each spec its schema.

use schemars::{JsonSchema, Schema, SchemaGenerator};

use mesh_api::{
    AuthorizationPolicySpec, DestinationRuleSpec, IstioGatewaySpec, PeerAuthenticationSpec,
    RequestAuthenticationSpec, ServiceEntrySpec, SidecarSpec, VirtualServiceSpec,
    WorkloadEntrySpec,
};

/// A printer column (`kubectl get` shows it).
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    pub json_path: &'static str,
    pub description: &'static str,
}

/// Age, which every Istio CRD but three shows last (WorkloadEntry shows it first).
pub const AGE: Column = Column {
    name: "Age",
    json_path: ".metadata.creationTimestamp",
    description: "When the object was created.",
};

/// One CRD.
#[derive(Debug, Clone, Copy)]
pub struct Crd {
    pub group: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub short_names: &'static [&'static str],
    /// Served versions, in Istio's order.
    pub versions: &'static [&'static str],
    /// The version objects are stored at.
    pub storage: &'static str,
    pub columns: &'static [Column],
    /// The spec's schema from the project's types; `None` for kinds the mesh does not read,
    /// whose spec is kept as written.
    pub spec: Option<fn(&mut SchemaGenerator) -> Schema>,
    /// Whether an object must have a spec.
    pub spec_required: bool,
    /// Whether `helm uninstall` keeps it (`helm.sh/resource-policy: keep`).
    pub keep: bool,
    pub description: &'static str,
}

impl Crd {
    pub fn name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// The kind in lower case, as Kubernetes names the singular.
    pub fn singular(&self) -> String {
        self.kind.to_ascii_lowercase()
    }
}

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

const NETWORKING: &str = "networking.istio.io";
const SECURITY: &str = "security.istio.io";
const EXTENSIONS: &str = "extensions.istio.io";
const TELEMETRY: &str = "telemetry.istio.io";
const NETWORKING_VERSIONS: &[&str] = &["v1", "v1alpha3", "v1beta1"];
const SECURITY_VERSIONS: &[&str] = &["v1", "v1beta1"];

/// Every CRD, in the order the generated file lists them.
pub const CRDS: [Crd; 15] = [
    Crd {
        group: EXTENSIONS,
        kind: "WasmPlugin",
        plural: "wasmplugins",
        short_names: &[],
        versions: &["v1alpha1"],
        storage: "v1alpha1",
        columns: &[AGE],
        spec: None,
        spec_required: true,
        keep: true,
        description: "Extends a proxy with a WebAssembly module.",
    },
    Crd {
        group: EXTENSIONS,
        kind: "TrafficExtension",
        plural: "trafficextensions",
        short_names: &[],
        versions: &["v1alpha1"],
        storage: "v1alpha1",
        columns: &[AGE],
        spec: None,
        spec_required: true,
        keep: true,
        description: "Extends a proxy's traffic handling with a Wasm or Lua filter.",
    },
    Crd {
        group: NETWORKING,
        kind: "DestinationRule",
        plural: "destinationrules",
        short_names: &["dr"],
        versions: NETWORKING_VERSIONS,
        storage: "v1",
        columns: &[
            Column {
                name: "Host",
                json_path: ".spec.host",
                description: "The service the rule applies to.",
            },
            AGE,
        ],
        spec: Some(schema::<DestinationRuleSpec>),
        spec_required: false,
        keep: true,
        description: "Policies applied to traffic for a service after routing.",
    },
    Crd {
        group: NETWORKING,
        kind: "EnvoyFilter",
        plural: "envoyfilters",
        short_names: &[],
        versions: &["v1alpha3"],
        storage: "v1alpha3",
        columns: &[],
        spec: None,
        spec_required: false,
        keep: true,
        description: "Patches to the Envoy configuration istiod generates.",
    },
    Crd {
        group: NETWORKING,
        kind: "Gateway",
        plural: "gateways",
        short_names: &["gw"],
        versions: NETWORKING_VERSIONS,
        storage: "v1",
        columns: &[],
        spec: Some(schema::<IstioGatewaySpec>),
        spec_required: false,
        keep: true,
        description: "A load balancer at the edge of the mesh (Istio's own Gateway kind).",
    },
    Crd {
        group: NETWORKING,
        kind: "ProxyConfig",
        plural: "proxyconfigs",
        short_names: &[],
        versions: &["v1beta1"],
        storage: "v1beta1",
        columns: &[],
        spec: None,
        spec_required: false,
        keep: true,
        description: "Per-workload proxy settings.",
    },
    Crd {
        group: NETWORKING,
        kind: "ServiceEntry",
        plural: "serviceentries",
        short_names: &["se"],
        versions: NETWORKING_VERSIONS,
        storage: "v1",
        columns: &[
            Column {
                name: "Hosts",
                json_path: ".spec.hosts",
                description: "The hosts of the service.",
            },
            Column {
                name: "Location",
                json_path: ".spec.location",
                description: "MESH_EXTERNAL or MESH_INTERNAL.",
            },
            Column {
                name: "Resolution",
                json_path: ".spec.resolution",
                description: "How the hosts resolve: NONE, STATIC or DNS.",
            },
            AGE,
        ],
        spec: Some(schema::<ServiceEntrySpec>),
        spec_required: true,
        keep: true,
        description: "A service the mesh does not discover on its own.",
    },
    Crd {
        group: NETWORKING,
        kind: "Sidecar",
        plural: "sidecars",
        short_names: &[],
        versions: NETWORKING_VERSIONS,
        storage: "v1",
        columns: &[],
        spec: Some(schema::<SidecarSpec>),
        spec_required: false,
        keep: true,
        description: "What a sidecar proxy receives and accepts.",
    },
    Crd {
        group: NETWORKING,
        kind: "VirtualService",
        plural: "virtualservices",
        short_names: &["vs"],
        versions: NETWORKING_VERSIONS,
        storage: "v1",
        columns: &[
            Column {
                name: "Gateways",
                json_path: ".spec.gateways",
                description: "The gateways and sidecars the routes apply to.",
            },
            Column {
                name: "Hosts",
                json_path: ".spec.hosts",
                description: "The hosts the routes apply to.",
            },
            AGE,
        ],
        spec: Some(schema::<VirtualServiceSpec>),
        spec_required: false,
        keep: true,
        description: "Routing rules for traffic to a host.",
    },
    Crd {
        group: NETWORKING,
        kind: "WorkloadEntry",
        plural: "workloadentries",
        short_names: &["we"],
        versions: NETWORKING_VERSIONS,
        storage: "v1",
        columns: &[
            AGE,
            Column {
                name: "Address",
                json_path: ".spec.address",
                description: "The workload's address.",
            },
        ],
        spec: Some(schema::<WorkloadEntrySpec>),
        spec_required: true,
        keep: true,
        description: "A workload that is not a pod (a VM, a bare-metal host).",
    },
    Crd {
        group: NETWORKING,
        kind: "WorkloadGroup",
        plural: "workloadgroups",
        short_names: &["wg"],
        versions: NETWORKING_VERSIONS,
        storage: "v1",
        columns: &[AGE],
        spec: None,
        spec_required: true,
        keep: false,
        description: "A template for WorkloadEntries.",
    },
    Crd {
        group: SECURITY,
        kind: "AuthorizationPolicy",
        plural: "authorizationpolicies",
        short_names: &["ap"],
        versions: SECURITY_VERSIONS,
        storage: "v1",
        columns: &[
            Column {
                name: "Action",
                json_path: ".spec.action",
                description: "What the policy does to matching requests.",
            },
            AGE,
        ],
        spec: Some(schema::<AuthorizationPolicySpec>),
        spec_required: false,
        keep: true,
        description: "Access control for workloads and waypoints.",
    },
    Crd {
        group: SECURITY,
        kind: "PeerAuthentication",
        plural: "peerauthentications",
        short_names: &["pa"],
        versions: SECURITY_VERSIONS,
        storage: "v1",
        columns: &[
            Column {
                name: "Mode",
                json_path: ".spec.mtls.mode",
                description: "The mTLS mode.",
            },
            AGE,
        ],
        spec: Some(schema::<PeerAuthenticationSpec>),
        spec_required: false,
        keep: true,
        description: "Whether workloads accept plaintext or only mutual TLS.",
    },
    Crd {
        group: SECURITY,
        kind: "RequestAuthentication",
        plural: "requestauthentications",
        short_names: &["ra"],
        versions: SECURITY_VERSIONS,
        storage: "v1",
        columns: &[],
        spec: Some(schema::<RequestAuthenticationSpec>),
        spec_required: false,
        keep: true,
        description: "Which JSON Web Tokens a workload or waypoint accepts.",
    },
    Crd {
        group: TELEMETRY,
        kind: "Telemetry",
        plural: "telemetries",
        short_names: &["telemetry"],
        // Istio still stores v1alpha1 and serves v1 beside it.
        versions: &["v1", "v1alpha1"],
        storage: "v1alpha1",
        columns: &[AGE],
        spec: None,
        spec_required: false,
        keep: true,
        description: "Metrics, access logs and tracing for workloads.",
    },
];
