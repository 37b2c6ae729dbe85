//! The charts under Helm's own engine: strict lint, every profile renders, the facts an Istio
//! user relies on (names, ports, host paths, capabilities, token audience, RBAC), profiles and
//! bad values.

use std::path::PathBuf;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Service};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use mesh_charts::manifest::Component;
use mesh_charts::{charts_dir, Helm, HelmError, Rendered, Severity, CHARTS, PROFILES};
use serde_json::{json, Value};

const NAMESPACE: &str = "istio-system";

fn chart(name: &str) -> PathBuf {
    charts_dir().join(name)
}

/// The release name istioctl gives the chart (`istio-base`, `istiod`, `istio-cni`, `ztunnel`);
/// the gateway chart's as Istio's documentation installs it (istioctl does not install it).
fn release(name: &str) -> &'static str {
    if name == "gateway" {
        return "istio-ingressgateway";
    }
    Component::ALL
        .iter()
        .map(|c| c.chart())
        .find(|(chart, _)| *chart == name)
        .map(|(_, release)| release)
        .unwrap_or_else(|| panic!("no component renders chart {name}"))
}

fn render(name: &str, values: Value) -> Rendered {
    Helm::default()
        .render(&chart(name), release(name), NAMESPACE, &values)
        .unwrap_or_else(|e| panic!("{name} with {values}: {e}"))
}

fn render_err(name: &str, values: Value) -> String {
    match Helm::default().render(&chart(name), release(name), NAMESPACE, &values) {
        Err(HelmError::Refused { message, .. }) => message,
        other => panic!("{name} with {values}: expected Helm to refuse, got {other:?}"),
    }
}

fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    rendered: &Rendered,
    kind: &str,
    name: &str,
) -> T {
    let object = rendered
        .get(kind, name)
        .unwrap_or_else(|| panic!("no {kind}/{name} in {:?}", rendered.ids()));
    let typed: T = object
        .typed()
        .unwrap_or_else(|e| panic!("{kind}/{name} is not a valid {kind}: {e}"));
    // k8s-openapi drops fields it does not know: a key at the wrong indentation would vanish
    // here, so the typed object must say exactly what the chart rendered.
    let again = serde_json::to_value(&typed).expect("serializes");
    assert_eq!(
        again, object.value,
        "{kind}/{name} has fields Kubernetes does not know"
    );
    typed
}

fn pod_spec(spec: Option<PodSpec>) -> PodSpec {
    spec.expect("pod spec")
}

fn daemonset_pod(rendered: &Rendered, name: &str) -> PodSpec {
    let ds: DaemonSet = typed(rendered, "DaemonSet", name);
    pod_spec(ds.spec.expect("spec").template.spec)
}

fn deployment_pod(rendered: &Rendered, name: &str) -> PodSpec {
    let deployment: Deployment = typed(rendered, "Deployment", name);
    pod_spec(deployment.spec.expect("spec").template.spec)
}

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

fn host_paths(pod: &PodSpec) -> Vec<(String, String)> {
    pod.volumes
        .iter()
        .flatten()
        .filter_map(|v| Some((v.name.clone(), v.host_path.as_ref()?.path.clone())))
        .collect()
}

fn capabilities(c: &Container) -> Vec<String> {
    c.security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default()
}

#[test]
fn every_chart_lints_clean_in_strict_mode_under_every_profile() {
    let helm = Helm::default();
    for name in CHARTS {
        for profile in PROFILES {
            let report = helm
                .lint(&chart(name), &json!({"profile": profile}), true, "v1.33.0")
                .unwrap_or_else(|e| panic!("lint {name}: {e}"));
            assert_eq!(report.total_charts_linted, 1, "{name}");
            let findings = report.findings(Severity::Warning);
            assert!(
                findings.is_empty() && report.errors.is_empty(),
                "{name} ({profile}): {findings:?} {:?}",
                report.errors
            );
        }
    }
}

#[test]
fn every_chart_renders_every_profile_and_platform() {
    for name in CHARTS {
        for profile in PROFILES {
            let rendered = render(name, json!({"profile": profile}));
            assert!(!rendered.objects.is_empty(), "{name} {profile}");
            for object in &rendered.objects {
                let labels = &object.value["metadata"]["labels"];
                assert_eq!(
                    labels["app.kubernetes.io/part-of"],
                    "istio",
                    "{name} {profile}: {} lacks Istio's labels",
                    object.id()
                );
            }
        }
        for platform in ["gke", "k3d", "k3s", "microk8s", "minikube"] {
            render(
                name,
                json!({"profile": "ambient", "global": {"platform": platform}}),
            );
        }
    }
}

#[test]
fn every_chart_links_every_profile_and_the_shared_template() {
    let common = charts_dir().join("common");
    let profiles: Vec<String> = std::fs::read_dir(common.join("profiles"))
        .expect("charts/common/profiles")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    for profile in PROFILES {
        assert!(profiles.contains(&format!("{profile}.yaml")), "{profile}");
    }
    for name in CHARTS {
        let files = chart(name).join("files");
        let linked: Vec<String> = std::fs::read_dir(&files)
            .expect("files/")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|f| f.starts_with("profile-"))
            .collect();
        assert_eq!(linked.len(), profiles.len(), "{name}: {linked:?}");
        for file in &profiles {
            let path = files.join(format!("profile-{file}"));
            let target = std::fs::read_link(&path)
                .unwrap_or_else(|e| panic!("{}: not a link to charts/common: {e}", path.display()));
            assert_eq!(
                target,
                PathBuf::from(format!("../../common/profiles/{file}"))
            );
        }
        let path = chart(name).join("templates/zzz_profile.yaml");
        let target = std::fs::read_link(&path)
            .unwrap_or_else(|e| panic!("{}: not a link to charts/common: {e}", path.display()));
        assert_eq!(target, PathBuf::from("../../common/zzz_profile.yaml"));
    }
}

#[test]
fn the_users_values_beat_the_profile_wherever_they_are_nested() {
    // The ambient profile says cni.ambient.enabled=true; the user's top-level value wins.
    let cni = render(
        "cni",
        json!({"profile": "ambient", "ambient": {"enabled": false}}),
    );
    let config: ConfigMap = typed(&cni, "ConfigMap", "istio-cni-config");
    assert_eq!(config.data.expect("data")["AMBIENT_ENABLED"], "false");
    // Nested under the component's name, as a mesh-wide values file writes it.
    let cni = render("cni", json!({"cni": {"ambient": {"enabled": true}}}));
    let config: ConfigMap = typed(&cni, "ConfigMap", "istio-cni-config");
    assert_eq!(config.data.expect("data")["AMBIENT_ENABLED"], "true");
    // The demo profile's small requests give way to the user's.
    let ztunnel = render(
        "ztunnel",
        json!({"profile": "demo", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}),
    );
    let pod = daemonset_pod(&ztunnel, "ztunnel");
    let requests = container(&pod, "istio-proxy")
        .resources
        .as_ref()
        .and_then(|r| r.requests.clone())
        .expect("requests");
    assert_eq!(requests["cpu"].0, "500m");
    let istiod = render(
        "istiod",
        json!({"profile": "ambient", "env": {"PILOT_ENABLE_AMBIENT": "false"}}),
    );
    let pod = deployment_pod(&istiod, "istiod");
    assert_eq!(
        env(container(&pod, "discovery"), "PILOT_ENABLE_AMBIENT"),
        Some("false")
    );
}

#[test]
fn every_container_names_each_variable_once_and_the_users_env_wins() {
    let values = json!({
        "profile": "ambient",
        "env": {"RUST_LOG": "debug", "POD_NAME": "fixed", "CLUSTER_ID": "c1", "NETWORK": "n1"},
        "meshConfig": {"defaultConfig": {"proxyMetadata": {"NETWORK": "from-metadata"}}}
    });
    for name in CHARTS {
        let rendered = render(name, values.clone());
        for kind in ["Deployment", "DaemonSet"] {
            for object in rendered.of_kind(kind) {
                let containers = object.value["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for c in containers {
                    let mut names: Vec<&str> = c["env"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|e| e["name"].as_str())
                        .collect();
                    let count = names.len();
                    names.sort();
                    names.dedup();
                    assert_eq!(
                        names.len(),
                        count,
                        "{}: {} repeats a variable",
                        object.id(),
                        c["name"]
                    );
                }
            }
        }
    }
    let ztunnel = render("ztunnel", values.clone());
    let pod = daemonset_pod(&ztunnel, "ztunnel");
    let proxy = container(&pod, "istio-proxy");
    assert_eq!(env(proxy, "RUST_LOG"), Some("debug"));
    assert_eq!(env(proxy, "NETWORK"), Some("n1"));
    assert_eq!(env(proxy, "POD_NAME"), Some("fixed"));
    let istiod = render("istiod", values);
    let pod = deployment_pod(&istiod, "istiod");
    assert_eq!(env(container(&pod, "discovery"), "CLUSTER_ID"), Some("c1"));
}

#[test]
fn bad_profiles_platforms_and_prefixes_are_refused_by_name() {
    for name in CHARTS {
        let message = render_err(name, json!({"profile": "ambiant"}));
        assert!(
            message.contains("unknown profile \"ambiant\"") && message.contains("ambient"),
            "{name}: {message}"
        );
        let message = render_err(name, json!({"global": {"platform": "openshift"}}));
        assert!(
            message.contains("unknown platform \"openshift\""),
            "{name}: {message}"
        );
        let message = render_err(name, json!({"compatibilityVersion": "1.24"}));
        assert!(
            message.contains("compatibility version \"1.24\""),
            "{name}: {message}"
        );
        let message = render_err(name, json!({"defaults": {"hub": "x"}}));
        assert!(message.contains("'defaults'"), "{name}: {message}");
    }
    let message = render_err(
        "cni",
        json!({"profile": "ambient", "cni": {"chained": false}}),
    );
    assert!(message.contains("chained=false"), "{message}");
    let message = render_err("cni", json!({"ambient": {"redirectMode": "iptables"}}));
    assert!(
        message.contains("\"iptables\": choose nftables or ebpf"),
        "{message}"
    );
}

#[test]
fn ztunnel_is_a_privileged_node_proxy_with_the_ca_token() {
    let rendered = render("ztunnel", json!({"profile": "ambient"}));
    assert_eq!(
        rendered.ids(),
        ["DaemonSet/ztunnel", "ServiceAccount/ztunnel"]
    );
    let pod = daemonset_pod(&rendered, "ztunnel");
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("ztunnel"));
    let proxy = container(&pod, "istio-proxy");
    assert_eq!(
        proxy.image.as_deref(),
        Some("localhost/mesh/ztunnel:0.1.0-distroless")
    );
    assert_eq!(capabilities(proxy), ["NET_ADMIN", "SYS_ADMIN", "NET_RAW"]);
    let security = proxy.security_context.as_ref().expect("securityContext");
    assert_eq!(security.run_as_user, Some(0));
    assert_eq!(security.run_as_group, Some(1337));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(
        env(proxy, "CA_ADDRESS"),
        Some("istiod.istio-system.svc:15012")
    );
    assert_eq!(
        env(proxy, "XDS_ADDRESS"),
        Some("istiod.istio-system.svc:15012")
    );
    assert_eq!(env(proxy, "ISTIO_META_ENABLE_HBONE"), Some("true"));
    assert_eq!(
        host_paths(&pod),
        [(
            "cni-ztunnel-sock-dir".to_string(),
            "/var/run/ztunnel".to_string()
        )]
    );
    let token = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "istio-token")
        .and_then(|v| v.projected.clone())
        .and_then(|p| p.sources)
        .and_then(|s| s.into_iter().find_map(|s| s.service_account_token))
        .expect("projected token");
    assert_eq!(token.audience.as_deref(), Some("istio-ca"));
    assert_eq!(token.expiration_seconds, Some(43200));
    assert!(
        rendered.of_kind("ClusterRole").next().is_none(),
        "ztunnel needs no RBAC"
    );

    // A revision and Istio's global.* values, flattened onto the chart's own.
    let revised = render(
        "ztunnel",
        json!({"revision": "canary", "global": {"hub": "my.registry/mesh", "tag": "1.2.3"}}),
    );
    let pod = daemonset_pod(&revised, "ztunnel");
    let proxy = container(&pod, "istio-proxy");
    assert_eq!(
        proxy.image.as_deref(),
        Some("my.registry/mesh/ztunnel:1.2.3")
    );
    assert_eq!(
        env(proxy, "CA_ADDRESS"),
        Some("istiod-canary.istio-system.svc:15012")
    );
}

#[test]
fn cni_chains_into_the_node_and_watches_its_pods() {
    let rendered = render("cni", json!({"profile": "ambient"}));
    let config: ConfigMap = typed(&rendered, "ConfigMap", "istio-cni-config");
    let data = config.data.expect("data");
    assert_eq!(data["AMBIENT_ENABLED"], "true");
    assert_eq!(data["EXCLUDE_NAMESPACES"], "kube-system");
    assert_eq!(data["REDIRECTION_MODE"], "nftables");
    let pod = daemonset_pod(&rendered, "istio-cni-node");
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let mut paths: Vec<String> = host_paths(&pod).into_iter().map(|(_, p)| p).collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "/etc/cni/net.d",
            "/opt/cni/bin",
            "/proc",
            "/var/run/istio-cni",
            "/var/run/netns",
            "/var/run/ztunnel"
        ]
    );
    let netns_mount = container(&pod, "cni-agent")
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "cni-netns-dir")
        .expect("netns mount");
    assert_eq!(
        netns_mount.mount_path, "/var/run/netns",
        "the runtime's netns paths are the host's"
    );
    let install = container(&pod, "install-cni");
    assert_eq!(
        install.command.clone().unwrap_or_default(),
        ["cni-node", "install-cni", "--watch"]
    );
    let agent = container(&pod, "cni-agent");
    assert_eq!(
        agent.command.clone().unwrap_or_default(),
        ["cni-node", "run"]
    );
    assert_eq!(env(agent, "HOST_PROC"), Some("/host/proc"));
    assert_eq!(env(agent, "RUST_LOG"), Some("info"));
    for c in [install, agent] {
        assert_eq!(
            capabilities(c),
            [
                "NET_ADMIN",
                "NET_RAW",
                "SYS_PTRACE",
                "SYS_ADMIN",
                "DAC_OVERRIDE"
            ]
        );
        assert_eq!(
            c.image.as_deref(),
            Some("localhost/mesh/install-cni:0.1.0-distroless")
        );
    }
    let probe = agent
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref());
    assert_eq!(probe.and_then(|h| h.path.as_deref()), Some("/readyz"));

    // k3s keeps its CNI files elsewhere; the platform profile knows where.
    let k3s = render(
        "cni",
        json!({"profile": "ambient", "global": {"platform": "k3s"}}),
    );
    let paths: Vec<String> = host_paths(&daemonset_pod(&k3s, "istio-cni-node"))
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert!(paths.contains(&"/var/lib/rancher/k3s/agent/etc/cni/net.d".to_string()));

    // Without the ambient profile the agent enrolls nothing and needs no pods/status.
    let plain = render("cni", json!({}));
    let config: ConfigMap = typed(&plain, "ConfigMap", "istio-cni-config");
    assert_eq!(config.data.expect("data")["AMBIENT_ENABLED"], "false");
    assert!(plain.get("ClusterRole", "istio-cni-ambient").is_none());
}

#[test]
fn istiod_serves_xds_ca_and_webhooks_and_trusts_ztunnel() {
    let rendered = render("istiod", json!({"profile": "ambient"}));
    let service: Service = typed(&rendered, "Service", "istiod");
    let ports: Vec<(i32, String)> = service
        .spec
        .expect("spec")
        .ports
        .expect("ports")
        .into_iter()
        .map(|p| {
            let target = p.target_port.map(|t| format!("{t:?}")).unwrap_or_default();
            (p.port, target)
        })
        .collect();
    assert_eq!(
        ports,
        [
            (15010, String::new()),
            (15012, String::new()),
            (443, "Int(15017)".to_string()),
            (15014, String::new())
        ]
    );
    let deployment: Deployment = typed(&rendered, "Deployment", "istiod");
    let spec = deployment.spec.expect("spec");
    assert_eq!(
        spec.selector.match_labels,
        Some([("istio".to_string(), "pilot".to_string())].into())
    );
    let pod = pod_spec(spec.template.spec);
    let discovery = container(&pod, "discovery");
    assert_eq!(
        env(discovery, "CA_TRUSTED_NODE_ACCOUNTS"),
        Some("istio-system/ztunnel")
    );
    assert_eq!(env(discovery, "PILOT_ENABLE_AMBIENT"), Some("true"));
    assert_eq!(env(discovery, "TOKEN_AUDIENCES"), Some("istio-ca"));
    assert_eq!(
        env(discovery, "ISTIOD_SERVING_DNS_NAMES"),
        Some("istiod.istio-system.svc,istiod.istio-system.svc.cluster.local")
    );
    assert_eq!(
        discovery.image.as_deref(),
        Some("localhost/mesh/pilot:0.1.0-distroless")
    );
    // Istio's 30-minute connection age, passed as Istio's chart passes it; extra arguments
    // follow, and an empty age passes none.
    assert_eq!(
        discovery.args.as_deref(),
        Some(
            ["--keepaliveMaxServerConnectionAge", "30m"]
                .map(String::from)
                .as_slice()
        )
    );
    let tuned = render(
        "istiod",
        json!({"keepaliveMaxServerConnectionAge": "", "extraContainerArgs": ["--keepaliveInterval=20s"]}),
    );
    let tuned_pod = deployment_pod(&tuned, "istiod");
    assert_eq!(
        container(&tuned_pod, "discovery").args.as_deref(),
        Some(["--keepaliveInterval=20s".to_string()].as_slice())
    );
    let waypoints = container(&pod, "waypoint-controller");
    assert_eq!(env(waypoints, "TAG"), Some("0.1.0-distroless"));
    assert_eq!(
        env(waypoints, "DISCOVERY_ADDRESS"),
        Some("istiod.istio-system.svc:15012")
    );
    for kind_name in [
        "ClusterRole/istiod-clusterrole-istio-system",
        "ClusterRole/istiod-gateway-controller-istio-system",
        "ClusterRoleBinding/istiod-clusterrole-istio-system",
        "ConfigMap/istio",
        "ConfigMap/values",
        "HorizontalPodAutoscaler/istiod",
        "Role/istiod",
        "RoleBinding/istiod",
        "ServiceAccount/istiod",
        "ValidatingWebhookConfiguration/istio-validator-istio-system",
    ] {
        assert!(
            rendered.ids().iter().any(|id| id == kind_name),
            "{kind_name}"
        );
    }
    let mesh: ConfigMap = typed(&rendered, "ConfigMap", "istio");
    let mesh: Value =
        serde_yaml::from_str(&mesh.data.expect("data")["mesh"]).expect("mesh is YAML");
    assert_eq!(mesh["trustDomain"], "cluster.local");
    assert_eq!(mesh["rootNamespace"], "istio-system");
    assert_eq!(
        mesh["defaultConfig"]["discoveryAddress"],
        "istiod.istio-system.svc:15012"
    );
    let webhook = rendered
        .get(
            "ValidatingWebhookConfiguration",
            "istio-validator-istio-system",
        )
        .expect("validator");
    assert_eq!(
        webhook.value["metadata"]["labels"]["istio.io/rev"],
        "default"
    );
    assert_eq!(
        webhook.value["webhooks"][0]["clientConfig"]["service"]["path"],
        "/validate"
    );

    // pilot.X is X; a revision renames everything it owns.
    let canary = render(
        "istiod",
        json!({"revision": "canary", "pilot": {"autoscaleEnabled": false, "replicaCount": 2}}),
    );
    let deployment: Deployment = typed(&canary, "Deployment", "istiod-canary");
    assert_eq!(deployment.spec.expect("spec").replicas, Some(2));
    assert!(canary
        .get("HorizontalPodAutoscaler", "istiod-canary")
        .is_none());
    assert!(canary.get("PodDisruptionBudget", "istiod-canary").is_some());
    assert!(canary.get("ConfigMap", "istio-canary").is_some());
}

/// What each component calls on the API server (docs/kubernetes.md, "RBAC the components
/// need"): (group, resource, verb).
const ISTIOD_CALLS: &[(&str, &str, &str)] = &[
    ("", "namespaces", "watch"),
    ("", "pods", "list"),
    ("", "services", "watch"),
    ("", "serviceaccounts", "list"),
    ("", "nodes", "watch"),
    ("", "secrets", "watch"),
    ("discovery.k8s.io", "endpointslices", "watch"),
    ("", "configmaps", "create"),
    ("", "configmaps", "patch"),
    ("", "configmaps", "update"),
    ("apps", "deployments", "watch"),
    ("networking.istio.io", "serviceentries", "watch"),
    ("networking.istio.io", "workloadentries", "list"),
    ("networking.istio.io", "virtualservices", "watch"),
    ("networking.istio.io", "destinationrules", "watch"),
    ("networking.istio.io", "sidecars", "watch"),
    ("networking.istio.io", "gateways", "watch"),
    ("networking.istio.io", "gateways", "create"),
    ("security.istio.io", "authorizationpolicies", "watch"),
    ("security.istio.io", "peerauthentications", "list"),
    ("security.istio.io", "requestauthentications", "watch"),
    ("gateway.networking.k8s.io", "httproutes", "watch"),
    ("gateway.networking.k8s.io", "gatewayclasses", "list"),
    ("authentication.k8s.io", "tokenreviews", "create"),
    (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "update",
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "watch",
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "update",
    ),
    ("", "services/status", "patch"),
    ("networking.istio.io", "serviceentries/status", "patch"),
    ("security.istio.io", "authorizationpolicies/status", "patch"),
    ("", "secrets", "get"),
    ("", "secrets", "create"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    // The waypoint controller runs as istiod's service account.
    ("gateway.networking.k8s.io", "gateways/status", "patch"),
    ("", "services", "create"),
    ("", "serviceaccounts", "delete"),
    ("apps", "deployments", "patch"),
];

const CNI_CALLS: &[(&str, &str, &str)] = &[
    ("", "pods", "watch"),
    ("", "namespaces", "list"),
    ("", "pods/status", "patch"),
    ("apps", "daemonsets", "get"),
    ("", "nodes", "get"),
];

fn allows(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    let has = |list: &Option<Vec<String>>, want: &str| {
        list.iter().flatten().any(|x| x == want || x == "*")
    };
    rules.iter().any(|r| {
        has(&r.api_groups, group)
            && r.resources
                .iter()
                .flatten()
                .any(|x| x == resource || x == "*")
            && r.verbs.iter().any(|x| x == verb || x == "*")
    })
}

/// Every rule bound to `account` by the rendered (Cluster)RoleBindings.
fn rules_of(rendered: &Rendered, account: &str) -> Vec<PolicyRule> {
    let mut rules = Vec::new();
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for binding in rendered.of_kind(kind) {
            let bound = binding.value["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["kind"] == "ServiceAccount" && s["name"] == account);
            if !bound {
                continue;
            }
            let role_kind = binding.value["roleRef"]["kind"]
                .as_str()
                .unwrap_or_default();
            let role_name = binding.value["roleRef"]["name"]
                .as_str()
                .unwrap_or_default();
            let role_rules = if role_kind == "Role" {
                typed::<Role>(rendered, role_kind, role_name).rules
            } else {
                typed::<ClusterRole>(rendered, role_kind, role_name).rules
            };
            rules.extend(role_rules.into_iter().flatten());
        }
    }
    rules
}

#[test]
fn the_rbac_covers_every_call_the_components_make() {
    let istiod = render("istiod", json!({"profile": "ambient"}));
    let rules = rules_of(&istiod, "istiod");
    for (group, resource, verb) in ISTIOD_CALLS {
        assert!(
            allows(&rules, group, resource, verb),
            "istiod may not {verb} {resource} in '{group}'"
        );
    }
    let cni = render("cni", json!({"profile": "ambient"}));
    let rules = rules_of(&cni, "istio-cni");
    for (group, resource, verb) in CNI_CALLS {
        assert!(
            allows(&rules, group, resource, verb),
            "istio-cni may not {verb} {resource} in '{group}'"
        );
    }
    assert!(
        !allows(&rules, "", "pods", "delete"),
        "istio-cni deletes no pods"
    );
}

#[test]
fn resource_scope_splits_cluster_and_namespaced_objects() {
    for name in ["istiod", "cni", "base"] {
        let cluster = render(
            name,
            json!({"profile": "ambient", "global": {"resourceScope": "cluster"}}),
        );
        let namespaced = render(
            name,
            json!({"profile": "ambient", "global": {"resourceScope": "namespace"}}),
        );
        assert!(
            cluster.objects.iter().all(|o| o.namespace().is_none()),
            "{name}: {:?}",
            cluster.ids()
        );
        // As in Istio, the revision's own validating webhook goes with the namespaced objects.
        let cluster_kinds = [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
        ];
        assert!(
            namespaced
                .objects
                .iter()
                .all(|o| !cluster_kinds.contains(&o.kind())
                    && o.name() != "istiod-default-validator"),
            "{name}: {:?}",
            namespaced.ids()
        );
        assert!(!namespaced.objects.is_empty() || name == "base", "{name}");
    }
}

#[test]
fn a_values_file_written_for_istios_charts_renders() {
    // The shape of a values file an Istio ambient user keeps: profile, hub/tag, pilot env and
    // resources, cni and ztunnel settings, and keys this mesh does not read.
    let values = json!({
        "profile": "ambient",
        "global": {
            "hub": "registry.example.com/istio",
            "tag": "1.28.0",
            "logging": {"level": "default:debug"},
            "proxy": {"clusterDomain": "cluster.local", "resources": {"requests": {"cpu": "50m"}}},
            "imagePullSecrets": ["regcred"],
            "meshID": "mesh1",
            "multiCluster": {"clusterName": "east"},
            "network": "net1"
        },
        "pilot": {
            "env": {"PILOT_ENABLE_AMBIENT": "true", "PILOT_ENABLE_ALPHA_GATEWAY_API": "true"},
            "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
            "autoscaleMin": 2,
            "nodeSelector": {"node-role": "infra"}
        },
        "meshConfig": {"accessLogFile": "/dev/stdout", "trustDomain": "example.org"},
        "cni": {"ambient": {"dnsCapture": false}, "excludeNamespaces": ["kube-system", "monitoring"]},
        "ztunnel": {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}},
        "sidecarInjectorWebhook": {"rewriteAppHTTPProbe": true},
        "telemetry": {"enabled": true}
    });
    for name in CHARTS {
        render(name, values.clone());
    }
    let istiod = render("istiod", values.clone());
    let pod = deployment_pod(&istiod, "istiod");
    let discovery = container(&pod, "discovery");
    assert_eq!(
        discovery.image.as_deref(),
        Some("registry.example.com/istio/pilot:1.28.0-distroless")
    );
    assert_eq!(env(discovery, "RUST_LOG"), Some("debug"));
    assert_eq!(env(discovery, "CLUSTER_ID"), Some("east"));
    assert_eq!(
        env(discovery, "PILOT_ENABLE_ALPHA_GATEWAY_API"),
        Some("true")
    );
    let limits = discovery
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .expect("limits");
    assert_eq!(limits["memory"].0, "1Gi");
    let mesh: ConfigMap = typed(&istiod, "ConfigMap", "istio");
    let mesh: Value = serde_yaml::from_str(&mesh.data.expect("data")["mesh"]).expect("YAML");
    assert_eq!(mesh["trustDomain"], "example.org");
    assert_eq!(mesh["accessLogFile"], "/dev/stdout");
    assert_eq!(mesh["defaultConfig"]["meshId"], "mesh1");

    let cni = render("cni", values.clone());
    let config: ConfigMap = typed(&cni, "ConfigMap", "istio-cni-config");
    let data = config.data.expect("data");
    assert_eq!(data["AMBIENT_DNS_CAPTURE"], "false");
    assert_eq!(data["EXCLUDE_NAMESPACES"], "kube-system,monitoring");

    let ztunnel = render("ztunnel", values);
    let pod = daemonset_pod(&ztunnel, "ztunnel");
    let proxy = container(&pod, "istio-proxy");
    assert_eq!(
        proxy.image.as_deref(),
        Some("registry.example.com/istio/ztunnel:1.28.0-distroless")
    );
    assert_eq!(env(proxy, "NETWORK"), Some("net1"));
    let requests = proxy
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .expect("requests");
    assert_eq!(requests["memory"].0, "256Mi");
}

#[test]
fn istiod_renders_the_injector_webhooks_and_the_configuration_it_reads() {
    let off = render(
        "istiod",
        json!({"sidecarInjectorWebhook": {"enabled": false}}),
    );
    assert!(
        off.of_kind("MutatingWebhookConfiguration").next().is_none(),
        "enabled: false leaves the injector's webhooks out"
    );
    let rendered = render(
        "istiod",
        json!({"global": {"hub": "registry.example/mesh", "tag": "2.0"},
               "sidecarInjectorWebhook": {
                   "neverInjectSelector": [{"matchLabels": {"team": "batch"}}]}}),
    );
    let webhook = rendered
        .get("MutatingWebhookConfiguration", "istio-sidecar-injector")
        .expect("the injector's webhook configuration");
    let hooks = webhook.value["webhooks"].as_array().expect("webhooks");
    let names: Vec<&str> = hooks.iter().filter_map(|h| h["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "rev.namespace.sidecar-injector.istio.io",
            "rev.object.sidecar-injector.istio.io",
            "namespace.sidecar-injector.istio.io",
            "object.sidecar-injector.istio.io"
        ]
    );
    for hook in hooks {
        assert_eq!(hook["clientConfig"]["service"]["path"], "/inject");
        assert_eq!(hook["clientConfig"]["service"]["port"], 443);
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["rules"][0]["resources"], json!(["pods"]));
    }
    assert_eq!(
        hooks[2]["namespaceSelector"]["matchExpressions"][0],
        json!({"key": "istio-injection", "operator": "In", "values": ["enabled"]})
    );
    // A revision has only its own two webhooks and its own names.
    let canary = render(
        "istiod",
        json!({"revision": "canary",
               "sidecarInjectorWebhook": {"enabled": true, "enableNamespacesByDefault": true}}),
    );
    let webhook = canary
        .get(
            "MutatingWebhookConfiguration",
            "istio-sidecar-injector-canary",
        )
        .expect("the canary injector");
    assert_eq!(webhook.value["webhooks"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        webhook.value["webhooks"][0]["clientConfig"]["service"]["name"],
        "istiod-canary"
    );

    // The ConfigMap istiod mounts holds values the injector reads as Istio's names.
    let config = rendered
        .get("ConfigMap", "istio-sidecar-injector")
        .expect("the injector's ConfigMap");
    let values: Value =
        serde_json::from_str(config.value["data"]["values"].as_str().expect("values"))
            .expect("JSON values");
    let inject = mesh_inject::InjectConfig::from_values(&values);
    assert_eq!(inject.image(), "registry.example/mesh/proxyv2:2.0");
    assert_eq!(inject.ca_address, "istiod.istio-system.svc:15012");
    let policy: Value =
        serde_yaml::from_str(config.value["data"]["config"].as_str().expect("config"))
            .expect("YAML config");
    assert_eq!(
        policy,
        serde_json::json!({"policy": "enabled", "alwaysInjectSelector": [],
            "neverInjectSelector": [{"matchLabels": {"team": "batch"}}]})
    );
    assert_eq!(
        inject.never_inject.len(),
        1,
        "the injector reads the selectors"
    );
    let deployment = rendered.get("Deployment", "istiod").expect("istiod");
    let mounts = deployment.value["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts");
    assert!(mounts
        .iter()
        .any(|m| m["name"] == "inject" && m["mountPath"] == "/var/lib/istio/inject"));
}

#[test]
fn the_gateway_chart_renders_a_gateway_for_the_injector_as_istios() {
    let rendered = render("gateway", json!({}));
    let name = "istio-ingressgateway";
    let deployment: Deployment = typed(&rendered, "Deployment", name);
    let template = deployment.spec.expect("spec").template;
    let meta = template.metadata.expect("pod metadata");
    let labels = meta.labels.expect("labels");
    assert_eq!(labels["sidecar.istio.io/inject"], "true");
    assert_eq!(labels["istio"], "ingressgateway");
    assert_eq!(labels["app"], name);
    assert_eq!(
        meta.annotations.expect("annotations")["inject.istio.io/templates"],
        "gateway"
    );
    let pod = template.spec.expect("pod spec");
    let proxy = container(&pod, "istio-proxy");
    assert_eq!(
        proxy.image.as_deref(),
        Some("auto"),
        "the injector fills it in"
    );
    let security = proxy.security_context.clone().expect("security context");
    assert_eq!(security.run_as_user, Some(1337));
    let sysctls = pod
        .security_context
        .and_then(|s| s.sysctls)
        .expect("sysctls");
    assert_eq!(sysctls[0].name, "net.ipv4.ip_unprivileged_port_start");
    assert_eq!(pod.service_account_name.as_deref(), Some(name));

    let service: Service = typed(&rendered, "Service", name);
    let spec = service.spec.expect("service spec");
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    let ports: Vec<(i32, String)> = (spec.ports.expect("ports").iter())
        .map(|p| (p.port, p.name.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        ports,
        [
            (15021, "status-port".to_string()),
            (80, "http2".to_string()),
            (443, "https".to_string())
        ]
    );
    assert_eq!(spec.selector.expect("selector")["istio"], "ingressgateway");
    let role: Role = typed(&rendered, "Role", name);
    let rules = role.rules.expect("rules");
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["secrets".to_string()][..])
    );
    assert!(rendered.get("RoleBinding", name).is_some());
    assert!(rendered.get("ServiceAccount", name).is_some());
    let hpa = &rendered
        .get("HorizontalPodAutoscaler", name)
        .expect("hpa")
        .value;
    assert_eq!(hpa["spec"]["maxReplicas"], 5);
    assert!(rendered.get("PodDisruptionBudget", name).is_none());

    // Istio's value names: name, service type and ports, kind, autoscaling, PDB, env.
    let custom = render(
        "gateway",
        json!({"name": "edge", "kind": "DaemonSet", "service": {"type": "None"},
               "podDisruptionBudget": {"minAvailable": 1}, "env": {"EXTRA": "1"},
               "labels": {"team": "web"}}),
    );
    let pod = daemonset_pod(&custom, "edge");
    assert_eq!(env(container(&pod, "istio-proxy"), "EXTRA"), Some("1"));
    assert!(custom.get("Service", "edge").is_none());
    assert!(custom.get("HorizontalPodAutoscaler", "edge").is_none());
    let pdb = &custom
        .get("PodDisruptionBudget", "edge")
        .expect("pdb")
        .value;
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(pdb["spec"]["selector"]["matchLabels"]["istio"], "edge");
    assert_eq!(
        custom.get("DaemonSet", "edge").expect("ds").value["metadata"]["labels"]["team"],
        "web"
    );
    let refused = render_err("gateway", json!({"kind": "StatefulSet"}));
    assert!(refused.contains("kind \"StatefulSet\""), "{refused}");
}
