#!/usr/bin/env bash
# e2e/run.sh — Sweety's end-to-end tests on the local, Docker-less control plane:
#   1. e2e/install.sh: cluster + Gateway API CRDs + build + node agent + `helm install` + smoke check
#      (skipped with --no-install when it is already up);
#   2. cargo test -p sweety-e2e (e2e/suite/tests/e2e.rs) with --ignored (the tests are ignored without a
#      cluster), one test at a time: Ingress, HTTPRoute and SweetySite over HTTP/1.1, HTTP/2 and
#      HTTP/3 through the load-balancer address, a route change, container kills, invalid objects, the
#      ingress-nginx user guide's examples and `sweety-controller migrate-report` on them (the debug binary
#      `cargo test --workspace` builds, or SWEETY_E2E_CONTROLLER_BIN);
#   3. with --down, e2e/install.sh down --purge afterwards (also when the tests fail).
#
# Usage: e2e/run.sh [--real-node] [--no-install] [--down] [-- <cargo test filter and test-binary args>]
# --real-node: the cluster of e2e/realnode/up.sh (real kubelet, containerd, runc, the image of
# deploy/image/build.sh) instead of the node agent's; its defaults (cluster-realnode, 10.245.0.0/24) apply.
# Environment: as e2e/install.sh (SWEETY_CLUSTER_DIR, the port variables, SWEETY_BRIDGE, SWEETY_POD_CIDR,
# CARGO_TARGET_DIR, ...); the tests get SWEETY_E2E_KUBECONFIG and SWEETY_E2E_ALLOWED_CIDR (= the Pod CIDR:
# load-balancer addresses are .200-.250 in it) from them. Needs root.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
install=1 down=0 real=0
test_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --real-node) real=1 ;;
    --no-install) install=0 ;;
    --down) down=1 ;;
    --) shift; test_args=("$@"); break ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$real" = 1 ]; then
  # shellcheck source=e2e/realnode/env.sh
  . e2e/realnode/env.sh
  up=(bash e2e/realnode/up.sh) teardown=(bash e2e/realnode/down.sh --purge)
  export SWEETY_E2E_ECHO_IMAGE=$ECHO_IMAGE SWEETY_E2E_PULL_POLICY=Never
else
  export SWEETY_CLUSTER_DIR=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster-e2e}
  POD_CIDR=${SWEETY_POD_CIDR:-10.246.0.0/24}
  up=(bash e2e/install.sh) teardown=(bash e2e/install.sh down --purge)
fi
if [ "$down" = 1 ]; then
  trap '"${teardown[@]}" >/dev/null 2>&1 || true' EXIT
fi
t0=$(date +%s)
[ "$install" = 1 ] && "${up[@]}"
t1=$(date +%s)
export SWEETY_E2E_KUBECONFIG=$SWEETY_CLUSTER_DIR/run/kubeconfig
export SWEETY_E2E_ALLOWED_CIDR=$POD_CIDR
export SWEETY_E2E_RESTART=process
cargo test -p sweety-e2e --test e2e -- --ignored --test-threads=1 --nocapture "${test_args[@]}"
t2=$(date +%s)
echo "[run] install $((t1 - t0))s, tests $((t2 - t1))s"
