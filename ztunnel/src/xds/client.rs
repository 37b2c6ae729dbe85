//! The delta ADS client task: connect, subscribe, apply and ACK/NACK, reconnect with backoff.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use mesh_grpc::{RequestSink, ResponseStream, SetupError};
use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use mesh_proto::envoy::pb::envoy::config::core::v3::Node;
use mesh_proto::envoy::pb::google::protobuf::{value::Kind, Struct, Value};
use mesh_xds::{ClientError, DeltaClient};
use tokio::sync::watch;

use super::{rejection_message, Handler, XdsConfig, XdsError, INVALID_ARGUMENT, SUBSCRIBED_TYPES};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest response accepted, as Istio's ztunnel: the first Address response carries every
/// workload and service of the mesh (about 20 MB with 50,000 Pods).
const MAX_MESSAGE: usize = 200 << 20;

/// ztunnel's xDS client. Build it with [`XdsClient::new`], keep a [`XdsClient::ready`]
/// receiver, then drive it with [`XdsClient::run`].
pub struct XdsClient {
    config: XdsConfig,
    handler: Arc<dyn Handler>,
    channel: mesh_grpc::Channel,
    delta: DeltaClient,
    /// Types whose first response has been handed to the handler.
    seen: BTreeSet<String>,
    ready: watch::Sender<bool>,
}

impl std::fmt::Debug for XdsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsClient")
            .field("address", &self.config.address)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl XdsClient {
    /// Validates the address and (for https) reads the root certificate; does not connect yet.
    pub fn new(config: XdsConfig, handler: Arc<dyn Handler>) -> Result<XdsClient, XdsError> {
        let channel = channel(&config)?;
        let mut delta = DeltaClient::new(Some(node(&config)));
        for type_url in SUBSCRIBED_TYPES {
            // Only marks the subscription: every stream's first requests come from
            // `reconnect_requests`, with whatever the client holds by then.
            let _ = delta.subscribe_wildcard(type_url);
        }
        let (ready, _) = watch::channel(false);
        Ok(XdsClient {
            config,
            handler,
            channel,
            delta,
            seen: BTreeSet::new(),
            ready,
        })
    }

    /// Becomes `true` once the first response of every subscribed type has been applied.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// What the client holds of `type_url` (name -> version): what it will send as
    /// `initial_resource_versions` on the next connect.
    pub fn initial_resource_versions(&self, type_url: &str) -> HashMap<String, String> {
        self.delta.initial_resource_versions(type_url)
    }

    /// Streams from istiod until `shutdown` resolves, reconnecting after every failure with
    /// backoff (doubling from `initial_backoff` to `max_backoff`, reset after a stream that
    /// delivered at least one response).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut backoff = self.config.initial_backoff;
        loop {
            let mut healthy = false;
            let error = tokio::select! {
                () = &mut shutdown => break,
                error = self.stream(&mut healthy) => error,
            };
            if healthy {
                backoff = self.config.initial_backoff;
            }
            tracing::warn!(address = %self.config.address, reason = error.reason(), error = %error, backoff = ?backoff, "xDS stream ended; reconnecting");
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(self.config.max_backoff);
        }
        tracing::info!(address = %self.config.address, "xDS client stopped");
    }

    /// One stream, until it fails; `healthy` is set once a response arrived.
    async fn stream(&mut self, healthy: &mut bool) -> XdsError {
        let (mut outbound, mut inbound) = match self.open().await {
            Ok(opened) => opened,
            Err(e) => return e,
        };
        tracing::info!(address = %self.config.address, "xDS stream connected");
        loop {
            let resp = match inbound.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => return self.closed(),
                Err(status) => {
                    return XdsError::Receive {
                        address: self.config.address.clone(),
                        code: status.code(),
                        message: status.message().to_string(),
                    }
                }
            };
            *healthy = true;
            let reply = self.on_response(&resp);
            if outbound.send(&reply).is_err() {
                return self.closed();
            }
        }
    }

    fn closed(&self) -> XdsError {
        XdsError::Closed {
            address: self.config.address.clone(),
        }
    }

    /// Opens the stream with the first request of every type (with what we hold).
    async fn open(
        &self,
    ) -> Result<
        (
            RequestSink<DeltaDiscoveryRequest>,
            ResponseStream<DeltaDiscoveryResponse>,
        ),
        XdsError,
    > {
        let first = self.delta.reconnect_requests();
        for req in &first {
            tracing::debug!(type_url = %req.type_url, known = req.initial_resource_versions.len(), "subscribing");
        }
        let mut metadata = http::HeaderMap::new();
        if let Some(token) = self.token().await? {
            metadata.insert(http::header::AUTHORIZATION, token);
        }
        self.channel
            .streaming(mesh_proto::DELTA_ADS_PATH, &metadata, &first)
            .await
            .map_err(|status| XdsError::Open {
                address: self.config.address.clone(),
                code: status.code(),
                message: status.message().to_string(),
            })
    }

    /// `Bearer <token>` from the token file, read now (projected tokens rotate).
    async fn token(&self) -> Result<Option<http::HeaderValue>, XdsError> {
        let Some(path) = &self.config.token_path else {
            return Ok(None);
        };
        match mesh_grpc::bearer_token(path).await {
            Ok(value) => Ok(Some(value)),
            Err(mesh_grpc::TokenError::Read { path, source }) => {
                Err(XdsError::Token { path, source })
            }
            Err(mesh_grpc::TokenError::NotAHeader { path }) => Err(XdsError::BadToken { path }),
        }
    }

    /// Applies one response through the handler; returns the ACK or NACK to send.
    fn on_response(&mut self, resp: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
        let type_url = resp.type_url.as_str();
        let (updated, removed) = match extract(resp) {
            Ok(parts) => parts,
            Err(e) => {
                tracing::warn!(type_url, nonce = %resp.nonce, reason = e.reason(), error = %e, "NACK: malformed response");
                return mesh_xds::nack(resp, INVALID_ARGUMENT, &e.to_string());
            }
        };
        tracing::debug!(type_url, nonce = %resp.nonce, updated = updated.len(), removed = removed.len(), "xDS response");
        let outcome = self.handler.apply(type_url, &updated, &removed);
        self.mark_seen(type_url);
        match outcome {
            Ok(()) => {
                let (reply, applied) = self.delta.handle_response(resp);
                if let Err(e) = applied {
                    tracing::warn!(type_url, reason = e.reason(), error = %e, "NACK: malformed response");
                }
                reply
            }
            Err(rejected) => {
                // Remember only what the handler took, so a reconnect asks again for the rest.
                if let Err(e) = self.delta.apply(&without(resp, &rejected)) {
                    tracing::warn!(type_url, reason = e.reason(), error = %e, "cannot record the accepted resources");
                }
                let message = rejection_message(type_url, &rejected);
                tracing::warn!(type_url, nonce = %resp.nonce, message = %message, "NACK");
                mesh_xds::nack(resp, INVALID_ARGUMENT, &message)
            }
        }
    }

    fn mark_seen(&mut self, type_url: &str) {
        if !SUBSCRIBED_TYPES.contains(&type_url) || !self.seen.insert(type_url.to_string()) {
            return;
        }
        if SUBSCRIBED_TYPES.iter().all(|t| self.seen.contains(*t)) {
            tracing::info!(address = %self.config.address, "xDS ready: first response of every type applied");
            self.ready.send_replace(true);
        }
    }
}

type Parts = (Vec<(String, Vec<u8>)>, Vec<String>);

/// The updates and removals of a response, refusing what the protocol forbids (the rules of
/// [`mesh_xds::validate_response`]) before anything reaches the handler.
fn extract(resp: &DeltaDiscoveryResponse) -> Result<Parts, ClientError> {
    mesh_xds::validate_response(resp)?;
    let updated = resp
        .resources
        .iter()
        .filter_map(|r| Some((r.name.clone(), r.resource.as_ref()?.value.clone())))
        .collect();
    Ok((updated, resp.removed_resources.clone()))
}

/// `resp` minus the rejected resources.
fn without(resp: &DeltaDiscoveryResponse, rejected: &[(String, String)]) -> DeltaDiscoveryResponse {
    let names: BTreeSet<&str> = rejected.iter().map(|(n, _)| n.as_str()).collect();
    let mut accepted = resp.clone();
    accepted
        .resources
        .retain(|r| !names.contains(r.name.as_str()));
    accepted
        .removed_resources
        .retain(|n| !names.contains(n.as_str()));
    accepted
}

/// The node sent on the first request of each type.
fn node(config: &XdsConfig) -> Node {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_string())),
    };
    let fields = BTreeMap::from([
        ("CLUSTER_ID".to_string(), string(&config.cluster_id)),
        ("ISTIO_VERSION".to_string(), string(&config.istio_version)),
    ]);
    Node {
        id: config.node.node_id(),
        metadata: Some(Struct {
            fields: fields.into_iter().collect(),
        }),
        ..Node::default()
    }
}

/// A lazily connecting channel: h2c for `http://`, TLS verified against the root file for
/// `https://`.
fn channel(config: &XdsConfig) -> Result<mesh_grpc::Channel, XdsError> {
    let endpoint = mesh_grpc::Endpoint::new(
        &config.address,
        &config.root_cert_path,
        config.server_name.as_deref(),
    )
    .map_err(|e| match e {
        SetupError::BadAddress { detail, .. } => XdsError::BadAddress {
            address: config.address.clone(),
            detail,
        },
        SetupError::RootCert { path, detail } => XdsError::RootCert { path, detail },
        SetupError::Tls(source) => XdsError::Tls {
            address: config.address.clone(),
            source,
        },
    })?;
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .max_message(MAX_MESSAGE)
        .channel())
}

#[cfg(test)]
mod tests {
    use mesh_proto::discovery::Resource;
    use mesh_proto::envoy::pb::google::protobuf::Any;
    use mesh_proto::type_url::{ADDRESS, AUTHORIZATION};

    use super::*;
    use crate::xds::NodeIdentity;

    struct Accept;

    impl Handler for Accept {
        fn apply(
            &self,
            _: &str,
            _: &[(String, Vec<u8>)],
            _: &[String],
        ) -> Result<(), Vec<(String, String)>> {
            Ok(())
        }
    }

    fn response(type_url: &str, nonce: &str, names: &[&str]) -> DeltaDiscoveryResponse {
        let resource = |name: &&str| Resource {
            name: name.to_string(),
            version: "v1".to_string(),
            resource: Some(Any {
                type_url: type_url.to_string(),
                value: b"x".to_vec(),
            }),
            ..Resource::default()
        };
        DeltaDiscoveryResponse {
            type_url: type_url.to_string(),
            nonce: nonce.to_string(),
            resources: names.iter().map(resource).collect(),
            ..DeltaDiscoveryResponse::default()
        }
    }

    fn client() -> XdsClient {
        let node = NodeIdentity {
            ip: "10.0.0.1".to_string(),
            pod_name: "z".to_string(),
            pod_namespace: "istio-system".to_string(),
            cluster_domain: "cluster.local".to_string(),
        };
        XdsClient::new(XdsConfig::new("http://127.0.0.1:1", node), Arc::new(Accept))
            .expect("client")
    }

    #[tokio::test]
    async fn ready_only_after_both_types_and_malformed_responses_are_nacked() {
        let mut client = client();
        let ready = client.ready();
        let ack = client.on_response(&response(ADDRESS, "n1", &["a"]));
        assert!(ack.error_detail.is_none());
        assert!(!*ready.borrow(), "one type is not enough");
        let mut bad = response(AUTHORIZATION, "n2", &["p"]);
        bad.resources[0].resource = None;
        let nack = client.on_response(&bad);
        let detail = nack.error_detail.expect("nack");
        assert!(detail.message.contains('p'), "{}", detail.message);
        assert!(!*ready.borrow(), "a malformed response is not applied");
        client.on_response(&response(AUTHORIZATION, "n3", &["p"]));
        assert!(*ready.borrow());
        assert_eq!(client.initial_resource_versions(ADDRESS).len(), 1);
    }

    #[test]
    fn rejected_resources_are_not_remembered() {
        let resp = response(ADDRESS, "n", &["a", "b"]);
        let kept = without(&resp, &[("a".to_string(), "no".to_string())]);
        let names: Vec<&str> = kept.resources.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["b"]);
    }
}
