//! What an injected pod gets, with Istio's names, order and values.

use serde_json::{json, Map, Value};

use crate::config::InjectConfig;
use crate::{probes, InjectError};
use mesh_api::label;

/// The proxy's uid and gid (capture lets its own traffic through by them).
pub const PROXY_UID: u64 = 1337;
/// Envoy's Prometheus port, the agent's readiness port.
pub const PROMETHEUS_PORT: u16 = 15090;
pub const READINESS_PORT: u16 = 15021;

pub(crate) const PROXY: &str = "istio-proxy";
const ANN_TRAFFIC: &str = "traffic.sidecar.istio.io/";

/// The workload a pod belongs to: its namespace, name (the Deployment's, for a Deployment's
/// pods) and owner, as `ISTIO_META_WORKLOAD_NAME` and `ISTIO_META_OWNER` name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub name: String,
    /// `kubernetes://apis/<apiVersion>/namespaces/<ns>/<kinds>/<name>`.
    pub owner: String,
}

impl Workload {
    /// The workload of a pod object, as the webhook sees it: its controller's name with a
    /// ReplicaSet's hash taken off (`web-7d9c6b5f4` -> `web`), else the pod's name.
    pub fn of_pod(pod: &Value, namespace: &str) -> Workload {
        let meta = &pod["metadata"];
        let controller = meta["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["controller"] == Value::Bool(true));
        let (kind, api_version, name) = match controller {
            Some(o) => {
                let name = o["name"].as_str().unwrap_or_default().to_string();
                match o["kind"].as_str().unwrap_or_default() {
                    "ReplicaSet" => match name.rsplit_once('-') {
                        Some((deployment, _)) => ("Deployment", "apps/v1", deployment.to_string()),
                        None => ("ReplicaSet", "apps/v1", name),
                    },
                    "Job" => ("Job", "batch/v1", name),
                    kind => (kind, o["apiVersion"].as_str().unwrap_or("v1"), name),
                }
            }
            None => {
                let name = meta["name"]
                    .as_str()
                    .or_else(|| meta["generateName"].as_str())
                    .unwrap_or_default()
                    .trim_end_matches('-')
                    .to_string();
                ("Pod", "v1", name)
            }
        };
        Workload::new(namespace, kind, api_version, &name)
    }

    /// The workload `kind` `name` of `api_version` in `namespace`.
    pub fn new(namespace: &str, kind: &str, api_version: &str, name: &str) -> Workload {
        // Istio writes `apis/` for the core group too (`kubernetes://apis/v1/...`).
        Workload {
            namespace: namespace.to_string(),
            name: name.to_string(),
            owner: format!(
                "kubernetes://apis/{api_version}/namespaces/{namespace}/{}s/{name}",
                kind.to_ascii_lowercase()
            ),
        }
    }
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}})
}

fn resource_env(name: &str, resource: &str) -> Value {
    json!({"name": name, "valueFrom": {"resourceFieldRef": {"resource": resource, "divisor": "1"}}})
}

fn value_env(name: &str, value: &str) -> Value {
    json!({"name": name, "value": value})
}

pub(crate) fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["annotations"][key].as_str()
}

/// What an earlier injection recorded in its proxy container.
#[derive(Default)]
struct Previous {
    /// `ISTIO_KUBE_APP_PROBERS`: the app's own probes behind the rewritten ones.
    probers: Map<String, Value>,
    /// `ISTIO_PROMETHEUS_ANNOTATIONS`: the app's own scrape annotations.
    prometheus: Option<Map<String, Value>>,
}

/// Removes what an earlier injection added (the status annotation lists it) and puts back the
/// app's own scrape annotations, so injecting again gives what injecting once gave.
fn strip(pod: &mut Value, status_port: u16) -> Previous {
    let mut previous = Previous::default();
    let Some(status) =
        annotation(pod, label::SIDECAR_STATUS).and_then(|s| serde_json::from_str::<Value>(s).ok())
    else {
        return previous;
    };
    let names = |key: &str| -> Vec<String> {
        status[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    if let Some(proxy) = pod["spec"]["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == PROXY))
    {
        let recorded =
            |name: &str| serde_json::from_str::<Map<String, Value>>(env_value(proxy, name)?).ok();
        previous.probers = recorded("ISTIO_KUBE_APP_PROBERS").unwrap_or_default();
        previous.prometheus = recorded("ISTIO_PROMETHEUS_ANNOTATIONS");
    }
    for (list, key) in [
        ("initContainers", "initContainers"),
        ("containers", "containers"),
        ("volumes", "volumes"),
    ] {
        let gone = names(key);
        if let Some(items) = pod["spec"][list].as_array_mut() {
            items.retain(|c| !gone.iter().any(|g| c["name"].as_str() == Some(g.as_str())));
        }
    }
    let mut annotations = map_of(&pod["metadata"]["annotations"]);
    annotations.remove(label::SIDECAR_STATUS);
    if annotations
        .get("prometheus.io/port")
        .and_then(Value::as_str)
        == Some(status_port.to_string().as_str())
    {
        for key in ["scrape", "path", "port"] {
            annotations.remove(&format!("prometheus.io/{key}"));
        }
        for (key, value) in previous.prometheus.iter().flatten() {
            annotations.insert(format!("prometheus.io/{key}"), value.clone());
        }
    }
    pod["metadata"]["annotations"] = Value::Object(annotations);
    previous
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

/// The pod's own proxy configuration (`proxy.istio.io/config`, YAML or JSON) laid over the
/// mesh's `defaultConfig`.
pub const PROXY_CONFIG_ANNOTATION: &str = "proxy.istio.io/config";
/// The proxy's resources, by annotation: when any is set, they replace the values' resources.
const RESOURCE_ANNOTATIONS: [(&str, &str, &str); 4] = [
    ("sidecar.istio.io/proxyCPU", "requests", "cpu"),
    ("sidecar.istio.io/proxyMemory", "requests", "memory"),
    ("sidecar.istio.io/proxyCPULimit", "limits", "cpu"),
    ("sidecar.istio.io/proxyMemoryLimit", "limits", "memory"),
];

/// Lays `overlay` over `base`, objects key by key (as a ProtoBuf message merge does for the
/// fields the proxy configuration has), anything else replaced.
fn merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The configuration for this pod: the injector's, with the pod's proxy configuration and
/// resource annotations applied.
fn pod_config<'a>(
    pod: &Value,
    cfg: &'a InjectConfig,
) -> Result<std::borrow::Cow<'a, InjectConfig>, InjectError> {
    let own_config = annotation(pod, PROXY_CONFIG_ANNOTATION);
    let resources = RESOURCE_ANNOTATIONS
        .iter()
        .filter_map(|(key, kind, what)| annotation(pod, key).map(|v| (*key, *kind, *what, v)))
        .collect::<Vec<_>>();
    if own_config.is_none() && resources.is_empty() {
        return Ok(std::borrow::Cow::Borrowed(cfg));
    }
    let mut cfg = cfg.clone();
    if let Some(text) = own_config {
        let bad = |why: String| InjectError::BadAnnotation {
            annotation: PROXY_CONFIG_ANNOTATION.into(),
            value: text.into(),
            why,
        };
        let overlay: Value = serde_yaml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if !overlay.is_object() && !overlay.is_null() {
            return Err(bad("not a ProxyConfig mapping".into()));
        }
        merge(&mut cfg.proxy_config, &overlay);
        if cfg.proxy_config["holdApplicationUntilProxyStarts"] == Value::Bool(true) {
            cfg.hold_application = true;
        }
    }
    if !resources.is_empty() {
        let mut out = json!({});
        for (_, kind, what, value) in resources {
            out[kind][what] = Value::String(value.to_string());
        }
        cfg.resources = out;
    }
    Ok(std::borrow::Cow::Owned(cfg))
}

/// Injects `pod` (an object with `metadata` and `spec`: a Pod, or a workload's pod template)
/// and returns the injected pod.
pub fn inject(pod: &Value, workload: &Workload, cfg: &InjectConfig) -> Result<Value, InjectError> {
    if !pod.is_object() {
        return Err(InjectError::Shape {
            field: "the pod",
            expected: "an object",
        });
    }
    let mut pod = pod.clone();
    if !pod["metadata"].is_object() {
        pod["metadata"] = json!({});
    }
    if !pod["spec"].is_object() {
        return Err(InjectError::Shape {
            field: "spec",
            expected: "an object",
        });
    }
    let per_pod = pod_config(&pod, cfg)?;
    let cfg = &per_pod;
    if super::gateway::wants_gateway(&pod)? {
        return super::gateway::inject(pod, workload, cfg);
    }
    let status_port = match annotation(&pod, "status.sidecar.istio.io/port") {
        Some(p) => p.parse::<u16>().map_err(|_| InjectError::BadAnnotation {
            annotation: "status.sidecar.istio.io/port".into(),
            value: p.into(),
            why: "not a port number".into(),
        })?,
        None => cfg.status_port,
    };
    let previous = strip(&mut pod, status_port);
    let containers = pod["spec"]["containers"]
        .as_array()
        .filter(|c| !c.is_empty())
        .ok_or(InjectError::NoContainers)?
        .clone();
    if containers.iter().any(|c| c["name"] == PROXY) {
        // Istio merges a pod's own istio-proxy into its template (custom injection); this
        // injector has no templates to merge with.
        return Err(InjectError::Shape {
            field: "spec.containers",
            expected: "free of a container named istio-proxy (custom injection templates are not supported)",
        });
    }
    let app_names: Vec<String> = containers
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    let ports: Vec<Value> = containers
        .iter()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .collect();

    let rewrite = match annotation(&pod, "sidecar.istio.io/rewriteAppHTTPProbers") {
        Some(v) => v.eq_ignore_ascii_case("true"),
        None => cfg.rewrite_probes,
    };
    let mut probers = Map::new();
    if rewrite && status_port != 0 {
        for list in ["containers", "initContainers"] {
            if let Some(items) = pod["spec"][list].as_array_mut() {
                probers.extend(probes::rewrite(items, status_port, &previous.probers));
            }
        }
    }

    let mut proxy = proxy_container(&pod, workload, cfg, &app_names, &ports, status_port);
    if !probers.is_empty() {
        push_env(
            &mut proxy,
            value_env(
                "ISTIO_KUBE_APP_PROBERS",
                &Value::Object(probers).to_string(),
            ),
        );
    }
    prometheus_merge(&mut pod, &mut proxy, status_port);
    let init = init_container(&pod, cfg, status_port)?;

    // Containers: the proxy last, or first when the app must wait for it.
    let spec = &mut pod["spec"];
    if let Some(items) = spec["containers"].as_array_mut() {
        if cfg.hold_application {
            items.insert(0, proxy);
        } else {
            items.push(proxy);
        }
    }
    let mut init_names = Vec::new();
    if let Some(init) = init {
        init_names.push(init["name"].clone());
        let mut inits = spec["initContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if cfg.cni {
            inits.insert(0, init);
        } else {
            inits.push(init);
        }
        spec["initContainers"] = Value::Array(inits);
    }
    let added_volumes = volumes(cfg);
    let volume_names: Vec<Value> = added_volumes.iter().map(|v| v["name"].clone()).collect();
    let mut all_volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    all_volumes.extend(added_volumes);
    spec["volumes"] = Value::Array(all_volumes);

    let status = json!({
        "initContainers": init_names,
        "containers": [PROXY],
        "volumes": volume_names,
        "imagePullSecrets": null,
        "revision": cfg.revision_name(),
    });
    let first_app = app_names.first().cloned().unwrap_or_default();
    mark_injected(&mut pod, workload, cfg, &status, &first_app, true);
    Ok(pod)
}

/// The status annotation, the revision, the default container, and the labels Istio adds:
/// canonical name and revision, the network, and (`sidecar`) the mutual TLS and tunnel labels
/// that tell callers the pod's proxy takes Istio mutual TLS and HBONE.
pub(crate) fn mark_injected(
    pod: &mut Value,
    workload: &Workload,
    cfg: &InjectConfig,
    status: &Value,
    first_app: &str,
    sidecar: bool,
) {
    let meta = &mut pod["metadata"];
    let mut annotations = map_of(&meta["annotations"]);
    annotations.insert(label::SIDECAR_STATUS.into(), status.to_string().into());
    for key in [
        "kubectl.kubernetes.io/default-container",
        "kubectl.kubernetes.io/default-logs-container",
    ] {
        annotations
            .entry(key)
            .or_insert_with(|| Value::String(first_app.to_string()));
    }
    annotations.insert(label::REV.into(), cfg.revision_name().into());
    meta["annotations"] = Value::Object(annotations);
    let labels_now = meta["labels"].clone();
    let mut labels = map_of(&labels_now);
    // A proxy that takes HBONE says so to ztunnels (and istiod) with the tunnel label.
    let hbone =
        cfg.proxy_config["proxyMetadata"]["ISTIO_META_ENABLE_HBONE"].as_str() == Some("true");
    if sidecar {
        labels
            .entry("security.istio.io/tlsMode")
            .or_insert_with(|| "istio".into());
        if hbone {
            labels.entry(label::TUNNEL).or_insert_with(|| "http".into());
        }
    }
    let canonical_name = [label::APP_K8S_NAME, label::APP]
        .iter()
        .find_map(|k| labels_now[*k].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| workload.name.clone());
    let canonical_name: String = canonical_name.chars().take(63).collect();
    labels
        .entry(label::CANONICAL_NAME)
        .or_insert_with(|| canonical_name.trim_end_matches('-').into());
    let canonical_revision = [label::APP_K8S_VERSION, label::VERSION]
        .iter()
        .find_map(|k| labels_now[*k].as_str())
        .unwrap_or("latest")
        .to_string();
    labels
        .entry(label::CANONICAL_REVISION)
        .or_insert(canonical_revision.into());
    if let Some(network) = &cfg.network {
        labels
            .entry(label::NETWORK)
            .or_insert_with(|| network.clone().into());
    }
    meta["labels"] = Value::Object(labels);
}

/// A copy of the map at `v` (empty when it is not one), to be put back after editing.
pub(crate) fn map_of(v: &Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

fn push_env(container: &mut Value, env: Value) {
    if let Some(list) = container["env"].as_array_mut() {
        list.push(env);
    }
}

pub(crate) fn proxy_container(
    pod: &Value,
    workload: &Workload,
    cfg: &InjectConfig,
    app_names: &[String],
    ports: &[Value],
    status_port: u16,
) -> Value {
    let image = annotation(pod, "sidecar.istio.io/proxyImage")
        .filter(|i| i.contains('/'))
        .map_or_else(|| cfg.image(), str::to_string);
    let interception = annotation(pod, "sidecar.istio.io/interceptionMode").unwrap_or("REDIRECT");
    let workload_name = pod["metadata"]["labels"]["service.istio.io/workload-name"]
        .as_str()
        .unwrap_or(&workload.name);
    let mut env = vec![
        value_env("PILOT_CERT_PROVIDER", &cfg.pilot_cert_provider),
        value_env("CA_ADDR", &cfg.ca_address),
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("INSTANCE_IP", "status.podIP"),
        field_env("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        field_env("HOST_IP", "status.hostIP"),
        resource_env("ISTIO_CPU_LIMIT", "limits.cpu"),
        value_env("PROXY_CONFIG", &cfg.proxy_config.to_string()),
        value_env(
            "ISTIO_META_POD_PORTS",
            &Value::Array(ports.to_vec()).to_string(),
        ),
        value_env("ISTIO_META_APP_CONTAINERS", &app_names.join(",")),
        resource_env("GOMEMLIMIT", "limits.memory"),
        resource_env("GOMAXPROCS", "limits.cpu"),
        value_env("ISTIO_META_CLUSTER_ID", &cfg.cluster_id),
        field_env("ISTIO_META_NODE_NAME", "spec.nodeName"),
        value_env("ISTIO_META_INTERCEPTION_MODE", interception),
    ];
    if let Some(network) = &cfg.network {
        env.push(value_env("ISTIO_META_NETWORK", network));
    }
    env.extend([
        value_env("ISTIO_META_WORKLOAD_NAME", workload_name),
        value_env("ISTIO_META_OWNER", &workload.owner),
        value_env("ISTIO_META_MESH_ID", &cfg.mesh_id),
        value_env("TRUST_DOMAIN", &cfg.trust_domain),
    ]);
    if let Some(Value::Object(metadata)) = cfg.proxy_config.get("proxyMetadata") {
        for (k, v) in metadata {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            env.push(value_env(k, &v));
        }
    }
    let level = |key: &str, default: &str| annotation(pod, key).unwrap_or(default).to_string();
    let mut container = json!({
        "name": PROXY,
        "image": image,
        "args": [
            "proxy", "sidecar", "--domain",
            format!("$(POD_NAMESPACE).svc.{}", cfg.cluster_domain),
            format!("--proxyLogLevel={}", level("sidecar.istio.io/logLevel", &cfg.log_level)),
            format!("--proxyComponentLogLevel={}", level("sidecar.istio.io/componentLogLevel", &cfg.component_log_level)),
            format!("--log_output_level={}", level("sidecar.istio.io/agentLogLevel", &cfg.agent_log_level)),
        ],
        "ports": [{"containerPort": PROMETHEUS_PORT, "protocol": "TCP", "name": "http-envoy-prom"}],
        "env": env,
        "resources": cfg.resources,
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "privileged": false,
            "readOnlyRootFilesystem": true,
            "runAsGroup": PROXY_UID,
            "runAsNonRoot": true,
            "runAsUser": PROXY_UID,
        },
        "volumeMounts": [
            {"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"},
            {"name": "credential-socket", "mountPath": "/var/run/secrets/credential-uds"},
            {"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"},
            {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio"},
            {"name": "istio-data", "mountPath": "/var/lib/istio/data"},
            {"name": "istio-envoy", "mountPath": "/etc/istio/proxy"},
            {"name": "istio-token", "mountPath": "/var/run/secrets/tokens"},
            {"name": "istio-podinfo", "mountPath": "/etc/istio/pod"},
        ],
    });
    if status_port != 0 {
        let probe = |period: u32, failures: u32| {
            json!({"httpGet": {"path": "/healthz/ready", "port": READINESS_PORT},
                   "initialDelaySeconds": 0, "periodSeconds": period, "timeoutSeconds": 3,
                   "failureThreshold": failures})
        };
        container["startupProbe"] = probe(1, 600);
        container["readinessProbe"] = probe(15, 4);
    }
    if cfg.hold_application {
        container["lifecycle"] =
            json!({"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}});
    }
    container
}

/// Refuses `traffic.sidecar.istio.io/*` values the capture could not apply (as Istio's
/// injector does), so a bad range or port fails the pod's admission with the annotation named
/// rather than its init step or CNI ADD later.
fn validate_traffic_annotations(pod: &Value) -> Result<(), InjectError> {
    use mesh_capture::sidecar::{self as capture, ConfigError};
    type Check = fn(&str) -> Result<(), ConfigError>;
    let checks: [(&str, Check); 7] = [
        ("includeOutboundIPRanges", |v| {
            capture::parse_cidr_selection(v).map(drop)
        }),
        ("excludeOutboundIPRanges", |v| {
            capture::parse_exclude_cidrs(v, "excludeOutboundIPRanges").map(drop)
        }),
        ("includeInboundPorts", |v| {
            capture::parse_port_selection(v).map(drop)
        }),
        ("excludeInboundPorts", |v| capture::parse_ports(v).map(drop)),
        ("includeOutboundPorts", |v| {
            capture::parse_ports(v).map(drop)
        }),
        ("excludeOutboundPorts", |v| {
            capture::parse_ports(v).map(drop)
        }),
        ("excludeInterfaces", |v| {
            capture::parse_interfaces(v).map(drop)
        }),
    ];
    for (key, check) in checks {
        let name = format!("{ANN_TRAFFIC}{key}");
        if let Some(value) = annotation(pod, &name) {
            check(value).map_err(|e| InjectError::BadAnnotation {
                annotation: name.clone(),
                value: value.into(),
                why: e.to_string(),
            })?;
        }
    }
    Ok(())
}

/// `istio-init` (capture set up in the pod, as root with NET_ADMIN / NET_RAW), or with
/// cni-node `istio-validation` (checks the capture cni-node set up, as the proxy's user).
fn init_container(
    pod: &Value,
    cfg: &InjectConfig,
    status_port: u16,
) -> Result<Option<Value>, InjectError> {
    let traffic = |key: &str, default: &str| {
        annotation(pod, &format!("{ANN_TRAFFIC}{key}"))
            .unwrap_or(default)
            .to_string()
    };
    validate_traffic_annotations(pod)?;
    let interception = annotation(pod, "sidecar.istio.io/interceptionMode").unwrap_or("REDIRECT");
    match interception {
        "REDIRECT" | "TPROXY" => {}
        // No capture: no init step, as Istio's.
        "NONE" => return Ok(None),
        _ => {
            return Err(InjectError::BadAnnotation {
                annotation: "sidecar.istio.io/interceptionMode".into(),
                value: interception.into(),
                why: "expected REDIRECT, TPROXY or NONE".into(),
            })
        }
    }
    let mut excluded_inbound: Vec<String> = traffic("excludeInboundPorts", "")
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    for port in [PROMETHEUS_PORT, READINESS_PORT, status_port] {
        let port = port.to_string();
        if port != "0" && !excluded_inbound.contains(&port) {
            excluded_inbound.push(port);
        }
    }
    let mut args: Vec<String> = vec![
        "istio-iptables".into(),
        "-p".into(),
        mesh_capture::OUTBOUND_CAPTURE_PORT.to_string(),
        "-z".into(),
        mesh_capture::INBOUND_CAPTURE_PORT.to_string(),
        "-u".into(),
        PROXY_UID.to_string(),
        "-m".into(),
        interception.into(),
        "-i".into(),
        traffic("includeOutboundIPRanges", "*"),
        "-x".into(),
        traffic("excludeOutboundIPRanges", ""),
        "-b".into(),
        traffic("includeInboundPorts", "*"),
        "-d".into(),
        excluded_inbound.join(","),
    ];
    for (key, flag) in [
        ("includeOutboundPorts", "-q"),
        ("excludeOutboundPorts", "-o"),
        ("excludeInterfaces", "-c"),
    ] {
        let v = traffic(key, "");
        if !v.is_empty() {
            args.push(flag.into());
            args.push(v);
        }
    }
    args.push(format!("--log_output_level={}", cfg.agent_log_level));
    let image = cfg.image();
    Ok(Some(if cfg.cni {
        args.push("--run-validation".into());
        args.push("--skip-rule-apply".into());
        json!({
            "name": "istio-validation", "image": image, "args": args,
            "resources": cfg.resources,
            "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                "privileged": false, "readOnlyRootFilesystem": true,
                "runAsGroup": PROXY_UID, "runAsNonRoot": true, "runAsUser": PROXY_UID,
            },
        })
    } else {
        json!({
            "name": "istio-init", "image": image, "args": args,
            "resources": cfg.resources,
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
                "privileged": false, "readOnlyRootFilesystem": false,
                "runAsGroup": 0, "runAsNonRoot": false, "runAsUser": 0,
            },
        })
    }))
}

pub(crate) fn volumes(cfg: &InjectConfig) -> Vec<Value> {
    vec![
        json!({"name": "workload-socket", "emptyDir": {}}),
        json!({"name": "credential-socket", "emptyDir": {}}),
        json!({"name": "workload-certs", "emptyDir": {}}),
        json!({"name": "istio-envoy", "emptyDir": {"medium": "Memory"}}),
        json!({"name": "istio-data", "emptyDir": {}}),
        json!({"name": "istio-podinfo", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        ]}}),
        json!({"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
            "audience": cfg.token_audience, "expirationSeconds": 43200, "path": "istio-token"}}]}}),
        json!({"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}}),
    ]
}

/// Points Prometheus at the agent's merged metrics (15020 `/stats/prometheus`), handing the
/// app's own scrape annotations to the agent in `ISTIO_PROMETHEUS_ANNOTATIONS`; a pod that
/// opts out of scraping keeps its annotations.
fn prometheus_merge(pod: &mut Value, proxy: &mut Value, status_port: u16) {
    if status_port == 0 || annotation(pod, "prometheus.io/scrape") == Some("false") {
        return;
    }
    let mut app = Map::new();
    for key in ["scrape", "path", "port"] {
        if let Some(v) = annotation(pod, &format!("prometheus.io/{key}")) {
            app.insert(key.into(), v.into());
        }
    }
    if !app.is_empty() {
        push_env(
            proxy,
            value_env(
                "ISTIO_PROMETHEUS_ANNOTATIONS",
                &Value::Object(app).to_string(),
            ),
        );
    }
    let mut annotations = map_of(&pod["metadata"]["annotations"]);
    annotations.insert("prometheus.io/port".into(), status_port.to_string().into());
    annotations.insert("prometheus.io/path".into(), "/stats/prometheus".into());
    annotations.insert("prometheus.io/scrape".into(), "true".into());
    pod["metadata"]["annotations"] = Value::Object(annotations);
}

#[cfg(test)]
mod tests;
