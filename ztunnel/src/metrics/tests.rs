use super::*;

fn info() -> ConnectionInfo {
    ConnectionInfo {
        direction: Direction::Outbound,
        src_addr: "10.0.0.1:5000".parse().expect("addr"),
        src: Peer::of_identity(
            Identity::new("cluster.local", "default", "client").expect("identity"),
        ),
        dst_addr: "10.0.0.2:80".parse().expect("addr"),
        hbone_addr: None,
        dst: Peer::default(),
        dst_service: Some(ServiceName {
            hostname: "echo.default.svc.cluster.local".into(),
            namespace: "default".into(),
            name: "echo".into(),
        }),
        security: SecurityPolicy::None,
    }
}

#[test]
fn labels_fill_unknown_and_render_istio_names() {
    let registry = mesh_runtime::metrics::Metrics::new();
    let m = Metrics::register(&registry);
    let record = ConnectionRecord::open(&m, info());
    assert_eq!(m.opened(&info().labels(ResponseFlags::None)), 1);
    record.finish(Outcome::Completed(Transferred {
        sent: 10,
        received: 20,
    }));
    let text = registry.render();
    let line = text
        .lines()
        .find(|l| l.starts_with("istio_tcp_connections_closed_total{"))
        .expect("closed line");
    for part in [
        "reporter=\"source\"",
        "source_principal=\"spiffe://cluster.local/ns/default/sa/client\"",
        "source_workload=\"unknown\"",
        "source_workload_namespace=\"default\"",
        "destination_workload=\"unknown\"",
        "destination_principal=\"unknown\"",
        "destination_service=\"echo.default.svc.cluster.local\"",
        "destination_service_name=\"echo\"",
        "request_protocol=\"tcp\"",
        "response_flags=\"-\"",
        "connection_security_policy=\"none\"",
    ] {
        assert!(line.contains(part), "{part} missing in {line}");
    }
    assert!(text.contains("istio_tcp_received_bytes_total{"));
    assert!(text
        .lines()
        .any(|l| l.starts_with("istio_tcp_received_bytes_total{") && l.ends_with(" 10")));
    assert!(text
        .lines()
        .any(|l| l.starts_with("istio_tcp_sent_bytes_total{") && l.ends_with(" 20")));
    assert!(text.contains("istio_build{component=\"ztunnel\""), "{text}");
    assert!(!text.contains("istio_tcp_connections_failed_total{"));
}

#[test]
fn failures_and_dropped_records_count_as_failed() {
    let registry = mesh_runtime::metrics::Metrics::new();
    let m = Metrics::register(&registry);
    let err = std::io::Error::other("boom");
    ConnectionRecord::open(&m, info()).finish(Outcome::Failed {
        flags: ResponseFlags::Denied,
        error: &err,
        transferred: Transferred::default(),
    });
    drop(ConnectionRecord::open(&m, info()));
    let text = registry.render();
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_failed_total{"))
        .collect();
    assert!(
        failed
            .iter()
            .any(|l| l.contains("response_flags=\"DENY\"") && l.ends_with(" 1")),
        "{text}"
    );
    assert!(
        failed
            .iter()
            .any(|l| l.contains("response_flags=\"-\"") && l.ends_with(" 1")),
        "{text}"
    );
}
