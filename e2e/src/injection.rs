//! Pods with a sidecar as a cluster gets them: the Pod the harness would create goes through
//! the real injector (`mesh_inject`, as istiod's webhook runs it) with the istiod chart's values,
//! and the injected Pod is what the local API server holds (so cni-node sees its `istio-proxy`
//! and `istio-validation` containers). [`start_sidecar`] then runs its init step (unless cni-node
//! wrote the capture) and its `istio-proxy` container as the kubelet would.

use mesh_api::k8s_openapi::api::core::v1::Pod;
use mesh_inject::{inject, InjectConfig, Workload};
use serde_json::Value;

use crate::bins::binary;
use crate::cluster::{MeshPod, PodSpec};
use crate::istiod::Istiod;
use crate::waypoint::Waypoint;

/// The istiod chart's values as the ambient profile renders them for the injector (its proxy
/// metadata `ISTIO_META_ENABLE_HBONE`, so sidecars take HBONE), with the local istiod as
/// discovery address (the harness resolves it); `cni`: cni-node writes the capture
/// (`istio-validation`) instead of the `istio-init` step.
pub fn ambient_values(cni: bool) -> Value {
    serde_json::json!({
        "istio_cni": {"enabled": cni},
        "meshConfig": {"defaultConfig": {
            "discoveryAddress": "istiod.istio-system.svc:15012",
            "proxyMetadata": {"ISTIO_META_ENABLE_HBONE": "true"},
            "drainDuration": "2s",
        }},
    })
}

/// `spec` injected with the injector configured by `values` (the istiod chart's values, e.g.
/// `{"istio_cni": {"enabled": true}}` for cni-node's capture, or the ambient profile's proxy
/// metadata); panics with the injector's reason if it refuses the pod.
pub fn injected(spec: PodSpec, values: &Value) -> PodSpec {
    let pod: Value = serde_yaml::from_str(&spec.yaml(None)).expect("the harness's pod is YAML");
    inject_into(spec, pod, values)
}

/// The pod of a workload rendered by a chart (its `template`: labels, annotations, security
/// context and containers laid on the harness's pod for `spec`), through the real injector,
/// which picks the template the pod asks for (e.g. the gateway chart's `gateway`).
pub fn injected_from_template(spec: PodSpec, template: &Value, values: &Value) -> PodSpec {
    let mut pod: Value = serde_yaml::from_str(&spec.yaml(None)).expect("the harness's pod is YAML");
    for field in ["labels", "annotations"] {
        if let Some(map) = template["metadata"][field].as_object() {
            if !pod["metadata"][field].is_object() {
                pod["metadata"][field] = serde_json::json!({});
            }
            for (k, v) in map {
                pod["metadata"][field][k] = v.clone();
            }
        }
    }
    for field in ["containers", "securityContext", "volumes"] {
        if let Some(v) = template["spec"].get(field) {
            pod["spec"][field] = v.clone();
        }
    }
    inject_into(spec, pod, values)
}

fn inject_into(spec: PodSpec, pod: Value, values: &Value) -> PodSpec {
    let cfg = InjectConfig::from_values(values);
    let workload = Workload::of_pod(&pod, &spec.namespace);
    let out = inject(&pod, &workload, &cfg).unwrap_or_else(|e| panic!("inject {}: {e}", spec.name));
    let mut spec = spec;
    let meta = &out["metadata"];
    for (field, into) in [
        ("labels", &mut spec.labels),
        ("annotations", &mut spec.annotations),
    ] {
        if let Some(map) = meta[field].as_object() {
            for (k, v) in map {
                into.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
            }
        }
    }
    spec.object = Some(out);
    spec
}

/// Starts an injected pod's sidecar: its `istio-init` init container (`pilot-agent
/// istio-iptables ...` in the pod's namespace), unless the pod has cni-node's
/// `istio-validation` instead, then its `istio-proxy` container, as the user it runs as.
pub fn start_sidecar(pod: &MeshPod, istiod: &Istiod, extra: &[(&str, &str)]) -> Waypoint {
    let object = pod
        .spec
        .object
        .clone()
        .expect("an injected pod (see `injected`)");
    let typed: Pod = serde_json::from_value(object).expect("the injected pod is a Pod");
    let spec = typed.spec.expect("pod spec");
    for init in spec.init_containers.iter().flatten() {
        if init.name != "istio-init" {
            continue;
        }
        let args: Vec<String> = init.args.clone().unwrap_or_default();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = pod
            .netns
            .exec(&binary("pilot-agent").display().to_string(), &args)
            .expect("run istio-init");
        assert!(
            out.status.success(),
            "istio-init {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let proxy = (spec.containers.iter())
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == "istio-proxy")
        .expect("an istio-proxy container");
    let volumes = spec.volumes.clone().unwrap_or_default();
    Waypoint::from_container(pod, istiod, proxy, &volumes, extra)
}
