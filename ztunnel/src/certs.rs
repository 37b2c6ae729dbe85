//! Workload certificates (the CA client and cache live in `mesh-certs`, shared with
//! pilot-agent), plus ztunnel's own prefetch of the identities of local workloads.

pub use mesh_certs::*;

pub mod prefetch;

#[cfg(test)]
mod tests;
