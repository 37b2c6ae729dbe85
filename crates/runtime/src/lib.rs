//! Process scaffolding shared by the mesh binaries: logging, shutdown signals, readiness, and the
//! small HTTP servers for metrics and admin/debug endpoints.

pub mod http;
pub mod metrics;
pub mod readiness;
pub mod signal;
pub mod task;
pub mod telemetry;
