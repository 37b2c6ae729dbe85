#!/usr/bin/env bash
# The local mesh demo: installs what is missing, builds, runs istiod on the example cluster and
# shows what it serves. Usage (as root on Debian 12): ./scripts/demo.sh [--keep]
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"

KEEP=0
for a in "$@"; do
  case "$a" in
    --keep) KEEP=1 ;;
    -h|--help) echo "usage: $0 [--keep]   (--keep: leave istiod running until Ctrl-C)"; exit 0 ;;
    *) echo "unknown argument: $a (try --help)" >&2; exit 2 ;;
  esac
done

step() { printf '\n\033[1;34m==> %s\033[0m\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "The demo installs packages and (later) creates network namespaces: run it as root, e.g. sudo $0" >&2
  exit 1
fi

"$REPO_ROOT/scripts/install-deps.sh"

step "building istiod and istioctl (first build takes a few minutes)"
cargo build -q -p istiod -p istioctl
ISTIOD="$BIN_DIR/istiod"
ISTIOCTL="$BIN_DIR/istioctl"

WORK=$(mktemp -d /tmp/mesh-demo.XXXXXX)
ISTIOD_PID=""
cleanup() {
  if [ -n "$ISTIOD_PID" ] && kill -0 "$ISTIOD_PID" 2>/dev/null; then
    kill -TERM "$ISTIOD_PID" 2>/dev/null || true
    wait "$ISTIOD_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cp -r examples/local/cluster "$WORK/cluster"
mkdir -p "$WORK/state"
printf 'local-ztunnel-node1' > "$WORK/node1.token"

step "starting istiod on the example cluster ($WORK/cluster)"
"$ISTIOD" --config-dir "$WORK/cluster" --state-dir "$WORK/state" \
  --tokens-file examples/local/tokens.yaml \
  --grpc-addr 127.0.0.1:15010 --secure-grpc-addr 127.0.0.1:15012 \
  --monitoring-addr 127.0.0.1:15014 --http-addr 127.0.0.1:8080 \
  >"$WORK/istiod.log" 2>&1 &
ISTIOD_PID=$!
for _ in $(seq 1 100); do
  curl -sf localhost:8080/ready >/dev/null 2>&1 && break
  if ! kill -0 "$ISTIOD_PID" 2>/dev/null; then
    echo "istiod exited during start-up; its log:" >&2; cat "$WORK/istiod.log" >&2; exit 1
  fi
  sleep 0.1
done
curl -sf localhost:8080/ready >/dev/null || { echo "istiod did not become ready; log:" >&2; cat "$WORK/istiod.log" >&2; exit 1; }
echo "istiod is ready (pid $ISTIOD_PID); root certificate published at $WORK/state/root-cert.pem"

XDS=(--xds-address https://localhost:15012 --root-cert "$WORK/state/root-cert.pem" --token-file "$WORK/node1.token")

step "what a ztunnel on node1 receives over delta xDS (TLS, port 15012)"
"$ISTIOCTL" x xds-dump "${XDS[@]}" --node node1

step "a certificate for the demo client, requested as ztunnel on node1 (ImpersonatedIdentity)"
"$ISTIOCTL" x csr "${XDS[@]}" --identity spiffe://cluster.local/ns/demo/sa/client
echo "and one for legacy-client, which runs on node2, not node1: istiod must refuse"
"$ISTIOCTL" x csr "${XDS[@]}" --identity spiffe://cluster.local/ns/legacy/sa/default || true

step "scaling server-v1 on disk (a new Pod file), then deleting legacy-client: a watching client gets deltas"
"$ISTIOCTL" x xds-dump "${XDS[@]}" --node node1 --show workloads --watch 3s > "$WORK/watch.out" &
WATCH_PID=$!
sleep 1
sed -e 's/server-v1-7d9c6b5f4-abcde/server-v1-7d9c6b5f4-klmno/' -e 's/10.244.1.10/10.244.1.12/g' \
  "$WORK/cluster/demo-app.yaml" | awk 'BEGIN{RS="---\n"; ORS=""} /server-v1-7d9c6b5f4-klmno/ {print}' \
  > "$WORK/cluster/.server-v1-2.tmp"
mv "$WORK/cluster/.server-v1-2.tmp" "$WORK/cluster/server-v1-2.yaml"
rm "$WORK/cluster/legacy.yaml"
sleep 0.5
echo "/debug/syncz while the watcher is connected (first 900 bytes):"
curl -s localhost:8080/debug/syncz | head -c 900; echo
wait "$WATCH_PID" || true
grep '^delta:' "$WORK/watch.out" || echo "(no delta seen)"

step "metrics (Prometheus, port 15014)"
curl -s localhost:15014/metrics | grep -E '^(pilot_xds|pilot_xds_pushes|pilot_proxy_convergence_time_count|citadel_server|istiod_snapshot_version)' | head -20

if [ "$KEEP" -eq 1 ]; then
  step "istiod keeps running (Ctrl-C to stop). Explore:"
  cat <<EOT
  curl -s localhost:8080/debug/configz | less     # current snapshot
  curl -s localhost:8080/debug/syncz              # connected proxies, nonces, ACK/NACK
  curl -s localhost:15014/metrics                 # Prometheus metrics
  $ISTIOCTL x xds-dump ${XDS[*]} --watch 60s      # watch deltas while you edit $WORK/cluster
EOT
  wait "$ISTIOD_PID"
fi
step "done; tearing down"
