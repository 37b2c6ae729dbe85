//! The Kubernetes API as the mesh's components use it: one way to build a client (a kubeconfig
//! or the in-cluster configuration) and leader election on Istio's locks.

pub mod client;
pub mod leader;

pub use client::{client, client_for_user, ClientError};
pub use leader::{LeaderElection, LeaderError, LockKind};
