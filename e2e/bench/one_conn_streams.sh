#!/usr/bin/env bash
# One HTTP/2 client connection with many concurrent streams through the proxy, on a runtime of
# several workers: whether the request phase of one connection's streams spreads over the
# workers (it did while every waiting stream was a tokio task; since 8ad2887 a connection polls
# its streams' futures itself, so all of them run where its task runs). Two backends: a plain
# HTTP/1.1 one (keep-alive) and a TLS one that closes after every answer, so every proxied
# request dials and handshakes (a pool that stays cold: the rustls client handshakes are the
# request phase's largest CPU cost).
#
# Usage: PORT_BASE=20700 e2e/bench/one_conn_streams.sh ROUNDS BINARY_A BINARY_B
#   Each round runs both binaries (the order alternates), each fresh, on both backends, with
#   h2load -c1 -m$STREAMS -n N (bounded by `timeout 120`), and prints one line per run:
#   requests per second, p50 and p99 (h2load's log), the server's CPU (utime + stime from /proc)
#   per request, and the 1-minute load average (a timing: read it beside the load).
# Environment: PORT_BASE (uses PORT_BASE+1..+3 and +9), WORKERS=2, STREAMS=128, N_TLS=2560,
#   N_PLAIN=25600. Needs nginx, h2load, openssl. Everything binds 127.0.0.1.
set -euo pipefail

ROUNDS=${1:?rounds}
A=${2:?binary A}
B=${3:?binary B}
BASE=${PORT_BASE:?PORT_BASE}
WORKERS=${WORKERS:-2}
STREAMS=${STREAMS:-128}
N_TLS=${N_TLS:-2560}
N_PLAIN=${N_PLAIN:-25600}
PLAIN=$((BASE + 1)) TLS=$((BASE + 2)) FRONT=$((BASE + 3)) ADMIN=$((BASE + 9))
D=$(mktemp -d)
BACKEND_PID=""
cleanup() {
    [[ -n $BACKEND_PID ]] && kill "$BACKEND_PID" 2>/dev/null
    rm -rf "$D"
}
trap cleanup EXIT

cd "$D"
mkdir -p backend/tmp
openssl ecparam -name prime256v1 -genkey -noout -out ca.key
openssl req -x509 -new -key ca.key -out ca.pem -days 3 -subj "/CN=bench ca" 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout -out leaf.key
openssl req -new -key leaf.key -out leaf.csr -subj "/CN=127.0.0.1" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >leaf.ext
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem -days 3 \
    -extfile leaf.ext 2>/dev/null
cat >backend.conf <<EOF
worker_processes 1;
daemon off;
pid $D/backend/nginx.pid;
error_log $D/backend/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $D/backend/tmp/body;
    proxy_temp_path $D/backend/tmp/proxy;
    fastcgi_temp_path $D/backend/tmp/fastcgi;
    uwsgi_temp_path $D/backend/tmp/uwsgi;
    scgi_temp_path $D/backend/tmp/scgi;
    keepalive_requests 1000000000;
    server {
        listen 127.0.0.1:$PLAIN;
        keepalive_timeout 75s;
        default_type text/plain;
        location / { return 200 "hello world\n"; }
    }
    server {
        listen 127.0.0.1:$TLS ssl;
        ssl_certificate $D/leaf.pem;
        ssl_certificate_key $D/leaf.key;
        ssl_protocols TLSv1.3;
        keepalive_timeout 0;
        default_type text/plain;
        location / { return 200 "hello world\n"; }
    }
}
EOF
cat >sweety.yaml <<EOF
version: 1
admin: {address: 127.0.0.1, port: $ADMIN}
access_log: {enabled: false}
limits: {drain_timeout: 1s}
listeners:
  - {name: plain, address: 127.0.0.1, port: $FRONT, protocol: http}
virtual_hosts:
  - name: bench
    routes:
      - name: tls
        matches: [{path: {prefix: /tls}}]
        action: {proxy: {backends: [{backend: tlsb}]}}
      - name: plain
        action: {proxy: {backends: [{backend: plainb}]}}
backends:
  - name: plainb
    protocol: http1
    endpoints: [{address: "127.0.0.1:$PLAIN"}]
  - name: tlsb
    protocol: https
    tls: {ca: {file: $D/ca.pem}}
    endpoints: [{address: "127.0.0.1:$TLS"}]
EOF
nginx -p "$D/backend/" -c "$D/backend.conf" &
BACKEND_PID=$!
sleep 0.5

tick=$(getconf CLK_TCK)
one() { # one LABEL BINARY PATH N
    local label=$1 bin=$2 path=$3 n=$4 pid c0 c1 out rps ok p
    RUST_LOG=warn "$bin" run --config "$D/sweety.yaml" --workers "$WORKERS" >/dev/null 2>>"$D/sweety.err" &
    pid=$!
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$FRONT") 2>/dev/null && break
        sleep 0.1
    done
    sleep 0.3
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    rm -f "$D/lat.log" # h2load appends to its log
    out=$(timeout 120 h2load -c1 -m"$STREAMS" -n "$n" -t1 --log-file "$D/lat.log" \
        "http://127.0.0.1:$FRONT$path" 2>&1 || true)
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rps=$(sed -n 's/.*finished in .*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out")
    ok=$(sed -n 's/^status codes: \([0-9]*\) 2xx.*/\1/p' <<<"$out")
    p=$(awk '{print $3}' "$D/lat.log" | sort -n |
        awk '{a[NR] = $1} END {printf "%.1f %.1f", a[int(NR * 0.5)] / 1000, a[int(NR * 0.99)] / 1000}')
    echo "$label $path n=$n 2xx=$ok rps=$rps p50/p99_ms=$p" \
        "server_cpu_us_per_req=$(((c1 - c0) * 1000000 / tick / n)) load=$(cut -d' ' -f1 /proc/loadavg)"
}
for r in $(seq "$ROUNDS"); do
    order="A B"
    ((r % 2)) || order="B A"
    for w in $order; do
        bin=$A
        [[ $w == B ]] && bin=$B
        one "$w r$r" "$bin" /tls "$N_TLS"
        one "$w r$r" "$bin" /plain "$N_PLAIN"
    done
done
