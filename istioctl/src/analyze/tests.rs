use super::*;

/// A namespace in ambient, a pod, the service and policy selecting it, and the waypoint it
/// uses: nothing to report.
const CLEAN: &str = "\
apiVersion: v1
kind: Namespace
metadata:
  name: demo
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: Pod
metadata:
  name: server
  namespace: demo
  labels:
    app: server
    istio.io/use-waypoint: waypoint
spec:
  containers:
  - name: server
    image: echo
---
apiVersion: v1
kind: Service
metadata:
  name: server
  namespace: demo
spec:
  selector:
    app: server
  ports:
  - port: 80
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: allow-server
  namespace: demo
spec:
  selector:
    matchLabels:
      app: server
  rules:
  - from:
    - source:
        principals: [cluster.local/ns/demo/sa/client]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: waypoint
  namespace: demo
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - name: mesh
    port: 15008
    protocol: HBONE
";

fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    dir
}

/// The text lines of the messages, with the temp dir replaced by `DIR`.
fn lines(dir: &tempfile::TempDir) -> Vec<String> {
    let root = dir.path().display().to_string();
    analyze(dir.path(), "istio-system")
        .iter()
        .map(|m| m.to_string().replace(&root, "DIR"))
        .collect()
}

#[test]
fn clean_directory_has_no_messages() {
    let dir = dir_with(&[("app.yaml", CLEAN)]);
    assert_eq!(lines(&dir), Vec::<String>::new());
}

#[test]
fn authorization_policy_selecting_no_workload() {
    let policy = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: allow-nothing-there
  namespace: demo
spec:
  selector:
    matchLabels:
      version: v9
      app: server
";
    let dir = dir_with(&[("app.yaml", CLEAN), ("policy.yaml", policy)]);
    assert_eq!(
        lines(&dir),
        ["Warning [IST0127] (AuthorizationPolicy demo/allow-nothing-there DIR/policy.yaml:1) No matching workloads for this resource with the following labels: app=server,version=v9"]
    );
}

#[test]
fn policies_only_count_pods_in_the_mesh() {
    // The same pod outside the mesh: the policy (and the waypoint label) still matter, but
    // the policy selects nothing ztunnel enforces.
    let outside = CLEAN.replace(
        "    istio.io/dataplane-mode: ambient\n",
        "    other: label\n",
    );
    let dir = dir_with(&[("app.yaml", &outside)]);
    assert_eq!(
        lines(&dir),
        ["Warning [IST0127] (AuthorizationPolicy demo/allow-server DIR/app.yaml:32) No matching workloads for this resource with the following labels: app=server"]
    );
}

#[test]
fn service_selecting_no_pod() {
    let svc = "\
# the backend was renamed
apiVersion: v1
kind: Service
metadata:
  name: backend
  namespace: demo
spec:
  selector:
    app: backend
";
    let dir = dir_with(&[("app.yaml", CLEAN), ("svc.yaml", svc)]);
    assert_eq!(
        lines(&dir),
        ["Warning [IST0127] (Service demo/backend DIR/svc.yaml:2) No matching workloads for this resource with the following labels: app=backend"]
    );
}

#[test]
fn ambient_pod_with_sidecar() {
    let pods = "\
apiVersion: v1
kind: Pod
metadata:
  name: both
  namespace: demo
  labels:
    istio.io/dataplane-mode: ambient
    sidecar.istio.io/inject: \"true\"
---
apiVersion: v1
kind: Pod
metadata:
  name: injected
  namespace: demo
  labels:
    istio.io/dataplane-mode: ambient
  annotations:
    sidecar.istio.io/status: '{\"containers\":[\"istio-proxy\"]}'
";
    let dir = dir_with(&[("app.yaml", CLEAN), ("pods.yaml", pods)]);
    assert_eq!(
        lines(&dir),
        [
            "Warning [IST0901] (Pod demo/both DIR/pods.yaml:1) The pod is labeled istio.io/dataplane-mode=ambient but it asks for a sidecar (sidecar.istio.io/inject=true); ztunnel does not capture pods with a sidecar. Run 'kubectl label pod both -n demo istio.io/dataplane-mode-' or disable the sidecar.",
            "Warning [IST0901] (Pod demo/injected DIR/pods.yaml:10) The pod is labeled istio.io/dataplane-mode=ambient but it is sidecar-injected (sidecar.istio.io/status); ztunnel does not capture pods with a sidecar. Run 'kubectl label pod injected -n demo istio.io/dataplane-mode-' or disable the sidecar.",
        ]
    );
}

#[test]
fn namespace_with_injection_and_ambient() {
    let ns = "\
apiVersion: v1
kind: Namespace
metadata:
  name: mixed
  labels:
    istio-injection: enabled
    istio.io/dataplane-mode: ambient
";
    let dir = dir_with(&[("app.yaml", CLEAN), ("ns.yaml", ns)]);
    assert_eq!(
        lines(&dir),
        ["Warning [IST0123] (Namespace mixed DIR/ns.yaml:1) The namespace has both istio-injection=enabled and istio.io/dataplane-mode=ambient: new pods get sidecars, which ambient then skips. Run 'kubectl label namespace mixed istio-injection-' or 'kubectl label namespace mixed istio.io/dataplane-mode-'."]
    );
}

#[test]
fn use_waypoint_naming_a_missing_gateway() {
    let no_gateway = CLEAN
        .split("---\napiVersion: gateway.networking.k8s.io/v1")
        .next()
        .expect("prefix")
        .to_string();
    let ns = "\
apiVersion: v1
kind: Namespace
metadata:
  name: other
  labels:
    istio.io/use-waypoint: shared
    istio.io/use-waypoint-namespace: infra
";
    let dir = dir_with(&[("app.yaml", &no_gateway), ("ns.yaml", ns)]);
    assert_eq!(
        lines(&dir),
        [
            "Error [IST0101] (Pod demo/server DIR/app.yaml:8) Referenced gateway not found: \"demo/waypoint\"",
            "Error [IST0101] (Namespace other DIR/ns.yaml:1) Referenced gateway not found: \"infra/shared\"",
        ]
    );
}

#[test]
fn loader_problems_carry_file_and_line() {
    let broken = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  labels: [unclosed\n";
    let invalid = "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n  namespace: demo\nspec:\n  ports:\n  - port: not-a-number\n";
    let unknown = "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: d\n";
    let dir = dir_with(&[
        ("app.yaml", CLEAN),
        ("broken.yaml", broken),
        ("invalid.yaml", invalid),
        ("unknown.yaml", unknown),
    ]);
    let found = lines(&dir);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found[0].starts_with(
            "Error [IST0106] (DIR/broken.yaml:6) Schema validation error: malformed YAML:"
        ),
        "{found:#?}"
    );
    assert_eq!(
        found[1],
        "Error [IST0106] (Service demo/s DIR/invalid.yaml:8) Schema validation error: invalid field spec.ports[0].port: invalid type: string \"not-a-number\", expected i32"
    );
    assert!(
        found[2].starts_with("Warning [IST0133] (DIR/unknown.yaml:2) Schema validation warning: unsupported object apps/v1/StatefulSet"),
        "{found:#?}"
    );
}

#[test]
fn structured_output_has_upstream_keys() {
    let svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: lonely\nspec:\n  selector:\n    app: gone\n";
    let dir = dir_with(&[("svc.yaml", svc)]);
    let messages = analyze(dir.path(), "istio-system");
    let refs: Vec<&Message> = messages.iter().collect();
    let json: serde_json::Value =
        serde_json::from_str(&to_json(&refs).expect("json")).expect("valid");
    let m = &json[0];
    assert_eq!(m["code"], "IST0127");
    assert_eq!(m["level"], "Warning");
    assert_eq!(m["origin"], "Service default/lonely");
    assert_eq!(
        m["reference"],
        format!("{}:1", dir.path().join("svc.yaml").display())
    );
    assert_eq!(
        m["documentationUrl"],
        "https://istio.io/latest/docs/reference/config/analysis/ist0127/?ref=istioctl-analyze"
    );
    let yaml = to_yaml(&refs).expect("yaml");
    assert!(
        yaml.starts_with("- code: IST0127\n  documentationUrl: "),
        "{yaml}"
    );
}

#[test]
fn sidecar_resources_selecting_nothing_or_the_same_pods() {
    let sidecars = "\
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: default
  namespace: demo
spec:
  egress:
  - hosts: [\"./*\"]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: default-2
  namespace: demo
spec:
  egress:
  - hosts: [\"./*\"]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: server
  namespace: demo
spec:
  workloadSelector:
    labels:
      app: server
  egress:
  - hosts: [\"./*\"]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: server-again
  namespace: demo
spec:
  workloadSelector:
    labels:
      app: server
  egress:
  - hosts: [\"./*\"]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: gone
  namespace: demo
spec:
  workloadSelector:
    labels:
      app: gone
  egress:
  - hosts: [\"./*\"]
";
    let dir = dir_with(&[("app.yaml", CLEAN), ("sidecars.yaml", sidecars)]);
    assert_eq!(
        lines(&dir),
        [
            "Error [IST0111] (Sidecar demo/default DIR/sidecars.yaml:1) The Sidecars [default default-2] in namespace \"demo\" have no workload selector, which can lead to undefined behavior.",
            "Error [IST0111] (Sidecar demo/default-2 DIR/sidecars.yaml:10) The Sidecars [default default-2] in namespace \"demo\" have no workload selector, which can lead to undefined behavior.",
            "Error [IST0110] (Sidecar demo/server DIR/sidecars.yaml:19) The Sidecars [server server-again] in namespace \"demo\" select the same workload pod \"server\", which can lead to undefined behavior.",
            "Error [IST0110] (Sidecar demo/server-again DIR/sidecars.yaml:31) The Sidecars [server server-again] in namespace \"demo\" select the same workload pod \"server\", which can lead to undefined behavior.",
            "Error [IST0101] (Sidecar demo/gone DIR/sidecars.yaml:43) Referenced selector not found: \"app=gone\"",
        ]
    );
}
