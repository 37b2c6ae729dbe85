//! The sidecar injector webhook: `POST /inject` (and `/inject/<anything>`) on 15017, with
//! AdmissionReview `admission.k8s.io/v1`, as Istio's injector serves it. A pod the webhook
//! decides to inject is answered with a JSON patch (`patchType: JSONPatch`); a pod it skips
//! (host network, system namespace, `sidecar.istio.io/inject: "false"`, policy) is allowed
//! unchanged; a pod that cannot be injected is denied with the reason, as Istio's is.
//!
//! The configuration is what the `istio-sidecar-injector` ConfigMap mounts in istiod's pod
//! (`--inject-dir`, default `/var/lib/istio/inject`): `values`, the istiod chart's values as
//! JSON, and `config`, whose `policy` is `enabled` or `disabled`. It is read at start; without
//! the files, Istio's defaults apply, with istiod's own revision, namespace, trust domain,
//! cluster and network.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use mesh_inject::{decide, Decision, InjectConfig, Policy, Workload};
use serde_json::{json, Map, Value};

use crate::config::Config;
use crate::webhook::{admission_request, answer};

/// Why the injector's configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InjectConfigError {
    #[error("injector values {path}: {detail}")]
    Values { path: String, detail: String },
    #[error("injector config {path}: {detail}")]
    Config { path: String, detail: String },
}

/// Sets `map[key]` unless the values already set it.
fn default_at(map: &mut Map<String, Value>, path: &[&str], value: &str) {
    if value.is_empty() {
        return;
    }
    let mut at = map;
    for key in &path[..path.len() - 1] {
        let next = at.entry(key.to_string()).or_insert_with(|| json!({}));
        let Value::Object(next) = next else { return };
        at = next;
    }
    if let Some(last) = path.last() {
        at.entry(last.to_string()).or_insert_with(|| value.into());
    }
}

/// The injector's configuration for this istiod.
pub fn load(config: &Config) -> Result<InjectConfig, InjectConfigError> {
    let values_path = config.inject_dir.join("values");
    let mut values = match std::fs::read_to_string(&values_path) {
        Ok(text) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(map)) => map,
            Ok(_) => {
                return Err(InjectConfigError::Values {
                    path: values_path.display().to_string(),
                    detail: "not a JSON object".into(),
                })
            }
            Err(e) => {
                return Err(InjectConfigError::Values {
                    path: values_path.display().to_string(),
                    detail: e.to_string(),
                })
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Map::new(),
        Err(e) => {
            return Err(InjectConfigError::Values {
                path: values_path.display().to_string(),
                detail: e.to_string(),
            })
        }
    };
    let revision = if config.revision == "default" {
        ""
    } else {
        config.revision.as_str()
    };
    default_at(&mut values, &["revision"], revision);
    default_at(
        &mut values,
        &["global", "istioNamespace"],
        &config.pod_namespace,
    );
    default_at(
        &mut values,
        &["meshConfig", "trustDomain"],
        &config.trust_domain,
    );
    default_at(
        &mut values,
        &["global", "multiCluster", "clusterName"],
        &config.cluster_id,
    );
    default_at(&mut values, &["global", "network"], &config.network);
    let mut inject = InjectConfig::from_values(&Value::Object(values));
    let config_path = config.inject_dir.join("config");
    match std::fs::read_to_string(&config_path) {
        Ok(text) => {
            let parsed: Value =
                serde_yaml::from_str(&text).map_err(|e| InjectConfigError::Config {
                    path: config_path.display().to_string(),
                    detail: e.to_string(),
                })?;
            inject.policy = match parsed["policy"].as_str() {
                None | Some("enabled") => Policy::Enabled,
                Some("disabled") => Policy::Disabled,
                Some(other) => {
                    return Err(InjectConfigError::Config {
                        path: config_path.display().to_string(),
                        detail: format!("policy {other:?} is neither enabled nor disabled"),
                    })
                }
            };
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(InjectConfigError::Config {
                path: config_path.display().to_string(),
                detail: e.to_string(),
            })
        }
    }
    Ok(inject)
}

/// `/inject` and `/inject/<anything>`.
pub fn router(config: Arc<InjectConfig>) -> Router {
    let other = config.clone();
    Router::new()
        .route(
            "/inject",
            post(move |body: Bytes| async move { handle(&config, &body) }),
        )
        .route(
            "/inject/{*rest}",
            post(move |body: Bytes| async move { handle(&other, &body) }),
        )
}

fn handle(config: &InjectConfig, body: &[u8]) -> Response {
    match review(config, body) {
        Ok(answer) => Json(answer).into_response(),
        Err(message) => {
            tracing::warn!(%message, "bad admission review for injection");
            (StatusCode::BAD_REQUEST, message).into_response()
        }
    }
}

/// The AdmissionReview answering an injection request, or why `body` is not one.
pub fn review(config: &InjectConfig, body: &[u8]) -> Result<Value, String> {
    let (request, uid) = admission_request(body)?;
    let pod = &request["object"];
    if request["kind"]["kind"] != "Pod" || !pod.is_object() {
        return Ok(answer(json!({"uid": uid, "allowed": true})));
    }
    let namespace = request["namespace"]
        .as_str()
        .or_else(|| pod["metadata"]["namespace"].as_str())
        .unwrap_or("default");
    let name = pod["metadata"]["name"]
        .as_str()
        .or_else(|| pod["metadata"]["generateName"].as_str())
        .unwrap_or_default();
    if let Decision::Skip(why) = decide(pod, namespace, config) {
        tracing::debug!(pod = %format!("{namespace}/{name}"), %why, "not injected");
        return Ok(answer(json!({"uid": uid, "allowed": true})));
    }
    let workload = Workload::of_pod(pod, namespace);
    match mesh_inject::inject(pod, &workload, config) {
        Ok(injected) => {
            let patch = mesh_inject::patch(pod, &injected);
            tracing::info!(pod = %format!("{namespace}/{name}"), "injected the sidecar");
            Ok(answer(json!({
                "uid": uid,
                "allowed": true,
                "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
            })))
        }
        Err(e) => {
            tracing::warn!(pod = %format!("{namespace}/{name}"), error = %e, "injection refused");
            Ok(answer(json!({
                "uid": uid,
                "allowed": false,
                "status": {"status": "Failure", "message": format!("injection failed: {e}"), "reason": "BadRequest", "code": 400},
            })))
        }
    }
}
