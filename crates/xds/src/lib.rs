//! xDS stream state shared by the control plane and the proxies: named, versioned resources and
//! the per-stream bookkeeping of the delta protocol (subscriptions, nonces, ACK/NACK).
//!
//! - [`DeltaStream`]: the server half of one delta ADS stream (what the client subscribed to,
//!   what it has, which nonces were sent and acknowledged), computing responses from an
//!   [`XdsSnapshot`]. Pure: no I/O, no tonic server code.
//! - [`DeltaClient`]: the client half (apply responses to a local map, build ACK/NACK and
//!   reconnect requests), for proxies, tests and benchmarks.

mod client;
mod resource;
mod response;
mod snapshot;
mod stream;
#[cfg(test)]
mod testing;

pub use client::{ack, nack, validate_response, Applied, ClientError, DeltaClient, LocalResource};
pub use resource::{Resource, ResourceMap};
pub use response::{FrameChunks, FrameError, SharedResponse};
pub use snapshot::{ChangeSet, ResourceView, Scoped, XdsSnapshot};
pub use stream::{
    DeltaStream, NackRecord, RequestKind, RequestOutcome, StreamError, TypeStatus, WILDCARD,
};

/// The short type name Istio uses as the `type` label of its xDS metrics (`wds`, `wads`, `cds`,
/// ...); unknown type URLs are returned unchanged, as upstream does.
pub fn metric_type(type_url: &str) -> &str {
    use mesh_proto::type_url as t;
    match type_url {
        t::ADDRESS => "wds",
        t::AUTHORIZATION => "wads",
        t::CLUSTER => "cds",
        t::ENDPOINT => "eds",
        t::LISTENER => "lds",
        t::ROUTE => "rds",
        t::SECRET => "sds",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn metric_types_match_istio() {
        assert_eq!(super::metric_type(mesh_proto::type_url::ADDRESS), "wds");
        assert_eq!(
            super::metric_type(mesh_proto::type_url::AUTHORIZATION),
            "wads"
        );
        assert_eq!(super::metric_type("x/y"), "x/y");
    }
}
