//! The demo's L7 part: a waypoint for `demo` (a Gateway of class `istio-waypoint`, run by
//! pilot-agent with Envoy 1.40 in its own pod), an HTTPRoute splitting `web` 90/10 between two
//! versions, an L7 AuthorizationPolicy refusing `GET /admin`, and the waypoint's request stats.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use mesh_e2e::cluster::{MeshCluster, MeshPod};
use mesh_e2e::controller::WaypointController;
use mesh_e2e::kubelet::{gateway_programmed, Kubelet};
use mesh_testutil::{http_request, HttpApp};

use super::{step, until};

const WEB_PORT: u16 = 9080;
const WEB_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);

fn web_service(name: &str, vip: &str, selector: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: demo\n  labels:\n    istio.io/use-waypoint: waypoint\nspec:\n  clusterIP: {vip}\n  selector: {{{selector}}}\n  ports:\n  - name: http\n    port: 80\n    targetPort: {WEB_PORT}\n"
    )
}

const SPLIT: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: web-split\n  namespace: demo\nspec:\n  parentRefs:\n  - group: \"\"\n    kind: Service\n    name: web\n    port: 80\n  rules:\n  - backendRefs:\n    - name: web-v1\n      port: 80\n      weight: 90\n    - name: web-v2\n      port: 80\n      weight: 10\n";

const DENY_ADMIN: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-admin\n  namespace: demo\nspec:\n  targetRefs:\n  - kind: Service\n    group: \"\"\n    name: web\n  action: DENY\n  rules:\n  - to:\n    - operation:\n        methods: [GET]\n        paths: [\"/admin*\"]\n";

/// What the L7 part keeps running until the demo ends.
pub struct L7 {
    kubelet: Kubelet,
    _controller: WaypointController,
    _apps: Vec<HttpApp>,
}

impl L7 {
    /// How to look at the waypoint while the demo is kept running.
    pub fn explore(&self) {
        let ns = self.kubelet.proxy("demo", "waypoint").netns().name();
        println!("  ip netns exec {ns} curl -s localhost:15000/config_dump | less   # the waypoint's Envoy");
        println!("  ip netns exec {ns} curl -s localhost:15020/stats/prometheus | grep rbac");
    }
}

fn get(client: &MeshPod, method: &str, path: &str) -> Option<(u16, String)> {
    http_request(
        &client.netns,
        SocketAddr::from((WEB_VIP, 80)),
        method,
        path,
        &[],
        Duration::from_secs(5),
    )
    .map(|r| (r.status, r.body))
}

pub fn run(c: &mut MeshCluster, client: &MeshPod, servers: &[&MeshPod]) -> Result<L7, String> {
    step("deploying a waypoint for namespace demo: `istioctl waypoint apply -n demo` writes Gateway `waypoint` (class istio-waypoint); the waypoint controller makes its ServiceAccount, Deployment and Service; the local kubelet runs the pod (`pilot-agent proxy waypoint` with Envoy 1.40)");
    c.objects().write(
        "svc-web.yaml",
        &format!(
            "{}---\n{}---\n{}",
            web_service("web", &WEB_VIP.to_string(), "app: server"),
            web_service("web-v1", "10.96.0.31", "version: v1"),
            web_service("web-v2", "10.96.0.32", "version: v2"),
        ),
    );
    let out = std::process::Command::new(mesh_e2e::bins::binary("istioctl"))
        .args(["waypoint", "apply", "-n", "demo", "--config-dir"])
        .arg(c.objects().path())
        .output()
        .map_err(|e| format!("istioctl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "istioctl waypoint apply: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    print!("  {}", String::from_utf8_lossy(&out.stdout));
    let mut apps = Vec::new();
    for s in servers {
        let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, WEB_PORT));
        let version = s.spec.labels.get("version").cloned().unwrap_or_default();
        apps.push(HttpApp::start(&s.netns, any, &version).map_err(|e| e.to_string())?);
    }
    let controller = WaypointController::start(c);
    let mut kubelet = Kubelet::new("node1", &[]);
    kubelet.run_until(c, Duration::from_secs(60), |c| {
        gateway_programmed(c.objects().path(), "demo", "waypoint")
    });
    let waypoint = kubelet.proxy("demo", "waypoint");
    println!(
        "  Gateway demo/waypoint Programmed; pod {} ({}) ready on 15021; Envoy rejected {} cluster and {} listener updates",
        kubelet.pod_name("demo", "waypoint").unwrap_or_default(),
        waypoint.ip(),
        waypoint.stat("cluster_manager.cds.update_rejected"),
        waypoint.stat("listener_manager.lds.update_rejected")
    );
    println!("  services web, web-v1, web-v2 are labelled istio.io/use-waypoint=waypoint");

    step("HTTPRoute web-split: 90% to web-v1, 10% to web-v2; demo/client sends 200 requests to web.demo");
    c.objects().write("route-web-split.yaml", SPLIT);
    until(|| waypoint.admin("/config_dump").contains("demo/web-split"));
    let (mut v1, mut v2, mut failed) = (0, 0, 0);
    for _ in 0..200 {
        match get(client, "GET", "/") {
            Some((200, b)) if b == "v1" => v1 += 1,
            Some((200, b)) if b == "v2" => v2 += 1,
            _ => failed += 1,
        }
    }
    println!("  v1: {v1}, v2: {v2}, failed: {failed}");

    step("L7 AuthorizationPolicy on the waypoint: DENY GET /admin* for service web");
    c.objects().write("deny-admin.yaml", DENY_ADMIN);
    until(|| get(client, "GET", "/admin").is_some_and(|(s, _)| s == 403));
    for (method, path) in [
        ("GET", "/admin"),
        ("GET", "/api/orders"),
        ("POST", "/admin"),
    ] {
        let answer = get(client, method, path)
            .map_or_else(|| "no answer".to_string(), |(s, b)| format!("{s} {b}"));
        println!("  {method:<4} {path:<12} -> {answer}");
    }

    step("the waypoint's request metrics (istio_requests_total on 15020, reporter=\"waypoint\") and its access log");
    // Envoy flushes its access log stream to pilot-agent every 200 ms.
    until(|| waypoint.metrics().contains("response_code=\"403\""));
    let label = |line: &str, name: &str| {
        let key = format!("{name}=\"");
        line.split(&key)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("-")
            .to_string()
    };
    for line in waypoint
        .metrics()
        .lines()
        .filter(|l| l.starts_with("istio_requests_total{"))
    {
        let count = line.rsplit(' ').next().unwrap_or("0");
        println!(
            "  {count:>4}  {} -> {} ({}) {}",
            label(line, "source_principal"),
            label(line, "destination_workload"),
            label(line, "destination_service"),
            label(line, "response_code"),
        );
    }
    // Envoy writes its access log file once a second.
    let denied = "\"GET /admin HTTP/1.1\" 403";
    until(|| waypoint.log().contains(denied));
    if let Some(line) = waypoint.log().lines().find(|l| l.contains(denied)) {
        println!("  access log: {line}");
    }
    Ok(L7 {
        kubelet,
        _controller: controller,
        _apps: apps,
    })
}
