//! istioctl: the command line Istio users expect, for this mesh. The binary (`main.rs`) is a
//! thin clap front end over these modules.

pub mod analyze;
pub mod cluster;
pub mod connect;
pub mod csr;
pub mod http;
pub mod input;
pub mod install;
pub mod kube_inject;
pub mod manifest;
pub mod precheck;
pub mod proxy_config;
pub mod render;
pub mod table;
pub mod uninstall;
pub mod waypoint;
pub mod xds_dump;
pub mod ztunnel_config;
