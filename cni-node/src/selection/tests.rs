use super::*;

fn from_json<T: serde::de::DeserializeOwned>(json: &str) -> T {
    serde_json::from_str(json).expect("test object")
}

/// A pod in `ns` with `labels`/`annotations` (JSON object bodies) and extra spec/status.
fn make_pod(ns: &str, labels: &str, annotations: &str, spec: &str, phase: &str) -> Pod {
    from_json(&format!(
        r#"{{"metadata":{{"name":"p","namespace":"{ns}","labels":{{{labels}}},"annotations":{{{annotations}}}}},
            "spec":{{"containers":[]{spec}}},"status":{{"phase":"{phase}"}}}}"#
    ))
}

fn make_ns(labels: &str) -> Namespace {
    from_json(&format!(
        r#"{{"metadata":{{"name":"ns","labels":{{{labels}}}}}}}"#
    ))
}

const AMBIENT: &str = r#""istio.io/dataplane-mode":"ambient""#;
const NONE: &str = r#""istio.io/dataplane-mode":"none""#;

const ENROLL: Decision = Decision::Enroll {
    dns_capture: true,
    bypass_inbound: false,
};

/// One row of the decision table: the pod (namespace, labels, annotations, extra spec
/// fields, phase), its namespace's labels (`None` = unknown namespace) and the verdict.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    ns: &'static str,
    labels: &'static str,
    annotations: &'static str,
    spec: &'static str,
    phase: &'static str,
    ns_labels: Option<&'static str>,
    want: Decision,
}

const BASE: Case = Case {
    name: "",
    ns: "ns",
    labels: AMBIENT,
    annotations: "",
    spec: "",
    phase: "Running",
    ns_labels: None,
    want: ENROLL,
};

const fn skip(reason: SkipReason) -> Decision {
    Decision::Skip(reason)
}

#[test]
fn decisions() {
    let cases = [
        Case {
            name: "pod label",
            ..BASE
        },
        Case {
            name: "namespace label",
            labels: "",
            ns_labels: Some(AMBIENT),
            ..BASE
        },
        Case {
            name: "namespace label, pod none",
            labels: NONE,
            ns_labels: Some(AMBIENT),
            want: skip(SkipReason::OptedOut),
            ..BASE
        },
        Case {
            name: "pod label wins over namespace none",
            ns_labels: Some(NONE),
            ..BASE
        },
        Case {
            name: "no labels",
            labels: "",
            ns_labels: Some(""),
            want: skip(SkipReason::NotSelected),
            ..BASE
        },
        Case {
            name: "namespace unknown",
            labels: "",
            want: skip(SkipReason::NotSelected),
            ..BASE
        },
        Case {
            name: "other pod label value",
            labels: r#""istio.io/dataplane-mode":"sidecar""#,
            want: skip(SkipReason::NotSelected),
            ..BASE
        },
        Case {
            name: "sidecar",
            annotations: r#""sidecar.istio.io/status":"{}""#,
            want: skip(SkipReason::SidecarInjected),
            ..BASE
        },
        Case {
            name: "host network",
            spec: r#","hostNetwork":true"#,
            want: skip(SkipReason::HostNetwork),
            ..BASE
        },
        Case {
            name: "host network false",
            spec: r#","hostNetwork":false"#,
            ..BASE
        },
        Case {
            name: "excluded namespace",
            ns: "kube-system",
            ns_labels: Some(AMBIENT),
            want: skip(SkipReason::ExcludedNamespace),
            ..BASE
        },
        Case {
            name: "succeeded",
            phase: "Succeeded",
            want: skip(SkipReason::Terminated),
            ..BASE
        },
        Case {
            name: "failed",
            phase: "Failed",
            want: skip(SkipReason::Terminated),
            ..BASE
        },
        Case {
            name: "pending phase",
            phase: "Pending",
            ..BASE
        },
        Case {
            name: "dns off",
            annotations: r#""ambient.istio.io/dns-capture":"false""#,
            want: Decision::Enroll {
                dns_capture: false,
                bypass_inbound: false,
            },
            ..BASE
        },
        Case {
            name: "dns bad value keeps default",
            annotations: r#""ambient.istio.io/dns-capture":"nope""#,
            ..BASE
        },
    ];
    let config = SelectionConfig::default();
    for c in cases {
        let p = make_pod(c.ns, c.labels, c.annotations, c.spec, c.phase);
        let n = c.ns_labels.map(make_ns);
        assert_eq!(decide(&p, n.as_ref(), &config), c.want, "case {}", c.name);
    }
}

#[test]
fn dns_default_from_config_and_annotation_override() {
    let config = SelectionConfig {
        dns_capture: false,
        ..SelectionConfig::default()
    };
    let plain = make_pod("ns", AMBIENT, "", "", "Running");
    assert_eq!(
        decide(&plain, None, &config),
        Decision::Enroll {
            dns_capture: false,
            bypass_inbound: false,
        }
    );
    let on = make_pod(
        "ns",
        AMBIENT,
        r#""ambient.istio.io/dns-capture":"true""#,
        "",
        "Running",
    );
    assert_eq!(
        decide(&on, None, &config),
        Decision::Enroll {
            dns_capture: true,
            bypass_inbound: false,
        }
    );
}

#[test]
fn excluded_namespaces_are_configurable() {
    let config = SelectionConfig {
        excluded_namespaces: ["apps".to_string()].into(),
        ..SelectionConfig::default()
    };
    let in_apps = make_pod("apps", AMBIENT, "", "", "Running");
    assert_eq!(
        decide(&in_apps, None, &config),
        Decision::Skip(SkipReason::ExcludedNamespace)
    );
    let in_kube_system = make_pod("kube-system", AMBIENT, "", "", "Running");
    assert!(decide(&in_kube_system, None, &config).is_enroll());
}

#[test]
fn bypass_inbound_capture_annotation() {
    let config = SelectionConfig::default();
    let bypass = make_pod(
        "ns",
        AMBIENT,
        r#""ambient.istio.io/bypass-inbound-capture":"true""#,
        "",
        "Running",
    );
    assert_eq!(
        decide(&bypass, None, &config),
        Decision::Enroll {
            dns_capture: true,
            bypass_inbound: true,
        }
    );
    // Any other value captures inbound as usual.
    let other = make_pod(
        "ns",
        AMBIENT,
        r#""ambient.istio.io/bypass-inbound-capture":"yes""#,
        "",
        "Running",
    );
    assert_eq!(decide(&other, None, &config), ENROLL);
}

#[test]
fn with_ambient_disabled_no_pod_is_enrolled() {
    let config = SelectionConfig {
        ambient_enabled: false,
        ..SelectionConfig::default()
    };
    let pod = make_pod("ns", AMBIENT, "", "", "Running");
    assert_eq!(
        decide(&pod, None, &config),
        Decision::Skip(SkipReason::AmbientDisabled)
    );
    assert!(decide(&pod, None, &SelectionConfig::default()).is_enroll());
}
