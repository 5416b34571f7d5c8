#!/usr/bin/env bash
# e2e/run.sh — Sweety's end-to-end tests on the local, Docker-less control plane:
#   1. e2e/install.sh: cluster + Gateway API CRDs + build + node agent + `helm install` + smoke check
#      (skipped with --no-install when it is already up);
#   2. cargo test -p sweety-e2e (e2e/suite/tests/e2e.rs) with --ignored (the tests are ignored without a
#      cluster), one test at a time: Ingress, HTTPRoute and SweetySite over HTTP/1.1, HTTP/2 and
#      HTTP/3 through the load-balancer address, a route change, container kills, invalid objects;
#   3. with --down, e2e/install.sh down --purge afterwards (also when the tests fail).
#
# Usage: e2e/run.sh [--no-install] [--down] [-- <cargo test filter and test-binary args>]
# Environment: as e2e/install.sh (SWEETY_CLUSTER_DIR, the port variables, SWEETY_BRIDGE, SWEETY_POD_CIDR,
# CARGO_TARGET_DIR, ...); the tests get SWEETY_E2E_KUBECONFIG and SWEETY_E2E_ALLOWED_CIDR (= the Pod CIDR:
# load-balancer addresses are .200-.250 in it) from them. Needs root.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
export SWEETY_CLUSTER_DIR=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster-e2e}
POD_CIDR=${SWEETY_POD_CIDR:-10.246.0.0/24}

install=1 down=0
test_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --no-install) install=0 ;;
    --down) down=1 ;;
    --) shift; test_args=("$@"); break ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$down" = 1 ]; then
  trap 'bash e2e/install.sh down --purge >/dev/null 2>&1 || true' EXIT
fi
t0=$(date +%s)
[ "$install" = 1 ] && bash e2e/install.sh
t1=$(date +%s)
export SWEETY_E2E_KUBECONFIG=$SWEETY_CLUSTER_DIR/run/kubeconfig
export SWEETY_E2E_ALLOWED_CIDR=$POD_CIDR
export SWEETY_E2E_RESTART=process
cargo test -p sweety-e2e --test e2e -- --ignored --test-threads=1 --nocapture "${test_args[@]}"
t2=$(date +%s)
echo "[run] install $((t1 - t0))s, tests $((t2 - t1))s"
