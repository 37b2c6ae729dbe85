//! mesh-source
