//! xDS stream state shared by the control plane and the proxies: named, versioned resources and
//! the per-stream bookkeeping of the delta protocol (subscriptions, nonces, ACK/NACK).

mod resource;
mod snapshot;

pub use resource::{Resource, ResourceMap};
pub use snapshot::{ChangeSet, XdsSnapshot};
