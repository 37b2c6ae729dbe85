#!/usr/bin/env bash
# The whole test suite: formatting, lints (also without default features), cargo deny,
# unit/component/integration/e2e tests and a short run of every fuzz target.
# Usage (as root on Debian 12): ./scripts/test.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"

"$REPO_ROOT/scripts/install-deps.sh" --dev-tools

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

step "fuzz: every target for ${FUZZ_SECONDS:-10}s (./scripts/fuzz.sh runs them longer)"
set +e
"$REPO_ROOT/scripts/fuzz.sh" "${FUZZ_SECONDS:-10}" > "$CARGO_TARGET_DIR/fuzz-output.txt" 2>&1
fuzz_status=$?
set -e
grep -E '^==> fuzz|stat::number_of_executed_units|deadly signal|panicked|ERROR' "$CARGO_TARGET_DIR/fuzz-output.txt" || true
if [ "$fuzz_status" -ne 0 ]; then
  tail -40 "$CARGO_TARGET_DIR/fuzz-output.txt" >&2
  if [ "$fuzz_status" -eq 2 ]; then
    echo "fuzz: a target crashed; its input is in fuzz/artifacts/ (full log: $CARGO_TARGET_DIR/fuzz-output.txt)" >&2
  else
    echo "fuzz: the fuzz step failed before fuzzing (full log: $CARGO_TARGET_DIR/fuzz-output.txt)" >&2
  fi
  exit 1
fi

passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$CARGO_TARGET_DIR/test-output.txt" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' "$CARGO_TARGET_DIR/test-output.txt" | awk '{s+=$1} END {print s+0}')
step "done in $(( $(date +%s) - start ))s"
echo "tests: ${passed} passed, ${failed} failed"
