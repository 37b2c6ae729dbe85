//! ztunnel: the per-node L4 proxy of the ambient mesh (being built; see issue "ztunnel").
//!
//! Landed so far: configuration (`config`), the proxy's view of the mesh fed by delta xDS
//! (`state`, `xds`), L4 authorization (`rbac`), HBONE (`hbone`), workload certificates (`certs`),
//! admin and readiness endpoints (`admin`).

pub mod admin;
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
