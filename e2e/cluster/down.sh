#!/usr/bin/env bash
# e2e/cluster/down.sh — stop what up.sh started (by PID files), in reverse order. --purge also deletes etcd data, PKI and logs.
set -uo pipefail
ROOT=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster}
RUN=$ROOT/run
for name in node-agent kube-scheduler kube-controller-manager kube-apiserver etcd; do
  f=$RUN/$name.pid
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  # Only a live process that is the named program: a stale pid file may name a reused pid.
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$name"; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && { echo "$name ($pid) did not exit, sending SIGKILL"; kill -9 "$pid"; }
    echo "stopped $name ($pid)"
  fi
  rm -f "$f"
done
if [ "${1:-}" = "--purge" ]; then
  [ -n "${ETCD_DATA_DIR:-}" ] && rm -rf "$ETCD_DATA_DIR"
  rm -rf "$RUN" "$ROOT/logs"
  echo "purged $RUN and $ROOT/logs"
fi
