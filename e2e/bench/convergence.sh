#!/usr/bin/env bash
# Controller convergence at scale on the e2e cluster (issue 22): N HTTPRoutes behind one Gateway
# to an echo-basic backend, then M single-route changes under steady background load.
# Prints one JSON line and one markdown row (docs/benchmarks.md); asserts nothing.
#
# Usage: e2e/bench/convergence.sh [N=1000] [M=200] [RPS=200]
#   M changes polled at the Gateway's address, then M more polled at the dataplane Pod.
#   Needs a cluster from e2e/install.sh (same SWEETY_CLUSTER_DIR, ports, bridge and CIDR
#   variables; SWEETY_PROFILE=release for figures worth recording) and runs in the namespace
#   conv-bench, which it deletes first and afterwards.
# What is measured is described in convergence.py. Every wait is bounded (BENCH_DEADLINE
# seconds for the measured part, default 900). The load average is printed before and after.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
N=${1:-1000}
M=${2:-200}
RPS=${3:-200}
NS=conv-bench
export SWEETY_CLUSTER_DIR=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster-e2e}
export KUBECONFIG=${KUBECONFIG:-$SWEETY_CLUSTER_DIR/run/kubeconfig}
K8S_BIN=${SWEETY_K8S_BIN:-$HOME/.cache/sweety/k8s/k8s-${K8S_VERSION:-1.34.4}-etcd-${ETCD_VERSION:-3.6.16}/bin}
export PATH="$K8S_BIN:$PATH"
k() { kubectl "$@"; }
# shellcheck source=e2e/lib.sh
. e2e/lib.sh

k get ns "$NS" >/dev/null 2>&1 && { k delete ns "$NS" --wait=true --timeout=600s >/dev/null; }
echo_app "$NS"
http_gateway "$NS" bench
addr=$(k -n "$NS" get gateway bench -o jsonpath='{.status.addresses[0].value}')
[ -n "$addr" ] || { echo "the Gateway has no address" >&2; exit 1; }
# The controller's /metrics (the pod's address; the chart's metrics port): where a change's time goes.
pod_ip=$(k -n "${SWEETY_NAMESPACE:-sweety}" get pod -l app.kubernetes.io/name=sweety --request-timeout=20s \
  -o jsonpath='{.items[0].status.podIP}' 2>/dev/null || true)
metrics=${pod_ip:+http://$pod_ip:${CONTROLLER_METRICS_PORT:-9090}/metrics}
# The dataplane Pod's address and the Gateway listener's container port (the per-Gateway
# EndpointSlice): a second change phase polls there, without the node agent's load balancer.
direct=$(k -n "${SWEETY_NAMESPACE:-sweety}" get endpointslices --request-timeout=20s \
  -l "sweety.dev/gateway-namespace=$NS,sweety.dev/gateway-name=bench" \
  -o jsonpath='{.items[0].endpoints[0].addresses[0]}:{.items[0].ports[0].port}' 2>/dev/null || true)
case $direct in *[0-9]:[0-9]*) ;; *) echo "no EndpointSlice of the Gateway: no direct phase" >&2; direct= ;; esac
commit=$(git rev-parse --short HEAD)
echo "commit $commit; N=$N M=$M RPS=$RPS; gateway $addr; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 e2e/bench/convergence.py --kubeconfig "$KUBECONFIG" --ns "$NS" --gateway "$addr" \
  --routes "$N" --changes "$M" --rps "$RPS" --image-dir "$SWEETY_CLUSTER_DIR/image" \
  --deadline "${BENCH_DEADLINE:-900}" --metrics "$metrics" --direct "$direct"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
k delete ns "$NS" --wait=true --timeout=600s >/dev/null || echo "namespace $NS not gone in 600 s" >&2
