#!/usr/bin/env bash
# e2e/cluster/up.sh — build (if missing) and start a real, docker-less Kubernetes control plane on 127.0.0.1:
#   etcd (3.6.x, built from the Go module proxy)
#   kube-apiserver / kube-controller-manager / kube-scheduler (built from k8s.io/kubernetes via the Go module proxy)
# No kubelet, no container runtime: Pods get scheduled to Node objects but nothing runs them
# (the e2e node agent runs them; see shared notes on the local control plane).
# Adopted from the k8slocal prototype; Sweety owns it now.
#
# Usage:  e2e/cluster/up.sh            # build if needed, generate PKI if needed, start, wait for readiness
#         e2e/cluster/up.sh --build-only
#         e2e/cluster/down.sh [--purge]
#         export KUBECONFIG=$SWEETY_CLUSTER_DIR/run/kubeconfig   (default ~/.cache/sweety/cluster)
#
# Binaries are cached under ~/.cache/sweety/k8s/<versions>/bin, keyed by version (K8S_VERSION, ETCD_VERSION).
# Knobs (env): SWEETY_CLUSTER_DIR (state: PKI, etcd data, logs, pid files), ETCD_PORT, ETCD_PEER_PORT,
# APISERVER_PORT, KCM_PORT, SCHED_PORT (give each concurrent cluster its own), POD_CIDRS (node-agent networks
# whose .1 the apiserver certificate names), SERVICE_CIDR, CLUSTER_CIDR, AUTHZ_MODE, KCM_CONTROLLERS,
# START_KCM, START_SCHEDULER, ETCD_DATA_DIR; for a real kubelet (e2e/realnode): WITH_NODE=1 (builds kubelet and
# kube-proxy too; the apiserver gets a kubelet client certificate and reaches nodes by InternalIP),
# APISERVER_ADDRESS (bind/advertise address and the kubeconfigs' server; default 127.0.0.1; Pods reach the
# apiserver only when it is an address of their bridge), ENDPOINT_RECONCILER (default none; lease publishes
# APISERVER_ADDRESS as the endpoint of the `kubernetes` Service).
#
# Requirements: go (>=1.24; 1.26 tested), openssl, curl, python3 (only for parsing `go mod download -json`).
set -euo pipefail

ROOT=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster}
K8S_VERSION=${K8S_VERSION:-1.34.4}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
CACHE=${SWEETY_CACHE:-$HOME/.cache/sweety}
BIN=${SWEETY_K8S_BIN:-$CACHE/k8s/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/bin}
SRC=$CACHE/k8s/src
export GOFLAGS=${GOFLAGS:--buildvcs=false} GOTOOLCHAIN=${GOTOOLCHAIN:-local}
RUN=$ROOT/run
LOG=$ROOT/logs
PKI=$RUN/pki
ETCD_DATA_DIR=${ETCD_DATA_DIR:-$RUN/etcd-data}   # put it on /dev/shm for speed if you like

ETCD_PORT=${ETCD_PORT:-2379}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-2380}
APISERVER_PORT=${APISERVER_PORT:-6443}
APISERVER_ADDRESS=${APISERVER_ADDRESS:-127.0.0.1}
ENDPOINT_RECONCILER=${ENDPOINT_RECONCILER:-none}
WITH_NODE=${WITH_NODE:-0}
KCM_PORT=${KCM_PORT:-10257}
SCHED_PORT=${SCHED_PORT:-10259}
SERVICE_CIDR=${SERVICE_CIDR:-10.96.0.0/16}
SERVICE_API_IP=${SERVICE_API_IP:-10.96.0.1}
CLUSTER_CIDR=${CLUSTER_CIDR:-10.244.0.0/16}
# The node agents' Pod networks (comma-separated /24s; each agent's bridge gets .1). Pods reach the apiserver
# through the agent's relay on that .1 address, so the serving certificate names each of them (it is remade
# when this list changes). The default covers 10.244.0.0/24 ... 10.251.0.0/24, the networks the e2e
# harnesses use (see e2e/README.md: the agent's default, install.sh, conformance, CI, the agent's own test).
POD_CIDRS=${POD_CIDRS:-10.244.0.0/24,10.245.0.0/24,10.246.0.0/24,10.247.0.0/24,10.248.0.0/24,10.249.0.0/24,10.250.0.0/24,10.251.0.0/24}
NODE_IP_SANS=""
IFS=, read -r -a _cidrs <<< "$POD_CIDRS"
for c in "${_cidrs[@]}"; do
  case $c in
    *.0/24) NODE_IP_SANS="$NODE_IP_SANS,IP:${c%.0/24}.1" ;;
    *) echo "POD_CIDRS: each entry must be a.b.c.0/24, got '$c'" >&2; exit 2 ;;
  esac
done
AUTHZ_MODE=${AUTHZ_MODE:-Node,RBAC}                # or AlwaysAllow
# node-lifecycle-controller would mark heartbeat-less fake Nodes NotReady/unreachable after ~50s and
# taint them (then evict pods). Disabled by default; set KCM_CONTROLLERS='*' when using kwok (it heartbeats).
KCM_CONTROLLERS=${KCM_CONTROLLERS:-*,-node-lifecycle-controller}
START_KCM=${START_KCM:-1}
START_SCHEDULER=${START_SCHEDULER:-1}

mkdir -p "$BIN" "$SRC" "$RUN" "$LOG" "$PKI"
export PATH="$BIN:$PATH"   # our kubectl (same version as the apiserver) first
t0=$(date +%s.%N)
log() { printf '[up %6.1fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')" "$*"; }
# shellcheck source=e2e/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# ---------------------------------------------------------------- build
k8s_module() {
  local d=$SRC/k8s
  mkdir -p "$d"
  if [ ! -f "$d/go.mod" ] || ! grep -q "k8s.io/kubernetes v$K8S_VERSION" "$d/go.mod" || ! grep -q cmd/kube-proxy "$d/tools.go"; then
    log "generating Go module for k8s.io/kubernetes v$K8S_VERSION in $d"
    ( cd "$d"
      rm -f go.mod go.sum
      local gomod
      gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
      # k8s.io/kubernetes requires its staging repos as v0.0.0 (+ replace => ./staging/src/...);
      # point each at the published v0.<minor>.<patch> tag instead.
      local mods
      mods=$(grep -E '^\s+k8s.io/[a-z0-9-]+ v0.0.0$' "$gomod" | awk '{print $1}')
      { echo "module k8slocal/k8s"; echo; echo "go 1.24"; echo
        echo "require k8s.io/kubernetes v$K8S_VERSION"
        for m in $mods; do echo "replace $m => $m v0.${K8S_VERSION#1.}"; done
      } > go.mod
      printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n\t_ "k8s.io/kubernetes/cmd/kubectl"\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n\t_ "k8s.io/kubernetes/cmd/kube-proxy"\n)\n' > tools.go
      go mod tidy )
  fi
}
k8s_ldflags() {
  local minor=${K8S_VERSION#1.}; minor=${minor%%.*}
  local ldf="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  echo "$ldf"
}
build_k8s() {
  local d=$SRC/k8s ldf
  k8s_module
  ldf=$(k8s_ldflags)
  log "building kube-apiserver kube-controller-manager kube-scheduler v$K8S_VERSION (measured: ~4.6 min with an empty GOCACHE on 2 idle cores, ~3 GB GOCACHE; seconds when cached)"
  ( cd "$d" && go build -ldflags "$ldf" -o "$BIN/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubectl )
}
# The node binaries (e2e/realnode: a real kubelet with containerd), only when WITH_NODE=1.
build_node() {
  local d=$SRC/k8s ldf
  k8s_module
  ldf=$(k8s_ldflags)
  log "building kubelet kube-proxy v$K8S_VERSION (about a minute once the apiserver's Go cache is warm)"
  ( cd "$d" && go build -ldflags "$ldf" -o "$BIN/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy )
}

build_etcd() {
  local d=$SRC/etcd
  mkdir -p "$d"
  if [ ! -f "$d/go.mod" ] || ! grep -q "go.etcd.io/etcd/server/v3 v$ETCD_VERSION" "$d/go.mod"; then
    log "generating Go module for etcd v$ETCD_VERSION in $d"
    ( cd "$d"
      rm -f go.mod go.sum
      # `go install go.etcd.io/etcd/server/v3@vX` is refused (etcd's go.mod has replace directives),
      # so use a wrapper module and `go build` the main packages of the dependency.
      printf 'module k8slocal/etcd\n\ngo 1.24\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 v%s\n\tgo.etcd.io/etcd/etcdctl/v3 v%s\n)\n' "$ETCD_VERSION" "$ETCD_VERSION" > go.mod
      printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "go.etcd.io/etcd/etcdctl/v3"\n\t_ "go.etcd.io/etcd/server/v3"\n)\n' > tools.go
      go mod tidy )
  fi
  log "building etcd + etcdctl v$ETCD_VERSION"
  ( cd "$d" && go build -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3 \
            && go build -ldflags "-s -w" -o "$BIN/etcdctl" go.etcd.io/etcd/etcdctl/v3 )
}

for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [ -x "$BIN/$b" ] || { build_k8s; break; }
done
[ -x "$BIN/etcd" ] || build_etcd
if [ "$WITH_NODE" = 1 ]; then
  for b in kubelet kube-proxy; do
    [ -x "$BIN/$b" ] || { build_node; break; }
  done
fi
if [ "${1:-}" = "--build-only" ]; then log "binaries in $BIN"; exit 0; fi

# ---------------------------------------------------------------- PKI (once)
if [ ! -f "$PKI/ca.crt" ]; then
  log "generating PKI in $PKI"
  ( cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=k8slocal-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    # admin client cert (O=system:masters) for client-cert auth
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=kubernetes-admin" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > client.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 3650 -extfile client.ext 2>/dev/null
    # service-account signing key
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    # static bearer tokens: token,user,uid,"groups"
    ADMIN_TOKEN=$(openssl rand -hex 16); KCM_TOKEN=$(openssl rand -hex 16); SCHED_TOKEN=$(openssl rand -hex 16)
    { echo "$ADMIN_TOKEN,admin,uid-admin,\"system:masters\""
      echo "$KCM_TOKEN,system:kube-controller-manager,uid-kcm,\"system:masters\""
      echo "$SCHED_TOKEN,system:kube-scheduler,uid-sched,\"system:masters\""
    } > tokens.csv
    chmod 600 ./*.key tokens.csv )
fi
# The apiserver's client certificate for kubelets (logs, exec, port-forward on a real node).
if [ "$WITH_NODE" = 1 ] && [ ! -f "$PKI/apiserver-kubelet-client.crt" ]; then
  ( cd "$PKI"
    openssl req -newkey rsa:2048 -nodes -keyout apiserver-kubelet-client.key -out apiserver-kubelet-client.csr \
      -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > client.ext
    openssl x509 -req -in apiserver-kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out apiserver-kubelet-client.crt -days 3650 -extfile client.ext 2>/dev/null
    chmod 600 apiserver-kubelet-client.key )
fi
# apiserver serving cert (a proper leaf cert: rustls/webpki rejects self-signed CA-as-leaf certs); remade
# when its SANs change (e.g. other POD_CIDRS). The apiserver reloads it from disk.
san="IP:127.0.0.1,IP:$SERVICE_API_IP$NODE_IP_SANS,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
ext=$(printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=%s' "$san")
if [ ! -f "$PKI/apiserver.crt" ] || [ "$(cat "$PKI/apiserver.ext" 2>/dev/null)" != "$ext" ]; then
  log "generating apiserver serving certificate (SANs $san)"
  ( cd "$PKI"
    printf '%s\n' "$ext" > apiserver.ext
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 3650 -extfile apiserver.ext 2>/dev/null
    chmod 600 apiserver.key )
fi

token_of() { grep ",$1," "$PKI/tokens.csv" | cut -d, -f1; }
write_kubeconfig() { # file user token
  local ca; ca=$(base64 -w0 < "$PKI/ca.crt")
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: k8slocal
  cluster:
    server: https://$APISERVER_ADDRESS:$APISERVER_PORT
    certificate-authority-data: $ca
users:
- name: $2
  user:
    token: $3
- name: admin-cert
  user:
    client-certificate-data: $(base64 -w0 < "$PKI/admin.crt")
    client-key-data: $(base64 -w0 < "$PKI/admin.key")
contexts:
- name: k8slocal
  context: {cluster: k8slocal, user: $2, namespace: default}
- name: k8slocal-cert
  context: {cluster: k8slocal, user: admin-cert, namespace: default}
current-context: k8slocal
EOF
  chmod 600 "$1"
}
write_kubeconfig "$RUN/kubeconfig" admin "$(token_of admin)"
write_kubeconfig "$RUN/kcm.kubeconfig" system:kube-controller-manager "$(token_of system:kube-controller-manager)"
write_kubeconfig "$RUN/scheduler.kubeconfig" system:kube-scheduler "$(token_of system:kube-scheduler)"

# ---------------------------------------------------------------- start
# running / start / wait_for: e2e/lib.sh

# need_free NAME PORT...: unless NAME (ours) already runs, refuse to start it when another process listens on
# one of its ports: the wait below would then succeed against that process (another cluster's etcd or
# apiserver on the same host) and this cluster would write into it.
need_free() {
  local name=$1 p; shift
  running "$name" && return 0
  for p in "$@"; do
    if [ -n "$(ss -Hltn "sport = :$p" 2>/dev/null)" ]; then
      echo "up.sh: port $p for $name is already in use by another process: $(ss -Hltnp "sport = :$p" | tr -s ' ' | cut -d' ' -f6-)" >&2
      echo "up.sh: choose other ports (ETCD_PORT, ETCD_PEER_PORT, APISERVER_PORT, KCM_PORT, SCHED_PORT)" >&2
      exit 1
    fi
  done
}
need_free etcd "$ETCD_PORT" "$ETCD_PEER_PORT"
need_free kube-apiserver "$APISERVER_PORT"
[ "$START_KCM" = 1 ] && need_free kube-controller-manager "$KCM_PORT"
[ "$START_SCHEDULER" = 1 ] && need_free kube-scheduler "$SCHED_PORT"

start etcd "$BIN/etcd" --name default --data-dir "$ETCD_DATA_DIR" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync --log-level warn
wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

node_flags=()
if [ "$WITH_NODE" = 1 ]; then
  node_flags=(--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt"
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" --kubelet-preferred-address-types InternalIP)
fi
start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address "$APISERVER_ADDRESS" --advertise-address "$APISERVER_ADDRESS" --secure-port "$APISERVER_PORT" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" \
  --authorization-mode "$AUTHZ_MODE" --allow-privileged=true \
  --endpoint-reconciler-type "$ENDPOINT_RECONCILER" \
  --profiling=false "${node_flags[@]}"
KC=(kubectl --kubeconfig "$RUN/kubeconfig")
wait_for "kube-apiserver /readyz" 120 "${KC[@]}" get --raw /readyz
wait_for "kubectl get ns" 30 "${KC[@]}" get ns

if [ "$START_KCM" = 1 ]; then
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$RUN/kcm.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
    --controllers "$KCM_CONTROLLERS" \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --allocate-node-cidrs=true --cluster-cidr "$CLUSTER_CIDR" --service-cluster-ip-range "$SERVICE_CIDR" \
    --use-service-account-credentials=false --profiling=false
fi
if [ "$START_SCHEDULER" = 1 ]; then
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$RUN/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false --profiling=false
fi
[ "$START_KCM" = 1 ] && wait_for kube-controller-manager 60 curl -skf "https://127.0.0.1:$KCM_PORT/healthz"
[ "$START_SCHEDULER" = 1 ] && wait_for kube-scheduler 60 curl -skf "https://127.0.0.1:$SCHED_PORT/healthz"
# the default ServiceAccount must exist before Pods can be created in a namespace
[ "$START_KCM" = 1 ] && wait_for "serviceaccount default/default" 60 "${KC[@]}" -n default get serviceaccount default
log "control plane up.  export KUBECONFIG=$RUN/kubeconfig"
