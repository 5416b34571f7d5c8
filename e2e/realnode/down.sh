#!/usr/bin/env bash
# e2e/realnode/down.sh [--purge] — tear down what e2e/realnode/up.sh started, leaving the host as it was:
#   Pods first, through the kubelet (the node is cordoned and every Pod deleted, so the runtime removes the
#   sandboxes: CNI DEL, network namespaces), then the LoadBalancer allocator (removes its addresses),
#   kube-proxy, the kubelet, whatever containers are left (ctr), containerd and its shims, the mounts under the
#   node dir, the iptables chains and rules that the kubelet, kube-proxy and up.sh added (only those: what is
#   not in the snapshot up.sh took before they first ran; nothing else of the host's is touched), the bridge,
#   and the control plane (e2e/cluster/down.sh). --purge also deletes the cluster dir's state.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
# shellcheck source=e2e/realnode/env.sh
. e2e/realnode/env.sh
# shellcheck source=e2e/lib.sh
. e2e/lib.sh
log() { echo "[realnode down] $*"; }

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
stop load-balancer 20
stop kube-proxy 20
stop kubelet 20
if running containerd; then
  for c in $(ctr_ -n k8s.io containers ls -q 2>/dev/null); do
    timeout 10 ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1
  done
  sleep 1
  for c in $(ctr_ -n k8s.io containers ls -q 2>/dev/null); do
    timeout 10 ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1
    timeout 10 ctr --address "$CONTAINERD_SOCK" -n k8s.io containers delete "$c" >/dev/null 2>&1
  done
fi
stop containerd 20
# Shims outlive containerd; only ours (their -address names our socket).
for p in $(pgrep -f "containerd-shim.*-address $CONTAINERD_SOCK" || true); do kill -9 "$p" 2>/dev/null; done
# Mounts under the node dir (Pod volumes, rootfs overlays, sandbox shm), deepest first.
grep -F " $NODE_DIR/" /proc/self/mounts | awk '{print $2}' | sort -r | while read -r m; do
  umount -l "$m" 2>/dev/null
done
# iptables: what is ours now and was not before the node first ran (IPTABLES_BEFORE): the rules first (-A lines,
# deleted with -D), then our chains, flushed and deleted. Chains and rules that were there before stay.
if [ -f "$IPTABLES_BEFORE" ]; then
  added=$(iptables_ours | grep -vxF -f "$IPTABLES_BEFORE")
  n_rules=0 n_chains=0
  while read -r ipt t op rest; do
    [ "$op" = -A ] || continue
    # The rule as iptables -S printed it; xargs splits it into words as the shell would (quoted comments).
    printf '%s\n' "$rest" | xargs "$ipt" -w 5 -t "$t" -D 2>/dev/null && n_rules=$((n_rules + 1))
  done <<<"$added"
  for pass in -F -X; do
    while read -r ipt t op chain; do
      [ "$op" = -N ] || continue
      "$ipt" -w 5 -t "$t" "$pass" "$chain" 2>/dev/null && [ "$pass" = -X ] && n_chains=$((n_chains + 1))
    done <<<"$added"
  done
  log "iptables: removed the $n_chains chains and $n_rules rules the node added (left $(iptables_ours | grep -cvxF -f "$IPTABLES_BEFORE") of them)"
  rm -f "$IPTABLES_BEFORE"
else
  log "iptables: no snapshot ($IPTABLES_BEFORE): the node never ran here, nothing to remove"
fi
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
