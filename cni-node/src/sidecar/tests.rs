//! Which injected pods get cni-node's sidecar capture, and the settings their annotations give.

use std::net::IpAddr;

use mesh_sidecar_capture::config::ConfigError;
use mesh_sidecar_capture::Selection;
use serde_json::json;

use super::*;

fn pod(annotations: serde_json::Value, init: &[&str], proxy_args: &[&str]) -> Pod {
    let inits: Vec<_> = init
        .iter()
        .map(|n| json!({"name": n, "image": "x"}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
        "spec": {
            "initContainers": inits,
            "containers": [
                {"name": "app", "image": "app"},
                {"name": "istio-proxy", "image": "proxy", "args": proxy_args,
                 "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}
            ]
        }
    }))
    .expect("pod")
}

fn injected(extra: serde_json::Value) -> serde_json::Value {
    let mut a = json!({"sidecar.istio.io/status": "{}"});
    if let (Some(a), Some(extra)) = (a.as_object_mut(), extra.as_object()) {
        a.extend(extra.clone());
    }
    a
}

const SIDECAR: [&str; 2] = ["proxy", "sidecar"];
const V4: [IpAddr; 1] = [IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 5))];

#[test]
fn injected_pods_without_istio_init_get_istio_s_defaults() {
    let cfg = decide(
        &pod(injected(json!({})), &["istio-validation"], &SIDECAR),
        &V4,
    )
    .expect("valid")
    .expect("captured")
    .config;
    assert_eq!(cfg.include_outbound_cidrs, Selection::All);
    assert_eq!(cfg.include_inbound_ports, Selection::All);
    assert_eq!(cfg.exclude_inbound_ports, vec![15020, 15021, 15090]);
    assert_eq!(cfg.exclude_outbound_ports, vec![15020]);
    assert_eq!(
        (cfg.proxy_uids.clone(), cfg.proxy_gids.clone()),
        (vec![1337], vec![1337])
    );
    assert!(!cfg.ipv6);
    let v6: [IpAddr; 1] = ["fd00::5".parse().expect("ip")];
    let cfg = decide(&pod(injected(json!({})), &[], &SIDECAR), &v6)
        .expect("valid")
        .expect("captured")
        .config;
    assert!(cfg.ipv6);
}

#[test]
fn annotations_shape_the_rules() {
    let annotations = injected(json!({
        "traffic.sidecar.istio.io/includeOutboundIPRanges": "10.96.0.0/12",
        "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.96.0.10",
        "traffic.sidecar.istio.io/includeInboundPorts": "8080,9090",
        "traffic.sidecar.istio.io/excludeInboundPorts": "9090,15021",
        "traffic.sidecar.istio.io/excludeOutboundPorts": "5432",
        "traffic.sidecar.istio.io/excludeInterfaces": "net1",
        "status.sidecar.istio.io/port": "15999",
    }));
    let cfg = decide(&pod(annotations, &[], &SIDECAR), &V4)
        .expect("valid")
        .expect("captured")
        .config;
    assert_eq!(cfg.include_inbound_ports, Selection::Only(vec![8080, 9090]));
    assert_eq!(
        cfg.exclude_inbound_ports,
        vec![9090, 15021, 15020, 15090, 15999]
    );
    assert_eq!(cfg.exclude_outbound_ports, vec![5432]);
    assert_eq!(cfg.exclude_outbound_cidrs[0].to_string(), "10.96.0.10/32");
    assert_eq!(cfg.exclude_interfaces, vec!["net1".to_string()]);
}

#[test]
fn pods_the_init_step_or_nobody_captures_are_skipped() {
    let cases = [
        (pod(json!({}), &[], &SIDECAR), Skip::NotInjected),
        (
            pod(injected(json!({})), &["istio-init"], &SIDECAR),
            Skip::InitContainer,
        ),
        (
            pod(injected(json!({})), &[], &["proxy", "router"]),
            Skip::NotSidecar,
        ),
        (
            pod(
                injected(json!({"sidecar.istio.io/inject": "false"})),
                &[],
                &SIDECAR,
            ),
            Skip::InjectionOff,
        ),
    ];
    for (pod, skip) in cases {
        assert_eq!(decide(&pod, &V4), Ok(Err(skip)));
    }
    let mut no_proxy = pod(injected(json!({})), &[], &SIDECAR);
    if let Some(spec) = no_proxy.spec.as_mut() {
        spec.containers.retain(|c| c.name != "istio-proxy");
    }
    assert_eq!(decide(&no_proxy, &V4), Ok(Err(Skip::NoProxy)));
}

#[test]
fn bad_annotations_name_the_annotation_and_the_value() {
    let bad = pod(
        injected(json!({"traffic.sidecar.istio.io/includeInboundPorts": "80,http"})),
        &[],
        &SIDECAR,
    );
    let err = decide(&bad, &V4).expect_err("bad port");
    assert_eq!(
        err,
        SidecarError::Annotation {
            annotation: INCLUDE_INBOUND_PORTS,
            source: ConfigError::Port("http".into())
        }
    );
    assert!(err.to_string().contains("includeInboundPorts") && err.to_string().contains("http"));
    let tproxy = pod(
        injected(json!({"sidecar.istio.io/interceptionMode": "TPROXY"})),
        &[],
        &SIDECAR,
    );
    assert!(matches!(
        decide(&tproxy, &V4),
        Err(SidecarError::Annotation {
            source: ConfigError::Tproxy,
            ..
        })
    ));
}
