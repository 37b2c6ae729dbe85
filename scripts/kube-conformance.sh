#!/usr/bin/env bash
# Runs the fake Kubernetes API server's test flows against a real kube-apiserver, to check that
# the fake behaves as the real server where the mesh's tests rely on it.
# Usage: ./scripts/kube-conformance.sh <kubeconfig>
# Each test creates a namespace mesh-conformance-<test>-<n> and deletes it afterwards.
set -euo pipefail
source "$(dirname "$0")/env.sh"
if [ $# -ne 1 ] || [ ! -r "$1" ]; then
    echo "usage: $0 <kubeconfig>   (a readable kubeconfig; its current context is used)" >&2
    exit 2
fi
cd "$REPO_ROOT"
MESH_KUBE_CONFORMANCE="$(realpath "$1")" \
    cargo test -p mesh-testutil --test kube_api -- --nocapture --test-threads 2
