# shellcheck shell=bash disable=SC2034
# e2e/realnode/env.sh — names shared by up.sh and down.sh (sourced; see up.sh for the knobs).
export SWEETY_CLUSTER_DIR=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster-realnode}
export APISERVER_PORT=${APISERVER_PORT:-36443} ETCD_PORT=${ETCD_PORT:-32379} ETCD_PEER_PORT=${ETCD_PEER_PORT:-32380}
export KCM_PORT=${KCM_PORT:-40257} SCHED_PORT=${SCHED_PORT:-40259}
BRIDGE=${SWEETY_BRIDGE:-sweetyrn0}
POD_CIDR=${SWEETY_POD_CIDR:-10.245.0.0/24}
case $POD_CIDR in
  *.0/24) NET=${POD_CIDR%.0/24} ;;
  *) echo "SWEETY_POD_CIDR must be a.b.c.0/24, got $POD_CIDR" >&2; exit 2 ;;
esac
[[ $BRIDGE =~ ^[a-z0-9]{1,11}$ ]] || { echo "SWEETY_BRIDGE must be 1-11 characters a-z0-9, got $BRIDGE" >&2; exit 2; }
NODE_IP=$NET.1
_o2=${NET#*.}; _o2=${_o2%%.*}
SERVICE_CIDR=${SWEETY_SERVICE_CIDR:-10.97.$_o2.0/24}
SERVICE_API_IP=${SERVICE_CIDR%.0/24}.1
NODE=${SWEETY_NODE:-sweety-real-node}
KUBELET_PORT=${SWEETY_KUBELET_PORT:-10270}
NS=${SWEETY_NAMESPACE:-sweety}
RELEASE=${SWEETY_RELEASE:-sweety}
K8S_BIN=${SWEETY_K8S_BIN:-$HOME/.cache/sweety/k8s/k8s-${K8S_VERSION:-1.34.4}-etcd-${ETCD_VERSION:-3.6.16}/bin}
K8S_SRC=$HOME/.cache/sweety/k8s/src/k8s
NODE_AGENT=${SWEETY_NODE_AGENT:-${CARGO_TARGET_DIR:-$REPO/target}/debug/sweety-node-agent}
RUN=$SWEETY_CLUSTER_DIR/run
LOG=$SWEETY_CLUSTER_DIR/logs
PKI=$RUN/pki
NODE_DIR=$SWEETY_CLUSTER_DIR/node
CONTAINERD_SOCK=$NODE_DIR/containerd/containerd.sock
PAUSE_IMAGE=docker.io/sweety-e2e/pause:3.10
ECHO_IMAGE=docker.io/sweety-e2e/echo-basic:v1.6.3
export KUBECONFIG=$RUN/kubeconfig
export PATH="$K8S_BIN:$PATH"
export GOFLAGS=${GOFLAGS:--buildvcs=false} GOTOOLCHAIN=${GOTOOLCHAIN:-local}

ctr_() { ctr --address "$CONTAINERD_SOCK" "$@"; }
# A pid file counts only while its process is alive AND is the named program (pids get reused).
running() {
  local pid
  [ -f "$RUN/$1.pid" ] || return 1
  pid=$(cat "$RUN/$1.pid")
  kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$1"
}
