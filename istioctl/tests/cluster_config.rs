//! `istioctl ztunnel-config` and `proxy-config` in a cluster: the admin port of a pod is
//! reached by port-forward through the (fake) API server, as Istio's istioctl does. ztunnel's
//! side serves a real ztunnel's `/config_dump`; Envoy's side is a real Envoy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use mesh_testutil::kube_api::{core_types, FakeApiServer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FIXTURE: &str = include_str!("fixtures/ztunnel-config-dump.json");

/// Answers every `GET /config_dump` with the fixture, as ztunnel's admin port does.
async fn ztunnel_admin() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = if head.starts_with(b"GET /config_dump ") {
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{FIXTURE}",
                        FIXTURE.len()
                    )
                } else {
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_string()
                };
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

struct Cluster {
    api: FakeApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

async fn cluster() -> Cluster {
    cluster_serving(core_types()).await
}

/// A cluster that also serves the Istio and Gateway API CRDs.
async fn cluster_with_crds() -> Cluster {
    let mut types = core_types();
    types.extend(mesh_testutil::kube_api::mesh_crd_types());
    cluster_serving(types).await
}

async fn cluster_serving(types: Vec<mesh_testutil::kube_api::ResourceType>) -> Cluster {
    let api = FakeApiServer::start(types).await.expect("fake API");
    for ns in ["istio-system", "default"] {
        api.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .expect("namespace");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).expect("kubeconfig");
    Cluster {
        api,
        dir,
        kubeconfig,
    }
}

impl Cluster {
    fn pod(&self, ns: &str, name: &str, app: &str, node: &str, phase: &str) {
        self.api
            .seed(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": phase, "podIP": "127.0.0.1"}}))
            .expect("pod");
    }

    async fn istioctl(&self, args: &[&str]) -> Output {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_istioctl"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env_remove("KUBECONFIG")
            .env_remove("ZTUNNEL_ADMIN")
            .env_remove("PROXY_ADMIN")
            .stdin(Stdio::null())
            .output()
            .await
            .expect("istioctl runs")
    }
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "istioctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_config_reads_a_ztunnel_pod_through_port_forward() {
    let c = cluster().await;
    let admin = ztunnel_admin().await;
    c.pod(
        "istio-system",
        "ztunnel-aaaaa",
        "ztunnel",
        "node1",
        "Running",
    );
    c.pod(
        "istio-system",
        "ztunnel-bbbbb",
        "ztunnel",
        "node2",
        "Running",
    );
    c.pod(
        "istio-system",
        "ztunnel-00000",
        "ztunnel",
        "node1",
        "Pending",
    );
    c.api
        .forward_pod_port("istio-system", "ztunnel-aaaaa", 15000, admin);

    let fixture = c.dir.path().join("dump.json");
    std::fs::write(&fixture, FIXTURE).expect("fixture");
    let from_file = tokio::process::Command::new(env!("CARGO_BIN_EXE_istioctl"))
        .args(["ztunnel-config", "workloads", "--ztunnel-config-dump"])
        .arg(&fixture)
        .output()
        .await
        .expect("istioctl");
    let expected = stdout(&from_file);

    // The first running ztunnel, then the one on a node, then one named.
    let out = c.istioctl(&["ztunnel-config", "workloads"]).await;
    assert_eq!(stdout(&out), expected);
    let out = c.istioctl(&["zc", "workloads", "--node", "node1"]).await;
    assert!(stdout(&out).contains("client"));
    let out = c
        .istioctl(&["zc", "workloads", "pod/ztunnel-aaaaa.istio-system"])
        .await;
    assert_eq!(stdout(&out), expected);
    assert!(c
        .api
        .requests()
        .iter()
        .any(|r| r == "GET /api/v1/namespaces/istio-system/pods/ztunnel-aaaaa/portforward"));

    // No ztunnel there, and a ztunnel whose admin port does not answer, are named.
    let out = c.istioctl(&["zc", "workloads", "--node", "node9"]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no running ztunnel pod (app=ztunnel) in istio-system on node node9"),
        "{err}"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    c.api
        .forward_pod_port("istio-system", "ztunnel-bbbbb", 15000, closed);
    let out = c
        .istioctl(&["zc", "workloads", "ztunnel-bbbbb.istio-system"])
        .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The kubelet's reason, or (when kube's forwarder lost it: the server closed the tunnel
    // before the request went out) the closed tunnel; either way the port-forward is named.
    assert!(
        err.contains("cannot port-forward to pod istio-system/ztunnel-bbbbb port 15000: error forwarding port 15000 to pod")
            || err.contains("cannot port-forward to pod istio-system/ztunnel-bbbbb port 15000: the tunnel closed before the pod's port answered"),
        "{err}"
    );
    let out = c
        .istioctl(&["zc", "workloads", "missing.istio-system"])
        .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot port-forward to pod istio-system/missing"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_config_reads_a_real_envoy_through_port_forward() {
    let Some(envoy) = mesh_testutil::envoy_path() else {
        eprintln!("no Envoy here (it is required in CI)");
        return;
    };
    let c = cluster().await;
    let port_file = c.dir.path().join("admin-address");
    let bootstrap = c.dir.path().join("bootstrap.yaml");
    std::fs::write(
        &bootstrap,
        r#"
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: inbound-demo
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: demo
          cluster: outbound|8080||server.demo.svc.cluster.local
  clusters:
  - name: outbound|8080||server.demo.svc.cluster.local
    type: STATIC
    load_assignment:
      cluster_name: outbound|8080||server.demo.svc.cluster.local
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8080}}}
"#,
    )
    .expect("bootstrap");
    let mut child = tokio::process::Command::new(envoy)
        .arg("-c")
        .arg(&bootstrap)
        .arg("--admin-address-path")
        .arg(&port_file)
        .args([
            "--base-id-path",
            "/dev/null",
            "--use-dynamic-base-id",
            "-l",
            "error",
        ])
        .kill_on_drop(true)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("envoy starts");
    let mut admin = None;
    for _ in 0..100 {
        if let Ok(text) = std::fs::read_to_string(&port_file) {
            if let Ok(addr) = text.trim().parse::<SocketAddr>() {
                admin = Some(addr);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let admin = admin.expect("Envoy wrote its admin address");
    c.pod("demo-ns", "client-7d9c", "client", "node1", "Running");
    c.api
        .forward_pod_port("demo-ns", "client-7d9c", 15000, admin);

    let out = c
        .istioctl(&["proxy-config", "clusters", "client-7d9c", "-n", "demo-ns"])
        .await;
    let text = stdout(&out);
    assert!(text.contains("server.demo.svc.cluster.local"), "{text}");
    assert!(text.contains("8080"), "{text}");
    let out = c
        .istioctl(&["pc", "listeners", "client-7d9c.demo-ns"])
        .await;
    let text = stdout(&out);
    assert!(
        text.contains("outbound|8080||server.demo.svc.cluster.local"),
        "{text}"
    );
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyze_reads_the_live_cluster_with_files_laid_over_it() {
    let c = cluster_with_crds().await;
    for (ns, labels) in [
        ("default", json!({"istio.io/dataplane-mode": "ambient"})),
        ("shop", json!({"istio.io/dataplane-mode": "ambient"})),
    ] {
        c.api
            .seed(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": labels}}))
            .expect("namespace");
    }
    c.pod("default", "web-1", "web", "node1", "Running");
    for ns in ["default", "shop"] {
        c.api
            .seed(
                json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
                "metadata": {"name": "nobody", "namespace": ns},
                "spec": {"selector": {"matchLabels": {"app": "ghost"}}, "action": "DENY",
                         "rules": [{}]}}),
            )
            .expect("policy");
    }

    let out = c.istioctl(&["analyze"]).await;
    let text = stdout(&out);
    assert!(
        text.contains("Warning [IST0127] (AuthorizationPolicy default/nobody) No matching workloads for this resource with the following labels: app=ghost"),
        "{text}"
    );
    assert!(!text.contains("shop/nobody"), "another namespace: {text}");
    let out = c.istioctl(&["analyze", "-A"]).await;
    assert!(stdout(&out).contains("(AuthorizationPolicy shop/nobody)"));

    // A file's policy replaces the live one: it selects the pod, so nothing is reported, and
    // the file's own problems are named by its path.
    let file = c.dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: nobody\n  namespace: default\nspec:\n  selector:\n    matchLabels:\n      app: web\n  action: DENY\n  rules:\n  - {}\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: broken\n  namespace: default\nspec:\n  action: SOMETIMES\n",
    )
    .expect("file");
    let file_arg = file.display().to_string();
    let out = c.istioctl(&["analyze", &file_arg]).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!text.contains("default/nobody"), "{text}");
    assert!(
        text.contains(&format!("(AuthorizationPolicy default/broken {file_arg}:")),
        "{text}"
    );

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_istioctl"))
        .args(["analyze", "--use-kube=false"])
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("istioctl");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("pass directories or files of manifests to analyze, or a cluster"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waypoints_are_applied_listed_awaited_and_deleted_in_a_cluster() {
    let c = cluster_with_crds().await;
    c.api
        .seed(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "shop", "labels": {"istio.io/dataplane-mode": "ambient"}}}))
        .expect("namespace");

    let out = c
        .istioctl(&[
            "waypoint",
            "apply",
            "-n",
            "shop",
            "--enroll-namespace",
            "--for",
            "all",
        ])
        .await;
    let text = stdout(&out);
    assert!(
        text.contains("namespace shop labeled with \"istio.io/use-waypoint: waypoint\""),
        "{text}"
    );
    assert!(text.contains("waypoint shop/waypoint applied"), "{text}");
    let gw = c
        .api
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "shop",
            "waypoint",
        )
        .expect("the Gateway was applied");
    assert_eq!(gw["spec"]["gatewayClassName"], "istio-waypoint");
    assert_eq!(gw["metadata"]["labels"]["istio.io/waypoint-for"], "all");
    let ns = c.api.get("v1", "Namespace", "", "shop").expect("ns");
    assert_eq!(
        ns["metadata"]["labels"]["istio.io/use-waypoint"],
        "waypoint"
    );
    assert_eq!(
        ns["metadata"]["labels"]["istio.io/dataplane-mode"],
        "ambient"
    );
    assert!(c.api.requests().iter().any(|r| r.starts_with(
        "PATCH /apis/gateway.networking.k8s.io/v1/namespaces/shop/gateways/waypoint?"
    ) && r.contains("fieldManager=istioctl")));

    let out = c.istioctl(&["waypoint", "list", "-n", "shop"]).await;
    assert_eq!(
        stdout(&out),
        "NAME     REVISION TRAFFIC TYPE PROGRAMMED\nwaypoint default  all          False\n"
    );
    // The controller programs it while status waits.
    let waiting = c.istioctl(&["waypoint", "status", "-n", "shop", "--timeout", "30s"]);
    let program = async {
        // Once istioctl has read the Gateways it is waiting for this one.
        let reads = || {
            c.api
                .requests()
                .iter()
                .filter(|r| r.starts_with("GET /apis/gateway.networking.k8s.io/v1/gateways"))
                .count()
        };
        let before = reads();
        for _ in 0..600 {
            if reads() > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut gw = c
            .api
            .get(
                "gateway.networking.k8s.io/v1",
                "Gateway",
                "shop",
                "waypoint",
            )
            .expect("gateway");
        gw["status"] = json!({"conditions": [{"type": "Programmed", "status": "True",
            "reason": "Programmed", "message": "Resource programmed",
            "lastTransitionTime": "2026-12-03T00:00:00Z"}]});
        c.api.seed(gw).expect("status");
    };
    let (out, ()) = tokio::join!(waiting, program);
    assert_eq!(
        stdout(&out),
        "NAME     STATUS TYPE       REASON     MESSAGE\nwaypoint True   Programmed Programmed Resource programmed\n"
    );
    let out = c
        .istioctl(&[
            "waypoint",
            "apply",
            "-n",
            "shop",
            "--name",
            "other",
            "--enroll-namespace",
        ])
        .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already uses waypoint \"waypoint\""));
    let out = c
        .istioctl(&["waypoint", "delete", "-n", "shop", "waypoint"])
        .await;
    assert!(stdout(&out).contains("waypoint shop/waypoint deleted"));
    assert!(c
        .api
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "shop",
            "waypoint"
        )
        .is_none());
}
