#!/usr/bin/env bash
# e2e/controller-it.sh — run the controller's integration tests (controller/tests/apiserver.rs, #[ignore]d
# without a cluster, so run here with --ignored) against a real etcd + kube-apiserver (+ controller-manager)
# started by e2e/cluster/up.sh, with the Gateway API CRDs installed; the cluster is stopped afterwards (also
# on failure).
#
# Knobs: SWEETY_CLUSTER_DIR (default ~/.cache/sweety/cluster-it) and the port variables of up.sh
# (defaults here avoid the standard ports so a developer cluster can keep running).
set -euo pipefail
cd "$(dirname "$0")/.."
export SWEETY_CLUSTER_DIR=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster-it}
export APISERVER_PORT=${APISERVER_PORT:-16443} ETCD_PORT=${ETCD_PORT:-12379} ETCD_PEER_PORT=${ETCD_PEER_PORT:-12380}
export KCM_PORT=${KCM_PORT:-20257} SCHED_PORT=${SCHED_PORT:-20259} START_SCHEDULER=${START_SCHEDULER:-0}
export KUBECONFIG=$SWEETY_CLUSTER_DIR/run/kubeconfig

# Purged afterwards: every run starts from an empty etcd.
cleanup() { e2e/cluster/down.sh --purge >/dev/null || true; }
trap cleanup EXIT
e2e/cluster/up.sh
e2e/cluster/gateway-api.sh crds standard
SWEETY_KUBECONFIG=$KUBECONFIG cargo test -p sweety-controller --test apiserver -- --ignored --nocapture "$@"
