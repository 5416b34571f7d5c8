#!/usr/bin/env bash
# Instructions per request of the Sweety dataplane, counted by valgrind's callgrind: a count that
# does not depend on what else the machine runs (unlike a timing), for before/after comparisons
# on a loaded or shared machine.
#
# Usage:
#   e2e/bench/callgrind.sh BINARY [BINARY...]     # one line per binary and cell
#   CELLS="h2-1k cache-h2" TOP=25 e2e/bench/callgrind.sh BINARY   # and the costliest functions
#   CELLS="proxy-h1 proxy-h2" PEERS="haproxy nginx" e2e/bench/callgrind.sh BINARY   # the proxy
#                                                 # path beside HAProxy and nginx, and Sweety/HAProxy
#   CELLS="h1-100k h2-100k h3-100k" PEERS=nginx WARM=200 N1=1000 N2=2000 e2e/bench/callgrind.sh BINARY
#                                                 # bulk downloads, beside nginx (h1, h2)
#
# Environment:
#   CELLS="h1-1k h2-1k proxy-h1 cache-h2"   which cells (the run.sh cells of the same name; also
#                     proxy-h2 and proxy-h2-4k: the proxy path with an HTTP/2-over-TLS front,
#                     12-byte and 4 KB answers; proxy-h1s and proxy-h1s-4k: the same with an
#                     HTTP/1.1-over-TLS front; proxy-h2c and proxy-h2c-4k: the HTTP/2 front to an
#                     h2c backend, no nginx peer; h1-100k, h2-100k, and h3-100k with oha over HTTP/3;
#                     h3-1k, and h3-1k-p1 with one request at a time per connection; proxy-h3: the
#                     proxy path with an HTTP/3 front, 100 x 10 streams, Sweety only; every h3 cell
#                     needs N1 >= 1000, as oha -n N -p 10 opens only ceil(N / 10) connections)
#   N1=1000 N2=5000   the two measured windows (requests, on 100 new connections each; the
#                     proxy-h2 cells: on H2_CONNS)
#   H2_CONNS=10       connections of the proxy-h2 cells (10 streams each: H2_CONNS x 10 requests
#                     in flight; run.sh's cells have 100 x 10)
#   POOL_IDLE=        Sweety's `max_idle_per_endpoint` for the backend (default: unset, the
#                     dataplane's default, as in run.sh)
#   WARM=1000         requests of the warm-up before the counters are zeroed
#   OHA=              oha with HTTP/3 for the h3 cells (default: oha on PATH, else
#                     ~/.cache/sweety/tools/bin/oha, as in run.sh); or the dataplane's
#                     h3_bench example, which takes the same arguments (quinn + h3 with quinn's
#                     defaults; `cargo build --release -p sweety-dataplane --example h3_bench`,
#                     then OHA=<target>/release/examples/h3_bench): counts with it and with oha
#                     are not comparable, the two clients differ
#   SWEETY_HTTP3=     extra `http3:` settings for the h3 cells, as YAML flow-mapping entries
#                     (as in run.sh), e.g. "ack_eliciting_threshold: 8"
#   TOP_EVENT=Ir      the event TOP ranks by: Ir, or with CACHE_SIM=1 I1mr, D1mr, D1mw, ILmr, ...
#   TOP=0             print the TOP functions by instructions per request (self cost, from the
#                     two windows' difference, so the TLS handshakes cancel out)
#   SERVER_CPU=0 CLIENT_CPU=1   taskset CPU of the server (under valgrind) and of h2load and the backend
#   PORT_BASE=18540   ports on 127.0.0.1: TLS = base, plain = base+1, backend = base+2, admin = base+3,
#                     h2c backend = base+5
#   KEEP_WORK=1       keep the work dir (configs, callgrind dumps)
#   CACHE_SIM=        1: also simulate the caches (`--cache-sim=yes`, slower) and print each
#                     event per request from the two windows' difference: instruction fetch
#                     and data read/write misses of the first level (I1mr, D1mr, D1mw) and
#                     the last level (ILmr, DLmr, DLmw). Where a count ratio and a timed ratio
#                     differ, these tell whether cache misses take the difference (a count of
#                     valgrind's model of this machine's caches, not of its hardware)
#   SWEETY_LIMITS=    extra `limits:` settings of the Sweety config, as YAML flow-mapping entries
#                     (as in run.sh), e.g. "http1_engine: hyper" to count one binary's two engines
#   ORDER=FILE        instead of counting: write the link order of BINARY's functions to FILE
#                     (dataplane/symbol-order.txt, read by dataplane/build.rs): the functions an
#                     idle server runs, with run.sh's two probe connections, first, then those
#                     of a few requests of each of CELLS (default for ORDER: every cell below
#                     but the h3 ones), each group by instructions (e2e/bench/symbol_order.py)
#   PEERS=""          "haproxy nginx": also count HAProxy and nginx as the proxy of each proxy-*
#                     cell in CELLS, and nginx as the server of the static h1-*/h2-* cells (once
#                     per run, not per binary), then print each binary's ratio to them
#
# Method: run.sh's Sweety config (same routes, files, backend: a one-worker nginx answering
# "hello world\n"), with `header_read_timeout: 120s` so that 100 TLS handshakes under valgrind do
# not time out. The release binary runs under `valgrind --tool=callgrind` with one worker, glibc's
# `rep movsb` memcpy turned off (valgrind counts every byte a `rep movsb` moves as an instruction).
# Per cell: a fresh server, a warm-up of WARM requests (1,000 by default), counters zeroed, a window of N1 requests and
# one of N2 requests (h2load -c 100, each on new connections; H2: -m 10; proxy-h1: --h1 over plain
# HTTP; proxy-h1s*: --h1 over TLS; proxy-h2* and proxy-h2c*: -c H2_CONNS -m 10 over TLS; h3-100k: oha -c 100 -p 10 over HTTP/3, Sweety
# with `http3: true`), each dumped; per request = (Ir(N2) - Ir(N1)) / (N2 - N1), which cancels the handshakes
# and connection setup. Same-binary repeats differ by up to ~2 %. Everything listens on 127.0.0.1.
#
# Peers (PEERS; the proxy-* cells, and for nginx the static h1-*/h2-* cells too): HAProxy
# (Debian's haproxy) and nginx (Debian's nginx-light)
# as the proxy in front of the same backend, with run.sh's configs for the proxy cells: HAProxy
# nbthread 1, `option http-keep-alive` and `http-reuse always`, TLS 1.3 with ALPN h2; nginx one
# worker, `listen ssl http2`, an upstream with `keepalive 128` and `proxy_http_version 1.1`; nginx
# also serves the files of the static cells as run.sh's does (sendfile, open_file_cache; here
# `master_process off`, so that the one process under valgrind is the worker). Both run under
# the same valgrind command and glibc setting, with the same client, warm-up and windows; access logs off in all three. Caveat: valgrind runs a
# process's threads one at a time and counts instructions, not cycles, so a count weighs neither
# cache misses nor a syscall's kernel time (the syscalls themselves are not in any count; the
# three make similar ones per request: a read and a write each side, epoll).
set -euo pipefail

ORDER=${ORDER:-}
[[ -n $ORDER && -z ${CELLS:-} ]] &&
    CELLS="h1-1k h2-1k h1-100k h2-100k proxy-h1 proxy-h1s proxy-h1s-4k proxy-h2 proxy-h2-4k proxy-h2c proxy-h2c-4k cache-h2"
CELLS=${CELLS:-h1-1k h2-1k proxy-h1 cache-h2}
N1=${N1:-1000}
N2=${N2:-5000}
TOP=${TOP:-0}
TOP_EVENT=${TOP_EVENT:-Ir}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PORT_BASE=${PORT_BASE:-18540}
PEERS=${PEERS:-}
CACHE_SIM=${CACHE_SIM:-}
H2_CONNS=${H2_CONNS:-10}
POOL_IDLE=${POOL_IDLE:-}
WARM=${WARM:-1000}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cache/sweety/tools/bin/oha")}
TLS_PORT=$PORT_BASE
PLAIN_PORT=$((PORT_BASE + 1))
BACKEND_PORT=$((PORT_BASE + 2))
ADMIN_PORT=$((PORT_BASE + 3))
H2C_PORT=$((PORT_BASE + 5))

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
(($#)) || die "usage: $0 BINARY [BINARY...] (see the top of this file)"
for bin in "$@"; do [[ -x $bin ]] || die "not an executable: $bin"; done
for peer in $PEERS; do
    [[ $peer == haproxy || $peer == nginx ]] || die "unknown peer $peer (PEERS: haproxy, nginx)"
done
PROXY_CELLS=() STATIC_CELLS=()
for cell in $CELLS; do
    [[ $cell == proxy-* && $cell != proxy-h3 ]] && PROXY_CELLS+=("$cell")
    [[ $cell == h1-* || $cell == h2-* ]] && STATIC_CELLS+=("$cell")
done
peer_cells() { # peer_cells PEER: the cells of CELLS the peer runs (nginx: no h2c backend)
    local c
    for c in "${PROXY_CELLS[@]}"; do
        [[ $1 == nginx && $c == proxy-h2c* ]] || printf '%s\n' "$c"
    done
    [[ $1 == nginx ]] && printf '%s\n' "${STATIC_CELLS[@]}"
    return 0
}
for peer in $PEERS; do
    [[ -n $(peer_cells "$peer") ]] ||
        die "PEERS: $peer runs none of CELLS=$CELLS (haproxy: proxy-*; nginx: proxy-*, h1-*, h2-*)"
done
if [[ " $CELLS " == *" h3-"* || " $CELLS " == *" proxy-h3 "* ]]; then
    [[ -x $OHA ]] || die "the h3 cells need oha with HTTP/3 (OHA=, see run.sh)"
    # oha -n N opens at most ceil(N / streams) connections: a window below 100 x 10 requests
    # runs on fewer connections than the other, and the handshakes no longer cancel (N1=300
    # counted 70 extra handshakes in the difference: ~0.07 per request).
    ((N1 >= 1000)) || die "the h3 cells need N1 >= 1000 (oha -n N -p 10 opens ceil(N / 10) connections)"
fi

# Debian packages of the tools that are missing (as .ci/run does).
need=()
command -v valgrind >/dev/null || need+=(valgrind)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
command -v taskset >/dev/null || need+=(util-linux)
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || need+=(nginx-light)
if [[ " $PEERS " == *" haproxy "* ]]; then
    command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]] || need+=(haproxy)
fi
if ((${#need[@]})); then
    echo "installing ${need[*]}" >&2
    sudo=()
    ((EUID == 0)) || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get install -y -qq "${need[@]}" >&2 ||
        { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq "${need[@]}" >&2; }
fi
for tool in valgrind callgrind_control callgrind_annotate h2load openssl curl taskset; do
    command -v "$tool" >/dev/null || die "$tool is missing (Debian: valgrind, nghttp2-client, openssl, curl, util-linux)"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x $NGINX ]] || die "nginx is missing (Debian: nginx-light)"
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

WORK=$(mktemp -d -t sweety-callgrind.XXXXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [[ -n ${KEEP_WORK:-} ]]; then echo "work dir kept: $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$WORK/www" "$WORK/backend/tmp"
openssl ecparam -name prime256v1 -genkey -noout -out "$WORK/key.pem" 2>/dev/null
openssl req -x509 -new -key "$WORK/key.pem" -out "$WORK/cert.pem" -days 30 \
    -subj "/CN=127.0.0.1" -addext "subjectAltName=IP:127.0.0.1" 2>/dev/null
dd if=/dev/urandom of="$WORK/www/1k.bin" bs=1024 count=1 status=none
dd if=/dev/urandom of="$WORK/www/4k.bin" bs=1024 count=4 status=none
dd if=/dev/urandom of="$WORK/www/100k.bin" bs=1024 count=100 status=none
chmod -R a+rX "$WORK/www"

cat >"$WORK/backend.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/backend/nginx.pid;
error_log $WORK/backend/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000000;
    client_body_temp_path $WORK/backend/tmp/body;
    proxy_temp_path $WORK/backend/tmp/proxy;
    fastcgi_temp_path $WORK/backend/tmp/fastcgi;
    uwsgi_temp_path $WORK/backend/tmp/uwsgi;
    scgi_temp_path $WORK/backend/tmp/scgi;
    server {
        listen 127.0.0.1:$BACKEND_PORT;
        default_type text/plain;
        location = /proxy4k { alias $WORK/www/4k.bin; }
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
# run.sh's Sweety config (the routes these cells use), with a header timeout for valgrind's pace.
cat >"$WORK/sweety.yaml" <<EOF
version: 1
admin: {address: 127.0.0.1, port: $ADMIN_PORT}
access_log: {enabled: false}
limits: {drain_timeout: 1s, header_read_timeout: 120s${SWEETY_LIMITS:+, $SWEETY_LIMITS}}
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
        matches: [{path: {exact: /proxy4k}}]
        action: {proxy: {backends: [{backend: hello}]}}
      - name: h2c
        matches: [{path: {prefix: /h2c}}, {path: {exact: /h2c4k}}]
        action: {proxy: {backends: [{backend: hello-h2c}]}}
      - name: cached
        matches: [{path: {prefix: /cached}}]
        filters: [{cache: {ttl: 10m}}]
        action: {proxy: {backends: [{backend: hello}]}}
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
EOF
sed 's/^    http3: false$/    http3: true/' "$WORK/sweety.yaml" >"$WORK/sweety-h3.yaml"
[[ -n ${SWEETY_HTTP3:-} ]] && printf 'http3: {%s}\n' "$SWEETY_HTTP3" >>"$WORK/sweety-h3.yaml"

# The peers as proxies of the proxy cells: run.sh's configs for them (the plain port for proxy-h1,
# TLS with HTTP/2 for proxy-h2*).
cat "$WORK/cert.pem" "$WORK/key.pem" >"$WORK/haproxy.pem"
mkdir -p "$WORK/nginx/tmp"
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
master_process off;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    default_type application/octet-stream;
    tcp_nodelay on;
    sendfile on;
    tcp_nopush on;
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
    server {
        listen 127.0.0.1:$PLAIN_PORT;
        location /proxy {
            proxy_pass http://hello;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
    server {
        listen 127.0.0.1:$TLS_PORT ssl http2;
        ssl_certificate $WORK/cert.pem;
        ssl_certificate_key $WORK/key.pem;
        ssl_protocols TLSv1.3;
        root $WORK/www;
        location /proxy {
            proxy_pass http://hello;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
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
frontend plain
    bind 127.0.0.1:$PLAIN_PORT
    default_backend hello
frontend tls
    bind 127.0.0.1:$TLS_PORT ssl crt $WORK/haproxy.pem alpn h2,http/1.1
    use_backend h2c if { path_beg /h2c }
    default_backend hello
backend hello
    server be 127.0.0.1:$BACKEND_PORT
backend h2c
    server be 127.0.0.1:$H2C_PORT proto h2
EOF
for peer in $PEERS; do
    case $peer in
        haproxy) "$HAPROXY" -c -q -f "$WORK/haproxy.cfg" || die "the generated HAProxy config is invalid" ;;
        nginx) "$NGINX" -t -q -p "$WORK/nginx/" -c "$WORK/nginx.conf" -e "$WORK/nginx/error.log" ||
            die "the generated nginx config is invalid" ;;
    esac
done

taskset -c "$CLIENT_CPU" "$NGINX" -p "$WORK/backend/" -c "$WORK/backend.conf" -e "$WORK/backend/error.log" &
PIDS+=("$!")
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$BACKEND_PORT/" && break; sleep 0.1; done

load() { # load CELL N: N requests on 100 (proxy-h2*: H2_CONNS) new connections
    local args=(-c 100 -t 1 -n "$2") out ok
    [[ $1 == proxy-h2* ]] && args=(-c "$H2_CONNS" -t 1 -n "$2")
    case $1 in
        h1-1k | h1-100k) args+=(--h1 "https://127.0.0.1:$TLS_PORT/${1#h1-}.bin") ;;
        h2-1k | h2-100k) args+=(-m 10 "https://127.0.0.1:$TLS_PORT/${1#h2-}.bin") ;;
        h3-100k | h3-1k | h3-1k-p1 | proxy-h3)
            local path=${1#h3-}.bin streams=10
            [[ $1 == *-p1 ]] && path=${path%-p1.bin}.bin streams=1
            [[ $1 == proxy-h3 ]] && path=proxy
            # --connect-timeout: 100 QUIC handshakes under valgrind on a loaded machine take
            # longer than oha's 5 s default, and a connection that gives up fails its requests.
            # h3_bench takes it as each handshake's and request's deadline: 1,000 concurrent
            # 100 KB responses all end near the window's end, minutes in at valgrind's pace.
            out=$(taskset -c "$CLIENT_CPU" timeout 600 "$OHA" --http-version 3 --insecure --no-tui \
                --connect-timeout 540s --output-format json -c 100 -p "$streams" -n "$2" "https://127.0.0.1:$TLS_PORT/$path")
            ok=$(python3 -c 'import json, sys; print(json.load(sys.stdin).get("statusCodeDistribution", {}).get("200", 0))' <<<"$out")
            [[ $ok == "$2" ]] || die "$1: $ok of $2 requests got 200 (${out:0:400})"
            return 0
            ;;
        cache-h2) args+=(-m 10 -H "accept-encoding: gzip" "https://127.0.0.1:$TLS_PORT/cached") ;;
        proxy-h1) args+=(--h1 "http://127.0.0.1:$PLAIN_PORT/proxy") ;;
        proxy-h2) args+=(-m 10 "https://127.0.0.1:$TLS_PORT/proxy") ;;
        proxy-h2-4k) args+=(-m 10 "https://127.0.0.1:$TLS_PORT/proxy4k") ;;
        proxy-h1s) args+=(--h1 "https://127.0.0.1:$TLS_PORT/proxy") ;;
        proxy-h1s-4k) args+=(--h1 "https://127.0.0.1:$TLS_PORT/proxy4k") ;;
        proxy-h2c) args+=(-m 10 "https://127.0.0.1:$TLS_PORT/h2c") ;;
        proxy-h2c-4k) args+=(-m 10 "https://127.0.0.1:$TLS_PORT/h2c4k") ;;
        *) die "unknown cell $1" ;;
    esac
    local out
    out=$(taskset -c "$CLIENT_CPU" timeout 600 h2load "${args[@]}")
    grep -q "requests: $2 total, $2 started, $2 done, $2 succeeded" <<<"$out" ||
        die "$1: not all of $2 requests succeeded: $(grep '^requests:' <<<"$out")"
}

total() { sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$1" | head -1; }

# A dump's total of one event (Ir, or with CACHE_SIM I1mr, D1mr, D1mw, ...).
event_total() { # event_total DUMP EVENT
    paste <(sed -n 's/^events: *//p' "$1" | tr ' ' '\n') \
        <(sed -n 's/^\(summary\|totals\): *//p' "$1" | head -1 | tr ' ' '\n') |
        awk -v e="$2" '$1 == e { print $2 }'
}

# Self cost per function in a dump, "COUNT<TAB>function" lines of the event TOP_EVENT (without
# the frames that were on the stack when the dump was taken, which callgrind_annotate shows with
# the whole dump's total). One event column only (--show): with CACHE_SIM the other events'
# columns would otherwise end up in the function's name, and no function of one dump would
# match its other dump's.
functions() { callgrind_annotate --inclusive=no --threshold=100 --show="$TOP_EVENT" --sort="$TOP_EVENT" "$1" 2>/dev/null |
    sed -n 's/^ *\([0-9,]*\) ([ 0-9.%]*) *\(.*\)$/\1\t\2/p' | tr -d , |
    awk -F '\t' -v t="$(event_total "$1" "$TOP_EVENT")" '$1 != t'; }

declare -A PER_REQUEST # "label cell" -> instructions per request

measure() { # measure LABEL CELL COMMAND...: COMMAND (a server) under callgrind, serving CELL
    local label=$1 cell=$2 dir pid i probe
    shift 2
    dir=$WORK/$cell.$(basename "${label// /-}").$RANDOM
    mkdir -p "$dir"
    GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4294967295 taskset -c "$SERVER_CPU" \
        valgrind --tool=callgrind ${CACHE_SIM:+--cache-sim=yes} --callgrind-out-file="$dir/cg.out" \
        "$@" >"$dir/server.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    case $cell in
        proxy-h1) probe=(curl -s -o /dev/null --max-time 5 "http://127.0.0.1:$PLAIN_PORT/proxy") ;;
        proxy-h2*) probe=(curl -skf --http2 -o /dev/null --max-time 5 "https://127.0.0.1:$TLS_PORT/proxy") ;;
        proxy-h1s*) probe=(curl -skf --http1.1 -o /dev/null --max-time 5 "https://127.0.0.1:$TLS_PORT/proxy") ;;
        *) probe=(curl -sk -o /dev/null --max-time 5 "https://127.0.0.1:$TLS_PORT/1k.bin") ;;
    esac
    for ((i = 0; i < 600; i++)); do
        "${probe[@]}" && break
        kill -0 "$pid" 2>/dev/null || die "$label did not start: $(tail -5 "$dir/server.log")"
        sleep 0.5
    done
    load "$cell" "$WARM" # warm-up
    callgrind_control -z "$pid" >/dev/null 2>&1
    load "$cell" "$N1"
    callgrind_control -d "$cell-$N1" "$pid" >/dev/null 2>&1
    load "$cell" "$N2"
    callgrind_control -d "$cell-$N2" "$pid" >/dev/null 2>&1
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    local d1 d2 i1 i2
    d1=$dir/cg.out.1
    d2=$dir/cg.out.2
    [[ -f $d1 && -f $d2 ]] || die "no callgrind dumps in $dir"
    i1=$(total "$d1")
    i2=$(total "$d2")
    PER_REQUEST["$label $cell"]=$(((i2 - i1) / (N2 - N1)))
    printf '%-40s %-9s Ir(%d)=%-12s Ir(%d)=%-12s per request: %d\n' "$label" "$cell" "$N1" "$i1" \
        "$N2" "$i2" "${PER_REQUEST["$label $cell"]}"
    if [[ -n $CACHE_SIM ]]; then # every event of the dumps, per request
        paste <(sed -n 's/^events: *//p' "$d1" | tr ' ' '\n') \
            <(sed -n 's/^\(summary\|totals\): *//p' "$d1" | head -1 | tr ' ' '\n') \
            <(sed -n 's/^\(summary\|totals\): *//p' "$d2" | head -1 | tr ' ' '\n') |
            awk -v d=$((N2 - N1)) '{ printf "%s=%.1f ", $1, ($3 - $2) / d } END { print "per request" }'
    fi
    if ((TOP > 0)); then
        join -t $'\t' -j 2 -a 2 -e 0 -o 0,1.1,2.1 <(functions "$d1" | sort -t $'\t' -k2,2) \
            <(functions "$d2" | sort -t $'\t' -k2,2) |
            awk -F '\t' -v d=$((N2 - N1)) -v f="$([[ $TOP_EVENT == Ir ]] && echo %10.0f || echo %10.1f)" '{ printf f "  %s\n", ($3 - $2) / d, $1 }' |
            sort -rn | head -n "$TOP" || true # head closes the pipe early
    fi
}

profile_order() { # profile_order BINARY: writes $ORDER (see ORDER at the top)
    local bin=$1 dir=$WORK/order pid i cell
    mkdir -p "$dir"
    # Started as run.sh starts it (one worker, warn logs), the counters zeroed when the start-up
    # code is released (release_startup_code_logged in dataplane/src/main.rs, once the first
    # config serves): what runs from there on is what an idle server has mapped.
    GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4294967295 RUST_LOG=warn taskset -c "$SERVER_CPU" \
        valgrind --tool=callgrind --demangle=no --zero-before='*release_startup_code_logged*' \
        --callgrind-out-file="$dir/cg.out" \
        "$bin" run --config "$WORK/sweety.yaml" --workers 1 >"$dir/server.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    # Left alone until it listens (a connection before the release would leave its first-use
    # code out) and a moment more, for the release.
    for ((i = 0; i < 600; i++)); do
        [[ -n $(ss -Hltn "sport = :$TLS_PORT") && -n $(ss -Hltn "sport = :$PLAIN_PORT") ]] && break
        kill -0 "$pid" 2>/dev/null || die "$bin did not start: $(tail -5 "$dir/server.log")"
        sleep 0.5
    done
    sleep 2
    # run.sh's idle probe: one connect and close per port (bench_helper.py port-state), then idle
    python3 -B "$(dirname "$0")/bench_helper.py" port-state "$TLS_PORT" open 0
    python3 -B "$(dirname "$0")/bench_helper.py" port-state "$PLAIN_PORT" open 0
    sleep 3
    callgrind_control -d idle "$pid" >/dev/null 2>&1
    for cell in $CELLS; do
        load "$cell" 200
    done
    callgrind_control -d requests "$pid" >/dev/null 2>&1
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    [[ -f $dir/cg.out.1 && -f $dir/cg.out.2 ]] || die "no callgrind dumps in $dir"
    python3 -B "$(dirname "$0")/symbol_order.py" "$bin" "$dir/cg.out.1" "$dir/cg.out.2" >"$ORDER.tmp"
    [[ -s $ORDER.tmp ]] || die "no function of $bin in the dumps"
    mv "$ORDER.tmp" "$ORDER"
    echo "$ORDER: $(grep -vc "^#" "$ORDER") functions, $(sed -n "2,/^# dump 2/p" "$ORDER" | grep -vc "^#") of them run by the idle server"
}

if [[ -n $ORDER ]]; then
    (($# == 1)) || die "ORDER= takes one binary"
    profile_order "$1"
    exit 0
fi

for bin in "$@"; do
    for cell in $CELLS; do
        config=$WORK/sweety.yaml
        [[ $cell == h3-* || $cell == proxy-h3 ]] && config=$WORK/sweety-h3.yaml
        measure "$bin" "$cell" "$bin" run --config "$config" --workers 1
    done
done
PEER_LABELS=()
for peer in $PEERS; do
    case $peer in
        haproxy) PEER_LABELS+=("haproxy $("$HAPROXY" -v | sed -n 's/^HAProxy version \([^ ]*\).*/\1/p')") ;;
        nginx) PEER_LABELS+=("nginx $("$NGINX" -v 2>&1 | sed -n 's|^nginx version: nginx/||p')") ;;
    esac
    for cell in $(peer_cells "$peer"); do
        case $peer in
            haproxy) # -db: foreground, one process
                measure "${PEER_LABELS[-1]}" "$cell" "$HAPROXY" -db -f "$WORK/haproxy.cfg" ;;
            nginx)
                measure "${PEER_LABELS[-1]}" "$cell" \
                    "$NGINX" -p "$WORK/nginx/" -c "$WORK/nginx.conf" -e "$WORK/nginx/error.log" ;;
        esac
    done
done
for bin in "$@"; do
    for peer in "${PEER_LABELS[@]}"; do
        for cell in $CELLS; do
            [[ -n ${PER_REQUEST["$peer $cell"]:-} ]] || continue
            awk -v c="$cell" -v b="$bin" -v p="$peer" -v x="${PER_REQUEST["$bin $cell"]}" \
                -v y="${PER_REQUEST["$peer $cell"]}" 'BEGIN { printf "%s %s / %s: %.2fx\n", c, b, p, x / y }'
        done
    done
done
