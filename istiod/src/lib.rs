//! istiod: the ambient control plane.
//!
//! cluster state (`mesh-source`) -> debounced batches (`push`) -> immutable snapshots (`model`)
//! -> delta xDS to proxies (`xds`); plus the CA (`ca`, `auth`), debug endpoints and metrics.

pub mod auth;
pub mod ca;
pub mod config;
pub mod connection_age;
pub mod debug;
pub mod envoy;
pub mod inject;
pub mod kube;
pub mod live_ca;
pub mod mesh_config;
pub mod metrics;
pub mod model;
pub mod push;
pub mod server;
pub mod serving_tls;
pub mod signing_pool;
pub mod webhook;
pub mod xds;
