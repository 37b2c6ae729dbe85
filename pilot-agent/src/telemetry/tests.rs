use mesh_proto::envoy::pb::envoy::data::accesslog::v3::{
    AccessLogCommon, HttpRequestProperties, HttpResponseProperties,
};
use mesh_proto::envoy::pb::google::protobuf::{Any, Duration as PbDuration, UInt32Value};

use super::*;

fn entry(code: u32, principal: Option<&str>, flags: Option<ResponseFlags>) -> HttpAccessLogEntry {
    let mut common = AccessLogCommon {
        upstream_cluster: "inbound-vip|80|http|web.demo.svc.cluster.local".into(),
        time_to_last_downstream_tx_byte: Some(PbDuration {
            seconds: 0,
            nanos: 3_000_000,
        }),
        response_flags: flags,
        ..AccessLogCommon::default()
    };
    if let Some(p) = principal {
        common.filter_state_objects.insert(
            PEER_PRINCIPAL_STATE.into(),
            Any {
                type_url: "type.googleapis.com/google.protobuf.StringValue".into(),
                value: prost::Message::encode_to_vec(&StringValue { value: p.into() }),
            },
        );
    }
    common.custom_tags.insert(
        TAG_DESTINATION_WORKLOAD.into(),
        "web-v1;demo;web;v1;Kubernetes".into(),
    );
    common.custom_tags.insert(
        TAG_DESTINATION_PRINCIPAL.into(),
        "spiffe://cluster.local/ns/demo/sa/web".into(),
    );
    HttpAccessLogEntry {
        common_properties: Some(common),
        request: Some(HttpRequestProperties {
            request_headers_bytes: 100,
            request_body_bytes: 20,
            ..HttpRequestProperties::default()
        }),
        response: Some(HttpResponseProperties {
            response_code: Some(UInt32Value { value: code }),
            response_headers_bytes: 50,
            response_body_bytes: 1024,
            ..HttpResponseProperties::default()
        }),
        ..HttpAccessLogEntry::default()
    }
}

#[test]
fn labels_carry_the_source_identity_and_the_destination_endpoint() {
    let l = labels(
        &entry(200, Some("spiffe://cluster.local/ns/demo/sa/client"), None),
        &LocalWorkload::default(),
    );
    assert_eq!(l.reporter, "waypoint");
    assert_eq!(
        l.source_principal,
        "spiffe://cluster.local/ns/demo/sa/client"
    );
    assert_eq!(l.source_workload_namespace, "demo");
    assert_eq!(l.source_workload, "unknown");
    assert_eq!(l.destination_service, "web.demo.svc.cluster.local");
    assert_eq!(l.destination_service_name, "web");
    assert_eq!(l.destination_service_namespace, "demo");
    assert_eq!(l.destination_workload, "web-v1");
    assert_eq!(l.destination_canonical_service, "web");
    assert_eq!(l.destination_canonical_revision, "v1");
    assert_eq!(l.destination_cluster, "Kubernetes");
    assert_eq!(
        l.destination_principal,
        "spiffe://cluster.local/ns/demo/sa/web"
    );
    assert_eq!(
        (l.response_code.as_str(), l.response_flags.as_str()),
        ("200", "-")
    );
    assert_eq!(l.request_protocol, "http");
    assert_eq!(l.connection_security_policy, "mutual_tls");
}

#[test]
fn missing_parts_are_unknown_and_flags_use_envoys_codes() {
    let mut e = entry(
        503,
        None,
        Some(ResponseFlags {
            upstream_retry_limit_exceeded: true,
            no_healthy_upstream: true,
            ..ResponseFlags::default()
        }),
    );
    e.common_properties
        .as_mut()
        .expect("common")
        .custom_tags
        .clear();
    let l = labels(&e, &LocalWorkload::default());
    assert_eq!(l.source_principal, "unknown");
    assert_eq!(l.source_workload_namespace, "unknown");
    assert_eq!(l.destination_workload, "unknown");
    assert_eq!(l.response_flags, "UH,URX");
    assert_eq!(
        labels(&HttpAccessLogEntry::default(), &LocalWorkload::default()).destination_service,
        "unknown"
    );
}

#[test]
fn requests_are_counted_with_duration_and_sizes() {
    let metrics = Metrics::new();
    let m = RequestMetrics::new(&metrics, LocalWorkload::default());
    let principal = Some("spiffe://cluster.local/ns/demo/sa/client");
    for _ in 0..3 {
        m.record(&entry(200, principal, None));
    }
    m.record(&entry(403, principal, None));
    let text = metrics.render();
    let count = |code: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("istio_requests_total{")
                    && l.contains(&format!("response_code=\"{code}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_eq!(count("200").as_deref(), Some("3"), "{text}");
    assert_eq!(count("403").as_deref(), Some("1"), "{text}");
    assert!(
        text.contains("istio_request_duration_milliseconds_bucket{"),
        "{text}"
    );
    assert!(text.contains("istio_request_bytes_sum{"), "{text}");
    let response_sum = text
        .lines()
        .find(|l| l.starts_with("istio_response_bytes_sum{") && l.contains("response_code=\"200\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(response_sum, Some(3.0 * 1074.0));
}

#[test]
fn a_sidecar_reports_its_own_side() {
    let local = LocalWorkload {
        workload: "server".into(),
        namespace: "legacy".into(),
        principal: "spiffe://cluster.local/ns/legacy/sa/server".into(),
        canonical_service: "server".into(),
        canonical_revision: "v1".into(),
        app: "server".into(),
        version: "v1".into(),
        cluster: "Kubernetes".into(),
    };
    // Inbound: the client's certificate names the source; the destination is this workload.
    let mut e = entry(200, None, None);
    let common = e.common_properties.as_mut().expect("common");
    common.custom_tags.clear();
    common
        .custom_tags
        .insert(TAG_REPORTER.into(), "destination".into());
    common
        .custom_tags
        .insert(TAG_SECURITY_POLICY.into(), "mutual_tls".into());
    common.custom_tags.insert(
        TAG_DESTINATION_SERVICE.into(),
        "server.legacy.svc.cluster.local".into(),
    );
    use mesh_proto::envoy::pb::envoy::data::accesslog::v3::tls_properties::{
        certificate_properties::{subject_alt_name::San, SubjectAltName},
        CertificateProperties,
    };
    common.tls_properties = Some(
        mesh_proto::envoy::pb::envoy::data::accesslog::v3::TlsProperties {
            peer_certificate_properties: Some(CertificateProperties {
                subject_alt_name: vec![SubjectAltName {
                    san: Some(San::Uri(
                        "spiffe://cluster.local/ns/legacy/sa/client".into(),
                    )),
                }],
                ..CertificateProperties::default()
            }),
            ..Default::default()
        },
    );
    let l = labels(&e, &local);
    assert_eq!(l.reporter, "destination");
    assert_eq!(
        l.source_principal,
        "spiffe://cluster.local/ns/legacy/sa/client"
    );
    assert_eq!(l.source_workload_namespace, "legacy");
    assert_eq!(l.destination_workload, "server");
    assert_eq!(l.destination_version, "v1");
    assert_eq!(l.destination_principal, local.principal);
    assert_eq!(l.destination_service_name, "server");
    // Outbound: this workload is the source; the destination is the endpoint's metadata.
    let mut e = entry(200, None, None);
    let common = e.common_properties.as_mut().expect("common");
    common.upstream_cluster = "outbound|80||web.demo.svc.cluster.local".into();
    common
        .custom_tags
        .insert(TAG_REPORTER.into(), "source".into());
    common
        .custom_tags
        .insert(TAG_SECURITY_POLICY.into(), "unknown".into());
    let l = labels(&e, &local);
    assert_eq!(l.reporter, "source");
    assert_eq!(l.source_workload, "server");
    assert_eq!(l.source_principal, local.principal);
    assert_eq!(l.destination_workload, "web-v1");
    assert_eq!(l.destination_service, "web.demo.svc.cluster.local");
    assert_eq!(l.connection_security_policy, "unknown");
}
