//! The client half of a delta ADS stream: a local copy of the resources per type URL, the
//! requests that subscribe, ACK or NACK, and the `initial_resource_versions` for a reconnect.
//!
//! Responses are applied all-or-nothing: a response that fails validation leaves the local
//! state untouched and is answered with a NACK carrying the error.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use mesh_proto::envoy::pb::envoy::config::core::v3::Node;
use mesh_proto::envoy::pb::google::rpc::Status;

use crate::stream::WILDCARD;

/// gRPC code INVALID_ARGUMENT, used in NACKs for resources that fail validation.
const INVALID_ARGUMENT: i32 = 3;

/// A response the client refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("response for {type_url} carries a resource without a name: the server must name every resource")]
    UnnamedResource { type_url: String },
    #[error("resource {name} has no body: the server must set Resource.resource for every update")]
    MissingBody { name: String },
    #[error(
        "resource {name} is a {found} but the response is for {type_url}: the server mixed types \
         in one response"
    )]
    TypeMismatch {
        name: String,
        found: String,
        type_url: String,
    },
}

impl ClientError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ClientError::UnnamedResource { .. } => "unnamed_resource",
            ClientError::MissingBody { .. } => "missing_body",
            ClientError::TypeMismatch { .. } => "type_mismatch",
        }
    }
}

/// A resource as the client holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalResource {
    pub version: String,
    pub aliases: Vec<String>,
    pub body: prost_types::Any,
}

/// What applying one response changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Names added or updated.
    pub updated: Vec<String>,
    /// Names removed (including names the client did not have).
    pub removed: Vec<String>,
}

#[derive(Debug, Default)]
struct ClientType {
    wildcard: bool,
    names: BTreeSet<String>,
    resources: BTreeMap<String, LocalResource>,
}

/// The client half of a delta ADS stream.
#[derive(Debug, Default)]
pub struct DeltaClient {
    node: Option<Node>,
    types: BTreeMap<String, ClientType>,
}

impl DeltaClient {
    /// A client that sends `node` on the first request of each type.
    pub fn new(node: Option<Node>) -> DeltaClient {
        DeltaClient {
            node,
            types: BTreeMap::new(),
        }
    }

    /// The first request for a wildcard subscription to `type_url` (empty names), carrying
    /// what the client already holds.
    pub fn subscribe_wildcard(&mut self, type_url: &str) -> DeltaDiscoveryRequest {
        let t = self.types.entry(type_url.to_string()).or_default();
        t.wildcard = true;
        self.initial_request(type_url)
    }

    /// Subscribes to `names` (or aliases) of `type_url`: the initial request if the type is new
    /// to this stream, else a spontaneous subscription request.
    pub fn subscribe(&mut self, type_url: &str, names: &[&str]) -> DeltaDiscoveryRequest {
        let is_new = !self.types.contains_key(type_url);
        let t = self.types.entry(type_url.to_string()).or_default();
        for name in names {
            if *name == WILDCARD {
                t.wildcard = true;
            } else {
                t.names.insert((*name).to_string());
            }
        }
        if is_new {
            return self.initial_request(type_url);
        }
        DeltaDiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names_subscribe: names.iter().map(|n| n.to_string()).collect(),
            ..DeltaDiscoveryRequest::default()
        }
    }

    /// Unsubscribes from `names` (`*` ends the wildcard subscription) and forgets them locally.
    pub fn unsubscribe(&mut self, type_url: &str, names: &[&str]) -> DeltaDiscoveryRequest {
        if let Some(t) = self.types.get_mut(type_url) {
            for name in names {
                if *name == WILDCARD {
                    t.wildcard = false;
                } else {
                    t.names.remove(*name);
                    t.resources.remove(*name);
                }
            }
        }
        DeltaDiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names_unsubscribe: names.iter().map(|n| n.to_string()).collect(),
            ..DeltaDiscoveryRequest::default()
        }
    }

    /// The first request of each subscribed type for a new stream (reconnect), with
    /// `initial_resource_versions` so the server sends only what differs.
    pub fn reconnect_requests(&self) -> Vec<DeltaDiscoveryRequest> {
        self.types
            .keys()
            .map(|type_url| self.initial_request(type_url))
            .collect()
    }

    /// What the client holds of `type_url`: name -> version.
    pub fn initial_resource_versions(&self, type_url: &str) -> HashMap<String, String> {
        self.types
            .get(type_url)
            .map(|t| {
                t.resources
                    .iter()
                    .map(|(name, r)| (name.clone(), r.version.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The local resources of `type_url`.
    pub fn resources(&self, type_url: &str) -> Option<&BTreeMap<String, LocalResource>> {
        self.types.get(type_url).map(|t| &t.resources)
    }

    /// Validates then applies one response to the local state (all or nothing).
    pub fn apply(&mut self, resp: &DeltaDiscoveryResponse) -> Result<Applied, ClientError> {
        validate_response(resp)?;
        let t = self.types.entry(resp.type_url.clone()).or_default();
        let mut applied = Applied::default();
        for r in &resp.resources {
            let body = r
                .resource
                .as_ref()
                .map(|any| prost_types::Any {
                    type_url: any.type_url.clone(),
                    value: any.value.clone(),
                })
                .unwrap_or_default();
            let local = LocalResource {
                version: r.version.clone(),
                aliases: r.aliases.clone(),
                body,
            };
            t.resources.insert(r.name.clone(), local);
            applied.updated.push(r.name.clone());
        }
        for name in &resp.removed_resources {
            t.resources.remove(name);
            applied.removed.push(name.clone());
        }
        Ok(applied)
    }

    /// Applies `resp` and returns the ACK, or the NACK with the validation error.
    pub fn handle_response(
        &mut self,
        resp: &DeltaDiscoveryResponse,
    ) -> (DeltaDiscoveryRequest, Result<Applied, ClientError>) {
        match self.apply(resp) {
            Ok(applied) => (ack(resp), Ok(applied)),
            Err(e) => (nack(resp, INVALID_ARGUMENT, &e.to_string()), Err(e)),
        }
    }

    fn initial_request(&self, type_url: &str) -> DeltaDiscoveryRequest {
        let (wildcard, names) = self
            .types
            .get(type_url)
            .map(|t| (t.wildcard, t.names.iter().cloned().collect::<Vec<_>>()))
            .unwrap_or_default();
        let mut subscribe = names;
        let mut unsubscribe = Vec::new();
        if wildcard && !subscribe.is_empty() {
            subscribe.push(WILDCARD.to_string());
        } else if !wildcard && subscribe.is_empty() {
            // An explicit subscription to nothing must not look like a legacy wildcard request.
            unsubscribe.push(WILDCARD.to_string());
        }
        DeltaDiscoveryRequest {
            node: self.node.clone(),
            type_url: type_url.to_string(),
            resource_names_subscribe: subscribe,
            resource_names_unsubscribe: unsubscribe,
            initial_resource_versions: self.initial_resource_versions(type_url),
            ..DeltaDiscoveryRequest::default()
        }
    }
}

/// The ACK of `resp`.
pub fn ack(resp: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: resp.type_url.clone(),
        response_nonce: resp.nonce.clone(),
        ..DeltaDiscoveryRequest::default()
    }
}

/// The NACK of `resp` with a gRPC status `code` and `message`.
pub fn nack(resp: &DeltaDiscoveryResponse, code: i32, message: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: resp.type_url.clone(),
        response_nonce: resp.nonce.clone(),
        error_detail: Some(Status {
            code,
            message: message.to_string(),
            details: Vec::new(),
        }),
        ..DeltaDiscoveryRequest::default()
    }
}

/// Checks what the delta protocol requires of a response before anything in it is applied:
/// every resource is named, has a body, and the body is of the response's type.
pub fn validate_response(resp: &DeltaDiscoveryResponse) -> Result<(), ClientError> {
    for r in &resp.resources {
        if r.name.is_empty() {
            return Err(ClientError::UnnamedResource {
                type_url: resp.type_url.clone(),
            });
        }
        let Some(body) = &r.resource else {
            return Err(ClientError::MissingBody {
                name: r.name.clone(),
            });
        };
        if body.type_url != resp.type_url {
            return Err(ClientError::TypeMismatch {
                name: r.name.clone(),
                found: body.type_url.clone(),
                type_url: resp.type_url.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
