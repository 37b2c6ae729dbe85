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

/// Every field compares exactly (no floating point): `Eq` lets `Arc<Resource>` comparisons,
/// as in the persistent maps' diff, stop at pointer equality.
impl Eq for Resource {}

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
    /// About how many bytes this resource takes in a response: its name, aliases, version and
    /// body, plus a little framing. Cheap (no encoding), for budgets rather than exact sizes.
    pub fn wire_len(&self) -> usize {
        const FRAMING: usize = 16;
        self.name.len()
            + self.aliases.iter().map(String::len).sum::<usize>()
            + self.version.len()
            + self.body.type_url.len()
            + self.body.value.len()
            + FRAMING
    }

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

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::Resource;
    use crate::response::to_wire;

    #[test]
    fn wire_len_is_close_to_the_encoded_size_and_never_far_below_it() {
        for (name, aliases, body) in [
            ("a", vec![], vec![]),
            (
                "Kubernetes//Pod/default/web-0",
                vec!["network/10.0.0.1".to_string()],
                vec![7u8; 300],
            ),
            ("svc", vec![], vec![1u8; 70_000]),
        ] {
            let resource = Resource::from_encoded("type.googleapis.com/x", name, aliases, body);
            let encoded = to_wire(&resource).encoded_len();
            let estimate = resource.wire_len();
            assert!(
                estimate + 8 >= encoded && estimate <= encoded + 24,
                "{name}: estimate {estimate}, encoded {encoded}"
            );
        }
    }
}
