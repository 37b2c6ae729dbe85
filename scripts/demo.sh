#!/usr/bin/env bash
# The local ambient mesh demo: installs what is missing, builds, and brings up istiod plus two
# nodes (each with cni-node and ztunnel) in network namespaces on this machine, with a sample
# application in two namespaces; sends traffic, applies and removes a policy, shows metrics,
# and tears everything down. Usage (as root on Debian 12): ./scripts/demo.sh [--keep] [--ebpf]
#   --keep  leave the mesh running until Ctrl-C and print how to explore it
#   --ebpf  capture pod traffic with eBPF instead of nftables
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"

ARGS=()
for a in "$@"; do
  case "$a" in
    --keep|--ebpf) ARGS+=("$a") ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $a (try --help)" >&2; exit 2 ;;
  esac
done

step() { printf '\n\033[1;34m==> %s\033[0m\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "The demo installs packages and creates network namespaces: run it as root, e.g. sudo $0" >&2
  exit 1
fi

"$REPO_ROOT/scripts/install-deps.sh"

step "building istiod, ztunnel, cni-node, istio-cni, istioctl and the demo (the first build takes several minutes)"
cargo build --workspace --bins --locked

exec "$BIN_DIR/mesh-demo" "${ARGS[@]}"
