//! Test helpers shared by the crates' integration tests: a temporary cluster directory that
//! writes Kubernetes YAML the way tools do (atomically), and builders for common objects.
//! (Fake CA, fake ADS and fake ZDS peers join this crate with the data plane.)

mod cluster_dir;
mod envoy;
mod fake_ads;
mod fake_ca;
mod fake_zds;
mod golden;
mod http_app;
mod jwt;
pub mod kube_api;
mod memory_snapshot;
pub mod netns;
mod objects;
mod pki;
mod silent_relay;
mod tls_files;
mod wait;

pub use cluster_dir::ClusterDir;
pub use envoy::{envoy_path, INSTALLED_ENVOY};
pub use fake_ads::{FakeAds, FakeAdsError, RecordedDeltaRequest, RecordedDeltaResponse};
pub use fake_ca::{FakeCa, FakeCaError, RecordedRequest, IMPERSONATED_IDENTITY};
pub use fake_zds::{
    workload_info, AckResult, FakeZds, FakeZdsError, SnapshotItem, ACK_DEADLINE, CONNECT_WAIT,
};
pub use golden::golden;
pub use http_app::{
    http_call, http_get, http_request, https_request, HttpApp, HttpClientError, HttpResponse,
};
pub use jwt::{JwtIssuer, JwtIssuerError};
pub use memory_snapshot::MemorySnapshot;
pub use netns::{Netns, NetnsError, TestNet};
pub use objects::{namespace_yaml, pod_yaml, service_yaml, PodSpec};
pub use pki::TestPki;
pub use silent_relay::SilentRelay;
pub use tls_files::TlsFiles;
pub use wait::{eventually, eventually_async, eventually_blocking};
