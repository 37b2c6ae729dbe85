//! mesh-runtime
