#!/usr/bin/env bash
# Benchmark: HTTP through a waypoint vs the L4 mesh vs direct, in network namespaces (needs
# root and Envoy): requests/s at saturation, p50/p99 at a fixed rate, waypoint CPU and memory
# (RSS and private), HTTPRoute edit -> served. Builds release binaries, prints a table.
# Not part of the test suite. Pass --quick for a short smoke run.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$REPO_ROOT"
"$REPO_ROOT/scripts/install-deps.sh"
cargo build --release -p istiod -p cni-node -p waypoint-controller -p mesh-bench
# ztunnel and pilot-agent each on its own, as scripts/build-images.sh ships them (no features of
# the others' dependencies).
cargo build --release -p ztunnel
cargo build --release -p pilot-agent
export MESH_BIN_DIR="$CARGO_TARGET_DIR/release"
exec "$MESH_BIN_DIR/waypoint-http" "$@"
