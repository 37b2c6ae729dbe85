use super::*;
use crate::testing::{res, TestSnapshot, T};
use crate::{DeltaStream, RequestKind, XdsSnapshot};

fn base() -> TestSnapshot {
    TestSnapshot::new(&[
        res("a", "a1", &[]),
        res("b", "b1", &[]),
        res("c", "c1", &[]),
    ])
}

/// Sends `req` to the server stream and applies the answer, returning the client's ACK.
fn round_trip(
    server: &mut DeltaStream,
    client: &mut DeltaClient,
    req: &DeltaDiscoveryRequest,
    snap: &TestSnapshot,
) -> Option<DeltaDiscoveryRequest> {
    let out = server.handle_request(req).expect("valid request");
    if !out.respond {
        return None;
    }
    let resp = server.respond(T, snap, None)?;
    let (ack, applied) = client.handle_response(&resp);
    applied.expect("valid response");
    Some(ack)
}

fn local_names(client: &DeltaClient) -> Vec<String> {
    client
        .resources(T)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn client_tracks_server_and_reconnects() {
    let snap = base();
    let mut client = DeltaClient::new(None);
    let mut server = DeltaStream::new();
    let first = client.subscribe_wildcard(T);
    assert!(first.resource_names_subscribe.is_empty());
    let ack = round_trip(&mut server, &mut client, &first, &snap).expect("answered");
    assert_eq!(
        server.handle_request(&ack).expect("ack").kind,
        RequestKind::Ack
    );
    assert_eq!(local_names(&client), ["a", "b", "c"]);

    // The server moves on while the client is away.
    let next = snap.next(&[res("b", "b2", &[])], &["c"]);
    let mut server = DeltaStream::new();
    let reqs = client.reconnect_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].initial_resource_versions.len(), 3);
    let out = server.handle_request(&reqs[0]).expect("reconnect");
    assert_eq!(out.kind, RequestKind::Reconnect { known: 3 });
    let resp = server.respond(T, &next, None).expect("response");
    assert_eq!(resp.resources.len(), 1);
    assert_eq!(resp.resources[0].name, "b");
    assert_eq!(resp.removed_resources, ["c"]);
    client.apply(&resp).expect("apply");
    assert_eq!(local_names(&client), ["a", "b"]);
    assert_eq!(
        client.initial_resource_versions(T)["b"],
        next.resources(T).expect("served")["b"].version
    );
}

#[test]
fn explicit_client_subscription() {
    let snap = base();
    let mut client = DeltaClient::new(None);
    let mut server = DeltaStream::new();
    let first = client.subscribe(T, &[]);
    assert_eq!(
        first.resource_names_unsubscribe,
        ["*"],
        "not a legacy wildcard"
    );
    round_trip(&mut server, &mut client, &first, &snap).expect("answered");
    assert!(local_names(&client).is_empty());
    let sub = client.subscribe(T, &["a"]);
    assert!(sub.initial_resource_versions.is_empty());
    round_trip(&mut server, &mut client, &sub, &snap).expect("answered");
    assert_eq!(local_names(&client), ["a"]);
    let unsub = client.unsubscribe(T, &["a"]);
    assert!(local_names(&client).is_empty());
    assert_eq!(unsub.resource_names_unsubscribe, ["a"]);
}

#[test]
fn invalid_response_is_nacked_and_not_applied() {
    let mut client = DeltaClient::new(None);
    client.subscribe_wildcard(T);
    let resp = DeltaDiscoveryResponse {
        type_url: T.to_string(),
        nonce: "n1".into(),
        resources: vec![mesh_proto::discovery::Resource {
            name: "x".into(),
            resource: Some(mesh_proto::envoy::pb::google::protobuf::Any {
                type_url: "type.googleapis.com/other".into(),
                value: vec![],
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let (req, result) = client.handle_response(&resp);
    let err = result.expect_err("type mismatch");
    assert_eq!(err.reason(), "type_mismatch");
    assert_eq!(req.response_nonce, "n1");
    let status = req.error_detail.expect("nack");
    assert!(status.message.contains("other"), "{}", status.message);
    assert!(local_names(&client).is_empty());
}
