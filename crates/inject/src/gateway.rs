//! The `gateway` injection template, for pods annotated `inject.istio.io/templates: gateway`
//! (Istio's gateway chart sets it with the label `sidecar.istio.io/inject: "true"` and an
//! `istio-proxy` container of `image: auto`): the pod's own `istio-proxy` container laid over
//! the template's (`pilot-agent proxy router`, no capture, readiness on 15021), the proxy's
//! volumes, and the status annotation and canonical labels. No init step, no probe rewrite,
//! no mutual TLS or tunnel label: a gateway takes plain traffic from outside the mesh.

use serde_json::{json, Value};

use crate::sidecar::{
    annotation, mark_injected, proxy_container, volumes, Workload, PROXY, READINESS_PORT,
};
use crate::{InjectConfig, InjectError};

/// The annotation naming the templates a pod is injected with.
pub const TEMPLATES_ANNOTATION: &str = "inject.istio.io/templates";

/// Whether the pod asks for the `gateway` template rather than the sidecar one; a template
/// this injector does not have is refused by name.
pub(crate) fn wants_gateway(pod: &Value) -> Result<bool, InjectError> {
    let Some(value) = annotation(pod, TEMPLATES_ANNOTATION) else {
        return Ok(false);
    };
    let mut gateway = false;
    for t in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        match t {
            "sidecar" => {}
            "gateway" => gateway = true,
            other => {
                return Err(InjectError::BadAnnotation {
                    annotation: TEMPLATES_ANNOTATION.into(),
                    value: value.into(),
                    why: format!(
                    "unknown injection template {other:?} (this injector has sidecar and gateway)"
                ),
                })
            }
        }
    }
    Ok(gateway)
}

/// Injects a gateway pod (see the module comment).
pub(crate) fn inject(
    mut pod: Value,
    workload: &Workload,
    cfg: &InjectConfig,
) -> Result<Value, InjectError> {
    let containers = pod["spec"]["containers"]
        .as_array()
        .filter(|c| !c.is_empty())
        .ok_or(InjectError::NoContainers)?
        .clone();
    let apps: Vec<&Value> = containers.iter().filter(|c| c["name"] != PROXY).collect();
    let app_names: Vec<String> = (apps.iter())
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    let ports: Vec<Value> = (apps.iter())
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .collect();
    let mut template = proxy_container(&pod, workload, cfg, &app_names, &ports, 0);
    template["args"][1] = json!("router");
    // The template leaves the security context to the Deployment (the chart's runs as 1337).
    if let Some(t) = template.as_object_mut() {
        t.remove("securityContext");
    }
    template["readinessProbe"] = json!({
        "httpGet": {"path": "/healthz/ready", "port": READINESS_PORT},
        "initialDelaySeconds": 1, "periodSeconds": 2, "timeoutSeconds": 3,
        "failureThreshold": 30,
    });
    let spec = &mut pod["spec"];
    let mut list = spec["containers"].as_array().cloned().unwrap_or_default();
    match list.iter_mut().find(|c| c["name"] == PROXY) {
        Some(own) => *own = overlay(template, own),
        None => list.push(template),
    }
    spec["containers"] = Value::Array(list);
    let mut all_volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    let mut volume_names = Vec::new();
    for v in volumes(cfg) {
        volume_names.push(v["name"].clone());
        if !all_volumes.iter().any(|have| have["name"] == v["name"]) {
            all_volumes.push(v);
        }
    }
    spec["volumes"] = Value::Array(all_volumes);
    // The container is the pod's own: the status lists no container, so injecting again lays
    // the template over it again instead of removing it.
    let status = json!({
        "initContainers": [],
        "containers": [],
        "volumes": volume_names,
        "imagePullSecrets": null,
        "revision": cfg.revision_name(),
    });
    mark_injected(&mut pod, workload, cfg, &status, PROXY, false);
    Ok(pod)
}

/// `own` (the pod's `istio-proxy`) laid over `template`, as Istio merges them: the pod's fields
/// win, except `image: auto`; `env` by name, `volumeMounts` by mount path and `ports` by
/// number are merged entry by entry.
fn overlay(template: Value, own: &Value) -> Value {
    let mut out = template;
    let Some(own) = own.as_object() else {
        return out;
    };
    for (key, value) in own {
        match key.as_str() {
            "image" if value == "auto" => {}
            "env" => merge_list(&mut out, key, value, "name"),
            "volumeMounts" => merge_list(&mut out, key, value, "mountPath"),
            "ports" => merge_list(&mut out, key, value, "containerPort"),
            _ => out[key.as_str()] = value.clone(),
        }
    }
    out
}

/// The entries of `own` replace those of `out[key]` with the same `by`, others are added.
fn merge_list(out: &mut Value, key: &str, own: &Value, by: &str) {
    let mut list = out[key].as_array().cloned().unwrap_or_default();
    for entry in own.as_array().into_iter().flatten() {
        match list.iter_mut().find(|e| e[by] == entry[by]) {
            Some(e) => *e = entry.clone(),
            None => list.push(entry.clone()),
        }
    }
    out[key] = Value::Array(list);
}

#[cfg(test)]
mod tests;
