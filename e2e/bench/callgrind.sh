#!/usr/bin/env bash
# Instructions per request of the Sweety dataplane, counted by valgrind's callgrind: a count that
# does not depend on what else the machine runs (unlike a timing), for before/after comparisons
# on a loaded or shared machine.
#
# Usage:
#   e2e/bench/callgrind.sh BINARY [BINARY...]     # one line per binary and cell
#   CELLS="h2-1k cache-h2" TOP=25 e2e/bench/callgrind.sh BINARY   # and the costliest functions
#
# Environment:
#   CELLS="h1-1k h2-1k proxy-h1 cache-h2"   which cells (the run.sh cells of the same name)
#   N1=1000 N2=5000   the two measured windows (requests, on 100 new connections each)
#   TOP=0             print the TOP functions by instructions per request (self cost, from the
#                     two windows' difference, so the TLS handshakes cancel out)
#   SERVER_CPU=0 CLIENT_CPU=1   taskset CPU of the server (under valgrind) and of h2load and the backend
#   PORT_BASE=18540   ports on 127.0.0.1: TLS = base, plain = base+1, backend = base+2, admin = base+3
#   KEEP_WORK=1       keep the work dir (configs, callgrind dumps)
#
# Method: run.sh's Sweety config (same routes, files, backend: a one-worker nginx answering
# "hello world\n"), with `header_read_timeout: 120s` so that 100 TLS handshakes under valgrind do
# not time out. The release binary runs under `valgrind --tool=callgrind` with one worker, glibc's
# `rep movsb` memcpy turned off (valgrind counts every byte a `rep movsb` moves as an instruction).
# Per cell: a fresh server, a 1,000-request warm-up, counters zeroed, a window of N1 requests and
# one of N2 requests (h2load -c 100, each on new connections; H2: -m 10; proxy-h1: --h1 over plain
# HTTP), each dumped; per request = (Ir(N2) - Ir(N1)) / (N2 - N1), which cancels the handshakes
# and connection setup. Same-binary repeats differ by up to ~2 %. Everything listens on 127.0.0.1.
set -euo pipefail

CELLS=${CELLS:-h1-1k h2-1k proxy-h1 cache-h2}
N1=${N1:-1000}
N2=${N2:-5000}
TOP=${TOP:-0}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PORT_BASE=${PORT_BASE:-18540}
TLS_PORT=$PORT_BASE
PLAIN_PORT=$((PORT_BASE + 1))
BACKEND_PORT=$((PORT_BASE + 2))
ADMIN_PORT=$((PORT_BASE + 3))

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
(($#)) || die "usage: $0 BINARY [BINARY...] (see the top of this file)"
for bin in "$@"; do [[ -x $bin ]] || die "not an executable: $bin"; done
for tool in valgrind callgrind_control callgrind_annotate h2load openssl curl taskset; do
    command -v "$tool" >/dev/null || die "$tool is missing (Debian: valgrind, nghttp2-client, openssl, curl, util-linux)"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x $NGINX ]] || die "nginx is missing (Debian: nginx-light)"

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
        location / { return 200 "hello world\n"; }
    }
}
EOF
# run.sh's Sweety config (the routes these cells use), with a header timeout for valgrind's pace.
cat >"$WORK/sweety.yaml" <<EOF
version: 1
admin: {address: 127.0.0.1, port: $ADMIN_PORT}
access_log: {enabled: false}
limits: {drain_timeout: 1s, header_read_timeout: 120s}
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
    max_idle_per_endpoint: 128
EOF

taskset -c "$CLIENT_CPU" "$NGINX" -p "$WORK/backend/" -c "$WORK/backend.conf" -e "$WORK/backend/error.log" &
PIDS+=("$!")
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$BACKEND_PORT/" && break; sleep 0.1; done

load() { # load CELL N: N requests on 100 new connections
    local args=(-c 100 -t 1 -n "$2")
    case $1 in
        h1-1k) args+=(--h1 "https://127.0.0.1:$TLS_PORT/1k.bin") ;;
        h2-1k) args+=(-m 10 "https://127.0.0.1:$TLS_PORT/1k.bin") ;;
        cache-h2) args+=(-m 10 -H "accept-encoding: gzip" "https://127.0.0.1:$TLS_PORT/cached") ;;
        proxy-h1) args+=(--h1 "http://127.0.0.1:$PLAIN_PORT/proxy") ;;
        *) die "unknown cell $1" ;;
    esac
    local out
    out=$(taskset -c "$CLIENT_CPU" timeout 600 h2load "${args[@]}")
    grep -q "requests: $2 total, $2 started, $2 done, $2 succeeded" <<<"$out" ||
        die "$1: not all of $2 requests succeeded: $(grep '^requests:' <<<"$out")"
}

total() { sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$1" | head -1; }

# Self cost per function in a dump, "Ir<TAB>function" lines (without the frames that were on the
# stack when the dump was taken, which callgrind_annotate shows with the whole dump's total).
functions() { callgrind_annotate --inclusive=no --threshold=100 "$1" 2>/dev/null |
    sed -n 's/^ *\([0-9,]*\) ([ 0-9.%]*) *\(.*\)$/\1\t\2/p' | tr -d , |
    awk -F '\t' -v t="$(total "$1")" '$1 != t'; }

measure() { # measure BINARY CELL
    local bin=$1 cell=$2 dir pid i
    dir=$WORK/$cell.$(basename "$bin").$RANDOM
    mkdir -p "$dir"
    GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4294967295 taskset -c "$SERVER_CPU" \
        valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
        "$bin" run --config "$WORK/sweety.yaml" --workers 1 >"$dir/server.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    for ((i = 0; i < 600; i++)); do
        curl -sk -o /dev/null --max-time 5 "https://127.0.0.1:$TLS_PORT/1k.bin" &&
            curl -s -o /dev/null --max-time 5 "http://127.0.0.1:$PLAIN_PORT/proxy" && break
        kill -0 "$pid" 2>/dev/null || die "the server did not start: $(tail -5 "$dir/server.log")"
        sleep 0.5
    done
    load "$cell" 1000 # warm-up
    callgrind_control -z "$pid" >/dev/null
    load "$cell" "$N1"
    callgrind_control -d "$cell-$N1" "$pid" >/dev/null
    load "$cell" "$N2"
    callgrind_control -d "$cell-$N2" "$pid" >/dev/null
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    local d1 d2 i1 i2
    d1=$dir/cg.out.1
    d2=$dir/cg.out.2
    [[ -f $d1 && -f $d2 ]] || die "no callgrind dumps in $dir"
    i1=$(total "$d1")
    i2=$(total "$d2")
    printf '%-40s %-9s Ir(%d)=%-12s Ir(%d)=%-12s per request: %d\n' "$bin" "$cell" "$N1" "$i1" \
        "$N2" "$i2" $(((i2 - i1) / (N2 - N1)))
    if ((TOP > 0)); then
        join -t $'\t' -j 2 -a 2 -e 0 -o 0,1.1,2.1 <(functions "$d1" | sort -t $'\t' -k2,2) \
            <(functions "$d2" | sort -t $'\t' -k2,2) |
            awk -F '\t' -v d=$((N2 - N1)) '{ printf "%10.0f  %s\n", ($3 - $2) / d, $1 }' |
            sort -rn | head -n "$TOP" || true # head closes the pipe early
    fi
}

for bin in "$@"; do
    for cell in $CELLS; do
        measure "$bin" "$cell"
    done
done
