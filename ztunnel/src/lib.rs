//! ztunnel: the per-node L4 proxy of the ambient mesh (being built; see issue "ztunnel").
//!
//! Landed so far: L4 authorization (`rbac`), HBONE (`hbone`), workload certificates (`certs`).

pub mod certs;
pub mod config;
pub mod hbone;
pub mod rbac;
pub mod state;
pub mod xds;
