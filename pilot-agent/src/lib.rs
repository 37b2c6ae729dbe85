//! pilot-agent: runs Envoy for waypoints (and later sidecars) the way Istio's agent does.
//!
//! - `config`: the command line and Istio's environment variables;
//! - `bootstrap`: Envoy's bootstrap (node, admin, ADS and SDS over the agent's sockets);
//! - `sds`: the proxy certificate and mesh roots for Envoy, rotated at half life;
//! - `xds_proxy`: Envoy's ADS relayed to istiod over TLS with the pod's token;
//! - `envoy`: starting, restarting and draining Envoy;
//! - `telemetry`: Istio's request metrics from Envoy's access log stream;
//! - `status`: readiness, merged Prometheus metrics, `/quitquitquit` on 15020;
//! - `app_probe`: the app's kubelet probes, rewritten to `/app-health/...` on 15020;
//! - `iptables`: `pilot-agent istio-iptables`, the sidecar's capture init step and its validation;
//! - `wait`: `pilot-agent wait`, the app containers' hold until the proxy is ready.

pub mod admin;
pub mod app;
pub mod app_probe;
pub mod bootstrap;
pub mod config;
pub mod envoy;
pub mod iptables;
pub mod sds;
pub mod status;
pub mod telemetry;
pub mod wait;
pub mod xds_proxy;
