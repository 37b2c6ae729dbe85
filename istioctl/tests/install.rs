//! `istioctl install`, `uninstall` and the cluster precheck against the fake API server: the
//! objects `manifest generate` renders, applied in dependency order by server-side apply,
//! waited for, pruned when a later install drops them, and removed by uninstall.

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use mesh_testutil::kube_api::{core_types, FakeApiServer, ResourceType};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

struct Cluster {
    api: FakeApiServer,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

async fn cluster() -> Cluster {
    let api = FakeApiServer::start(core_types()).await.expect("fake API");
    api.seed(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"}}))
        .expect("node");
    api.seed(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"},
                    "status": {"phase": "Active"}}),
    )
    .expect("namespace");
    api.simulate_rollouts(true);
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).expect("kubeconfig");
    Cluster {
        api,
        _dir: dir,
        kubeconfig,
    }
}

impl Cluster {
    /// Runs istioctl with `--kubeconfig` (for the subcommands that take it) and `stdin`.
    async fn istioctl(&self, args: &[&str], stdin: &str) -> Output {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if args.first().is_some_and(|a| *a != "manifest") {
            all.push("--kubeconfig".into());
            all.push(self.kubeconfig.display().to_string());
        }
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_istioctl"))
            .args(&all)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("istioctl runs");
        if let Some(mut input) = child.stdin.take() {
            input.write_all(stdin.as_bytes()).await.expect("stdin");
        }
        child.wait_with_output().await.expect("istioctl ends")
    }

    fn get(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Option<Value> {
        self.api.get(api_version, kind, ns, name)
    }

    fn writes(&self) -> Vec<String> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| !r.starts_with("GET "))
            .filter(|r| !r.contains("accessreviews"))
            .collect()
    }
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn succeeded(out: &Output) -> String {
    let (stdout, stderr) = text(out);
    assert!(
        out.status.success(),
        "istioctl failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

/// Whether every field of `want` is in `have` with the same value.
fn contains(have: &Value, want: &Value) -> Result<(), String> {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => {
            for (k, wv) in w {
                let hv = h.get(k).ok_or_else(|| format!("missing field {k}"))?;
                contains(hv, wv).map_err(|e| format!("{k}: {e}"))?;
            }
            Ok(())
        }
        (Value::Array(h), Value::Array(w)) if h.len() == w.len() => {
            for (i, (hv, wv)) in h.iter().zip(w).enumerate() {
                contains(hv, wv).map_err(|e| format!("[{i}]: {e}"))?;
            }
            Ok(())
        }
        _ if have == want => Ok(()),
        _ => Err(format!("{have} is not {want}")),
    }
}

fn position(lines: &[String], wanted: &str) -> usize {
    lines
        .iter()
        .position(|l| l.contains(wanted))
        .unwrap_or_else(|| panic!("no {wanted:?} in {lines:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_applies_what_manifest_generate_renders_in_dependency_order() {
    let c = cluster().await;
    let out = c
        .istioctl(&["install", "--set", "profile=ambient", "-y"], "")
        .await;
    let stdout = succeeded(&out);
    let lines: Vec<String> = stdout.lines().map(str::to_string).collect();
    let done: Vec<usize> = [
        "\u{2714} Istio core installed",
        "\u{2714} Istiod installed",
        "\u{2714} CNI installed",
        "\u{2714} Ztunnel installed",
        "\u{2714} Installation complete",
        "The ambient profile has been installed successfully",
    ]
    .iter()
    .map(|l| position(&lines, l))
    .collect();
    assert!(done.windows(2).all(|w| w[0] < w[1]), "{stdout}");

    // Object by object, what is stored holds what the charts render for the same flags.
    let generated = c
        .istioctl(&["manifest", "generate", "--set", "profile=ambient"], "")
        .await;
    let generated = succeeded(&generated);
    let mut count = 0;
    for doc in serde_yaml::Deserializer::from_str(&generated) {
        let want = Value::deserialize(doc).expect("YAML");
        if want.is_null() {
            continue;
        }
        count += 1;
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let (api_version, kind) = (s(&want["apiVersion"]), s(&want["kind"]));
        let (ns, name) = (
            s(&want["metadata"]["namespace"]),
            s(&want["metadata"]["name"]),
        );
        let have = c
            .get(&api_version, &kind, &ns, &name)
            .unwrap_or_else(|| panic!("{kind} {ns}/{name} was not installed"));
        if let Err(e) = contains(&have, &want) {
            panic!("{kind} {ns}/{name} differs from the rendered object: {e}");
        }
    }
    assert!(count > 40, "only {count} objects rendered");

    let ns = c
        .get("v1", "Namespace", "", "istio-system")
        .expect("namespace created");
    assert!(ns["metadata"]["labels"]["topology.istio.io/network"].is_null());
    let crd = c
        .get(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            "authorizationpolicies.security.istio.io",
        )
        .expect("CRD");
    assert!(crd["status"]["conditions"]
        .to_string()
        .contains("Established"));

    // Every write is a forced server-side apply by istio-operator (the namespace aside), and
    // the components went in order: CRDs, istiod, the CNI agent, ztunnel.
    let writes = c.writes();
    let patches: Vec<&String> = writes.iter().filter(|w| w.starts_with("PATCH ")).collect();
    assert!(patches.len() >= count, "{writes:#?}");
    for p in &patches {
        assert!(
            p.contains("fieldManager=istio-operator") && p.contains("force=true"),
            "{p}"
        );
    }
    assert_eq!(
        writes.len(),
        patches.len() + 1,
        "one namespace create: {writes:#?}"
    );
    let first = |path: &str| position(&writes, path);
    let order = [
        first("/customresourcedefinitions/"),
        first("/deployments/istiod"),
        first("/daemonsets/istio-cni-node"),
        first("/daemonsets/ztunnel"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{writes:#?}");

    // The same install again changes nothing and prunes nothing.
    let again = c
        .istioctl(&["install", "--set", "profile=ambient", "-y"], "")
        .await;
    let stdout = succeeded(&again);
    assert!(!stdout.contains("Removed"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_install_prunes_what_its_profile_no_longer_renders() {
    let c = cluster().await;
    succeeded(
        &c.istioctl(&["install", "--set", "profile=ambient", "-y"], "")
            .await,
    );
    // A user's object of a pruned kind, and one the user asked to keep, stay.
    c.api
        .seed(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "mine", "namespace": "istio-system"}}))
        .expect("seed");
    let mut kept = c
        .get("v1", "ServiceAccount", "istio-system", "ztunnel")
        .expect("ztunnel SA");
    kept["metadata"]["labels"]["install.operator.istio.io/owning-resource-not-pruned"] =
        json!("true");
    c.api.seed(kept).expect("label");

    let out = c
        .istioctl(&["install", "--set", "profile=minimal", "-y"], "")
        .await;
    let stdout = succeeded(&out);
    assert!(stdout.contains("- Pruning removed resources"), "{stdout}");
    assert!(
        stdout.contains("  Removed DaemonSet/ztunnel.istio-system."),
        "{stdout}"
    );
    assert!(
        stdout.contains("  Removed ClusterRole/istio-cni."),
        "{stdout}"
    );
    assert!(!stdout.contains("CNI installed"), "{stdout}");
    for (api_version, kind, ns, name) in [
        ("apps/v1", "DaemonSet", "istio-system", "ztunnel"),
        ("apps/v1", "DaemonSet", "istio-system", "istio-cni-node"),
        ("v1", "ConfigMap", "istio-system", "istio-cni-config"),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "",
            "istio-cni",
        ),
    ] {
        assert!(
            c.get(api_version, kind, ns, name).is_none(),
            "{kind} {name} stayed"
        );
    }
    for (api_version, kind, ns, name) in [
        ("apps/v1", "Deployment", "istio-system", "istiod"),
        ("v1", "ConfigMap", "istio-system", "mine"),
        ("v1", "ServiceAccount", "istio-system", "ztunnel"),
        (
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            "peerauthentications.security.istio.io",
        ),
    ] {
        assert!(
            c.get(api_version, kind, ns, name).is_some(),
            "{kind} {name} went"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_waits_for_workloads_and_names_what_is_not_ready() {
    let c = cluster().await;
    c.api.simulate_rollouts(false);
    let out = c
        .istioctl(
            &[
                "install",
                "--set",
                "profile=minimal",
                "-y",
                "--readiness-timeout",
                "2s",
            ],
            "",
        )
        .await;
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("\u{2714} Istio core installed"), "{stdout}");
    assert!(
        stdout.contains(
            "- Processing resources for Istiod. Waiting for Deployment/istio-system/istiod"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("\u{2718} Istiod encountered an error: failed to wait for resource: resources not ready after 2s"),
        "{stdout}"
    );
    assert!(
        stderr.contains("failed to install manifests")
            && stderr.contains(
                "Deployment/istio-system/istiod (the controller has not seen generation 1 yet"
            ),
        "{stderr}"
    );
    assert!(!stdout.contains("Installation complete"), "{stdout}");

    // Rollouts that finish while istioctl waits let it finish.
    let run = c.istioctl(
        &[
            "install",
            "--set",
            "profile=minimal",
            "-y",
            "--readiness-timeout",
            "60s",
        ],
        "",
    );
    let finish = async {
        // Once istioctl reads istiod's Deployment it is waiting for it.
        let waiting = |r: &String| {
            r.starts_with("GET /apis/apps/v1/namespaces/istio-system/deployments/istiod")
        };
        let before = c.api.requests().iter().filter(|r| waiting(r)).count();
        for _ in 0..600 {
            if c.api.requests().iter().filter(|r| waiting(r)).count() > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        c.api.simulate_rollouts(true);
    };
    let (out, ()) = tokio::join!(run, finish);
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("\u{2714} Installation complete"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_asks_first_and_bad_input_touches_nothing() {
    let c = cluster().await;
    let out = c
        .istioctl(&["install", "--set", "profile=ambient"], "maybe\nn\n")
        .await;
    let (stdout, _) = text(&out);
    assert!(!out.status.success());
    assert_eq!(
        stdout
            .matches("This will install the Istio 0.1.0 profile \"ambient\" into the cluster. Proceed? (y/N)")
            .count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("Cancelled."), "{stdout}");

    let out = c
        .istioctl(&["install", "--set", "profile=nope", "-y"], "")
        .await;
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("unknown profile \"nope\""), "{stderr}");
    let out = c.istioctl(&["install", "-r", "Canary", "-y"], "").await;
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("invalid revision specified: \"Canary\""),
        "{stderr}"
    );

    let out = c
        .istioctl(&["install", "--set", "profile=ambient", "--dry-run"], "")
        .await;
    let stdout = succeeded(&out);
    assert!(stdout.contains("\u{2714} Ztunnel installed"), "{stdout}");
    assert_eq!(c.writes(), Vec::<String>::new(), "nothing may be written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_removes_a_revision_then_purge_removes_the_rest() {
    let c = cluster().await;
    succeeded(
        &c.istioctl(&["install", "--set", "profile=ambient", "-y"], "")
            .await,
    );
    c.api.add_type(ResourceType::custom(
        "gateway.networking.k8s.io",
        "v1",
        "gateways",
        "Gateway",
        true,
    ));
    for (name, class) in [("waypoint", "istio-waypoint"), ("ingress", "other")] {
        c.api
            .seed(
                json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"gatewayClassName": class, "listeners": []}}),
            )
            .expect("gateway");
    }

    let out = c.istioctl(&["uninstall", "-y"], "").await;
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("at least one of the --revision (or --set revision=<revision>), --filename or --purge flags must be set"),
        "{stderr}"
    );

    let out = c
        .istioctl(&["uninstall", "--revision", "default", "-y"], "")
        .await;
    let stdout = succeeded(&out);
    assert!(stdout.contains("\u{2714} Uninstall complete"), "{stdout}");
    for (api_version, kind, ns, name) in [
        ("apps/v1", "Deployment", "istio-system", "istiod"),
        ("apps/v1", "DaemonSet", "istio-system", "ztunnel"),
        ("apps/v1", "DaemonSet", "istio-system", "istio-cni-node"),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "",
            "istiod-istio-system",
        ),
    ] {
        assert!(
            c.get(api_version, kind, ns, name).is_none(),
            "{kind} {name} stayed"
        );
    }
    // The base component stays for other revisions; waypoints without the revision label too.
    for (api_version, kind, ns, name) in [
        (
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            "authorizationpolicies.security.istio.io",
        ),
        (
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
            "",
            "istiod-default-validator",
        ),
        (
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "default",
            "waypoint",
        ),
    ] {
        assert!(
            c.get(api_version, kind, ns, name).is_some(),
            "{kind} {name} went"
        );
    }

    let out = c.istioctl(&["uninstall", "--purge", "-y", "-v"], "").await;
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("All Istio resources will be pruned from the cluster"),
        "{stdout}"
    );
    assert!(
        stdout.contains("The following resources will be pruned from the cluster: ServiceAccount: istio-system/istio-reader-service-account."),
        "{stdout}"
    );
    assert!(
        c.get(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            "authorizationpolicies.security.istio.io"
        )
        .is_none(),
        "CRDs are purged"
    );
    assert!(c
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "default",
            "waypoint"
        )
        .is_none());
    assert!(c
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "default",
            "ingress"
        )
        .is_some());
    assert!(
        c.get("v1", "Namespace", "", "istio-system").is_some(),
        "the namespace stays"
    );

    let out = c.istioctl(&["uninstall", "--purge", "-y"], "").await;
    let stdout = succeeded(&out);
    assert!(
        stdout.contains(
            "No resources will be pruned from the cluster. Please double check the input configs"
        ),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precheck_reports_the_version_permissions_and_gateway_api_of_a_cluster() {
    let c = cluster().await;
    let out = c.istioctl(&["x", "precheck"], "").await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("\u{2714} No issues found when checking the cluster. Istio is safe to install or upgrade!"),
        "{stderr}"
    );

    c.api.set_version(1, 27);
    c.api
        .deny("create", "rbac.authorization.k8s.io", "clusterroles");
    c.api
        .seed(
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "httproutes.gateway.networking.k8s.io"},
            "spec": {"group": "gateway.networking.k8s.io", "scope": "Namespaced",
                     "names": {"plural": "httproutes", "kind": "HTTPRoute"},
                     "versions": [{"name": "v1beta1", "served": true, "storage": true}]}}),
        )
        .expect("CRD");
    let out = c.istioctl(&["x", "precheck"], "").await;
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success());
    for line in [
        "Error [IST0142] (Cluster) The Kubernetes Version \"v1.27.0\" is lower than the minimum version: 1.28",
        "Error [IST0141] (Cluster) Missing required permission to create resource clusterroles (denied by the fake API server's deny list)",
        "Error [IST0156] (CustomResourceDefinition httproutes.gateway.networking.k8s.io) The Gateway API CRD version v1beta1 is lower than the minimum version: v1",
    ] {
        assert!(stdout.contains(line), "{line}\n{stdout}");
    }
    assert!(
        stderr.contains(
            "Issues found when checking the cluster. Istio may not be safe to install or upgrade."
        ),
        "{stderr}"
    );
}
