#!/usr/bin/env bash
# e2e/conformance/build.sh — build the Gateway API conformance suite (sweety-conformance.test) and its echo
# backend (echo-basic) from this directory's Go module (sigs.k8s.io/gateway-api{,/conformance}
# v1.6.3) into the cache, once per go.sum: $SWEETY_GWAPI_BIN (default ~/.cache/sweety/gwapi/v1.6.3).
# Prints the directory holding both binaries. Cold build ~2 min on 2 cores; cached: nothing.
#   build.sh --coredns   instead builds CoreDNS v1.12.2 (the UDPRoute tests' DNS backend, the version the
#                        suite's base manifests name) into ~/.cache/sweety/tools/coredns-v1.12.2 and prints
#                        its path (cold ~5.5 min, ~107 MB).
set -euo pipefail
if [ "${1:-}" = --coredns ]; then
  V=v1.12.2
  D=${SWEETY_COREDNS_DIR:-$HOME/.cache/sweety/tools/coredns-$V}
  if [ ! -x "$D/coredns" ]; then
    echo "building CoreDNS $V into $D" >&2
    mkdir -p "$D"
    GOBIN=$D GOFLAGS=${GOFLAGS:--buildvcs=false} GOTOOLCHAIN=${GOTOOLCHAIN:-local} go install "github.com/coredns/coredns@$V" >&2
  fi
  echo "$D/coredns"; exit 0
fi
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${SWEETY_GWAPI_BIN:-$HOME/.cache/sweety/gwapi/v1.6.3}
export GOFLAGS=${GOFLAGS:--buildvcs=false} GOTOOLCHAIN=${GOTOOLCHAIN:-local}
mkdir -p "$OUT"
key=$(cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/conformance_test.go" | sha256sum | cut -c1-16)
# Other checkouts' scripts share this cache (e2e/cluster/gateway-api.sh builds echo-basic here too).
exec 9>"$OUT/.lock"
flock 9
if [ ! -x "$OUT/sweety-conformance.test" ] || [ "$(cat "$OUT/.build-key" 2>/dev/null)" != "$key" ]; then
  echo "building the conformance suite into $OUT" >&2
  (cd "$HERE" && go test -c -o "$OUT/sweety-conformance.test.tmp" . >&2)
  mv "$OUT/sweety-conformance.test.tmp" "$OUT/sweety-conformance.test"
  echo "$key" > "$OUT/.build-key"
fi
if [ ! -x "$OUT/echo-basic" ]; then
  echo "building echo-basic into $OUT" >&2
  (cd "$HERE" && go build -o "$OUT/echo-basic.tmp" sigs.k8s.io/gateway-api/conformance/echo-basic >&2)
  mv "$OUT/echo-basic.tmp" "$OUT/echo-basic"
fi
echo "$OUT"
