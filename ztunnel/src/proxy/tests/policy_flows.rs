//! Authorization flows: DENY and ALLOW over HBONE, STRICT mTLS on the plaintext port.

use std::net::SocketAddr;

use mesh_proto::security as sec;

use super::fixture::*;
use crate::hbone::{ConnectRequest, Connection, H2Settings};

fn principal_match(principal: &str) -> sec::Match {
    sec::Match {
        principals: vec![exact(principal)],
        ..Default::default()
    }
}

#[tokio::test]
async fn deny_policy_answers_401_and_closes_the_client() {
    let t = two_pods(31, b"").await;
    t.mesh.add_policy(policy(
        "deny-client",
        sec::Action::Deny,
        principal_match("cluster.local/ns/default/sa/client-sa"),
    ));
    // The proxy's own client sees the refusal as a closed connection.
    let tcp = t.mesh.connect(t.a, t.pods[0].outbound, t.echo).await;
    assert_eq!(round_trip(tcp, b"let me in").await, b"");
    // An HBONE client sees the 401 itself.
    let tls = t
        .mesh
        .pki
        .client_tls(Some(&id("client-sa")), vec![id("server-sa")]);
    let conn = Connection::connect(
        SocketAddr::new(t.b, HBONE_PORT),
        tls,
        &H2Settings::default(),
    )
    .await
    .expect("HBONE connection");
    let source = SocketAddr::new(t.a, 40000);
    let err = conn
        .open(&ConnectRequest::new(t.echo, source))
        .await
        .expect_err("denied");
    assert_eq!(err.status(), Some(http::StatusCode::UNAUTHORIZED), "{err}");
    for reporter in ["destination", "source"] {
        t.mesh
            .metric_line(&[
                "istio_tcp_connections_failed_total{",
                &format!("reporter=\"{reporter}\""),
                "response_flags=\"DENY\"",
                "source_principal=\"spiffe://cluster.local/ns/default/sa/client-sa\"",
            ])
            .await;
    }
}

#[tokio::test]
async fn allow_for_another_principal_denies_this_one() {
    let t = two_pods(32, b"").await;
    let tcp = t.mesh.connect(t.a, t.pods[0].outbound, t.echo).await;
    assert_eq!(
        round_trip(tcp, b"open").await,
        b"open",
        "allowed before the policy"
    );
    t.mesh.add_policy(policy(
        "allow-other",
        sec::Action::Allow,
        principal_match("cluster.local/ns/default/sa/other"),
    ));
    let tcp = t.mesh.connect(t.a, t.pods[0].outbound, t.echo).await;
    assert_eq!(
        round_trip(tcp, b"open").await,
        b"",
        "only `other` is allowed now"
    );
    t.mesh.add_policy(policy(
        "allow-other",
        sec::Action::Allow,
        principal_match("cluster.local/ns/default/sa/client-sa"),
    ));
    let tcp = t.mesh.connect(t.a, t.pods[0].outbound, t.echo).await;
    assert_eq!(
        round_trip(tcp, b"open").await,
        b"open",
        "allowed by principal"
    );
}

#[tokio::test]
async fn strict_refuses_plaintext_while_permissive_passes() {
    let t = two_pods(33, b"").await;
    let outsider = ip(33, 77);
    let dst = SocketAddr::new(t.b, APP_PORT);
    let tcp = t.mesh.connect(outsider, t.pods[1].plaintext, dst).await;
    assert_eq!(
        round_trip(tcp, b"plain").await,
        b"plain",
        "no STRICT: passes"
    );
    t.mesh
        .metric_line(&[
            "istio_tcp_connections_closed_total{",
            "reporter=\"destination\"",
            "source_principal=\"unknown\"",
            "connection_security_policy=\"none\"",
            "response_flags=\"-\"",
        ])
        .await;

    t.mesh.add_policy(static_strict());
    let tcp = t.mesh.connect(outsider, t.pods[1].plaintext, dst).await;
    assert_eq!(
        round_trip(tcp, b"plain").await,
        b"",
        "STRICT refuses plaintext"
    );
    t.mesh
        .metric_line(&[
            "istio_tcp_connections_failed_total{",
            "connection_security_policy=\"none\"",
            "response_flags=\"DENY\"",
        ])
        .await;
    // mTLS from a mesh client still passes under STRICT.
    let tcp = t.mesh.connect(t.a, t.pods[0].outbound, t.echo).await;
    assert_eq!(round_trip(tcp, b"mtls").await, b"mtls");
}
