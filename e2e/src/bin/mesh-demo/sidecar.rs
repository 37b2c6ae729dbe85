//! The demo's sidecar part: namespace `legacy` has injection enabled; two pods there run
//! sidecars (the init step's capture, `pilot-agent proxy sidecar` with Envoy 1.40, configured
//! by istiod) and call each other over Istio mutual TLS, call the ambient `web` service over
//! HBONE, and are called by the ambient client over HBONE, each receiver seeing the caller's
//! identity; then a sidecar's `istioctl proxy-config`.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use mesh_e2e::cluster::{MeshCluster, MeshPod, PodSpec};
use mesh_e2e::injection;
use mesh_e2e::waypoint::Waypoint;
use mesh_testutil::{http_request, service_yaml, HttpApp};

use super::{shorten_metric, step, until};

const HTTPBIN_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 40);
const HTTPBIN_PORT: u16 = 8080;
/// `web.demo` (the waypoint part's service, HTTP on 80).
const WEB_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);

/// What the sidecar part keeps running until the demo ends.
pub struct Sidecars {
    sleep: Waypoint,
    httpbin: Waypoint,
    _app: HttpApp,
    _pods: Vec<MeshPod>,
}

impl Sidecars {
    /// How to look at the sidecars while the demo is kept running.
    pub fn explore(&self) {
        for (name, proxy) in [("sleep", &self.sleep), ("httpbin", &self.httpbin)] {
            let ns = proxy.netns().name();
            println!(
                "  ip netns exec {ns} istioctl proxy-config all            # {name}'s sidecar"
            );
        }
    }
}

/// A pod of `legacy` through the injector (istiod's webhook code) with the ambient profile's
/// proxy metadata; `sleep` is captured by its `istio-init` step, `httpbin` by cni-node at CNI
/// ADD (`istio_cni.enabled`, the `istio-validation` init container).
fn injected(name: &str, node: &str, cni: bool) -> PodSpec {
    let values = injection::ambient_values(cni);
    injection::injected(PodSpec::new("legacy", name, node, name), &values)
}

/// The ztunnels' inbound connection counters whose labels contain `needle`, shortened.
fn ztunnels_saw<'a>(c: &'a MeshCluster, needle: &'a str) -> impl Iterator<Item = String> + 'a {
    c.nodes.iter().flat_map(move |n| {
        let metrics = n.ztunnel.metrics();
        let node = n.node.name().to_string();
        metrics
            .lines()
            .filter(|l| l.starts_with("istio_tcp_connections_opened_total") && l.contains(needle))
            .map(|l| format!("[{node} ztunnel] {}", shorten_metric(l)))
            .collect::<Vec<_>>()
    })
}

fn get(pod: &MeshPod, addr: SocketAddr) -> Option<(u16, String)> {
    http_request(&pod.netns, addr, "GET", "/", &[], Duration::from_secs(5))
        .map(|r| (r.status, r.body))
}

pub fn run(c: &mut MeshCluster, client: &MeshPod) -> Result<Sidecars, String> {
    step("namespace legacy has istio-injection=enabled: pods sleep and httpbin go through the injector and get sidecars (sleep's istio-init step and, for httpbin, cni-node write the capture; `pilot-agent proxy sidecar` runs Envoy 1.40 as uid 1337, configured by istiod)");
    c.objects().write(
        "svc-httpbin.yaml",
        &service_yaml("legacy", "httpbin", &HTTPBIN_VIP.to_string(), "httpbin"),
    );
    let sleep_pod = c
        .add_pod(injected("sleep", "node1", false))
        .map_err(|e| e.to_string())?;
    let httpbin_pod = c
        .add_pod(injected("httpbin", "node2", true))
        .map_err(|e| e.to_string())?;
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, HTTPBIN_PORT));
    let app = HttpApp::start(&httpbin_pod.netns, any, "httpbin").map_err(|e| e.to_string())?;
    let httpbin = injection::start_sidecar(&httpbin_pod, &c.istiod, &[]);
    let sleep = injection::start_sidecar(&sleep_pod, &c.istiod, &[]);
    httpbin.wait_ready(Duration::from_secs(30));
    sleep.wait_ready(Duration::from_secs(30));
    for (name, proxy) in [("sleep", &sleep), ("httpbin", &httpbin)] {
        println!(
            "  {name:<8} {:<10} sidecar ready; Envoy accepted {} listener and {} cluster updates, rejected {}",
            proxy.ip(),
            proxy.stat("listener_manager.lds.update_success"),
            proxy.stat("cluster_manager.cds.update_success"),
            proxy.stat("listener_manager.lds.update_rejected")
                + proxy.stat("cluster_manager.cds.update_rejected"),
        );
        let log = proxy.log();
        for line in log
            .lines()
            .filter(|l| l.contains("rejected") || l.contains("NACK"))
        {
            println!("    {line}");
        }
    }
    let identity = || {
        app.last_headers()
            .get("x-forwarded-client-cert")
            .and_then(|x| x.split(';').find_map(|p| p.strip_prefix("URI=")))
            .map(str::to_string)
            .unwrap_or_else(|| "(none)".into())
    };
    let httpbin_vip = SocketAddr::from((HTTPBIN_VIP, 80));

    step("sidecar -> sidecar: legacy/sleep calls httpbin.legacy; Istio mutual TLS between the two Envoys");
    until(|| get(&sleep_pod, httpbin_vip).is_some_and(|(s, _)| s == 200));
    let answer = get(&sleep_pod, httpbin_vip);
    println!("  sleep -> httpbin.legacy: {answer:?}");
    println!(
        "  httpbin's sidecar saw the client certificate of {}",
        identity()
    );

    step("sidecar -> ambient: legacy/sleep calls web.demo; its sidecar tunnels (HBONE) to the ambient pods' ztunnels with its own identity");
    let web = SocketAddr::from((WEB_VIP, 80));
    until(|| get(&sleep_pod, web).is_some_and(|(s, _)| s == 200));
    for _ in 0..3 {
        println!("  sleep -> web.demo: {:?}", get(&sleep_pod, web));
    }
    // HBONE connections stay open (ztunnels log them when they close): their counters say it.
    let sleep_id = "source_principal=\"spiffe://cluster.local/ns/legacy/sa/sleep\"";
    until(|| ztunnels_saw(c, sleep_id).next().is_some());
    for line in ztunnels_saw(c, sleep_id) {
        println!("  {line}");
    }

    step("ambient -> sidecar: demo/client calls httpbin.legacy; its ztunnel tunnels (HBONE) to the sidecar's HBONE port");
    until(|| get(client, httpbin_vip).is_some_and(|(s, _)| s == 200));
    println!("  client -> httpbin.legacy: {:?}", get(client, httpbin_vip));
    println!("  httpbin's sidecar saw the HBONE peer {}", identity());

    step("the sidecars' request metrics (istio_requests_total, each reporting its own side)");
    until(|| httpbin.metrics().contains("demo/sa/client"));
    for (name, proxy) in [("sleep", &sleep), ("httpbin", &httpbin)] {
        for line in proxy
            .metrics()
            .lines()
            .filter(|l| l.starts_with("istio_requests_total{"))
        {
            let label = |key: &str| {
                line.split(&format!("{key}=\""))
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or("-")
                    .to_string()
            };
            println!(
                "  [{name}] {:>3}  reporter={} {} -> {} ({}) {} {}",
                line.rsplit(' ').next().unwrap_or("0"),
                label("reporter"),
                label("source_principal"),
                label("destination_workload"),
                label("destination_service"),
                label("connection_security_policy"),
                label("response_code"),
            );
        }
    }

    step("istioctl proxy-config listeners / clusters, run in sleep's pod (Envoy's admin is localhost:15000 there)");
    let istioctl = mesh_e2e::bins::binary("istioctl").display().to_string();
    for what in ["listeners", "clusters"] {
        let out = sleep_pod
            .netns
            .exec(&istioctl, &["proxy-config", what])
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        for line in text.lines().take(14) {
            println!("  {line}");
        }
        if text.lines().count() > 14 {
            println!("  ...");
        }
    }
    Ok(Sidecars {
        sleep,
        httpbin,
        _app: app,
        _pods: vec![sleep_pod, httpbin_pod],
    })
}
