//! A lean delta-ADS client, so that one benchmark process can play a thousand ztunnels.
//!
//! tonic's streaming decoder keeps one contiguous buffer per stream, grown to the largest
//! message it has read and never shrunk. With 50,000 Pods a ztunnel's initial Address response
//! is about 20 MB, so a thousand tonic clients in one process keep about 20 GB after the
//! initial sync, more than this machine has. This client is ztunnel's own (`mesh-grpc`, which
//! decodes a message straight from the DATA chunks it came in) with a response type that keeps
//! only the resource names (prost skips the fields it is not asked for).

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use mesh_grpc::{RequestSink, ResponseStream};
use mesh_proto::discovery::DeltaDiscoveryRequest;

/// Largest message accepted (as ztunnel's).
const MAX_MESSAGE: usize = 200 << 20;

/// What a benchmark needs of a `DeltaDiscoveryResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub type_url: String,
    pub nonce: String,
    /// The names of the resources added or changed.
    pub names: Vec<String>,
}

/// `DeltaDiscoveryResponse` with only the fields kept (tags as in the Envoy API).
#[derive(Clone, PartialEq, prost::Message)]
struct SlimResponse {
    #[prost(message, repeated, tag = "2")]
    resources: Vec<SlimResource>,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
}

/// `Resource` with only its name.
#[derive(Clone, PartialEq, prost::Message)]
struct SlimResource {
    #[prost(string, tag = "3")]
    name: String,
}

/// One delta ADS stream over a connection of its own.
pub struct DeltaAds {
    requests: RequestSink<DeltaDiscoveryRequest>,
    responses: ResponseStream<SlimResponse>,
}

impl DeltaAds {
    /// Connects to `addr` (plain-text HTTP/2) with stream and connection receive windows of
    /// `window` bytes and opens the stream with the `first` requests.
    pub async fn connect(
        addr: SocketAddr,
        window: u32,
        first: &[DeltaDiscoveryRequest],
    ) -> anyhow::Result<DeltaAds> {
        let channel = mesh_grpc::Endpoint::new(&format!("http://{addr}"), Path::new(""), None)?
            .max_message(MAX_MESSAGE)
            .http2_windows(window, window)
            .channel();
        let (requests, responses) = channel
            .streaming(mesh_proto::DELTA_ADS_PATH, &http::HeaderMap::new(), first)
            .await
            .with_context(|| format!("opening the delta ADS stream to {addr}"))?;
        Ok(DeltaAds {
            requests,
            responses,
        })
    }

    /// Sends one request.
    pub fn send(&mut self, request: &DeltaDiscoveryRequest) -> anyhow::Result<()> {
        self.requests.send(request).context("sending a request")
    }

    /// The next response; `None` when the stream ended with status OK.
    pub async fn next(&mut self) -> anyhow::Result<Option<Names>> {
        let Some(slim) = self.responses.message().await.context("delta ADS stream")? else {
            return Ok(None);
        };
        Ok(Some(Names {
            type_url: slim.type_url,
            nonce: slim.nonce,
            names: slim.resources.into_iter().map(|r| r.name).collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use mesh_proto::discovery::{DeltaDiscoveryResponse, Resource};
    use prost::Message;

    use super::*;

    #[test]
    fn the_slim_response_keeps_names_type_and_nonce() {
        let full = DeltaDiscoveryResponse {
            type_url: "type.googleapis.com/istio.workload.Address".into(),
            nonce: "nonce-1".into(),
            system_version_info: "v9".into(),
            resources: (0..3)
                .map(|i| Resource {
                    name: format!("res-{i}"),
                    version: "v1".into(),
                    ..Default::default()
                })
                .collect(),
            removed_resources: vec!["gone".into()],
            ..Default::default()
        };
        let slim = SlimResponse::decode(full.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(slim.type_url, full.type_url);
        assert_eq!(slim.nonce, "nonce-1");
        let names: Vec<&str> = slim.resources.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["res-0", "res-1", "res-2"]);
    }
}
