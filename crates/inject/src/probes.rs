//! The kubelet's probes of app containers, rewritten to go through the agent (as Istio's
//! injector does, so they work under mTLS and capture): each HTTP, TCP or gRPC readiness,
//! liveness and startup probe becomes an HTTP GET of `/app-health/<container>/readyz`
//! (`livez`, `startupz`) on the status port, and `ISTIO_KUBE_APP_PROBERS` tells the agent what
//! each path stands for: `{"/app-health/web/readyz": {"httpGet": {...}, "timeoutSeconds": 1}}`.
//! Named ports are resolved to numbers; the rewritten probe is plain HTTP on the status port
//! whatever the original's scheme (the agent keeps it).

use serde_json::{json, Map, Value};

/// The probes rewritten, with the path suffix of each.
const PROBES: [(&str, &str); 3] = [
    ("readinessProbe", "readyz"),
    ("livenessProbe", "livez"),
    ("startupProbe", "startupz"),
];

/// The port number a probe names (a number, or a name of the container's ports).
fn resolve_port(port: &Value, container: &Value) -> Option<Value> {
    match port {
        Value::Number(_) => Some(port.clone()),
        Value::String(name) => container["ports"]
            .as_array()?
            .iter()
            .find(|p| p["name"].as_str() == Some(name.as_str()))
            .map(|p| p["containerPort"].clone())
            .or_else(|| name.parse::<u16>().ok().map(Value::from)),
        _ => None,
    }
}

/// Rewrites the probes of `containers` in place and returns the probers map (empty when
/// nothing was rewritten). A probe an earlier injection rewrote keeps the original that
/// injection recorded in `previous`.
pub fn rewrite(
    containers: &mut [Value],
    status_port: u16,
    previous: &Map<String, Value>,
) -> Map<String, Value> {
    let mut probers = Map::new();
    for c in containers.iter_mut() {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        let snapshot = c.clone();
        for (field, suffix) in PROBES {
            let Some(probe) = c.get_mut(field).filter(|p| p.is_object()) else {
                continue;
            };
            let path = format!("/app-health/{name}/{suffix}");
            if probe["httpGet"]["path"] == path.as_str() && probe["httpGet"]["port"] == status_port
            {
                if let Some(original) = previous.get(&path) {
                    probers.insert(path, original.clone());
                }
                continue;
            }
            let mut original = Map::new();
            if let Some(get) = probe.get("httpGet").filter(|g| g.is_object()) {
                let mut get = get.clone();
                if let Some(port) = resolve_port(&get["port"], &snapshot) {
                    get["port"] = port;
                }
                original.insert("httpGet".into(), get);
            } else if let Some(tcp) = probe.get("tcpSocket").filter(|t| t.is_object()) {
                let mut tcp = tcp.clone();
                if let Some(port) = resolve_port(&tcp["port"], &snapshot) {
                    tcp["port"] = port;
                }
                original.insert("tcpSocket".into(), tcp);
            } else if let Some(grpc) = probe.get("grpc").filter(|g| g.is_object()) {
                original.insert("grpc".into(), grpc.clone());
            } else {
                // exec probes run in the container and need nothing.
                continue;
            }
            if let Some(t) = probe.get("timeoutSeconds") {
                original.insert("timeoutSeconds".into(), t.clone());
            }
            probers.insert(path.clone(), Value::Object(original));
            if let Some(p) = probe.as_object_mut() {
                p.remove("tcpSocket");
                p.remove("grpc");
                p.insert(
                    "httpGet".into(),
                    json!({"path": path, "port": status_port, "scheme": "HTTP"}),
                );
            }
        }
    }
    probers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_tcp_and_grpc_probes_go_through_the_agent_and_exec_stays() {
        let mut containers = vec![
            json!({
                "name": "web",
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "timeoutSeconds": 2},
                "livenessProbe": {"tcpSocket": {"port": 8080}},
                "startupProbe": {"grpc": {"port": 9090}},
            }),
            json!({"name": "sidecar-ish", "livenessProbe": {"exec": {"command": ["true"]}}}),
        ];
        let probers = rewrite(&mut containers, 15020, &Map::new());
        assert_eq!(
            Value::Object(probers),
            json!({
                "/app-health/web/readyz": {"httpGet": {"path": "/ready", "port": 8080}, "timeoutSeconds": 2},
                "/app-health/web/livez": {"tcpSocket": {"port": 8080}},
                "/app-health/web/startupz": {"grpc": {"port": 9090}},
            })
        );
        assert_eq!(
            containers[0]["livenessProbe"],
            json!({"httpGet": {"path": "/app-health/web/livez", "port": 15020, "scheme": "HTTP"}})
        );
        assert_eq!(containers[0]["readinessProbe"]["timeoutSeconds"], 2);
        assert_eq!(containers[1]["livenessProbe"]["exec"]["command"][0], "true");
    }
}
