//! charts/base/files/crd-all.gen.yaml is what the API types generate, and the base chart
//! installs it: every CRD, relabelled, minus the excluded ones.

use mesh_charts::crds::{generate, GENERATED_FILE};
use mesh_charts::{charts_dir, repo_root, Helm};
use serde_json::json;

#[test]
fn the_generated_crds_are_up_to_date() {
    let path = repo_root().join(GENERATED_FILE);
    let generated = generate().expect("the API types give valid CRD schemas");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &generated).expect("write the generated CRDs");
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with UPDATE_GOLDEN=1", path.display()));
    assert!(
        committed == generated,
        "{} differs from what the API types generate: rerun with UPDATE_GOLDEN=1 and commit it",
        path.display()
    );
}

#[test]
fn the_base_chart_installs_every_crd_relabelled_and_honours_exclusions() {
    let helm = Helm::default();
    let base = charts_dir().join("base");
    let rendered = helm
        .render(&base, "istio-base", "istio-system", &json!({}))
        .expect("base renders");
    let crds: Vec<_> = rendered.of_kind("CustomResourceDefinition").collect();
    assert_eq!(crds.len(), 15, "{:?}", rendered.ids());
    assert!(crds
        .iter()
        .all(|c| !c.name().ends_with("gateway.networking.k8s.io")));
    for crd in &crds {
        let labels = &crd.value["metadata"]["labels"];
        assert_eq!(
            labels["app.kubernetes.io/part-of"],
            "istio",
            "{}",
            crd.name()
        );
        assert_eq!(labels["app.kubernetes.io/instance"], "istio-base");
        assert!(labels.get("heritage").is_none(), "static labels replaced");
    }
    let ap = rendered
        .get(
            "CustomResourceDefinition",
            "authorizationpolicies.security.istio.io",
        )
        .expect("AuthorizationPolicy CRD");
    assert_eq!(
        ap.value["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert_eq!(ap.value["spec"]["names"]["shortNames"], json!(["ap"]));

    let excluded = helm
        .render(
            &base,
            "istio-base",
            "istio-system",
            &json!({"base": {"excludedCRDs": ["envoyfilters.networking.istio.io", "wasmplugins.extensions.istio.io"]}}),
        )
        .expect("base renders with exclusions");
    assert_eq!(excluded.of_kind("CustomResourceDefinition").count(), 13);
    assert!(excluded
        .get(
            "CustomResourceDefinition",
            "envoyfilters.networking.istio.io"
        )
        .is_none());

    // Without templating the file goes out as generated, Istio's static labels and all.
    let verbatim = helm
        .render(
            &base,
            "istio-base",
            "istio-system",
            &json!({"base": {"enableCRDTemplates": false}}),
        )
        .expect("base renders verbatim");
    let pa = verbatim
        .get(
            "CustomResourceDefinition",
            "peerauthentications.security.istio.io",
        )
        .expect("PeerAuthentication CRD");
    assert_eq!(pa.value["metadata"]["labels"]["istio"], "security");
    assert_eq!(verbatim.of_kind("CustomResourceDefinition").count(), 15);
}
