#!/usr/bin/env bash
# Builds the release binaries and the mesh's container images from them, without a container
# engine: images/<name>.tar, each loadable with `docker load -i` or `ctr images import`.
# Usage: ./scripts/build-images.sh [--hub localhost/mesh] [--tag 0.1.0] [--out images]
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"
out=images
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --hub|--tag) args+=("$1" "$2"); shift 2 ;;
    *) echo "build-images: unknown argument $1; usage: $0 [--hub H] [--tag T] [--out DIR]" >&2; exit 2 ;;
  esac
done
"$REPO_ROOT/scripts/install-deps.sh"
cargo build --release --locked --bins
# ztunnel again on its own: built with the rest, it takes the features other crates turn on in
# shared dependencies (kube's `log` output of tracing and mio, among others), which adds about
# 0.4 MB of code and 0.3 MiB of idle RSS to every node's ztunnel.
cargo build --release --locked -p ztunnel
python3 "$REPO_ROOT/scripts/build-images.py" --bin-dir "$CARGO_TARGET_DIR/release" --out "$out" "${args[@]}"
