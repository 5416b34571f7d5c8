#!/usr/bin/env bash
# Side-by-side benchmark of the Sweety dataplane, nginx and HAProxy on one machine.
#
# Usage:
#   e2e/bench/run.sh [--out FILE]            # full run; markdown table on stdout (and in FILE)
#   DUR=1 RUNS=1 CELLS="h1-1k proxy-h1" e2e/bench/run.sh     # quick smoke test
#
# Environment:
#   DUR=5          seconds of load per cell (every load run is bounded by it; 5 s keeps a full
#                  run of every cell, three servers and two runs at ~20 min)
#   RUNS=2         passes over all cells (the machine is noisy; the report shows every run)
#   CELLS=         space/comma separated glob filter over the cell names (default: all):
#                  h1-1k h1-10k h1-100k h1-1m h2-1k h2-10k h2-100k h2-1m proxy-h1
#                  proxy-h2 proxy-h2-4k (the proxy path with an HTTP/2-over-TLS front)
#                  proxy-h1s proxy-h1s-4k (the proxy path with an HTTP/1.1-over-TLS front)
#                  proxy-h3 proxy-h3-4k (an HTTP/3 front; Sweety only, see below)
#                  proxy-h2c proxy-h2c-4k (HTTP/2-over-TLS front, h2c backend; no nginx)
#                  proxy-h1s-rate proxy-h2-rate (proxy-h1s / proxy-h2 at a fixed request rate)
#                  proxy-h1-100k proxy-h2-100k (100 KB through the proxy, for memory)
#                  h1-100k-c1000 h2-100k-c1000 h3-100k-c1000 (1,000 connections, for memory)
#                  proxy-h2-trace0 proxy-h2-trace1 (proxy-h2 with tracing on, Sweety only)
#                  h3-1k h3-10k h3-100k h3-1m (Sweety only: this nginx has no HTTP/3)
#                  cache-h2 gzip-h2 ws-h1 (edge features, see below)
#   SERVERS="sweety nginx haproxy"   which servers to run (HAProxy runs the proxy-* and
#                  cache-h2 cells only: it serves no files; neither peer runs proxy-h3*)
#   SERVER_CPU=0 CLIENT_CPU=1 BACKEND_CPU=$CLIENT_CPU   taskset CPU of each role
#   PORT_BASE=18440  ports used on 127.0.0.1: TLS = base, plain HTTP = base+1,
#                    backend = base+2, Sweety admin = base+3, WebSocket echo backend = base+4,
#                    h2c backend = base+5 (HTTP/3: UDP on the TLS port)
#   SWEETY_BIN=    use this binary instead of building (else: the profile-guided release build,
#                  dataplane/release.sh, into
#                  $CARGO_TARGET_DIR, default ~/.cache/sweety/target)
#   KEEP_WORK=1    keep the temporary work dir (configs, logs, client outputs, the rate cells'
#                  per-request databases)
#   SETTLE=0       seconds to wait after each cell's load before reading the server's RSS
#                  again ("settled RSS": what it keeps once idle; 0: not read)
#   POOL_IDLE=     Sweety's `max_idle_per_endpoint` for the proxy backend (default: unset, the
#                  dataplane's default: idle connections follow demand up to 1024; nginx here
#                  keeps at most 128 idle, `keepalive 128`; HAProxy keeps every connection)
#   PROXY_RATE=10000  requests/s of the *-rate cells (below every server's capacity here, so
#                  that all three serve the same load and their p99 compares)
#   RATE_SKIP=1    seconds: the *-rate cells' steady p99 counts the requests due this long
#                  after the start or later (see "p99 of the rate cells" below)
#   SWEETY_HTTP3=  extra `http3:` settings for the h3 cells, as YAML flow-mapping entries,
#                  e.g. "send_window: 262144, static_chunk_size: 16384" (default: none, the
#                  documented defaults of docs/config.md apply)
#   SWEETY_LIMITS= extra `limits:` settings of the Sweety configs, as YAML flow-mapping
#                  entries, e.g. "http2_engine: sweety" (default: none)
#   OHA=           oha binary with HTTP/3 for the h3 cells (default: oha on PATH, else
#                  ~/.cache/sweety/tools/bin/oha; build it with
#                  cargo install oha --locked --features http3 --root ~/.cache/sweety/tools)
#
# What it does (setup from /work/shared/notes/peers.md): builds sweety-dataplane in release
# mode; makes a temp dir with an ECDSA P-256 self-signed cert (SAN IP:127.0.0.1) and random
# files of 1 KB, 10 KB, 100 KB and 1 MB; writes an nginx config and a Sweety config serving
# the same files over HTTPS (TLS 1.3, HTTP/1.1 and HTTP/2) and a /proxy route on a plain HTTP
# port to a tiny backend (a separate nginx returning the 12-byte body "hello world\n", pinned
# to BACKEND_CPU, so its CPU is billed to neither server). For every run, cell and server it
# starts the server fresh, pinned to SERVER_CPU with one worker (Sweety: --workers 1, access
# log off; nginx: worker_processes 1, access_log off), records its idle RSS, probes the URL
# once with curl, runs the load generator pinned to CLIENT_CPU for DUR seconds, and records
# RPS, p99 latency, failed and non-2xx counts, server CPU-µs per request (utime+stime delta
# from /proc/PID/stat over the run), page faults per request (minflt+majflt delta) and peak
# RSS (VmHWM, summed over the server's processes).
#
# Cells: static files over TLS with h2load (H1: --h1 -c 100 -t 1; H2: -c 100 -m 10 -t 1;
# 1 MB: -c 10), and proxy-h1 with wrk -t1 -c100 over plain HTTP. proxy-h2 and proxy-h2-4k
# are the proxy path with an HTTP/2-over-TLS front (h2load -c 100 -m 10) to the same
# HTTP/1.1 keep-alive backend, answering 12 bytes and 4 KB (/proxy4k); proxy-h1s and
# proxy-h1s-4k are the same over HTTP/1.1 over TLS (h2load --h1 -c 100), proxy-h3 and
# proxy-h3-4k over HTTP/3 (oha -c 100 -p 10; Sweety only: Debian's HAProxy 2.6 is built
# without QUIC, `haproxy -vv` says -QUIC, and nginx 1.22 has no HTTP/3 module). proxy-h2c and
# proxy-h2c-4k are proxy-h2 / proxy-h2-4k to an h2c backend instead (the backend nginx's second
# server, `listen ... http2` in clear text, prior knowledge, 1,024 concurrent streams; Sweety
# `protocol: h2c`, HAProxy `proto h2`); nginx has no such cell: it proxies to HTTP/2 only
# through its gRPC module (grpc_pass), which is not its HTTP proxy. proxy-h1s-rate and
# proxy-h2-rate send the 12-byte proxy requests at a fixed rate, PROXY_RATE, with oha (H1 over
# TLS: -c 100; H2: -c 10 -p 10; --latency-correction, so a stall counts against every request it
# delays): the same load for every server, for issue 23's "p99 not worse than HAProxy's at the
# same load" (the closed-loop cells give a faster server more load). p99 of the rate cells: oha
# records every request (--db-url, SQLite: when it was due, sent and done); besides oha's p99 of
# the whole run the report gives the steady p99, over the requests due RATE_SKIP s after the
# start or later, for every server alike, and reads the goal on it: oha sends its first request
# 30-80 ms late in most runs (its TLS handshakes on the CPU it shares with the backend; over
# HTTP/1.1's 100 connections its sends lag up to ~0.75 s), and with latency correction the
# requests due meanwhile set the whole run's p99 whichever server runs (e2e/bench/HISTORY.md,
# "The rate cells' p99 over the steady state"). proxy-h1-100k (wrk
# -c 100 over plain HTTP) and proxy-h2-100k (h2load -c 100 -m 10 over TLS) proxy a 100 KB file
# of the backend (/proxy100k), and the *-c1000 cells are the 100 KB static cells with 1,000
# connections (H2 and H3 with 10 streams each): their figure is peak RSS (memory under bulk
# load, issue 23). p99 of h2load cells comes
# from h2load's --log-file (one line per request), of wrk from --latency. The h3 cells serve
# the same files over HTTP/3 (QUIC on the TLS port; Sweety started with http3 on) with oha
# (-c 100 -p 10, 1 MB: -c 10 -p 10, like h2load -m 10; JSON output), Sweety only; the report then also compares Sweety's H3
# with its H2 per file size.
#
# Edge cells (both servers, same backend): cache-h2 is HTTP/2 (h2load -m 10) over TLS to
# /cached, answered from the proxy cache (Sweety: `cache` filter with ttl 10m; nginx:
# proxy_cache with proxy_cache_valid 200 10m) after the warm-up, 12-byte body. gzip-h2 is
# HTTP/2 GETs of a 100 KB compressible text file (log-like lines) with accept-encoding: gzip,
# compressed on the fly (Sweety: `compress` filter, gzip only, level 5; nginx: gzip on,
# gzip_comp_level 5). ws-h1 is WebSocket echo through each proxy (HTTP/1.1 Upgrade on the
# plain port) to an echo backend on BACKEND_CPU: 50 connections each sending a 64-byte
# message and waiting for its echo (dataplane/examples/ws_bench.rs; messages/s in the rps
# column). WS_BENCH= uses a prebuilt ws_bench binary.
#
# Tracing cells (Sweety only; the report compares them with proxy-h2, tracing off, of the same
# run): proxy-h2-trace0 is proxy-h2 with `tracing` on and sampling_ratio 0 (trace context read,
# checked and passed on for every request, nothing recorded); proxy-h2-trace1 samples 1 % (the
# chart's suggested ratio), exporting OTLP/HTTP to the backend nginx (`/v1/traces` answers 200
# there, on BACKEND_CPU, so the receiver's CPU is billed to neither server).
#
# HAProxy (Debian's haproxy, nbthread 1, pinned like the others) is the third peer for the
# proxy cells and cache-h2 (its `cache` section, max-age 600 s): same front ports, TLS 1.3
# with ALPN h2/http/1.1, `http-reuse always` keep-alive to the same backend.
#
# Everything listens on 127.0.0.1 only; every process started here is killed on exit.
set -euo pipefail

DUR=${DUR:-5}
RUNS=${RUNS:-2}
CELLS=${CELLS:-}
SERVERS=${SERVERS:-sweety nginx haproxy}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
BACKEND_CPU=${BACKEND_CPU:-$CLIENT_CPU}
PORT_BASE=${PORT_BASE:-18440}
PROXY_RATE=${PROXY_RATE:-10000}
RATE_SKIP=${RATE_SKIP:-1}
OUT=""

ALL_CELLS="h1-1k h1-10k h1-100k h1-1m h2-1k h2-10k h2-100k h2-1m proxy-h1 proxy-h1s proxy-h1s-4k proxy-h2 proxy-h2-4k proxy-h3 proxy-h3-4k proxy-h2c proxy-h2c-4k proxy-h1s-rate proxy-h2-rate proxy-h1-100k proxy-h2-100k proxy-h2-trace0 proxy-h2-trace1 h3-1k h3-10k h3-100k h3-1m h1-100k-c1000 h2-100k-c1000 h3-100k-c1000 cache-h2 gzip-h2 ws-h1"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while (($#)); do
    case $1 in
        --out) OUT=${2:?--out needs a file}; shift 2 ;;
        --out=*) OUT=${1#--out=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ $DUR =~ ^[1-9][0-9]*$ ]] || { echo "DUR must be a positive integer (seconds)" >&2; exit 2; }
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "RUNS must be a positive integer" >&2; exit 2; }
[[ $PROXY_RATE =~ ^[1-9][0-9]*$ ]] || { echo "PROXY_RATE must be a positive integer" >&2; exit 2; }
# (at or past DUR the steady p99 has no request and reads "—")
[[ $RATE_SKIP =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "RATE_SKIP must be a number of seconds" >&2; exit 2; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
HELPER=(python3 -B "$HERE/bench_helper.py") # -B: no __pycache__ in the tree
TLS_PORT=$PORT_BASE
PLAIN_PORT=$((PORT_BASE + 1))
BACKEND_PORT=$((PORT_BASE + 2))
ADMIN_PORT=$((PORT_BASE + 3))
WS_PORT=$((PORT_BASE + 4))
H2C_PORT=$((PORT_BASE + 5))

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# ----------------------------------------------------------------------------- tools

install_missing() {
    local need=()
    command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || need+=(nginx-light)
    command -v h2load >/dev/null || need+=(nghttp2-client)
    command -v wrk >/dev/null || need+=(wrk)
    command -v openssl >/dev/null || need+=(openssl)
    command -v curl >/dev/null || need+=(curl)
    command -v taskset >/dev/null || need+=(util-linux)
    command -v python3 >/dev/null || need+=(python3)
    if [[ " $SERVERS " == *" haproxy "* ]]; then
        command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]] || need+=(haproxy)
    fi
    ((${#need[@]})) || return 0
    log "installing ${need[*]}"
    local sudo=()
    ((EUID == 0)) || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get install -y "${need[@]}" ||
        { "${sudo[@]}" apt-get update && "${sudo[@]}" apt-get install -y "${need[@]}"; }
}
install_missing
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
OHA=${OHA:-$(command -v oha || echo "$HOME/.cache/sweety/tools/bin/oha")}
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n) # servers' descriptor limit (nginx: worker_rlimit_nofile)
[[ $NOFILE =~ ^[0-9]+$ ]] || NOFILE=65536

# ----------------------------------------------------------------------------- build

if [[ -z ${SWEETY_BIN:-} ]]; then
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/sweety/target}
    log "building sweety-dataplane (release, target dir $CARGO_TARGET_DIR)"
    bash "$REPO/dataplane/release.sh" build
    SWEETY_BIN=$CARGO_TARGET_DIR/release/sweety-dataplane
    BUILT=1
fi
[[ -x $SWEETY_BIN ]] || die "no sweety-dataplane binary at $SWEETY_BIN"
WS_BENCH=${WS_BENCH:-}
if [[ -z $WS_BENCH ]] && { [[ -z $CELLS ]] || [[ $CELLS == *ws* ]]; }; then
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/sweety/target}
    log "building the WebSocket bench tool (release example ws_bench)"
    (cd "$REPO" && cargo build --release -q -p sweety-dataplane --example ws_bench)
    WS_BENCH=$CARGO_TARGET_DIR/release/examples/ws_bench
fi

# ----------------------------------------------------------------------------- process bookkeeping

STARTED=() # pids of every long-running process this script started and has not reaped yet

kill_tree() { # kill_tree SIGNAL PID: the process and its descendants (children first)
    local sig=$1 pid=$2 child
    for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do kill_tree "$sig" "$child"; done
    kill "-$sig" "$pid" 2>/dev/null || true
}

forget() { # drop a reaped pid from STARTED
    local p keep=()
    for p in "${STARTED[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    STARTED=("${keep[@]}")
}

stop() { # stop PID: SIGTERM, up to 5 s grace, then SIGKILL the tree; reap it
    local pid=$1 i
    kill_tree TERM "$pid"
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill_tree KILL "$pid"
    wait "$pid" 2>/dev/null || true
    forget "$pid"
}

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    local p
    trap - EXIT INT TERM
    for p in "${STARTED[@]}"; do stop "$p"; done
    if [[ -n ${WORK:-} && -d $WORK ]]; then
        if [[ -n ${KEEP_WORK:-} ]]; then log "work dir kept: $WORK"; else rm -rf "$WORK"; fi
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ----------------------------------------------------------------------------- work dir

WORK=$(mktemp -d -t sweety-bench.XXXXXX)
chmod 755 "$WORK" # nginx workers run as an unprivileged user when started as root
mkdir -p "$WORK/www" "$WORK/nginx/tmp" "$WORK/backend/tmp" "$WORK/out"
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
log "work dir $WORK"

openssl ecparam -name prime256v1 -genkey -noout -out "$WORK/key.pem" 2>/dev/null
openssl req -x509 -new -key "$WORK/key.pem" -out "$WORK/cert.pem" -days 30 \
    -subj "/CN=127.0.0.1" -addext "subjectAltName=IP:127.0.0.1" 2>/dev/null

for f in 1k:1 4k:4 10k:10 100k:100 1m:1024; do
    dd if=/dev/urandom of="$WORK/www/${f%%:*}.bin" bs=1024 count="${f#*:}" status=none
done
# gzip-h2: 100 KB of log-like text (compresses about 4-6x), the same file for both servers.
mkdir -p "$WORK/www/gz"
awk 'BEGIN { srand(7); for (i = 0; i < 2000; i++)
    printf "2026-11-22T12:%02d:%02d.%03dZ INFO request id=%08x method=GET path=/api/v1/items/%d status=200 bytes=%d ms=%.3f\n",
        int(i / 60) % 60, i % 60, int(rand() * 1000), int(rand() * 4294967295), int(rand() * 100000), int(rand() * 50000), rand() * 40 }' \
    >"$WORK/gz-lines.txt"
head -c 102400 "$WORK/gz-lines.txt" >"$WORK/www/gz/100k.txt"
chmod -R a+rX "$WORK/www"

# The backend: a separate single-worker nginx so its CPU is billed to neither server.
cat >"$WORK/backend.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/backend/nginx.pid;
error_log $WORK/backend/error.log warn;
worker_rlimit_nofile $NOFILE;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 1000000000;
    keepalive_timeout 75s;
    client_body_temp_path $WORK/backend/tmp/body;
    proxy_temp_path $WORK/backend/tmp/proxy;
    fastcgi_temp_path $WORK/backend/tmp/fastcgi;
    uwsgi_temp_path $WORK/backend/tmp/uwsgi;
    scgi_temp_path $WORK/backend/tmp/scgi;
    server {
        listen 127.0.0.1:$BACKEND_PORT;
        default_type text/plain;
        location = /proxy4k { alias $WORK/www/4k.bin; }
        location = /proxy100k { alias $WORK/www/100k.bin; }
        location = /v1/traces { return 200; }
        location / { return 200 "hello world\n"; }
    }
    server {
        listen 127.0.0.1:$H2C_PORT http2;
        http2_max_concurrent_streams 1024;
        default_type text/plain;
        location = /h2c4k { alias $WORK/www/4k.bin; }
        location / { return 200 "hello world\n"; }
    }
}
EOF

# nginx under test: same files over HTTPS (TLS 1.3, h2), /proxy to the backend on both ports.
proxy_location="location /proxy {
            proxy_pass http://hello;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
        location /cached {
            proxy_pass http://hello;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_cache bench;
            proxy_cache_valid 200 10m;
        }
        location /gz/ {
            default_type text/plain;
            gzip on;
            gzip_comp_level 5;
            gzip_types text/plain;
            gzip_min_length 256;
        }
        location /ws {
            proxy_pass http://wsecho;
            proxy_http_version 1.1;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection upgrade;
            proxy_read_timeout 300s;
        }"
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
worker_rlimit_nofile $NOFILE;
events { worker_connections 16384; }
http {
    access_log off;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    open_file_cache max=1024 inactive=60s;
    open_file_cache_valid 60s;
    open_file_cache_errors on;
    keepalive_requests 1000000000;
    keepalive_timeout 75s;
    client_body_temp_path $WORK/nginx/tmp/body;
    proxy_temp_path $WORK/nginx/tmp/proxy;
    fastcgi_temp_path $WORK/nginx/tmp/fastcgi;
    uwsgi_temp_path $WORK/nginx/tmp/uwsgi;
    scgi_temp_path $WORK/nginx/tmp/scgi;
    upstream hello {
        server 127.0.0.1:$BACKEND_PORT;
        keepalive 128;
        keepalive_requests 1000000000;
    }
    upstream wsecho {
        server 127.0.0.1:$WS_PORT;
    }
    proxy_cache_path $WORK/nginx/cache keys_zone=bench:10m max_size=256m;
    server {
        listen 127.0.0.1:$TLS_PORT ssl http2;
        ssl_certificate $WORK/cert.pem;
        ssl_certificate_key $WORK/key.pem;
        ssl_protocols TLSv1.3;
        root $WORK/www;
        $proxy_location
    }
    server {
        listen 127.0.0.1:$PLAIN_PORT;
        root $WORK/www;
        $proxy_location
    }
}
EOF

# Sweety: the same. precompressed off because nginx has no gzip_static here (h2load sends
# accept-encoding); HTTP/3 off because nginx has none, except in sweety-h3.yaml for the h3
# cells; a short drain so stops are quick.
cat >"$WORK/sweety.yaml" <<EOF
version: 1
admin: {address: 127.0.0.1, port: $ADMIN_PORT}
access_log: {enabled: false}
limits: {drain_timeout: 1s${SWEETY_LIMITS:+, $SWEETY_LIMITS}}
listeners:
  - name: tls
    address: 127.0.0.1
    port: $TLS_PORT
    protocol: https
    http3: false
    tls:
      min_version: "1.3"
      certificates:
        - {cert: {file: $WORK/cert.pem}, key: {file: $WORK/key.pem}}
  - {name: plain, address: 127.0.0.1, port: $PLAIN_PORT, protocol: http}
virtual_hosts:
  - name: bench
    routes:
      - name: proxy
        matches: [{path: {prefix: /proxy}}]
        action: {proxy: {backends: [{backend: hello}]}}
      - name: proxy-files
        matches: [{path: {exact: /proxy4k}}, {path: {exact: /proxy100k}}]
        action: {proxy: {backends: [{backend: hello}]}}
      - name: h2c
        matches: [{path: {prefix: /h2c}}, {path: {exact: /h2c4k}}]
        action: {proxy: {backends: [{backend: hello-h2c}]}}
      - name: cached
        matches: [{path: {prefix: /cached}}]
        filters: [{cache: {ttl: 10m}}]
        action: {proxy: {backends: [{backend: hello}]}}
      - name: gzip
        matches: [{path: {prefix: /gz/}}]
        filters: [{compress: {algorithms: [gzip]}}]
        action: {static: {root: $WORK/www, precompressed: false}}
      - name: ws
        matches: [{path: {prefix: /ws}}]
        action: {proxy: {backends: [{backend: wsecho}]}}
      - name: files
        action: {static: {root: $WORK/www, precompressed: false}}
backends:
  - name: hello
    protocol: http1
    endpoints: [{address: "127.0.0.1:$BACKEND_PORT"}]
${POOL_IDLE:+    max_idle_per_endpoint: $POOL_IDLE}
  - name: hello-h2c
    protocol: h2c
    endpoints: [{address: "127.0.0.1:$H2C_PORT"}]
  - name: wsecho
    protocol: http1
    endpoints: [{address: "127.0.0.1:$WS_PORT"}]
EOF
sed 's/^    http3: false$/    http3: true/' "$WORK/sweety.yaml" >"$WORK/sweety-h3.yaml"
for r in 0:0 1:0.01; do
    { cat "$WORK/sweety.yaml"
      printf 'tracing: {otlp_endpoint: "http://127.0.0.1:%s/v1/traces", sampling_ratio: %s}\n' "$BACKEND_PORT" "${r#*:}"
    } >"$WORK/sweety-trace${r%%:*}.yaml"
done
[[ -n ${SWEETY_HTTP3:-} ]] && printf 'http3: {%s}\n' "$SWEETY_HTTP3" >>"$WORK/sweety-h3.yaml"

# HAProxy: the proxy and cache routes only (it serves no files), on the same ports.
cat "$WORK/cert.pem" "$WORK/key.pem" >"$WORK/haproxy.pem"
mkdir -p "$WORK/haproxy"
cat >"$WORK/haproxy.cfg" <<EOF
global
    nbthread 1
    ssl-default-bind-options ssl-min-ver TLSv1.3
defaults
    mode http
    timeout connect 5s
    timeout client 75s
    timeout server 75s
    timeout http-keep-alive 75s
    option http-keep-alive
    http-reuse always
cache bench
    total-max-size 64
    max-age 600
frontend tls
    bind 127.0.0.1:$TLS_PORT ssl crt $WORK/haproxy.pem alpn h2,http/1.1
    use_backend cached if { path_beg /cached }
    use_backend h2c if { path_beg /h2c }
    default_backend hello
frontend plain
    bind 127.0.0.1:$PLAIN_PORT
    use_backend cached if { path_beg /cached }
    use_backend h2c if { path_beg /h2c }
    default_backend hello
backend hello
    server be 127.0.0.1:$BACKEND_PORT
backend h2c
    server be 127.0.0.1:$H2C_PORT proto h2
backend cached
    http-request cache-use bench
    http-response cache-store bench
    server be 127.0.0.1:$BACKEND_PORT
EOF

"$SWEETY_BIN" validate "$WORK/sweety.yaml" >&2 || die "the generated Sweety config is invalid"
"$SWEETY_BIN" validate "$WORK/sweety-h3.yaml" >&2 || die "the generated Sweety HTTP/3 config is invalid"
for r in 0 1; do
    "$SWEETY_BIN" validate "$WORK/sweety-trace$r.yaml" >&2 || die "the generated Sweety tracing config is invalid"
done
"$NGINX" -t -q -p "$WORK/nginx/" -c "$WORK/nginx.conf" -e "$WORK/nginx/error.log" ||
    die "the generated nginx config is invalid"
if [[ " $SERVERS " == *" haproxy "* ]]; then
    "$HAPROXY" -c -q -f "$WORK/haproxy.cfg" || die "the generated HAProxy config is invalid"
fi

# ----------------------------------------------------------------------------- servers

for port in "$TLS_PORT" "$PLAIN_PORT" "$BACKEND_PORT" "$ADMIN_PORT" "$WS_PORT" "$H2C_PORT"; do
    "${HELPER[@]}" port-state "$port" free 0 || die "127.0.0.1:$port is already in use (set PORT_BASE)"
done

taskset -c "$BACKEND_CPU" "$NGINX" -p "$WORK/backend/" -c "$WORK/backend.conf" \
    -e "$WORK/backend/error.log" &
STARTED+=($!)
"${HELPER[@]}" port-state "$BACKEND_PORT" open 10 || die "backend did not start: $(tail -5 "$WORK/backend/error.log")"
body=$(curl -s --max-time 5 "http://127.0.0.1:$BACKEND_PORT/")
[[ $body == "hello world" ]] || die "backend answers '$body'"
"${HELPER[@]}" port-state "$H2C_PORT" open 10 || die "h2c backend did not start"
if [[ -n $WS_BENCH ]]; then
    taskset -c "$BACKEND_CPU" "$WS_BENCH" server "127.0.0.1:$WS_PORT" &
    STARTED+=($!)
    "${HELPER[@]}" port-state "$WS_PORT" open 10 || die "WebSocket echo backend did not start"
fi

SERVER_PID=""
start_server() { # start_server NAME [CONFIG]: sets SERVER_PID; returns 1 if it does not come up
    local name=$1 config=${2:-$WORK/sweety.yaml} errlog logsize i
    case $name in
        sweety) errlog=$WORK/sweety.log ;;
        nginx) errlog=$WORK/nginx/error.log ;;
        haproxy) errlog=$WORK/haproxy/haproxy.log ;;
        *) die "unknown server $name" ;;
    esac
    touch "$errlog"
    logsize=$(stat -c %s "$errlog")
    case $name in
        sweety)
            RUST_LOG=${RUST_LOG:-warn} taskset -c "$SERVER_CPU" "$SWEETY_BIN" run \
                --config "$config" --workers 1 >>"$WORK/sweety.out" 2>>"$errlog" &
            ;;
        nginx)
            taskset -c "$SERVER_CPU" "$NGINX" -p "$WORK/nginx/" -c "$WORK/nginx.conf" -e "$errlog" &
            ;;
        haproxy) # -db: foreground, one process
            taskset -c "$SERVER_CPU" "$HAPROXY" -db -f "$WORK/haproxy.cfg" >>"$errlog" 2>&1 &
            ;;
    esac
    SERVER_PID=$!
    STARTED+=("$SERVER_PID")
    for ((i = 0; i < 150; i++)); do # up to ~15 s
        kill -0 "$SERVER_PID" 2>/dev/null || break
        if "${HELPER[@]}" port-state "$TLS_PORT" open 0 && "${HELPER[@]}" port-state "$PLAIN_PORT" open 0; then
            sleep 0.3 # let nginx fork its worker / Sweety finish applying the config
            return 0
        fi
        sleep 0.1
    done
    log "$name did not start; its log:"
    tail -c "+$((logsize + 1))" "$errlog" | tail -20 >&2 || true
    stop "$SERVER_PID"
    return 1
}

stop_server() {
    stop "$SERVER_PID"
    if ! "${HELPER[@]}" port-state "$TLS_PORT" free 10 || ! "${HELPER[@]}" port-state "$PLAIN_PORT" free 10; then
        die "ports still busy after stopping the server"
    fi
}

# ----------------------------------------------------------------------------- cells

selected() { # selected CELL: matches the CELLS filter?
    [[ -z $CELLS ]] && return 0
    local pat
    for pat in ${CELLS//,/ }; do
        # shellcheck disable=SC2053
        [[ $1 == $pat ]] && return 0
    done
    return 1
}

run_cell() { # run_cell CELL SERVER RUN
    local cell=$1 server=$2 run=$3 proto=${1%%-*} size=${1#*-} conns=100 url tool cmd idle probe expect
    local tag=$WORK/out/$cell.$server.$run config=$WORK/sweety.yaml
    if [[ $cell == *-c1000 ]]; then # the 1,000-connection memory cells
        conns=1000
        size=${size%-c1000}
    fi
    # HAProxy serves no files: only the proxy and cache cells; neither peer has HTTP/3 here,
    # and nginx proxies to no h2c backend (see the top).
    [[ $server == haproxy && $cell != proxy-* && $cell != cache-h2 ]] && return 0
    [[ $server != sweety && $cell == proxy-h3* ]] && return 0
    [[ $server == nginx && $cell == proxy-h2c* ]] && return 0
    if [[ $cell == proxy-h1s-rate || $cell == proxy-h2-rate ]]; then
        url=https://127.0.0.1:$TLS_PORT/proxy
        expect="200 12B"
        tool=oha
        cmd=("$OHA" --insecure --no-tui --output-format json --latency-correction -q "$PROXY_RATE" -z "${DUR}s"
            --db-url "$tag.db")
        if [[ $cell == proxy-h2-rate ]]; then
            cmd+=(--http-version 2 -c 10 -p 10 "$url")
        else
            cmd+=(--http-version 1.1 -c "$conns" "$url")
        fi
    elif [[ $cell == proxy-h3 || $cell == proxy-h3-4k ]]; then
        url=https://127.0.0.1:$TLS_PORT/proxy
        expect="200 12B"
        if [[ $cell == proxy-h3-4k ]]; then
            url=https://127.0.0.1:$TLS_PORT/proxy4k
            expect="200 4096B"
        fi
        tool=oha
        config=$WORK/sweety-h3.yaml
        cmd=("$OHA" --http-version 3 --insecure --no-tui --output-format json
            -c "$conns" -p 10 -z "${DUR}s" "$url")
    elif [[ $proto == h3 ]]; then
        [[ $server == sweety ]] || return 0 # nginx here has no HTTP/3
        url=https://127.0.0.1:$TLS_PORT/$size.bin
        [[ $size == 1m ]] && conns=10
        tool=oha
        config=$WORK/sweety-h3.yaml
        expect="200 $(stat -c %s "$WORK/www/$size.bin")B"
        cmd=("$OHA" --http-version 3 --insecure --no-tui --output-format json
            -c "$conns" -p 10 -z "${DUR}s" "$url")
    elif [[ $cell == cache-h2 || $cell == gzip-h2 ]]; then
        tool=h2load
        if [[ $cell == cache-h2 ]]; then
            url=https://127.0.0.1:$TLS_PORT/cached
            expect="200 12B"
        else
            url=https://127.0.0.1:$TLS_PORT/gz/100k.txt
            expect="200 $(stat -c %s "$WORK/www/gz/100k.txt")B" # the probe asks for no coding
        fi
        [[ $cell == gzip-h2 ]] && conns=10 # like the 1 MB cells: fewer large responses in flight
        cmd=(h2load -c "$conns" -m 10 -t 1 -D "$DUR" -H "accept-encoding: gzip" --log-file "$tag.log" "$url")
    elif [[ $cell == ws-h1 ]]; then
        [[ -n $WS_BENCH ]] || return 0
        url=ws://127.0.0.1:$PLAIN_PORT/ws
        tool=wsbench
        expect="101 64B"
        cmd=("$WS_BENCH" client "$url" 50 "$DUR" 64)
    elif [[ $cell == proxy-h2 || $cell == proxy-h2-4k || $cell == proxy-h2-100k || $cell == proxy-h2-trace* ||
        $cell == proxy-h2c || $cell == proxy-h2c-4k ]]; then
        tool=h2load
        if [[ $cell == proxy-h2-trace* ]]; then
            [[ $server == sweety ]] || return 0 # tracing cells: Sweety only
            config=$WORK/sweety-${cell#proxy-h2-}.yaml
        fi
        if [[ $cell == proxy-h2 || $cell == proxy-h2-trace* ]]; then
            url=https://127.0.0.1:$TLS_PORT/proxy
            expect="200 12B"
        elif [[ $cell == proxy-h2-4k ]]; then
            url=https://127.0.0.1:$TLS_PORT/proxy4k
            expect="200 4096B"
        elif [[ $cell == proxy-h2c ]]; then
            url=https://127.0.0.1:$TLS_PORT/h2c
            expect="200 12B"
        elif [[ $cell == proxy-h2c-4k ]]; then
            url=https://127.0.0.1:$TLS_PORT/h2c4k
            expect="200 4096B"
        else
            url=https://127.0.0.1:$TLS_PORT/proxy100k
            expect="200 102400B"
        fi
        cmd=(h2load -c "$conns" -m 10 -t 1 -D "$DUR" --log-file "$tag.log" "$url")
    elif [[ $cell == proxy-h1 || $cell == proxy-h1-100k ]]; then
        url=http://127.0.0.1:$PLAIN_PORT/proxy
        expect="200 12B"
        if [[ $cell == proxy-h1-100k ]]; then
            url=http://127.0.0.1:$PLAIN_PORT/proxy100k
            expect="200 102400B"
        fi
        tool=wrk
        cmd=(wrk -t1 -c100 "-d${DUR}s" --timeout 5s --latency "$url")
    elif [[ $cell == proxy-h1s || $cell == proxy-h1s-4k ]]; then
        url=https://127.0.0.1:$TLS_PORT/proxy
        expect="200 12B"
        if [[ $cell == proxy-h1s-4k ]]; then
            url=https://127.0.0.1:$TLS_PORT/proxy4k
            expect="200 4096B"
        fi
        tool=h2load
        cmd=(h2load --h1 -c "$conns" -t 1 -D "$DUR" --log-file "$tag.log" "$url")
    else
        url=https://127.0.0.1:$TLS_PORT/$size.bin
        [[ $size == 1m ]] && conns=10
        tool=h2load
        expect="200 $(stat -c %s "$WORK/www/$size.bin")B"
        cmd=(h2load -c "$conns" -t 1 -D "$DUR" --log-file "$tag.log")
        [[ $proto == h1 ]] && cmd+=(--h1) || cmd+=(-m 10)
        cmd+=("$url")
    fi

    start_server "$server" "$config" || {
        printf '{"cell":"%s","server":"%s","run":%s,"rps":null,"p99_ms":null,"done":0,"failed":0,"bad_status":0,"cpu_us_per_req":null,"server_cpu_pct":null,"client_cpu_pct":null,"idle_rss_kb":0,"peak_rss_kb":0,"probe":"server did not start","expect":"%s","probe_ok":false}\n' \
            "$cell" "$server" "$run" "$expect" >>"$RESULTS"
        return 0
    }
    read -r idle _ < <("${HELPER[@]}" mem "$SERVER_PID")
    if [[ $cell == *-rate ]]; then
        probe=$(curl -sk --max-time 5 -o /dev/null -w '%{http_code} %{size_download}B' "$url" || true)
        taskset -c "$CLIENT_CPU" timeout 10 h2load -n 200 -c 10 -t 1 \
            "$([[ $cell == proxy-h2-rate ]] && echo -m10 || echo --h1)" "$url" >/dev/null 2>&1 || true
    elif [[ $tool == oha ]]; then
        probe=$(timeout 10 "$OHA" --http-version 3 --insecure --no-tui --output-format json \
            -n 1 -c 1 "$url" 2>/dev/null | "${HELPER[@]}" oha-probe || true)
        # short warm-up, as for the other cells
        taskset -c "$CLIENT_CPU" timeout 10 "$OHA" --http-version 3 --insecure --no-tui \
            -n 200 -c 10 "$url" >/dev/null 2>&1 || true
    elif [[ $tool == wsbench ]]; then
        probe=$(timeout 10 "$WS_BENCH" probe "$url" || true)
    else
        local curl_proto=(--http1.1) h2load_proto=(--h1)
        if [[ $proto == h2 || $cell == cache-h2 || $cell == gzip-h2 || $cell == proxy-h2* ]]; then
            curl_proto=(--http2)
            h2load_proto=()
        fi
        probe=$(curl -sk --max-time 5 -o /dev/null -w '%{http_code} %{size_download}B' \
            "${curl_proto[@]}" "$url" || true)
        # short warm-up so both servers start the measured window with warm caches and pools
        taskset -c "$CLIENT_CPU" timeout 10 h2load -n 200 -c 10 -t 1 \
            "${h2load_proto[@]}" "$url" >/dev/null 2>&1 || true
    fi
    local log_arg=()
    [[ $tool == h2load ]] && log_arg=(--log "$tag.log")
    if [[ $cell == *-rate ]]; then
        rm -f "$tag.db" # oha appends to an existing database
        log_arg=(--oha-db "$tag.db" --steady-skip "$RATE_SKIP")
        [[ -n ${KEEP_WORK:-} ]] && log_arg+=(--keep-db)
    fi
    "${HELPER[@]}" measure --results "$RESULTS" --cell "$cell" \
        --server "$server" --run "$run" --tool "$tool" --server-pid "$SERVER_PID" \
        --idle-rss "${idle:-0}" --probe "${probe:-no answer}" --expect "$expect" --client-out "$tag.out" \
        --timeout $((DUR + 30)) --settle "${SETTLE:-0}" "${log_arg[@]}" \
        -- taskset -c "$CLIENT_CPU" "${cmd[@]}" &
    # in the background so that Ctrl-C / SIGTERM run the cleanup trap at once
    local helper=$!
    STARTED+=("$helper")
    wait "$helper" || true
    forget "$helper"
    stop_server
}

cells=()
for c in $ALL_CELLS; do selected "$c" && cells+=("$c"); done
((${#cells[@]})) || die "CELLS='$CELLS' matches none of: $ALL_CELLS"
log "cells: ${cells[*]}; servers: $SERVERS; DUR=${DUR}s, RUNS=$RUNS"

for ((run = 1; run <= RUNS; run++)); do
    for cell in "${cells[@]}"; do
        for server in $SERVERS; do
            run_cell "$cell" "$server" "$run"
        done
    done
done

# ----------------------------------------------------------------------------- report

if [[ -n ${BUILT:-} ]]; then
    rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
    git -C "$REPO" diff --quiet HEAD 2>/dev/null || rev="$rev (dirty tree)"
else
    rev="$SWEETY_BIN (prebuilt)"
fi
out_args=()
[[ -n $OUT ]] && out_args=(--out "$OUT")
"${HELPER[@]}" report "$RESULTS" "${out_args[@]}" \
    --meta "date=$(date -u '+%Y-%m-%d %H:%M UTC')" \
    --meta "machine=$(nproc) CPUs, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), Linux $(uname -r)" \
    --meta "sweety=$rev; nginx=$("$NGINX" -v 2>&1 | sed 's/.*\///')$([[ " $SERVERS " == *" haproxy "* ]] && echo "; haproxy=$("$HAPROXY" -v | sed -n '1s/^HAProxy version \([^ ]*\).*/\1/p')"); h2load=$(h2load --version | sed 's/.*\///'); $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)$([[ -x $OHA ]] && echo "; $("$OHA" --version 2>/dev/null)")" \
    --meta "setup=server on CPU $SERVER_CPU (one worker), load generator on CPU $CLIENT_CPU, backend on CPU $BACKEND_CPU; ${DUR}s per cell, $RUNS run(s)" \
    --meta "rate cells=$PROXY_RATE requests/s; p99 steady = over the requests due ${RATE_SKIP} s after the start or later (oha --db-url, every server alike), the goal's figure; p99 = the whole run's, oha's late start included"
[[ -n $OUT ]] && log "report written to $OUT"
exit 0
