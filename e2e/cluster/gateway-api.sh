#!/usr/bin/env bash
# e2e/cluster/gateway-api.sh — Gateway API helpers for the local control plane started by up.sh.
#   ./gateway-api.sh crds [standard|experimental]   install the CRDs (+ safe-upgrades VAP) from the Go module
#   ./gateway-api.sh build                          build bin/gwconf.test (conformance suite) and bin/echo-basic
#   ./gateway-api.sh build-echo                     build only bin/echo-basic (skipped when it exists)
#   ./gateway-api.sh build-echo-static              bin/echo-basic-static: CGO_ENABLED=0, for a FROM scratch image
#   ./gateway-api.sh run [conformance flags...]     run bin/gwconf.test against $KUBECONFIG
# GATEWAY_API_VERSION defaults to v1.6.3 (v1.7.0 needs Go >= 1.27).
set -euo pipefail
ROOT=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster}
GWBIN=${SWEETY_GWAPI_BIN:-$HOME/.cache/sweety/gwapi/${GATEWAY_API_VERSION:-v1.6.3}}
V=${GATEWAY_API_VERSION:-v1.6.3}
export KUBECONFIG=${KUBECONFIG:-$ROOT/run/kubeconfig}
export PATH="${SWEETY_K8S_BIN:-$HOME/.cache/sweety/k8s/k8s-${K8S_VERSION:-1.34.4}-etcd-${ETCD_VERSION:-3.6.16}/bin}:$PATH"
export GOFLAGS=${GOFLAGS:--buildvcs=false} GOTOOLCHAIN=${GOTOOLCHAIN:-local}
moddir() { go mod download -json "sigs.k8s.io/gateway-api@$V" | python3 -c 'import json,sys;d=json.load(sys.stdin);print(d.get("Dir") or sys.exit(d.get("Error")))'; }

case "${1:-}" in
crds)
  ch=${2:-standard}
  D=$(moddir)/config/crd/$ch
  # The bundled ValidatingAdmissionPolicy "safe-upgrades" refuses experimental-over-standard (and downgrades);
  # switching channels therefore needs: kubectl delete -f <other channel dir> first.
  for f in "$D"/*.yaml; do [ "$(basename "$f")" = kustomization.yaml ] || echo "-f=$f"; done | xargs kubectl apply --server-side
  kubectl wait --for=condition=Established crd --all --timeout=60s
  ;;
build|build-echo|build-echo-static)
  d=$GWBIN/src
  mkdir -p "$d" "$GWBIN"
  # Several checkouts share this cache: one build at a time.
  exec 9>"$GWBIN/.lock"
  flock 9
  if [ "$1" = build-echo ] && [ -x "$GWBIN/echo-basic" ]; then echo "$GWBIN/echo-basic"; exit 0; fi
  if [ "$1" = build-echo-static ] && [ -x "$GWBIN/echo-basic-static" ]; then echo "$GWBIN/echo-basic-static"; exit 0; fi
  if [ ! -f "$d/go.mod" ] || ! grep -q "sigs.k8s.io/gateway-api/conformance $V" "$d/go.mod"; then
    rm -f "$d/go.mod" "$d/go.sum"
    # The conformance package is its own module since v1.5 (with `replace sigs.k8s.io/gateway-api => ../`,
    # which is ignored for dependencies), so require both modules at the same version.
    printf 'module k8slocal/gwconf\n\ngo 1.26\n\nrequire (\n\tsigs.k8s.io/gateway-api %s\n\tsigs.k8s.io/gateway-api/conformance %s\n)\n' "$V" "$V" > "$d/go.mod"
    printf 'package gwconf\n\nimport (\n\t"testing"\n\n\t"sigs.k8s.io/gateway-api/conformance"\n)\n\nfunc TestConformance(t *testing.T) { conformance.RunConformance(t) }\n' > "$d/conformance_test.go"
    printf '//go:build tools\n\npackage gwconf\n\nimport _ "sigs.k8s.io/gateway-api/conformance/echo-basic"\n' > "$d/tools.go"
    (cd "$d" && go mod tidy)
  fi
  # Built under a temporary name and renamed, so a reader never sees a half-written binary.
  if [ "$1" = build-echo-static ]; then
    (cd "$d" && CGO_ENABLED=0 go build -ldflags "-s -w" -o "$GWBIN/.echo-basic-static.tmp" sigs.k8s.io/gateway-api/conformance/echo-basic)
    mv -f "$GWBIN/.echo-basic-static.tmp" "$GWBIN/echo-basic-static"
    echo "$GWBIN/echo-basic-static"
    exit 0
  fi
  (cd "$d" && go build -o "$GWBIN/.echo-basic.tmp" sigs.k8s.io/gateway-api/conformance/echo-basic)
  mv -f "$GWBIN/.echo-basic.tmp" "$GWBIN/echo-basic"
  if [ "$1" = build ]; then
    (cd "$d" && go test -c -o "$GWBIN/.gwconf.test.tmp" .)
    mv -f "$GWBIN/.gwconf.test.tmp" "$GWBIN/gwconf.test"
    ls -la "$GWBIN/gwconf.test"
  fi
  ls -la "$GWBIN/echo-basic"
  ;;
run)
  shift
  # e.g. ./gateway-api.sh run -gateway-class=sweety -supported-features=Gateway,HTTPRoute \
  #        -report-output=report.yaml -organization=x -project=sweety -url=... -version=... -contact=...
  cd "$ROOT/run" && exec "$GWBIN/gwconf.test" -test.run TestConformance -test.v -test.timeout 60m "$@"
  ;;
*) sed -n 2,6p "$0"; exit 2 ;;
esac
