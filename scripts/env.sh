# Sourced by the scripts: one place for paths shared by build, test and demo.
# shellcheck shell=bash
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$HOME/.cargo/bin:$PATH"
# Keep build output outside the clone when the caller asks (CI does, for incremental reruns).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
BIN_DIR="$CARGO_TARGET_DIR/debug"
