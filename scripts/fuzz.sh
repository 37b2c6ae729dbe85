#!/usr/bin/env bash
# Runs the fuzz targets (fuzz/, cargo-fuzz over libFuzzer, stable toolchain) for SECONDS each.
# Usage: ./scripts/fuzz.sh [SECONDS] [TARGET...]      (default: 60 s, every target)
#        ./scripts/fuzz.sh list
# Exit status: 0 clean, 2 when a target crashed (every target still runs), 1 for anything else
# (the build failed, an unknown target). Needs cargo-fuzz: `sudo ./scripts/install-deps.sh
# --dev-tools` once.
# The working corpus grows in fuzz/corpus/<target> (not committed). A crash stops the run and
# leaves its input in fuzz/artifacts/<target>/: fix the bug, then copy the input to
# fuzz/regressions/<target>/ so `cargo test -p mesh-fuzz` replays it from then on.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT/fuzz"

targets() { sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^mesh-fuzz-targets$'; }
if [ "${1:-}" = list ]; then targets; exit 0; fi

seconds=60
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then seconds=$1; shift; fi
if [ "$seconds" -lt 1 ]; then
  echo "fuzz: SECONDS must be at least 1 (libFuzzer takes 0 as no limit)" >&2
  exit 1
fi
if [ $# -gt 0 ]; then selected=("$@"); else mapfile -t selected < <(targets); fi
for t in "${selected[@]}"; do
  targets | grep -qxF "$t" || { echo "fuzz: no target $t (./scripts/fuzz.sh list)" >&2; exit 1; }
done

# The pinned cargo-fuzz, called directly: `cargo fuzz` would prefer one in ~/.cargo/bin.
cargo_fuzz=/opt/mesh-deps/tools/bin/cargo-fuzz
if [ ! -x "$cargo_fuzz" ]; then
  echo "fuzz: $cargo_fuzz is missing; run: sudo ./scripts/install-deps.sh --dev-tools" >&2
  exit 1
fi
# No sanitizer: -Zsanitizer needs a nightly compiler; libFuzzer's coverage and Rust's panics
# (debug assertions and overflow checks on) still find the crashes. Light optimisation and
# parallel codegen: the targets build in minutes on two cores and still run thousands of
# inputs a second. `cargo fuzz run` below reuses this build (same flags).
export CARGO_PROFILE_RELEASE_OPT_LEVEL=1
flags=(--sanitizer none --debug-assertions --codegen-units 16)
"$cargo_fuzz" fuzz build "${flags[@]}"
crashed=()
for t in "${selected[@]}"; do
  mkdir -p "corpus/$t"
  printf '\n==> fuzz %s for %ss\n' "$t" "$seconds"
  "$cargo_fuzz" fuzz run "${flags[@]}" "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 \
    || crashed+=("$t")
done
if [ ${#crashed[@]} -gt 0 ]; then
  echo "fuzz: crashed: ${crashed[*]}; the inputs are in fuzz/artifacts/<target>/" >&2
  exit 2
fi
