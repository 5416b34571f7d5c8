#!/usr/bin/env bash
# e2e/conformance/build.sh — build the Gateway API conformance suite (gwconf.test) and its echo
# backend (echo-basic) from this directory's Go module (sigs.k8s.io/gateway-api{,/conformance}
# v1.6.3) into the cache, once per go.sum: $SWEETY_GWAPI_BIN (default ~/.cache/sweety/gwapi/v1.6.3).
# Prints the directory holding both binaries. Cold build ~2 min on 2 cores; cached: nothing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${SWEETY_GWAPI_BIN:-$HOME/.cache/sweety/gwapi/v1.6.3}
export GOFLAGS=${GOFLAGS:--buildvcs=false} GOTOOLCHAIN=${GOTOOLCHAIN:-local}
mkdir -p "$OUT"
key=$(cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/conformance_test.go" | sha256sum | cut -c1-16)
if [ -x "$OUT/gwconf.test" ] && [ -x "$OUT/echo-basic" ] && [ "$(cat "$OUT/.build-key" 2>/dev/null)" = "$key" ]; then
  echo "$OUT"; exit 0
fi
echo "building the conformance suite and echo-basic into $OUT" >&2
( cd "$HERE"
  go test -c -o "$OUT/gwconf.test.tmp" . >&2
  go build -o "$OUT/echo-basic.tmp" sigs.k8s.io/gateway-api/conformance/echo-basic >&2 )
mv "$OUT/gwconf.test.tmp" "$OUT/gwconf.test"
mv "$OUT/echo-basic.tmp" "$OUT/echo-basic"
echo "$key" > "$OUT/.build-key"
echo "$OUT"
