#!/usr/bin/env bash
# Benchmark: ztunnel data plane vs direct, in network namespaces (needs root and iperf3):
# iperf3 1 and 8 streams, 1 KB ping-pong p50/p99, connection churn, ztunnel CPU/RSS/fds.
# Builds release binaries, runs the real istiod and ztunnels, prints a table.
# Not part of the test suite. Pass --quick for a short smoke run.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$REPO_ROOT"
command -v iperf3 >/dev/null || { echo "iperf3 is not installed (apt-get install iperf3)" >&2; exit 1; }
# Idle connections: the bench process holds their client ends, ztunnel one socket each.
ulimit -n "$(ulimit -Hn)" || true
cargo build --release -p istiod -p mesh-bench
# ztunnel on its own, as scripts/build-images.sh ships it (no features of the others' dependencies).
cargo build --release -p ztunnel
export MESH_BIN_DIR="$CARGO_TARGET_DIR/release"
exec "$MESH_BIN_DIR/ztunnel-dataplane" "$@"
