#!/usr/bin/env bash
# e2e/cluster/down.sh — stop what up.sh started (by PID files), in reverse order. --purge also deletes etcd data, PKI and logs.
set -uo pipefail
ROOT=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster}
RUN=$ROOT/run
# shellcheck source=e2e/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
for name in node-agent kube-scheduler kube-controller-manager kube-apiserver etcd; do
  stop "$name"   # only a live process that is the named program: a stale pid file may name a reused pid
done
if [ "${1:-}" = "--purge" ]; then
  [ -n "${ETCD_DATA_DIR:-}" ] && rm -rf "$ETCD_DATA_DIR"
  rm -rf "$RUN" "$ROOT/logs"
  echo "purged $RUN and $ROOT/logs"
fi
