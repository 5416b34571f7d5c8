#!/usr/bin/env bash
# Controller-to-dataplane scale benchmark: starts a release `sweety-dataplane --control-socket`,
# then runs controller/examples/scale.rs against it (translate + encode + push + Ack for N
# HTTPRoutes, single-route change latency, RSS). Prints numbers; asserts nothing.
#
# Usage: e2e/bench/controller.sh [ROUTES=5000] [CHANGES=200]
#   e2e/bench/controller.sh 5000 200    targets at 5,000 HTTPRoutes (latency, dataplane RSS)
#   e2e/bench/controller.sh 10000 50    controller RSS with 10,000+ objects
# Besides wall-clock times it prints CPU milliseconds per change of both processes, which do
# not grow with other load on the machine (the load average is printed too).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
ROUTES=${1:-5000}
CHANGES=${2:-200}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/sweety/target}
cargo build --release -q -p sweety-dataplane --bin sweety-dataplane
cargo build --release -q -p sweety-controller --example scale
work=$(mktemp -d)
trap 'kill "$dp" 2>/dev/null; wait "$dp" 2>/dev/null; rm -rf "$work"' EXIT
"$CARGO_TARGET_DIR/release/sweety-dataplane" run --control-socket "$work/control.sock" --admin 127.0.0.1:0 \
  >"$work/dataplane.log" 2>&1 &
dp=$!
for _ in $(seq 1 100); do [ -S "$work/control.sock" ] && break; sleep 0.05; done
[ -S "$work/control.sock" ] || { cat "$work/dataplane.log"; echo "dataplane did not open its control socket" >&2; exit 1; }
"$CARGO_TARGET_DIR/release/examples/scale" "$work/control.sock" "$dp" "$ROUTES" "$CHANGES"
