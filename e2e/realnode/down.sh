#!/usr/bin/env bash
# e2e/realnode/down.sh [--purge] — tear down what e2e/realnode/up.sh started, leaving the host as it was:
#   Pods first, through the kubelet (the node is cordoned and every Pod deleted, so the runtime removes the
#   sandboxes: CNI DEL, network namespaces), then the LoadBalancer allocator (removes its addresses),
#   kube-proxy and its rules (`kube-proxy --cleanup`), the kubelet, whatever containers are left (ctr), containerd,
#   the mounts under the node dir, the iptables chains the kubelet and kube-proxy added (KUBE-*), the bridge,
#   and the control plane (e2e/cluster/down.sh). --purge also deletes the cluster dir's state.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
# shellcheck source=e2e/realnode/env.sh
. e2e/realnode/env.sh
log() { echo "[realnode down] $*"; }
stop() { # name [seconds]: SIGTERM, then SIGKILL after the grace period
  local name=$1 grace=${2:-20} pid
  running "$name" || { rm -f "$RUN/$name.pid"; return 0; }
  pid=$(cat "$RUN/$name.pid")
  kill "$pid"
  for _ in $(seq 1 $((grace * 5))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && { log "$name ($pid) did not exit in $grace s, SIGKILL"; kill -9 "$pid"; }
  rm -f "$RUN/$name.pid"
  log "stopped $name ($pid)"
}

if running kubelet && kubectl get --raw /readyz >/dev/null 2>&1; then
  kubectl cordon "$NODE" >/dev/null 2>&1
  kubectl delete pods -A --all --grace-period=1 --wait=false >/dev/null 2>&1
  # The kubelet stops each sandbox (CNI DEL, netns removed) as it sees the deletion.
  for _ in $(seq 1 60); do
    [ -z "$(ctr_ -n k8s.io tasks ls -q 2>/dev/null)" ] && break
    sleep 1
  done
  log "pods deleted ($(ctr_ -n k8s.io tasks ls -q 2>/dev/null | wc -l) tasks left)"
fi
stop load-balancer
stop kube-proxy
[ -x "$K8S_BIN/kube-proxy" ] && "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1
stop kubelet
if running containerd; then
  for c in $(ctr_ -n k8s.io containers ls -q 2>/dev/null); do
    ctr_ -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1
  done
  sleep 1
  for c in $(ctr_ -n k8s.io containers ls -q 2>/dev/null); do
    ctr_ -n k8s.io tasks delete -f "$c" >/dev/null 2>&1
    ctr_ -n k8s.io containers delete "$c" >/dev/null 2>&1
  done
fi
stop containerd
# Shims outlive containerd; only ours (their -address names our socket).
for p in $(pgrep -f "containerd-shim.*-address $CONTAINERD_SOCK" || true); do kill -9 "$p" 2>/dev/null; done
# Mounts under the node dir (Pod volumes, rootfs overlays, sandbox shm), deepest first.
grep -F " $NODE_DIR/" /proc/self/mounts | awk '{print $2}' | sort -r | while read -r m; do
  umount -l "$m" 2>/dev/null
done
# iptables chains of the kubelet (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT...) and whatever
# kube-proxy --cleanup left: rules jumping to KUBE-* first, then the chains. No other program here makes KUBE-*.
for ipt in iptables ip6tables; do
  command -v $ipt >/dev/null || continue
  for t in filter nat mangle; do
    $ipt -t $t -S 2>/dev/null | grep -E '^-A [^ ]+ .*-j KUBE-' | sed 's/^-A/-D/' | while read -r rule; do
      # shellcheck disable=SC2086
      $ipt -t $t $rule 2>/dev/null
    done
    for c in $($ipt -t $t -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
      $ipt -t $t -F "$c" 2>/dev/null
    done
    for c in $($ipt -t $t -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
      $ipt -t $t -X "$c" 2>/dev/null
    done
  done
done
log "iptables KUBE-* chains removed"
# veths left on our bridge (a sandbox the runtime could not stop), then the bridge.
for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
  ip link del "$v" 2>/dev/null
done
if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE" && log "removed bridge $BRIDGE"; fi
bash e2e/cluster/down.sh "${1:-}"
if [ "${1:-}" = --purge ]; then
  rm -rf "$NODE_DIR"
  log "purged $NODE_DIR"
fi
