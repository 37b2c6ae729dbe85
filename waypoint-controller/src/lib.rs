//! The waypoint controller: Gateways of class `istio-waypoint` become a ServiceAccount, a
//! Deployment (`pilot-agent proxy waypoint`) and a Service named as Istio names them, owned by
//! the Gateway and labelled as managed; the Gateway's status gets `Accepted`, `Programmed` and,
//! once the waypoint is ready, its addresses. It reads and writes through `mesh-source`, so a
//! directory of YAML works now and the Kubernetes API plugs in behind the same traits.

pub mod controller;
pub mod render;
pub mod status;

pub use controller::{Controller, ControllerOptions, Report};
pub use render::{render, Names, RenderOptions};
