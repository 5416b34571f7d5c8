#!/usr/bin/env bash
# e2e/h2spec.sh — HTTP/2 conformance of the dataplane with h2spec (github.com/summerwind/h2spec).
#
# Builds h2spec (pinned with all its modules by e2e/h2spec/go.mod and go.sum, cached in
# ~/.cache/sweety/tools/bin per go.sum) and the dataplane (cargo; or SWEETY_BIN), starts the
# dataplane on free 127.0.0.1 ports in front of a small body-reading backend (python3), and
# runs every h2spec case twice: h2c with prior knowledge, and TLS with ALPN h2, on Sweety's own
# HTTP/2 engine (limits.http2_engine: sweety, the default, set explicitly; hyper's was the baseline),
# and the message-framing cases (http2/8.1.2.6) a third time ("local") against a TLS listener whose
# route answers without reading the body, as the embedded default's HTTPS port does. Prints
# h2spec's summary and writes <out>/{h2c,tls}.{txt,xml} (plain and JUnit reports), the
# failed case ids (<out>/failed.txt) and the dataplane's log.
#
#   e2e/h2spec.sh [out-dir]          # default out-dir: a fresh temporary directory
#
# Exit status: 0 when every failing case is listed in e2e/h2spec-known-failures.txt and every
# listed case still fails; 1 otherwise (a new failure, or a fixed one whose line must go).
#
# Why h2spec v2.2.1: the later tags (up to v2.6.0) come with a go.mod that declares the module
# without the /v2 suffix a v2 tag needs, so Go rejects them as invalid versions and the module
# proxy does not serve them (`go install github.com/summerwind/h2spec/cmd/h2spec@v2.6.0`: "This
# module version is not available"; `go list -m -versions` lists only v1.5.0 and
# v2.2.1+incompatible). v2.2.1 is the last tag without a go.mod; its dependencies would then
# float to their latest versions, so e2e/h2spec/go.mod pins them (it builds with Go 1.26).
#
# Environment: SWEETY_BIN (dataplane binary; default: cargo build into CARGO_TARGET_DIR),
# H2SPEC_TIMEOUT (seconds per case, default 2), H2SPEC_ARGS (extra h2spec arguments, e.g. a
# spec section such as "http2/6.5" to run only those cases, or -S for the strict cases too).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
KNOWN="$ROOT/e2e/h2spec-known-failures.txt"
OUT=${1:-$(mktemp -d /tmp/sweety-h2spec.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# --- h2spec, built once per go.sum ---------------------------------------------------------------
command -v go >/dev/null || { echo "h2spec.sh: Go (>= 1.24) is required to build h2spec" >&2; exit 1; }
TOOLS="$HOME/.cache/sweety/tools/bin"
mkdir -p "$TOOLS"
key=$(cat "$ROOT/e2e/h2spec/go.mod" "$ROOT/e2e/h2spec/go.sum" | sha256sum | cut -c1-16)
H2SPEC="$TOOLS/h2spec"
exec 9>"$TOOLS/.h2spec.lock"
flock 9
if [ ! -x "$H2SPEC" ] || [ "$(cat "$TOOLS/.h2spec.key" 2>/dev/null)" != "$key" ]; then
  echo "building h2spec into $TOOLS" >&2
  (cd "$ROOT/e2e/h2spec" &&
    GOFLAGS=-buildvcs=false GOTOOLCHAIN=local go build -o "$H2SPEC.tmp" github.com/summerwind/h2spec/cmd/h2spec)
  mv "$H2SPEC.tmp" "$H2SPEC"
  echo "$key" >"$TOOLS/.h2spec.key"
fi
flock -u 9

# --- the dataplane ---------------------------------------------------------------------------
if [ -z "${SWEETY_BIN:-}" ]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sweety/target}"
  (cd "$ROOT" && cargo build -p sweety-dataplane --bin sweety-dataplane >&2)
  SWEETY_BIN="$CARGO_TARGET_DIR/debug/sweety-dataplane"
fi
[ -x "$SWEETY_BIN" ] || { echo "h2spec.sh: no dataplane binary at $SWEETY_BIN" >&2; exit 1; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
H2C_PORT=$(free_port)
TLS_PORT=$(free_port)
LOCAL_PORT=$(free_port)
ADMIN_PORT=$(free_port)
BACKEND_PORT=$(free_port)

WORK=$(mktemp -d /tmp/sweety-h2spec-run.XXXXXX)
PID=
BACKEND_PID=
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  for p in $PID $BACKEND_PID; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# h2spec sends GET and POST (with DATA) to "/" and expects a response on the stream. The route
# proxies to a backend that reads the whole request body before it answers, so the server's
# verdict on a malformed request (a stream error) never races an early response, which would
# end the stream first (a fixed reply does not wait for the body).
cat >"$WORK/backend.py" <<'EOF'
import http.server, sys
# At least 5 octets: http2/6.9.2/2 (a negative flow-control window) is skipped otherwise.
BODY = b"hello from the h2spec backend\n"
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def read_body(self):
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                self.rfile.read(size + 2)
                if size == 0:
                    return
        self.rfile.read(int(self.headers.get("content-length") or 0))
    def answer(self):
        self.read_body()
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(BODY)
    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = do_OPTIONS = answer
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
cat >"$WORK/h2spec.yaml" <<EOF
version: 1
admin: {address: 127.0.0.1, port: $ADMIN_PORT}
limits: {http2_engine: sweety}
listeners:
  - {name: h2c, address: 127.0.0.1, port: $H2C_PORT, protocol: http, http3: false}
  - name: tls
    address: 127.0.0.1
    port: $TLS_PORT
    protocol: https
    http3: false
    tls:
      certificates:
        - cert: {file: $ROOT/deploy/examples/certs/example.test.crt}
          key: {file: $ROOT/deploy/examples/certs/example.test.key}
  # Like the embedded default's HTTPS port: a route answered locally, without reading the body.
  - name: local
    address: 127.0.0.1
    port: $LOCAL_PORT
    protocol: https
    http3: false
    tls:
      certificates:
        - cert: {file: $ROOT/deploy/examples/certs/example.test.crt}
          key: {file: $ROOT/deploy/examples/certs/example.test.key}
virtual_hosts:
  - name: local
    listeners: [local]
    routes:
      - name: fixed
        action: {fixed: {status: 200, body: "answered locally"}}
  - name: any
    listeners: [h2c, tls]
    routes:
      - name: backend
        action: {proxy: {backends: [{backend: reads-body}]}}
backends:
  - name: reads-body
    protocol: http1
    endpoints: [{address: "127.0.0.1:$BACKEND_PORT"}]
EOF

python3 "$WORK/backend.py" "$BACKEND_PORT" &
BACKEND_PID=$!
for _ in $(seq 1 100); do
  if curl -fsS -o /dev/null "http://127.0.0.1:$BACKEND_PORT/" 2>/dev/null; then break; fi
  sleep 0.1
done
"$SWEETY_BIN" run --config "$WORK/h2spec.yaml" >"$OUT/dataplane.log" 2>&1 &
PID=$!
for _ in $(seq 1 100); do
  if curl -fsS -o /dev/null "http://127.0.0.1:$ADMIN_PORT/readyz" 2>/dev/null; then break; fi
  kill -0 "$PID" 2>/dev/null || { echo "h2spec.sh: the dataplane exited:" >&2; cat "$OUT/dataplane.log" >&2; exit 1; }
  sleep 0.1
done
curl -fsS -o /dev/null "http://127.0.0.1:$ADMIN_PORT/readyz" || { echo "h2spec.sh: the dataplane is not ready" >&2; exit 1; }
curl -fsS -o /dev/null --http2-prior-knowledge "http://127.0.0.1:$H2C_PORT/" ||
  { echo "h2spec.sh: no h2c response through the backend" >&2; exit 1; }

# --- h2spec runs -------------------------------------------------------------------------------
# h2spec's exit status is non-zero when any case fails; the allowlist decides below.
read -r -a extra <<<"${H2SPEC_ARGS:-}"
run() { # mode, h2spec args...
  local mode=$1
  shift
  echo "== h2spec $mode"
  "$H2SPEC" "${extra[@]}" -h 127.0.0.1 -o "${H2SPEC_TIMEOUT:-2}" -j "$OUT/$mode.xml" "$@" >"$OUT/$mode.txt" 2>&1 || true
  # The summary: the failure list and the totals line.
  sed -n '/^Failures:/,$p' "$OUT/$mode.txt"
  grep -q 'tests, .* passed' "$OUT/$mode.txt" || { echo "h2spec.sh: h2spec ($mode) did not finish:" >&2; tail -20 "$OUT/$mode.txt" >&2; exit 1; }
}
run h2c -p "$H2C_PORT"
run tls -p "$TLS_PORT" -t -k
# Message framing on a locally answered route (http2/8.1.2.6: content-length against the DATA
# frames; the answer must not come before the stream error).
run local -p "$LOCAL_PORT" -t -k http2/8.1.2.6
kill -0 "$PID" 2>/dev/null || { echo "h2spec.sh: the dataplane died during the run" >&2; exit 1; }

# --- compare with the allowlist ---------------------------------------------------------------
# Failed case ids per mode ("h2c http2/6.5.3/2"), from the JUnit reports: a <testcase> whose
# next element is <failure> or <error>. h2spec names a case by package (e.g. "http2/6.5.3")
# and its index within the section; the id is what `h2spec <id>` runs.
status=0
python3 - "$OUT" "$KNOWN" <<'PY' || status=$?
import sys, xml.etree.ElementTree as ET
out, known_path = sys.argv[1], sys.argv[2]
ran, failed = set(), set()
for mode in ("h2c", "tls", "local"):
    n = bad = skipped = 0
    for suite in ET.parse(f"{out}/{mode}.xml").getroot().iter("testsuite"):
        for i, case in enumerate(suite.iter("testcase"), 1):
            case_id = f"{mode} {suite.get('package')}/{i}"
            ran.add(case_id)
            n += 1
            if case.find("skipped") is not None:
                skipped += 1
            elif case.find("failure") is not None or case.find("error") is not None:
                bad += 1
                failed.add(case_id)
    print(f"h2spec {mode}: {n} cases, {n - bad - skipped} passed, {skipped} skipped, {bad} failed")
known = {}
for line in open(known_path):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    fields = line.split(None, 2)
    if len(fields) < 3 or fields[0] not in ("h2c", "tls", "local", "both"):
        sys.exit(f"h2spec.sh: bad line in {known_path} (want: h2c|tls|local|both <id> <reason>): {line}")
    for mode in ("h2c", "tls") if fields[0] == "both" else (fields[0],):
        known[f"{mode} {fields[1]}"] = fields[2]
flaky = {k for k, why in known.items() if why.startswith("flaky:")}
new = sorted(failed - known.keys())
fixed = sorted((known.keys() & ran) - failed - flaky)
for f in sorted(failed & known.keys()):
    print(f"known failure: {f}: {known[f]}")
for f in new:
    print(f"NEW FAILURE: {f}")
for f in fixed:
    print(f"FIXED (remove its line from {known_path}): {f}")
with open(f"{out}/failed.txt", "w") as fh:
    fh.writelines(f + "\n" for f in sorted(failed))
sys.exit(1 if new or fixed else 0)
PY
echo "reports: $OUT"
exit "$status"
