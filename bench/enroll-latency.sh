#!/usr/bin/env bash
# Benchmark: enrollment latency (CNI ADD of istio-cni to ztunnel's ack) over 100 pods created
# through the real CNI chain, with nftables and with eBPF capture. Needs root.
# Builds release binaries, runs istiod, cni-node and ztunnel, prints a table.
# Not part of the test suite. Options: --pods N, --mode nftables|ebpf.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$REPO_ROOT"
cargo build --release -p istiod -p cni-node -p mesh-bench
# ztunnel on its own, as scripts/build-images.sh ships it (no features of the others' dependencies).
cargo build --release -p ztunnel
export MESH_BIN_DIR="$CARGO_TARGET_DIR/release"
exec "$MESH_BIN_DIR/enroll-latency" "$@"
