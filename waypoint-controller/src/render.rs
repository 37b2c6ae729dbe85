//! The objects a waypoint Gateway becomes, as Istio's `waypoint` template renders them: a
//! ServiceAccount, a Deployment running `pilot-agent proxy waypoint`, and a Service with the
//! status port and one port per listener. Each has an owner reference to the Gateway and the
//! labels naming it; the controller's managed label marks what it may change later.

use std::collections::BTreeMap;

use mesh_api::{Gateway, GATEWAY_NAME_LABEL};
use serde_json::{json, Value};

/// The label naming a Gateway's class, on every object made for it.
pub const GATEWAY_CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";
/// The label marking objects the controller manages, and its value for waypoints.
pub const MANAGED_LABEL: &str = "gateway.istio.io/managed";
pub const MANAGED_VALUE: &str = "istio.io-mesh-controller";
/// The field manager Istio's deployment controller applies with.
pub const FIELD_MANAGER: &str = "istio.io/gateway-controller";
/// Annotations a Gateway may carry to rename what is made for it.
pub const NAME_OVERRIDE: &str = "gateway.istio.io/name-override";
pub const SERVICE_ACCOUNT_OVERRIDE: &str = "gateway.istio.io/service-account";
/// The readiness port (Envoy's, forwarded to pilot-agent), a Service port of every waypoint.
pub const STATUS_PORT: u16 = 15021;

/// Annotations never copied from the Gateway onto what is made for it.
const OMITTED_ANNOTATIONS: [&str; 4] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    NAME_OVERRIDE,
    SERVICE_ACCOUNT_OVERRIDE,
    "gateway.istio.io/controller-version",
];

/// Install-wide settings of the template (Istio's `global.*` values).
#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// `global.hub` and `global.tag`: the proxy image is `<hub>/proxyv2:<tag>`.
    pub hub: String,
    pub tag: String,
    /// `global.proxy.clusterDomain`.
    pub cluster_domain: String,
    /// Where the proxy reaches istiod's CA and xDS (`istiod.istio-system.svc:15012`).
    pub discovery_address: String,
    /// `global.multiCluster.clusterName`.
    pub cluster_id: String,
    /// The mesh's trust domain.
    pub trust_domain: String,
    /// `global.proxy.logLevel`.
    pub proxy_log_level: String,
    /// The control plane revision (`istio.io/rev` on the pods).
    pub revision: String,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            hub: "localhost/mesh".into(),
            tag: env!("CARGO_PKG_VERSION").into(),
            cluster_domain: "cluster.local".into(),
            discovery_address: "istiod.istio-system.svc:15012".into(),
            cluster_id: "Kubernetes".into(),
            trust_domain: "cluster.local".into(),
            proxy_log_level: "warning".into(),
            revision: "default".into(),
        }
    }
}

/// Names of what a Gateway becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub namespace: String,
    pub gateway: String,
    /// The Deployment and Service (the Gateway's name unless overridden).
    pub deployment: String,
    pub service_account: String,
}

impl Names {
    pub fn of(gw: &Gateway) -> Names {
        let annotations = gw.metadata.annotations.clone().unwrap_or_default();
        let gateway = gw.metadata.name.clone().unwrap_or_default();
        let deployment = annotations
            .get(NAME_OVERRIDE)
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| gateway.clone());
        let service_account = annotations
            .get(SERVICE_ACCOUNT_OVERRIDE)
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| deployment.clone());
        Names {
            namespace: gw.metadata.namespace.clone().unwrap_or_default(),
            gateway,
            deployment,
            service_account,
        }
    }

    /// The Service's cluster hostname, e.g. `waypoint.shop.svc.cluster.local`.
    pub fn hostname(&self, domain: &str) -> String {
        format!("{}.{}.svc.{domain}", self.deployment, self.namespace)
    }
}

/// The ServiceAccount, Deployment and Service for `gw`, in apply order.
pub fn render(gw: &Gateway, opts: &RenderOptions) -> [Value; 3] {
    let names = Names::of(gw);
    let common = Common::new(gw, &names);
    [
        service_account(&common, &names),
        deployment(&common, &names, opts),
        service(&common, gw, &names),
    ]
}

/// What every object shares: labels, annotations and the owner reference.
struct Common {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner: Value,
}

impl Common {
    fn new(gw: &Gateway, names: &Names) -> Common {
        let infra = gw.spec.infrastructure.clone().unwrap_or_default();
        let mut labels = infra.labels;
        labels.insert(GATEWAY_NAME_LABEL.into(), names.gateway.clone());
        labels.insert(
            GATEWAY_CLASS_LABEL.into(),
            gw.spec.gateway_class_name.clone(),
        );
        labels.insert(MANAGED_LABEL.into(), MANAGED_VALUE.into());
        let mut annotations = infra.annotations;
        annotations.retain(|k, _| !OMITTED_ANNOTATIONS.contains(&k.as_str()));
        let owner = json!([{
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "name": names.gateway,
            "uid": gw.metadata.uid.clone().unwrap_or_default(),
        }]);
        Common {
            labels,
            annotations,
            owner,
        }
    }

    fn metadata(&self, name: &str, namespace: &str, annotations: &[(&str, &str)]) -> Value {
        let mut all = self.annotations.clone();
        all.extend(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        json!({
            "name": name,
            "namespace": namespace,
            "labels": self.labels,
            "annotations": all,
            "ownerReferences": self.owner,
        })
    }
}

fn service_account(c: &Common, names: &Names) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": c.metadata(&names.service_account, &names.namespace, &[]),
    })
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
}

fn value_env(name: &str, value: &str) -> Value {
    json!({"name": name, "value": value})
}

fn deployment(c: &Common, names: &Names, opts: &RenderOptions) -> Value {
    let mut pod_labels: BTreeMap<String, String> = BTreeMap::from([
        ("sidecar.istio.io/inject".into(), "false".into()),
        ("istio.io/dataplane-mode".into(), "none".into()),
        (
            "service.istio.io/canonical-name".into(),
            names.deployment.clone(),
        ),
        (
            "service.istio.io/canonical-revision".into(),
            "latest".into(),
        ),
    ]);
    pod_labels.extend(c.labels.clone());
    let mut pod_annotations = c.annotations.clone();
    for (k, v) in [
        ("istio.io/rev", opts.revision.as_str()),
        ("prometheus.io/path", "/stats/prometheus"),
        ("prometheus.io/port", "15020"),
        ("prometheus.io/scrape", "true"),
    ] {
        pod_annotations.insert(k.into(), v.into());
    }
    let proxy_config = json!({ "discoveryAddress": opts.discovery_address }).to_string();
    let owner = format!(
        "kubernetes://apis/apps/v1/namespaces/{}/deployments/{}",
        names.namespace, names.deployment
    );
    let env = json!([
        field_env("ISTIO_META_SERVICE_ACCOUNT", "spec.serviceAccountName"),
        field_env("ISTIO_META_NODE_NAME", "spec.nodeName"),
        value_env("PILOT_CERT_PROVIDER", "istiod"),
        value_env("CA_ADDR", &opts.discovery_address),
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("INSTANCE_IP", "status.podIP"),
        field_env("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        field_env("HOST_IP", "status.hostIP"),
        value_env("PROXY_CONFIG", &proxy_config),
        value_env("ISTIO_META_CLUSTER_ID", &opts.cluster_id),
        value_env("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"),
        value_env("ISTIO_META_WORKLOAD_NAME", &names.deployment),
        value_env("ISTIO_META_OWNER", &owner),
        value_env("ISTIO_META_MESH_ID", &opts.trust_domain),
        value_env("TRUST_DOMAIN", &opts.trust_domain),
    ]);
    let probe = |failure: u32, period: u32, delay: u32| {
        json!({
            "failureThreshold": failure,
            "httpGet": {"path": "/healthz/ready", "port": STATUS_PORT, "scheme": "HTTP"},
            "initialDelaySeconds": delay,
            "periodSeconds": period,
            "successThreshold": 1,
            "timeoutSeconds": 1,
        })
    };
    let container = json!({
        "name": "istio-proxy",
        "image": format!("{}/proxyv2:{}", opts.hub, opts.tag),
        "ports": [
            {"containerPort": 15020, "name": "metrics", "protocol": "TCP"},
            {"containerPort": STATUS_PORT, "name": "status-port", "protocol": "TCP"},
            {"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"},
        ],
        "args": [
            "proxy", "waypoint",
            "--domain", format!("$(POD_NAMESPACE).svc.{}", opts.cluster_domain),
            "--serviceCluster", format!("{}.$(POD_NAMESPACE)", names.service_account),
            "--proxyLogLevel", opts.proxy_log_level,
        ],
        "env": env,
        "startupProbe": probe(30, 1, 1),
        "readinessProbe": probe(4, 15, 0),
        "securityContext": {
            "privileged": false,
            "runAsGroup": 1337,
            "runAsUser": 1337,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"mountPath": "/var/run/secrets/workload-spiffe-uds", "name": "workload-socket"},
            {"mountPath": "/var/run/secrets/istio", "name": "istiod-ca-cert"},
            {"mountPath": "/var/lib/istio/data", "name": "istio-data"},
            {"mountPath": "/etc/istio/proxy", "name": "istio-envoy"},
            {"mountPath": "/var/run/secrets/tokens", "name": "istio-token"},
            {"mountPath": "/etc/istio/pod", "name": "istio-podinfo"},
        ],
    });
    let volumes = json!([
        {"name": "workload-socket", "emptyDir": {}},
        {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
        {"name": "istio-data", "emptyDir": {}},
        {"name": "istio-podinfo", "downwardAPI": {"items": [
            {"fieldRef": {"fieldPath": "metadata.labels"}, "path": "labels"},
            {"fieldRef": {"fieldPath": "metadata.annotations"}, "path": "annotations"},
        ]}},
        {"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
            "audience": "istio-ca", "expirationSeconds": 43200, "path": "istio-token"}}]}},
        {"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}},
    ]);
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": c.metadata(&names.deployment, &names.namespace, &[]),
        "spec": {
            "selector": {"matchLabels": {GATEWAY_NAME_LABEL: names.gateway}},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": pod_annotations},
                "spec": {
                    "serviceAccountName": names.service_account,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    })
}

/// The status port, then one port per distinct listener port (`appProtocol` is the
/// listener's protocol in lower case, so `hbone` for the mesh listener).
fn service_ports(gw: &Gateway) -> Vec<Value> {
    let mut ports = vec![json!({
        "name": "status-port", "port": STATUS_PORT, "protocol": "TCP", "appProtocol": "tcp",
    })];
    let mut seen = Vec::new();
    for (i, l) in gw.spec.listeners.iter().enumerate() {
        if seen.contains(&l.port) {
            continue;
        }
        seen.push(l.port);
        let protocol = l.protocol.to_ascii_lowercase();
        let name = if l.name.is_empty() {
            format!("{protocol}-{i}")
        } else {
            l.name.clone()
        };
        ports.push(json!({
            "name": name, "port": l.port, "protocol": "TCP", "appProtocol": protocol,
        }));
    }
    ports
}

fn service(c: &Common, gw: &Gateway, names: &Names) -> Value {
    let metadata = c.metadata(
        &names.deployment,
        &names.namespace,
        &[("networking.istio.io/traffic-distribution", "PreferClose")],
    );
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "ipFamilyPolicy": "PreferDualStack",
            "ports": service_ports(gw),
            "selector": {GATEWAY_NAME_LABEL: names.gateway},
            "type": "ClusterIP",
        },
    })
}
