//! `istioctl manifest generate`: the same objects the charts render for the same values, with
//! istioctl's labels, components chosen by the profile, bad input named.

use std::process::{Command, Output};

use mesh_charts::{charts_dir, Helm};
use serde::Deserialize;
use serde_json::{json, Value};

fn istioctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_istioctl"))
        .args(args)
        .output()
        .expect("istioctl runs")
}

fn objects(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "istioctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn without_istioctl_labels(mut object: Value) -> Value {
    if let Some(labels) = object["metadata"]["labels"].as_object_mut() {
        for key in [
            "operator.istio.io/managed",
            "operator.istio.io/version",
            "operator.istio.io/component",
        ] {
            labels.remove(key);
        }
    }
    object
}

#[test]
fn the_ambient_manifest_is_the_charts_objects_in_install_order() {
    let out = istioctl(&[
        "manifest",
        "generate",
        "--set",
        "profile=ambient",
        "--set",
        "values.global.hub=registry.example.com/mesh",
        "--set",
        "meshConfig.accessLogFile=/dev/stdout",
    ]);
    let generated = objects(&out);

    let values = json!({
        "profile": "ambient",
        "global": {"hub": "registry.example.com/mesh"},
        "meshConfig": {"accessLogFile": "/dev/stdout"}
    });
    let helm = Helm::default();
    let mut expected = Vec::new();
    let mut components = Vec::new();
    for (chart, release, component) in [
        ("base", "istio-base", "Base"),
        ("istiod", "istiod", "Pilot"),
        ("cni", "istio-cni", "Cni"),
        ("ztunnel", "ztunnel", "Ztunnel"),
    ] {
        let rendered = helm
            .render(&charts_dir().join(chart), release, "istio-system", &values)
            .expect("chart renders");
        for object in rendered.objects {
            expected.push(object.value);
            components.push(component);
        }
    }
    assert_eq!(generated.len(), expected.len());
    for ((got, want), component) in generated.iter().zip(&expected).zip(&components) {
        let id = format!("{}/{}", want["kind"], want["metadata"]["name"]);
        let labels = &got["metadata"]["labels"];
        assert_eq!(labels["operator.istio.io/component"], *component, "{id}");
        assert_eq!(labels["operator.istio.io/managed"], "Reconcile", "{id}");
        assert_eq!(
            labels["istio.io/rev"],
            want["metadata"]["labels"]
                .get("istio.io/rev")
                .cloned()
                .unwrap_or(json!("default")),
            "{id}"
        );
        let mut want = want.clone();
        if let Some(labels) = want["metadata"]["labels"].as_object_mut() {
            labels.entry("istio.io/rev").or_insert(json!("default"));
        }
        assert_eq!(
            without_istioctl_labels(got.clone()),
            without_istioctl_labels(want),
            "{id}"
        );
    }
    let deployment = generated
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("istiod");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example.com/mesh/pilot:0.1.0-distroless"
    );
}

#[test]
fn profiles_choose_components_and_files_merge_before_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("operator.yaml");
    std::fs::write(
        &file,
        "apiVersion: install.istio.io/v1alpha1\nkind: IstioOperator\nspec:\n  profile: minimal\n  revision: stable\n  components:\n    cni:\n      enabled: true\n",
    )
    .expect("write");
    let out = istioctl(&[
        "manifest",
        "generate",
        "-f",
        file.to_str().expect("utf-8"),
        "--set",
        "revision=canary",
    ]);
    let generated = objects(&out);
    let mut components: Vec<&str> = generated
        .iter()
        .filter_map(|o| o["metadata"]["labels"]["operator.istio.io/component"].as_str())
        .collect();
    components.dedup();
    assert_eq!(components, ["Base", "Pilot", "Cni"]);
    assert!(generated
        .iter()
        .any(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "istiod-canary"));
    assert!(!generated
        .iter()
        .any(|o| o["metadata"]["name"] == "istiod-stable"));

    // What the user writes under values wins over the spec's own fields, as in Istio.
    let out = istioctl(&[
        "manifest",
        "generate",
        "--set",
        "hub=spec.example.com",
        "--set",
        "values.global.hub=values.example.com",
        "--set",
        "tag=1.20",
    ]);
    let deployment = objects(&out)
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("istiod");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "values.example.com/pilot:1.20"
    );

    let out = istioctl(&["manifest", "generate"]);
    assert!(!objects(&out).is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ingress gateway"), "{stderr}");

    let out = istioctl(&["manifest", "generate", "--set", "profile=empty"]);
    assert!(objects(&out).is_empty());
}

#[test]
fn bad_flags_files_and_profiles_fail_naming_what_is_wrong() {
    for (args, wanted) in [
        (
            vec!["--set", "valuse.global.hub=x"],
            "unknown field spec.valuse",
        ),
        (
            vec!["--set", "profile=ambiant"],
            "unknown profile \"ambiant\"",
        ),
        (
            vec!["--set", "components.cni.enabled=maybe"],
            "spec.components.cni.enabled must be true or false",
        ),
        (
            vec!["--set", "values.global.platform=openshift"],
            "unknown platform \"openshift\"",
        ),
        (
            vec!["-f", "/nonexistent/operator.yaml"],
            "/nonexistent/operator.yaml: cannot read it",
        ),
    ] {
        let mut full = vec!["manifest", "generate"];
        full.extend(args.iter());
        let out = istioctl(&full);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(out.stdout.is_empty(), "{args:?} printed objects");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(wanted), "{args:?}: {stderr}");
    }
}
