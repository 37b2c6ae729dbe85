//! The project's Helm charts (`charts/`), rendered and linted by Helm's own engine.
//!
//! There is no helm binary to be had here: Helm v4's Go SDK comes as a C library inside the
//! `helm-python-sdk` wheel, which `scripts/install-deps.sh` installs pinned by hash, and
//! `scripts/helm.py` is its command-line front. This crate runs that front with values as
//! JSON and hands back the rendered objects, so tests (and istioctl) reason about the same
//! objects a `helm install` would create.

pub mod crds;
pub mod embedded;
mod engine;
pub mod manifest;
mod objects;
pub mod operator;

pub use engine::{Helm, HelmError, LintMessage, LintReport, Severity};
pub use objects::{ManifestError, Object, Rendered};

use std::path::PathBuf;

/// The charts this repository ships, by directory name under `charts/`.
pub const CHARTS: [&str; 5] = ["base", "istiod", "cni", "ztunnel", "gateway"];

/// The profiles every chart knows (`--set profile=<name>`).
pub const PROFILES: [&str; 5] = ["default", "ambient", "minimal", "demo", "empty"];

/// `charts/` in this repository.
pub fn charts_dir() -> PathBuf {
    repo_root().join("charts")
}

/// The repository's root (this crate lives in `crates/charts`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}
