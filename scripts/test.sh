#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/component/integration tests.
# Usage (as root on Debian 12): ./scripts/test.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"

"$REPO_ROOT/scripts/install-deps.sh"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
start=$(date +%s)

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (deny warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo clippy without default features (no eBPF), so those paths build and stay clean"
cargo clippy --workspace --all-targets --locked --no-default-features -- -D warnings

step "cargo deny (licences, bans, sources)"
cargo deny --locked check licenses bans sources

step "cargo build --bins (the e2e tests run the binaries as processes)"
cargo build --workspace --bins --locked

step "cargo test"
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$CARGO_TARGET_DIR/test-output.txt"

passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$CARGO_TARGET_DIR/test-output.txt" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' "$CARGO_TARGET_DIR/test-output.txt" | awk '{s+=$1} END {print s+0}')
step "done in $(( $(date +%s) - start ))s"
echo "tests: ${passed} passed, ${failed} failed"
