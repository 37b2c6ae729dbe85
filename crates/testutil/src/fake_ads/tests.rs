use super::*;
use mesh_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use mesh_proto::type_url::ADDRESS;
use mesh_xds::DeltaClient;

async fn open(
    ads: &FakeAds,
    token: Option<&str>,
) -> Result<
    (
        mpsc::Sender<DeltaDiscoveryRequest>,
        Streaming<DeltaDiscoveryResponse>,
    ),
    Status,
> {
    let mut client = AggregatedDiscoveryServiceClient::connect(ads.url())
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(8);
    let mut request = Request::new(ReceiverStream::new(rx));
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("header");
        request.metadata_mut().insert("authorization", value);
    }
    let inbound = client.delta_aggregated_resources(request).await?;
    Ok((tx, inbound.into_inner()))
}

async fn next(inbound: &mut Streaming<DeltaDiscoveryResponse>) -> DeltaDiscoveryResponse {
    tokio::time::timeout(DEFAULT_WAIT, inbound.message())
        .await
        .expect("response in time")
        .expect("stream ok")
        .expect("stream open")
}

#[tokio::test]
async fn serves_pushes_records_and_restarts() {
    let mut ads = FakeAds::start().await.expect("start");
    ads.set(ADDRESS, "a", b"one".to_vec());
    ads.require_token(Some("tok"));
    let Err(denied) = open(&ads, None).await else {
        panic!("the fake must require the token");
    };
    assert_eq!(denied.code(), tonic::Code::Unauthenticated);

    let mut client = DeltaClient::new(None);
    let (tx, mut inbound) = open(&ads, Some("tok")).await.expect("open");
    tx.send(client.subscribe_wildcard(ADDRESS))
        .await
        .expect("send");
    let first = next(&mut inbound).await;
    assert_eq!(first.resources.len(), 1);
    let (ack, applied) = client.handle_response(&first);
    applied.expect("valid");
    tx.send(ack).await.expect("ack");

    ads.set(ADDRESS, "b", b"two".to_vec());
    let push = next(&mut inbound).await;
    assert_eq!(push.resources[0].name, "b");
    let (_, applied) = client.handle_response(&push);
    applied.expect("valid");
    let nack = mesh_xds::nack(&push, 3, "b is bad");
    tx.send(nack).await.expect("nack");
    ads.wait_for("the NACK", |r| r.iter().any(RecordedDeltaRequest::is_nack))
        .await;

    let port = ads.addr().port();
    ads.stop().await;
    ads.remove(ADDRESS, "a");
    ads.restart().await.expect("restart");
    assert_eq!(ads.addr().port(), port);
    let (tx, mut inbound) = open(&ads, Some("tok")).await.expect("reopen");
    tx.send(client.reconnect_requests().remove(0))
        .await
        .expect("send");
    let diff = next(&mut inbound).await;
    assert!(diff.resources.is_empty(), "b is unchanged: {diff:?}");
    assert_eq!(diff.removed_resources, vec!["a".to_string()]);

    let requests = ads.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[0].bearer_token.as_deref(), Some("tok"));
    assert!(requests[1].is_ack());
    assert_eq!(requests[2].error_detail, Some((3, "b is bad".to_string())));
    assert_eq!(requests[3].connection, 2);
    assert_eq!(requests[3].initial_resource_versions.len(), 2);
    assert_eq!(ads.responses().len(), 3);
    assert_eq!(ads.versions(ADDRESS).len(), 1);
}
