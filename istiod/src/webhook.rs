//! The validating admission webhook, served as Istio serves it: `POST /validate` on 15017 over
//! TLS with istiod's CA-signed serving certificate, AdmissionReview `admission.k8s.io/v1`.
//!
//! Objects of Istio's configuration groups (`networking.istio.io`, `security.istio.io`,
//! `telemetry.istio.io`, `extensions.istio.io`) are decoded as the mesh decodes them; one
//! that does not decode is denied with the problem named. Kinds the mesh does not read are
//! allowed, except the `networking.istio.io` Gateway, which must list at least one server
//! (the check Istio's own fail-close probe relies on). Deletes are always allowed. A body that
//! is not an AdmissionReview gets 400.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use mesh_api::Object;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

/// The webhook's name in Istio's ValidatingWebhookConfiguration; the API server quotes it when
/// the webhook denies a request.
pub const WEBHOOK_NAME: &str = "validation.istio.io";

/// The groups whose objects are validated.
pub const VALIDATED_GROUPS: [&str; 4] = [
    "networking.istio.io",
    "security.istio.io",
    "telemetry.istio.io",
    "extensions.istio.io",
];

/// `/validate` (and `/validate/<anything>`, as Istio accepts), and the injector's `/inject`.
pub fn router(injector: std::sync::Arc<mesh_inject::InjectConfig>) -> Router {
    Router::new()
        .route("/validate", post(validate_handler))
        .route("/validate/{*rest}", post(validate_handler))
        .merge(crate::inject::router(injector))
}

async fn validate_handler(body: Bytes) -> Response {
    match review(&body) {
        Ok(answer) => Json(answer).into_response(),
        Err(message) => {
            tracing::warn!(%message, "bad admission review");
            (StatusCode::BAD_REQUEST, message).into_response()
        }
    }
}

/// The request of the AdmissionReview `body` and its uid, or why `body` is not one.
pub fn admission_request(body: &[u8]) -> Result<(Value, String), String> {
    let mut review: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let api_version = review["apiVersion"].as_str().unwrap_or_default();
    if review["kind"] != "AdmissionReview" || api_version != "admission.k8s.io/v1" {
        return Err(format!(
            "expected an admission.k8s.io/v1 AdmissionReview, got kind {} apiVersion {api_version:?}",
            review["kind"]
        ));
    }
    let request = review
        .get_mut("request")
        .filter(|r| r.is_object())
        .map(Value::take)
        .ok_or("the AdmissionReview has no request")?;
    let uid = request["uid"]
        .as_str()
        .filter(|u| !u.is_empty())
        .ok_or("the AdmissionReview request has no uid")?
        .to_string();
    Ok((request, uid))
}

/// The AdmissionReview `response` wrapped as the API server expects it.
pub fn answer(response: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

/// The AdmissionReview answering `body`, or why `body` is not one.
pub fn review(body: &[u8]) -> Result<Value, String> {
    let (request, uid) = admission_request(body)?;
    let verdict = if request["operation"] == "DELETE" {
        Ok(())
    } else {
        validate(&request["object"])
    };
    let mut response = json!({"uid": uid, "allowed": verdict.is_ok()});
    if let Err(message) = &verdict {
        let name = format!(
            "{}/{}",
            request["namespace"].as_str().unwrap_or_default(),
            request["name"].as_str().unwrap_or_default()
        );
        tracing::info!(object = %name, kind = %request["kind"]["kind"], %message, "denied invalid configuration");
        response["status"] =
            json!({"status": "Failure", "message": message, "reason": "BadRequest", "code": 400});
    }
    Ok(answer(response))
}

/// Whether the mesh accepts `object`.
pub fn validate(object: &Value) -> Result<(), String> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    if !VALIDATED_GROUPS.contains(&group) {
        return Ok(());
    }
    if group == "networking.istio.io" && object["kind"] == "Gateway" {
        let servers = object["spec"]["servers"].as_array().map_or(0, Vec::len);
        return match servers {
            0 => Err("gateway must have at least one server".into()),
            _ => Ok(()),
        };
    }
    match Object::from_value(object.clone()) {
        Ok(Object::RequestAuthentication(ra)) => crate::envoy::validate_request_authentication(&ra),
        Ok(Object::Sidecar(sc)) => crate::envoy::sidecar::validate_sidecar(&sc),
        Ok(_) => Ok(()),
        // A kind of these groups the mesh does not read (EnvoyFilter, Telemetry, ...).
        Err(mesh_api::ApiError::UnsupportedKind { .. }) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// TLS connections as an axum listener.
pub struct TlsListener {
    pub incoming: mpsc::Receiver<Result<TlsStream<TcpStream>, std::io::Error>>,
    pub addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.incoming.recv().await {
                Some(Ok(tls)) => {
                    let peer = tls.get_ref().0.peer_addr().unwrap_or(self.addr);
                    return (tls, peer);
                }
                Some(Err(e)) => tracing::debug!(error = %e, "webhook connection failed"),
                // The acceptor is gone: nothing more will come.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(object: Value, operation: &str) -> Vec<u8> {
        serde_json::to_vec(
            &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": operation, "namespace": "default", "name": "x",
                "kind": {"group": "", "version": "v1", "kind": "x"}, "object": object}}),
        )
        .expect("json")
    }

    #[test]
    fn decodes_istio_config_and_denies_what_the_mesh_cannot_read() {
        let good = json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "x", "namespace": "default"}, "spec": {"action": "ALLOW"}});
        let bad = json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "x", "namespace": "default"}, "spec": {"action": 7}});
        let answer = review(&admission(good, "CREATE")).expect("review");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["uid"], "u-1");
        let answer = review(&admission(bad.clone(), "UPDATE")).expect("review");
        assert_eq!(answer["response"]["allowed"], false);
        let message = answer["response"]["status"]["message"]
            .as_str()
            .expect("message");
        assert!(message.contains("spec.action"), "{message}");
        // Deleting is always allowed; other groups and unread Istio kinds pass.
        let answer = review(&admission(bad, "DELETE")).expect("review");
        assert_eq!(answer["response"]["allowed"], true);
        for other in [
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
            json!({"apiVersion": "networking.istio.io/v1", "kind": "EnvoyFilter", "metadata": {"name": "x"}}),
        ] {
            assert_eq!(
                review(&admission(other, "CREATE")).expect("review")["response"]["allowed"],
                true
            );
        }
        let gw = json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
            "metadata": {"name": "invalid-gateway"}, "spec": {}});
        let answer = review(&admission(gw, "CREATE")).expect("review");
        assert_eq!(answer["response"]["allowed"], false);
    }

    #[test]
    fn request_authentications_are_checked_as_istio_checks_them() {
        let ra = |spec: Value| {
            json!({"apiVersion": "security.istio.io/v1", "kind": "RequestAuthentication",
                "metadata": {"name": "jwt", "namespace": "shop"}, "spec": spec})
        };
        let verdict = |spec: Value| {
            let answer = review(&admission(ra(spec), "CREATE")).expect("review");
            let message = answer["response"]["status"]["message"]
                .as_str()
                .map(str::to_string);
            (
                answer["response"]["allowed"] == true,
                message.unwrap_or_default(),
            )
        };
        let jwks = r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#;
        let good = verdict(json!({"targetRefs": [{"kind": "Service", "name": "echo"}],
            "jwtRules": [{"issuer": "https://issuer.example", "jwks": jwks, "audiences": ["echo"]},
                         {"issuer": "https://other.example", "jwksUri": "https://other.example/keys"}]}));
        assert!(good.0, "{}", good.1);
        for (spec, needle) in [
            (
                json!({"selector": {"matchLabels": {"app": "echo"}}, "targetRefs": [{"kind": "Service", "name": "echo"}]}),
                "only one of targetRefs or workloadSelector",
            ),
            (
                json!({"targetRefs": [{"kind": "Pod", "name": "echo"}]}),
                "targetRefs[0]",
            ),
            (
                json!({"targetRefs": [{"kind": "Service", "name": "echo", "namespace": "other"}]}),
                "cross namespace",
            ),
            (
                json!({"jwtRules": [{"audiences": ["x"]}]}),
                "jwtRules[0]: issuer or jwksUri must be set",
            ),
            (
                json!({"jwtRules": [{"issuer": "i", "jwks": "{}"}]}),
                "jwtRules[0]: jwks: not a key set",
            ),
            (
                json!({"jwtRules": [{"issuer": "i", "jwksUri": "ftp://x/keys"}]}),
                "not an http(s) URL",
            ),
            (
                json!({"jwtRules": [{"issuer": "i", "fromHeaders": [{"name": ""}]}]}),
                "fromHeaders",
            ),
            (
                json!({"jwtRules": [{"issuer": "i", "timeout": "-1s"}]}),
                "timeout",
            ),
        ] {
            let (allowed, message) = verdict(spec.clone());
            assert!(!allowed && message.contains(needle), "{spec}: {message}");
        }
    }

    #[test]
    fn sidecars_are_checked_as_istio_checks_them() {
        let verdict = |spec: Value| {
            let sc = json!({"apiVersion": "networking.istio.io/v1beta1", "kind": "Sidecar",
                "metadata": {"name": "default", "namespace": "shop"}, "spec": spec});
            let answer = review(&admission(sc, "CREATE")).expect("review");
            let message = answer["response"]["status"]["message"]
                .as_str()
                .map(str::to_string);
            (
                answer["response"]["allowed"] == true,
                message.unwrap_or_default(),
            )
        };
        let good = verdict(json!({
            "workloadSelector": {"labels": {"app": "sleep"}},
            "ingress": [{"port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                         "defaultEndpoint": "127.0.0.1:8080"}],
            "egress": [{"port": {"number": 9000, "protocol": "TCP"}, "hosts": ["./*"]},
                       {"hosts": ["istio-system/*", "*/*.example.com", "~/*"]}],
            "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}));
        assert!(good.0, "{}", good.1);
        for (spec, needle) in [
            (json!({}), "empty configuration provided"),
            (
                json!({"egress": [{"hosts": ["reviews"]}]}),
                "must be of form namespace/dnsName",
            ),
            (
                json!({"egress": [{"hosts": ["shop/reviews"]}]}),
                "short names",
            ),
            (
                json!({"egress": [{"hosts": ["Shop/*"]}]}),
                "invalid namespace value",
            ),
            (
                json!({"egress": [{"hosts": ["./re*.shop.svc"]}]}),
                "partial wildcard",
            ),
            (json!({"egress": [{"hosts": []}]}), "at least one host"),
            (
                json!({"egress": [{"hosts": ["*/*"]}, {"port": {"number": 80}, "hosts": ["*/*"]}]}),
                "should be the last listener",
            ),
            (
                json!({"egress": [{"port": {"number": 80}, "hosts": ["*/*"]},
                                  {"port": {"number": 80}, "hosts": ["./*"]}]}),
                "must be unique",
            ),
            (
                json!({"egress": [{"port": {"number": 0}, "hosts": ["*/*"]}]}),
                "unix domain socket bind",
            ),
            (
                json!({"ingress": [{"port": {"number": 0}}]}),
                "between 1 and 65535",
            ),
            (
                json!({"ingress": [{"port": {"number": 80}, "defaultEndpoint": "10.0.0.1:80"}]}),
                "defaultEndpoint must be of form",
            ),
            (
                json!({"ingress": [{"port": {"number": 80}, "defaultEndpoint": "127.0.0.1:http"}]}),
                "is not a number",
            ),
            (
                json!({"ingress": [{"port": {"number": 80, "targetPort": 8080}}]}),
                "targetPort has no impact",
            ),
            (
                json!({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY",
                       "egressProxy": {"host": "proxy.example.com", "port": {"number": 3128}}}}),
                "egress_proxy must be set only with ALLOW_ANY",
            ),
            (
                json!({"workloadSelector": {"labels": {"app": "*"}}, "egress": [{"hosts": ["*/*"]}]}),
                "wildcard is not supported",
            ),
            (
                json!({"outboundTrafficPolicy": {"mode": "SOMETIMES"}}),
                "outboundTrafficPolicy.mode",
            ),
        ] {
            let (allowed, message) = verdict(spec.clone());
            assert!(!allowed && message.contains(needle), "{spec}: {message}");
        }
    }

    #[test]
    fn what_is_not_an_admission_review_is_named() {
        for (body, needle) in [
            (&b"{nope"[..], "not JSON"),
            (
                br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1beta1"}"#,
                "v1beta1",
            ),
            (
                br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#,
                "no request",
            ),
            (
                br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{}}"#,
                "no uid",
            ),
        ] {
            let err = review(body).expect_err(needle);
            assert!(err.contains(needle), "{err}");
        }
    }
}
