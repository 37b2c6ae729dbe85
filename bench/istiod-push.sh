#!/usr/bin/env bash
# Benchmark: istiod push convergence with 10,000 Pods, 1,000 Services, 500 delta-xDS clients
# (or --pods / --services / --clients), then a storm of CSRs.
# Builds release binaries, runs the real istiod, prints a table. Not part of the test suite.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$REPO_ROOT"
ulimit -n 65536 || true
cargo build --release -p istiod -p mesh-bench
exec "$CARGO_TARGET_DIR/release/istiod-push" --istiod "$CARGO_TARGET_DIR/release/istiod" "$@"
