//! mesh-identity
