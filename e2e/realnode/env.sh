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
IMG=$NODE_DIR/images
CONTAINERD_SOCK=$NODE_DIR/containerd/containerd.sock
# Local names only (the runtime qualifies them itself); both are imported by up.sh, never pulled.
PAUSE_IMAGE=sweety-e2e/pause:3.10
ECHO_IMAGE=sweety-e2e/echo-basic:v1.6.3
# The host's iptables rules before the kubelet and kube-proxy first started: down.sh removes only what is new.
IPTABLES_BEFORE=$NODE_DIR/iptables-before
# Sweety's own filter chain: drops what Pods send off the host (up.sh).
FWD_CHAIN=SWEETY-FWD-$BRIDGE
export KUBECONFIG=$RUN/kubeconfig
export PATH="$K8S_BIN:$PATH"
export GOFLAGS=${GOFLAGS:--buildvcs=false} GOTOOLCHAIN=${GOTOOLCHAIN:-local}

ctr_() { ctr --address "$CONTAINERD_SOCK" "$@"; }
# iptables_ours: for each of iptables/ip6tables and the filter, nat and mangle tables, the `-S` lines of the
# chains and rules that belong to the node (KUBE-* from the kubelet and kube-proxy, and FWD_CHAIN), as
# "<command> <table> <line>".
iptables_ours() {
  local ipt t
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      { "$ipt" -w 5 -t "$t" -S 2>/dev/null || true; } | { grep -E -- "KUBE-|$FWD_CHAIN( |\$)" || true; } | sed "s/^/$ipt $t /"
    done
  done
}
