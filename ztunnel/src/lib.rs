//! ztunnel: the per-node L4 proxy of the ambient mesh.
//!
//! `app` wires the parts: configuration (`config`); the mesh as ztunnel sees it, fed by delta
//! xDS (`state`, `xds`); workload certificates (`certs`); in-pod mode (`inpod`: pods handed
//! over by the node agent over ZDS, sockets made inside their netns by `socket` factories);
//! each pod's proxy (`proxy`: outbound 15001, inbound HBONE 15008, inbound plaintext 15006,
//! DNS 15053 in `dns`); HBONE itself (`hbone`); L4 authorization (`rbac`); metrics and access
//! logs (`metrics`); admin, readiness and `/config_dump` (`admin`); glibc malloc tuning
//! (`allocator`).

pub mod admin;
pub mod allocator;
pub mod app;
pub mod certs;
pub mod config;
pub mod dns;
pub mod hbone;
pub mod inpod;
pub mod metrics;
pub mod proxy;
pub mod rbac;
pub mod socket;
pub mod state;
pub mod xds;
