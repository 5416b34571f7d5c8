#!/usr/bin/env bash
# e2e/kind/run.sh — the e2e tests (e2e/suite) on a kind cluster, for machines with Docker (Linux: the tests
# reach the load-balancer addresses on the kind Docker network directly, which Docker Desktop on macOS and
# Windows does not allow). It cannot run on the Docker-less development machine; e2e/run.sh is the
# local-control-plane equivalent, with the same tests.
#   1. kind create cluster --name $KIND_CLUSTER (reused if it exists);
#   2. docker build -f deploy/Dockerfile -t sweety/sweety:<chart appVersion> . and kind load docker-image;
#   3. Gateway API CRDs v1.6.3, standard channel (e2e/cluster/gateway-api.sh crds, from the Go module);
#   4. LoadBalancer addresses: cloud-provider-kind (must be on PATH; started here if it is not running, and
#      stopped at the end);
#   5. helm upgrade --install sweety charts/sweety --wait (default values: the image was loaded, so
#      pullPolicy IfNotPresent never pulls it);
#   6. cargo test -p sweety-e2e -- --ignored: the kubeconfig from kind, the allowed network =
#      the kind Docker network's IPv4 subnet, container kills through `crictl stop` in the node container,
#      and the echo image of the Gateway API v1.6.3 conformance manifests;
#   7. kind delete cluster, unless KEEP_CLUSTER=1.
#
# Needs: docker, kind, kubectl, helm (v3), go (CRDs and the echo image name come from the Gateway API Go
# module), cargo, curl, and cloud-provider-kind. Usage: e2e/kind/run.sh [-- <cargo test filter/args>]
# Environment: KIND_CLUSTER [sweety-e2e], KIND_NODE_IMAGE [kind's default], KEEP_CLUSTER [0], HELM [helm].
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"

CLUSTER=${KIND_CLUSTER:-sweety-e2e}
HELM=${HELM:-helm}
GATEWAY_API_VERSION=v1.6.3
test_args=()
if [ "${1:-}" = -- ]; then shift; test_args=("$@"); fi

for tool in docker kind kubectl "$HELM" go cargo curl cloud-provider-kind; do
  command -v "$tool" >/dev/null || { echo "e2e/kind/run.sh needs $tool on PATH" >&2; exit 1; }
done

log() { echo "[kind-e2e] $*"; }
WORK=$(mktemp -d)
cpk_pid=""
cleanup() {
  if [ -n "$cpk_pid" ]; then kill "$cpk_pid" 2>/dev/null || true; fi
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# 1. cluster
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "reusing kind cluster $CLUSTER"
else
  node_image=()
  if [ -n "${KIND_NODE_IMAGE:-}" ]; then node_image=(--image "$KIND_NODE_IMAGE"); fi
  kind create cluster --name "$CLUSTER" "${node_image[@]}" --wait 120s
fi
export KUBECONFIG=$WORK/kubeconfig
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"

# 2. image
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/sweety/Chart.yaml)
[ -n "$app_version" ] || { echo "no appVersion in charts/sweety/Chart.yaml" >&2; exit 1; }
image=sweety/sweety:$app_version
log "building $image (deploy/Dockerfile)"
docker build -f deploy/Dockerfile -t "$image" .
kind load docker-image "$image" --name "$CLUSTER"

# 3. Gateway API CRDs
bash e2e/cluster/gateway-api.sh crds standard

# 4. load balancer
if pgrep -x cloud-provider-kind >/dev/null; then
  log "cloud-provider-kind is already running"
else
  cloud-provider-kind > "$WORK/cloud-provider-kind.log" 2>&1 &
  cpk_pid=$!
  log "started cloud-provider-kind (pid $cpk_pid)"
fi
subnet=$(docker network inspect kind --format '{{range .IPAM.Config}}{{.Subnet}} {{end}}' | tr ' ' '\n' | grep -m1 -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+/[0-9]+$' || true)
[ -n "$subnet" ] || { echo "the kind Docker network has no IPv4 subnet" >&2; exit 1; }

# 5. helm install
"$HELM" upgrade --install sweety charts/sweety --namespace sweety --create-namespace --wait --timeout 5m
kubectl -n sweety rollout status deployment/sweety --timeout=180s

# 6. the tests
moddir=$(go mod download -json "sigs.k8s.io/gateway-api/conformance@$GATEWAY_API_VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
echo_image=$(grep -m1 -oE 'image: [^ ]*/echo-basic:[^ ]+' "$moddir/base/manifests.yaml" | cut -d' ' -f2)
[ -n "$echo_image" ] || { echo "no echo-basic image in $moddir/base/manifests.yaml" >&2; exit 1; }
log "echo backends use $echo_image; load-balancer addresses must be in $subnet"
SWEETY_E2E_KUBECONFIG=$KUBECONFIG \
  SWEETY_E2E_ALLOWED_CIDR=$subnet \
  SWEETY_E2E_RESTART=kind \
  SWEETY_E2E_KIND_NODE=$CLUSTER-control-plane \
  SWEETY_E2E_ECHO_IMAGE=$echo_image \
  cargo test -p sweety-e2e --test e2e -- --ignored --test-threads=1 --nocapture "${test_args[@]}"
log "passed"
