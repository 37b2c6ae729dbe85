//! Typed objects that the mesh reads from the cluster: Kubernetes core objects (from
//! `k8s-openapi`), Istio CRDs (`security.istio.io`, `networking.istio.io`) and Gateway API
//! (`gateway.networking.k8s.io` GatewayClass, Gateway, HTTPRoute, GRPCRoute and TCPRoute).
//!
//! Every object is one variant of [`Object`], identified by an [`ObjectKey`]. Decoding goes
//! through [`Object::from_value`], which checks `apiVersion`/`kind` and reports the exact field
//! that failed.

mod destination_rule;
mod error;
mod gateway;
mod istio;
mod istio_gateway;
mod labels;
mod object;
mod pod;
mod sidecar;
mod virtual_service;

pub use destination_rule::*;
pub use error::ApiError;
pub use gateway::*;
pub use istio::*;
pub use istio_gateway::*;
pub use k8s_openapi;
pub use k8s_openapi::api::apps::v1::Deployment;
pub use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, Service, ServiceAccount};
pub use k8s_openapi::api::discovery::v1::EndpointSlice;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
pub use labels::{label, selector_matches};
pub use object::{Kind, Object, ObjectKey};
pub use pod::pod_service_account;
pub use sidecar::*;
pub use virtual_service::*;

#[cfg(test)]
mod tests;
