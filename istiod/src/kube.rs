//! istiod's controllers that write to the Kubernetes API (when it reads the cluster from the
//! API rather than a YAML directory).

pub mod root_cert;
