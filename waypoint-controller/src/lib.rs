//! The waypoint controller: Gateways of class `istio-waypoint` become a ServiceAccount, a
//! Deployment (`pilot-agent proxy waypoint`) and a Service named as Istio names them, owned by
//! the Gateway and labelled as managed; the Gateway's status gets `Accepted`, `Programmed` and,
//! once the waypoint is ready, its addresses. It reads and writes through `mesh-source`: a
//! directory of YAML, or the Kubernetes API (server-side apply with the field manager
//! `istio.io/gateway-controller`, under the `istio-gateway-deployment-<revision>` Lease).

pub mod controller;
pub mod render;
pub mod run;
pub mod status;

pub use controller::{Controller, ControllerOptions, Report};
pub use render::{render, Names, RenderOptions};

/// The kinds the controller reads from the API: Gateways and what it makes for them.
pub fn kube_watches() -> mesh_source::KubeOptions {
    use mesh_api::Kind;
    mesh_source::KubeOptions {
        kinds: vec![
            Kind::Gateway,
            Kind::Deployment,
            Kind::Service,
            Kind::ServiceAccount,
        ],
        ..mesh_source::KubeOptions::default()
    }
}

/// The field manager of everything the controller applies (Istio's gateway controller's).
pub const FIELD_MANAGER: &str = "istio.io/gateway-controller";
/// The per-revision Lease the controller leads under: `istio-gateway-deployment-<revision>`.
pub const DEPLOYMENT_LOCK_PREFIX: &str = "istio-gateway-deployment-";
