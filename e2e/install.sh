#!/usr/bin/env bash
# e2e/install.sh — a Docker-less Kubernetes on this host with Sweety installed by `helm install`:
#   1. the control plane (e2e/cluster/up.sh: etcd, kube-apiserver, controller-manager, scheduler on 127.0.0.1)
#      and the Gateway API CRDs (standard channel, e2e/cluster/gateway-api.sh);
#   2. builds sweety-controller, sweety-dataplane and sweety-node-agent with cargo, and echo-basic (the Gateway
#      API conformance echo server) with Go;
#   3. starts the node agent (e2e/node-agent: Pods run as processes in network namespaces on a bridge) with the
#      image map  sweety/sweety → a directory holding the freshly built controller and dataplane (the chart's
#      image holds both), echo-basic → the echo server; it also runs the LoadBalancer allocator;
#   4. `helm upgrade --install` of charts/sweety (default values; a pod annotation carries the binaries' hash
#      so a rebuild rolls the pod) and waits until the controller and dataplane containers are Ready;
#   5. a smoke check (skip with --no-smoke): an echo-basic Deployment, a Gateway of class sweety and an
#      HTTPRoute; waits for Gateway Programmed and route Accepted/ResolvedRefs, then curls the Gateway's
#      address from status.addresses (must be inside the Pod CIDR) and checks the echo pod answered.
#
# Usage:  e2e/install.sh [--no-build] [--no-smoke] [--no-helm]   bring everything up (idempotent);
#                                                         --no-helm stops after step 3 (e2e/lifecycle.sh)
#         e2e/install.sh down [--purge]                   stop the agent (its Pods, namespaces, bridge) and
#                                                         the control plane; --purge also deletes the state
# Needs root (network namespaces), go, openssl, curl, cargo. Prints `export KUBECONFIG=...` at the end.
#
# Environment (defaults in brackets; give each concurrent cluster its own dir, ports, bridge and CIDR):
#   SWEETY_CLUSTER_DIR [~/.cache/sweety/cluster-e2e]  cluster state; agent state in <dir>/agent, image in <dir>/image
#   APISERVER_PORT [26443] ETCD_PORT [22379] ETCD_PEER_PORT [22380] KCM_PORT [30257] SCHED_PORT [30259]
#   SWEETY_BRIDGE [sweetybr2]            bridge; Pod netns are <bridge>-<n>
#   SWEETY_POD_CIDR [10.246.0.0/24]      Pod network: node/bridge .1, Pods .2-.199, LoadBalancers .200-.250
#   SWEETY_NODE [sweety-e2e-node]        Node name
#   SWEETY_KUBELET_PORT [10250]          the agent's logs API on the bridge address
#   SWEETY_IMAGE_MAP []                  extra --image-map KEY=PATH entries for the agent, space-separated
#                                        (e.g. coredns=/path/to/coredns for the conformance suite's UDP tests)
#   SWEETY_NAMESPACE [sweety] SWEETY_RELEASE [sweety]   helm namespace and release
#   SWEETY_PROFILE [debug]               cargo profile of the binaries (debug or release)
#   CARGO_TARGET_DIR [<repo>/target]     where cargo builds
#   SWEETY_HELM [built into ~/.cache/sweety/tools like e2e/chart/check.sh]
#   SWEETY_IMAGE_MAPS []                 the same as SWEETY_IMAGE_MAP (older name; used when SWEETY_IMAGE_MAP is unset)
#   SWEETY_GATEWAY_API_CHANNEL [standard]  Gateway API CRD channel (experimental for the conformance suite;
#                                        none: no Gateway API CRDs, as on a fresh cluster)
# Extra helm arguments may follow `--`, e.g. e2e/install.sh -- --set controller.logLevel=debug
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
# shellcheck source=e2e/lib.sh
. e2e/lib.sh

export SWEETY_CLUSTER_DIR=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster-e2e}
export APISERVER_PORT=${APISERVER_PORT:-26443} ETCD_PORT=${ETCD_PORT:-22379} ETCD_PEER_PORT=${ETCD_PEER_PORT:-22380}
export KCM_PORT=${KCM_PORT:-30257} SCHED_PORT=${SCHED_PORT:-30259}
BRIDGE=${SWEETY_BRIDGE:-sweetybr2}
POD_CIDR=${SWEETY_POD_CIDR:-10.246.0.0/24}
NODE=${SWEETY_NODE:-sweety-e2e-node}
KUBELET_PORT=${SWEETY_KUBELET_PORT:-10250}
NS=${SWEETY_NAMESPACE:-sweety}
RELEASE=${SWEETY_RELEASE:-sweety}
PROFILE=${SWEETY_PROFILE:-debug}
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
K8S_BIN=${SWEETY_K8S_BIN:-$HOME/.cache/sweety/k8s/k8s-${K8S_VERSION:-1.34.4}-etcd-${ETCD_VERSION:-3.6.16}/bin}
GWBIN=${SWEETY_GWAPI_BIN:-$HOME/.cache/sweety/gwapi/${GATEWAY_API_VERSION:-v1.6.3}}
RUN=$SWEETY_CLUSTER_DIR/run
LOG=$SWEETY_CLUSTER_DIR/logs
AGENT_DIR=$SWEETY_CLUSTER_DIR/agent
IMAGE_DIR=$SWEETY_CLUSTER_DIR/image
export KUBECONFIG=$RUN/kubeconfig

case $POD_CIDR in
  *.0/24) NET=${POD_CIDR%.0/24} ;;
  *) echo "SWEETY_POD_CIDR must be a.b.c.0/24, got $POD_CIDR" >&2; exit 2 ;;
esac
[[ $BRIDGE =~ ^[a-z0-9]{1,11}$ ]] || { echo "SWEETY_BRIDGE must be 1-11 characters a-z0-9, got $BRIDGE" >&2; exit 2; }

t0=$(date +%s)
log() { echo "[install $(( $(date +%s) - t0 ))s] $*"; }
# On failure after the agent started: what the cluster and the agent say (for CI logs).
diag=0
diagnose() {
  [ "$diag" = 1 ] || return 0
  diag=0
  diagnostics "$LOG/node-agent.log" "$AGENT_DIR"/logs/"$NS"_*/*.log
}
trap diagnose ERR
die() { echo "install: $*" >&2; diagnose; exit 1; }

# running / start / stop / wait_for: e2e/lib.sh

# Stops the agent (SIGTERM: it stops its Pods in parallel, removes their namespaces and its bridge), then
# removes whatever a killed agent may have left on this bridge only.
stop_agent() {
  stop node-agent 60
  local n
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${BRIDGE}-[0-9]+$" || true); do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
    log "removed leftover netns $n"
  done
  for n in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${BRIDGE}[hp][0-9]+$" || true); do
    ip link del "$n" 2>/dev/null || true
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE" && log "removed bridge $BRIDGE"; fi
}

if [ "${1:-}" = down ]; then
  stop_agent
  bash e2e/cluster/down.sh "${2:-}"
  if [ "${2:-}" = --purge ]; then rm -rf "$AGENT_DIR" "$IMAGE_DIR"; log "purged $AGENT_DIR and $IMAGE_DIR"; fi
  exit 0
fi

build=1 smoke=1 helm=1
helm_extra=()
while [ $# -gt 0 ]; do
  case $1 in
    up) ;;
    --no-build) build=0 ;;
    --no-smoke) smoke=0 ;;
    --no-helm) helm=0 ;;
    --) shift; helm_extra=("$@"); break ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, bridge, bind mounts)"

# ------------------------------------------------------------------ 1. control plane + CRDs
POD_CIDRS=$POD_CIDR CLUSTER_CIDR=$NET.0/16 bash e2e/cluster/up.sh
export PATH="$K8S_BIN:$PATH"
if [ "${SWEETY_GATEWAY_API_CHANNEL:-standard}" = none ]; then
  log "no Gateway API CRDs (SWEETY_GATEWAY_API_CHANNEL=none)"
else
  bash e2e/cluster/gateway-api.sh crds "${SWEETY_GATEWAY_API_CHANNEL:-standard}" >/dev/null
  log "Gateway API CRDs established"
fi

# ------------------------------------------------------------------ 2. binaries
if [ "$build" = 1 ]; then
  log "cargo build ($PROFILE): sweety-controller sweety-dataplane sweety-node-agent"
  prof=(); [ "$PROFILE" = release ] && prof=(--release)
  cargo build "${prof[@]}" -p sweety-controller -p sweety-dataplane -p sweety-node-agent
fi
BIN=$TARGET/$PROFILE
for b in sweety-controller sweety-dataplane sweety-node-agent; do
  [ -x "$BIN/$b" ] || die "$BIN/$b is missing (build it, or drop --no-build)"
done
bash e2e/cluster/gateway-api.sh build-echo >/dev/null
[ -x "$GWBIN/echo-basic" ] || die "$GWBIN/echo-basic is missing"
# The "image": hard links (or copies) of the binaries, so a later cargo build does not change running Pods.
mkdir -p "$IMAGE_DIR"
for b in sweety-controller sweety-dataplane; do
  ln -f "$BIN/$b" "$IMAGE_DIR/$b" 2>/dev/null || cp -f "$BIN/$b" "$IMAGE_DIR/$b"
done
# The build id (pod annotation sweety.dev/build: a rebuild rolls the pods), kept beside the binaries for
# e2e/lifecycle.sh, whose helm installs carry the same annotation.
build_id=$(cat "$IMAGE_DIR/sweety-controller" "$IMAGE_DIR/sweety-dataplane" | sha256sum | cut -c1-16)
echo "$build_id" >"$IMAGE_DIR/build-id"

# ------------------------------------------------------------------ 3. node agent
if running node-agent; then
  log "node agent already running (pid $(cat "$RUN/node-agent.pid"))"
else
  mkdir -p "$AGENT_DIR" "$LOG"
  extra_maps=() maps=()
  read -r -a maps <<< "${SWEETY_IMAGE_MAP:-${SWEETY_IMAGE_MAPS:-}}"
  for m in "${maps[@]}"; do
    case $m in *=/*) extra_maps+=(--image-map "$m") ;; *) die "SWEETY_IMAGE_MAP entry '$m': expected KEY=/absolute/path" ;; esac
  done
  nohup "$BIN/sweety-node-agent" run --node "$NODE" --bridge "$BRIDGE" --pod-cidr "$POD_CIDR" \
    --root-dir "$AGENT_DIR" --kubelet-port "$KUBELET_PORT" --load-balancer \
    --node-label sweety.dev/e2e=true \
    --image-map "sweety/sweety=$IMAGE_DIR" --image-map "echo-basic=$GWBIN/echo-basic" "${extra_maps[@]}" \
    > "$LOG/node-agent.log" 2>&1 &
  echo $! > "$RUN/node-agent.pid"
  log "started node agent pid $! (log $LOG/node-agent.log)"
fi
for _ in $(seq 1 60); do
  kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True && break
  running node-agent || die "the node agent exited: $(tail -5 "$LOG/node-agent.log")"
  sleep 0.5
done
kubectl get node "$NODE" >/dev/null || die "node $NODE did not register"
diag=1
log "node $NODE Ready"

if [ "$helm" = 0 ]; then
  log "done (--no-helm).  export KUBECONFIG=$KUBECONFIG   (teardown: $0 down [--purge])"
  exit 0
fi

# ------------------------------------------------------------------ 4. helm install
log "helm upgrade --install $RELEASE charts/sweety -n $NS"
install_chart "$RELEASE" "$NS" "$build_id" "${helm_extra[@]}" || die "helm install failed"
log "controller and dataplane Ready"

# ------------------------------------------------------------------ 5. smoke check
if [ "$smoke" = 1 ]; then
  smoke_gateway sweety-smoke "$NET" || die "smoke check failed"
fi
log "done.  export KUBECONFIG=$KUBECONFIG   (teardown: $0 down [--purge])"
