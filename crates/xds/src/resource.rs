//! A named, versioned, pre-encoded xDS resource.

use std::sync::Arc;

use prost::Message;
use sha2::{Digest, Sha256};

/// One resource as it goes on the wire. Encoded once when the control plane builds it and shared
/// (via `Arc`) by every stream that sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// Unique name (e.g. a workload uid or `namespace/hostname` for a service).
    pub name: String,
    /// Alias names (e.g. `network/IP`) by which a client may subscribe on demand.
    pub aliases: Vec<String>,
    /// Content version: a hash of the encoded body, so it survives control-plane restarts.
    pub version: String,
    /// The encoded resource.
    pub body: prost_types::Any,
}

impl Resource {
    /// Encodes `message` as an `Any` of `type_url` and derives the version from its bytes.
    pub fn new<M: Message>(
        type_url: &str,
        name: impl Into<String>,
        aliases: Vec<String>,
        message: &M,
    ) -> Resource {
        Resource::from_encoded(type_url, name, aliases, message.encode_to_vec())
    }

    /// A resource from an already encoded body; the version is derived from the bytes as in
    /// [`Resource::new`].
    pub fn from_encoded(
        type_url: &str,
        name: impl Into<String>,
        aliases: Vec<String>,
        value: Vec<u8>,
    ) -> Resource {
        let digest = Sha256::digest(&value);
        Resource {
            name: name.into(),
            aliases,
            version: hex::encode(&digest[..8]),
            body: prost_types::Any {
                type_url: type_url.to_string(),
                value,
            },
        }
    }
}

impl Resource {
    /// A stand-in for a resource a client says it holds (`initial_resource_versions`): only
    /// the name and version are known.
    pub fn placeholder(name: &str, version: &str) -> Resource {
        Resource {
            name: name.to_string(),
            aliases: Vec::new(),
            version: version.to_string(),
            body: prost_types::Any::default(),
        }
    }
}

/// A persistent (structurally shared) map of resources by name: cloning is O(1) and an update
/// O(log n), so each snapshot can hold its own copy cheaply.
pub type ResourceMap = imbl::OrdMap<String, Arc<Resource>>;
