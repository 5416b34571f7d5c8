#!/usr/bin/env bash
# e2e/realnode/up.sh — Sweety on a real node: the local control plane (e2e/cluster/up.sh) plus a real kubelet
# with containerd and runc, a CNI bridge and kube-proxy, all on this host, running the image that
# deploy/image/build.sh makes; then `helm install` of charts/sweety and a smoke check through the dataplane Pod.
#   1. packages (Debian): containerd, runc, containernetworking-plugins, iptables, umoci, gcc/libc6-dev;
#   2. the bridge <SWEETY_BRIDGE> with .1 of the Pod CIDR (the node IP; the apiserver listens there too, so
#      Pods reach it through the `kubernetes` Service and kube-proxy);
#   3. control plane (WITH_NODE=1: kubelet and kube-proxy built from the same Go module) + Gateway API CRDs;
#   4. containerd (own config, root, state and socket under the cluster dir; runc; restrict_oom_score_adj,
#      because this sandbox withholds CAP_SYS_RESOURCE; CNI config and IPAM state under the cluster dir). Pods
#      get routes to the Pod /24 and the Service /24 only (no default route), and a FORWARD rule of our own
#      chain drops whatever they send to any other interface: they reach the node and each other, nothing else;
#   5. images, imported with `ctr images import` (nothing is ever pulled: every Pod of ours says
#      imagePullPolicy: Never, and containerd's registry traffic goes to a proxy address where nothing listens,
#      so any pull fails at once): the pause image compiled from the Kubernetes module's
#      build/pause/linux/pause.c, echo-basic (static Go binary), and Sweety's image (SWEETY_IMAGE_TAR, or
#      deploy/image/build.sh with --bin-dir SWEETY_BIN_DIR, or cargo build --release); with --conformance also
#      every echo-basic and CoreDNS image the Gateway API conformance manifests name (same local binaries);
#   6. kubelet (x509 client and serving certificates from the cluster CA, cgroupfs, no per-QoS cgroups) and
#      kube-proxy (iptables; NodePorts only on the bridge address); the node must become Ready;
#   7. the LoadBalancer allocator (`sweety-node-agent load-balancer`: the one thing a real node cannot give
#      here; addresses .200-.250 of the Pod CIDR on the bridge);
#   8. `helm upgrade --install` of charts/sweety (image.pullPolicy=Never) and the smoke check of e2e/lib.sh.
# Usage:  e2e/realnode/up.sh [--no-helm] [--conformance] [-- <helm args>]      (idempotent)
#         e2e/realnode/down.sh [--purge]
# Needs root. Prints `export KUBECONFIG=...` at the end.
#
# Environment (defaults in brackets; give each concurrent cluster its own dir, ports, bridge and CIDR):
#   SWEETY_CLUSTER_DIR [~/.cache/sweety/cluster-realnode]
#   APISERVER_PORT [36443] ETCD_PORT [32379] ETCD_PEER_PORT [32380] KCM_PORT [40257] SCHED_PORT [40259]
#   SWEETY_BRIDGE [sweetyrn0]  SWEETY_POD_CIDR [10.245.0.0/24]  Pods .2-.199, LoadBalancers .200-.250
#   SWEETY_SERVICE_CIDR [10.97.<2nd octet of the Pod CIDR>.0/24]  (outside every other cluster's 10.96.0.0/16)
#   SWEETY_NODE [sweety-real-node]  SWEETY_KUBELET_PORT [10270]  (+1 kubelet healthz, +2/+3 kube-proxy
#                                   healthz/metrics, all on 127.0.0.1 except the kubelet API on the bridge)
#   SWEETY_IMAGE_TAR []             an archive made by deploy/image/build.sh to run (empty: built here)
#   SWEETY_BIN_DIR []               release sweety-controller/sweety-dataplane for the image (empty: cargo builds)
#   SWEETY_GATEWAY_API_CHANNEL [standard]  the Gateway API CRDs (experimental for the conformance suite; none:
#                                   no Gateway API, as e2e/lifecycle.sh wants it; only with --no-helm)
#   SWEETY_NODE_AGENT [<CARGO_TARGET_DIR>/debug/sweety-node-agent]  (built with cargo when missing)
#   SWEETY_NAMESPACE [sweety] SWEETY_RELEASE [sweety] SWEETY_HELM [as e2e/install.sh]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
# shellcheck source=e2e/realnode/env.sh
. e2e/realnode/env.sh
# shellcheck source=e2e/lib.sh
. e2e/lib.sh

helm=1 conformance=0
helm_extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --no-helm) helm=0 ;;
    --conformance) conformance=1 ;;
    --) shift; helm_extra=("$@"); break ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "realnode: needs root" >&2; exit 1; }
if [ "${SWEETY_GATEWAY_API_CHANNEL:-}" = none ] && [ "$helm" = 1 ]; then
  echo "realnode: SWEETY_GATEWAY_API_CHANNEL=none only with --no-helm (the smoke check needs a Gateway)" >&2; exit 2
fi

t0=$(date +%s)
log() { echo "[realnode $(( $(date +%s) - t0 ))s] $*"; }
diag=0
diagnose() {
  [ "$diag" = 1 ] || return 0
  diag=0
  diagnostics "$LOG/kubelet.log" "$LOG/containerd.log" "$LOG/kube-proxy.log" "$LOG/load-balancer.log" \
    "$NODE_DIR"/pod-logs/"$NS"_*/*/*.log
}
trap diagnose ERR
die() { echo "realnode: $*" >&2; diagnose; exit 1; }

# ------------------------------------------------------------------ 1. packages
need=()
for c in containerd:containerd runc:runc ctr:containerd iptables:iptables umoci:umoci gcc:gcc conntrack:conntrack; do
  command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  timeout 300 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# ------------------------------------------------------------------ 2. bridge
mkdir -p "$RUN" "$LOG" "$NODE_DIR"
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  other=$(ip -o -4 addr show | awk -v n="$NET." '$4 ~ "^"n {print $2}' | head -1)
  [ -z "$other" ] || die "$other already has an address in $POD_CIDR (another cluster's network?)"
  ip link add "$BRIDGE" type bridge
  ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  log "bridge $BRIDGE $NODE_IP/24"
fi

# ------------------------------------------------------------------ 3. control plane
WITH_NODE=1 APISERVER_ADDRESS=$NODE_IP ENDPOINT_RECONCILER=lease POD_CIDRS=$POD_CIDR CLUSTER_CIDR=$POD_CIDR \
  SERVICE_CIDR=$SERVICE_CIDR SERVICE_API_IP=$SERVICE_API_IP KCM_CONTROLLERS='*' bash e2e/cluster/up.sh
channel=${SWEETY_GATEWAY_API_CHANNEL:-standard}
if [ "$channel" = none ]; then
  log "no Gateway API CRDs (SWEETY_GATEWAY_API_CHANNEL=none, as on a fresh cluster)"
else
  timeout 180 bash e2e/cluster/gateway-api.sh crds "$channel" >/dev/null
  log "Gateway API CRDs ($channel) established"
fi

# ------------------------------------------------------------------ 4. containerd
# Node PKI: the kubelet's client certificate (system:node:<name>, the Node authorizer's subject) and its
# serving certificate for the node IP, both from the cluster CA.
if [ ! -f "$PKI/kubelet.crt" ]; then
  ( cd "$PKI"
    openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr \
      -subj "/O=system:nodes/CN=system:node:$NODE" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > kubelet-client.ext
    openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out kubelet-client.crt \
      -days 3650 -extfile kubelet-client.ext 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout kubelet.key -out kubelet.csr -subj "/CN=$NODE" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:%s,DNS:%s\n' "$NODE_IP" "$NODE" > kubelet.ext
    openssl x509 -req -in kubelet.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out kubelet.crt \
      -days 3650 -extfile kubelet.ext 2>/dev/null
    chmod 600 kubelet.key kubelet-client.key )
fi
ca=$(base64 -w0 < "$PKI/ca.crt")
cat > "$NODE_DIR/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://$NODE_IP:$APISERVER_PORT", certificate-authority-data: $ca}}]
users: [{name: node, user: {client-certificate: "$PKI/kubelet-client.crt", client-key: "$PKI/kubelet-client.key"}}]
contexts: [{name: node, context: {cluster: local, user: node}}]
current-context: node
EOF
mkdir -p "$NODE_DIR/cni/net.d" "$NODE_DIR/cni/ipam" "$NODE_DIR/containerd/root" "$NODE_DIR/containerd/state" \
  "$NODE_DIR/containerd/opt" "$NODE_DIR/kubelet" "$NODE_DIR/pod-logs" "$NODE_DIR/volume-plugins"
# The CNI bridge: Pods get .2-.199 (the allocator owns .200-.250), the bridge address as gateway, and routes
# to the Pod /24 (on the link) and the Service /24 (through the node, where kube-proxy translates) only: no
# default route, no masquerading. The FORWARD rule below drops anything else they send.
cat > "$NODE_DIR/cni/net.d/10-sweety.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "sweety-$BRIDGE", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "isDefaultGateway": false, "ipMasq": false,
   "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$NODE_DIR/cni/ipam",
            "ranges": [[{"subnet": "$POD_CIDR", "rangeStart": "$NET.2", "rangeEnd": "$NET.199", "gateway": "$NODE_IP"}]],
            "routes": [{"dst": "$SERVICE_CIDR", "gw": "$NODE_IP"}]}}]}
EOF
# containerd pulls through HTTP(S)_PROXY: pointed at the discard port of 127.0.0.1, where nothing listens,
# every registry request fails at once ("proxyconnect ... connection refused"); no registry is named anywhere.
# Images come only from `ctr images import` below.
cat > "$NODE_DIR/containerd/config.toml" <<EOF
version = 2
root = "$NODE_DIR/containerd/root"
state = "$NODE_DIR/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$NODE_DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_DIR/cni/net.d"
EOF
start containerd env HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY= \
  http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 no_proxy= \
  containerd --config "$NODE_DIR/containerd/config.toml"
wait_for "containerd" 30 ctr_ version || die "containerd did not start: $(tail -5 "$LOG/containerd.log")"

# ------------------------------------------------------------------ 5. images
mkdir -p "$IMG"
# scratch_image TAR ENTRYPOINT REF[,REF...] FILE...: a one-layer FROM-scratch image (Docker archive, which
# `ctr images import` reads and names REF...) holding each FILE at /<basename> and the shared libraries it
# loads (ldd) at their paths; entrypoint /ENTRYPOINT.
scratch_image() {
  python3 - "$@" <<'PY'
import hashlib, io, json, os, re, subprocess, sys, tarfile
out, entry, refs, files = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4:]
members = {}
for f in files:
    members["/" + os.path.basename(f)] = f
    ldd = subprocess.run(["ldd", f], capture_output=True, text=True).stdout
    for lib in re.findall(r"(/\S+) \(0x", ldd):
        members.setdefault(lib, lib)
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
    for path in sorted(members):
        src = os.path.realpath(members[path])
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            if d not in t.getnames():
                di = tarfile.TarInfo(d); di.type = tarfile.DIRTYPE; di.mode = 0o755
                t.addfile(di)
        info = t.gettarinfo(src, arcname=path.strip("/"))
        info.uid = info.gid = 0; info.uname = info.gname = ""; info.mtime = 0; info.mode = 0o755
        with open(src, "rb") as fh:
            t.addfile(info, fh)
layer = layer.getvalue()
diff = "sha256:" + hashlib.sha256(layer).hexdigest()
config = json.dumps({"architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": ["/" + entry], "Env": ["PATH=/"]},
    "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
cfg_name = hashlib.sha256(config).hexdigest() + ".json"
manifest = json.dumps([{"Config": cfg_name, "RepoTags": refs, "Layers": ["layer.tar"]}]).encode()
with tarfile.open(out + ".tmp", "w") as t:
    for name, data in (("layer.tar", layer), (cfg_name, config), ("manifest.json", manifest)):
        info = tarfile.TarInfo(name); info.size = len(data)
        t.addfile(info, io.BytesIO(data))
os.replace(out + ".tmp", out)
PY
}
# The pause image, from the Kubernetes module's own source.
pause_src=$(cd "$K8S_SRC" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
if [ ! -f "$IMG/pause.tar" ]; then
  gcc -Os -static -Wall -Werror -DVERSION=v3.10-sweety -o "$IMG/pause" "$pause_src"
  strip "$IMG/pause"
  scratch_image "$IMG/pause.tar" pause "$PAUSE_IMAGE" "$IMG/pause"
fi
echo_bin=$(bash e2e/cluster/gateway-api.sh build-echo-static | tail -1)
echo_refs=$ECHO_IMAGE
tars=("$IMG/pause.tar" "$IMG/echo-basic.tar")
if [ "$conformance" = 1 ]; then
  # The images the conformance suite's manifests name (echo-basic of several versions, CoreDNS for the UDPRoute
  # tests), read from the suite's module, tagged onto the same local binaries as the node agent maps them.
  confdir=$(cd e2e/conformance && go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)
  mapfile -t conf_images < <(grep -rhoE 'image: *[^ ]+' "$confdir/base" "$confdir/tests" --include='*.yaml' | awk '{print $2}' | sort -u)
  coredns_refs=()
  for ref in "${conf_images[@]}"; do
    case $ref in
      */echo-basic:*) echo_refs="$echo_refs,$ref" ;;
      */coredns:*) coredns_refs+=("$ref") ;;
      *) die "conformance manifests name image $ref, which has no local build here" ;;
    esac
  done
  if [ ${#coredns_refs[@]} -gt 0 ]; then
    coredns_bin=$(bash e2e/conformance/build.sh --coredns)
    strip -o "$IMG/coredns" "$coredns_bin"   # without its debug information: a third of the size
    scratch_image "$IMG/coredns.tar" coredns "$(IFS=,; echo "${coredns_refs[*]}")" "$IMG/coredns"
    tars+=("$IMG/coredns.tar")
  fi
fi
scratch_image "$IMG/echo-basic.tar" echo-basic-static "$echo_refs" "$echo_bin"
# Sweety's image, as users get it. Stale archives of other versions go first (one sweety-*.oci.tar here).
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
if [ -n "${SWEETY_IMAGE_TAR:-}" ]; then
  [ -f "$SWEETY_IMAGE_TAR" ] || die "SWEETY_IMAGE_TAR=$SWEETY_IMAGE_TAR does not exist"
  sweety_tar=$SWEETY_IMAGE_TAR
else
  rm -f "$IMG"/sweety-*.oci.tar "$IMG"/sweety-*.oci.tar.tmp
  bin_args=()
  if [ -n "${SWEETY_BIN_DIR:-}" ]; then bin_args=(--bin-dir "$SWEETY_BIN_DIR"); fi
  bash deploy/image/build.sh --out "$IMG" "${bin_args[@]}" | tee "$LOG/image-build.log"
  sweety_tar=$IMG/sweety-$version.oci.tar
fi
tars+=("$sweety_tar")
for t in "${tars[@]}"; do
  ctr_ -n k8s.io images import --no-unpack=false "$t" >/dev/null
done
# The runtime qualifies the archive's local name; find ours by its path and tag.
sweety_ref=$(ctr_ -n k8s.io images ls -q | grep -E "(^|/)sweety/sweety:$version\$" | head -1)
[ -n "$sweety_ref" ] || die "no sweety/sweety:$version image after importing $sweety_tar"
# Other Sweety images left from earlier runs would only take space.
for old in $(ctr_ -n k8s.io images ls -q | grep -E '(^|/)sweety/sweety:' | grep -vxF "$sweety_ref" || true); do
  ctr_ -n k8s.io images rm "$old" >/dev/null && log "removed stale image $old"
done
sweety_digest=$(ctr_ -n k8s.io images ls | awk -v r="$sweety_ref" '$1 == r {print $3}')
log "images imported: $PAUSE_IMAGE, $echo_refs, ${coredns_refs[*]:-}, $sweety_ref ($sweety_digest)"

# ------------------------------------------------------------------ 6. kubelet, kube-proxy
# What the host's iptables held before the kubelet and kube-proxy ever ran here (kept across re-runs):
# down.sh removes only the chains and rules that are not in it.
if [ ! -f "$IPTABLES_BEFORE" ] && ! running kubelet && ! running kube-proxy; then
  iptables_ours > "$IPTABLES_BEFORE.tmp"
  mv "$IPTABLES_BEFORE.tmp" "$IPTABLES_BEFORE"
fi
# Nothing a Pod sends leaves the host: our chain, jumped to first from FORWARD, drops packets that arrive
# from the bridge and would leave through any other interface (Pod to Pod and Pod to node stay allowed).
if ! iptables -w 5 -S "$FWD_CHAIN" >/dev/null 2>&1; then
  iptables -w 5 -N "$FWD_CHAIN"
  iptables -w 5 -A "$FWD_CHAIN" -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
fi
iptables -w 5 -C FORWARD -j "$FWD_CHAIN" 2>/dev/null || iptables -w 5 -I FORWARD 1 -j "$FWD_CHAIN"
: > "$NODE_DIR/resolv.conf"   # Pods get no resolver: nothing of theirs may leave the host
cat > "$NODE_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((KUBELET_PORT + 1))
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
runtimeRequestTimeout: 2m
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
podCIDR: $POD_CIDR
clusterDomain: cluster.local
resolvConf: $NODE_DIR/resolv.conf
podLogsDir: $NODE_DIR/pod-logs
volumePluginDir: $NODE_DIR/volume-plugins
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
EOF
start kubelet "$K8S_BIN/kubelet" --config "$NODE_DIR/kubelet.yaml" --kubeconfig "$NODE_DIR/kubelet.kubeconfig" \
  --root-dir "$NODE_DIR/kubelet" --hostname-override "$NODE" --node-ip "$NODE_IP" \
  --node-labels sweety.dev/e2e=true --v 1
cat > "$NODE_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $RUN/kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:$((KUBELET_PORT + 2))
metricsBindAddress: 127.0.0.1:$((KUBELET_PORT + 3))
nodePortAddresses: ["$NODE_IP/32"]
conntrack: {maxPerCore: 0, min: 0}
iptables: {localhostNodePorts: false}
EOF
start kube-proxy "$K8S_BIN/kube-proxy" --config "$NODE_DIR/kube-proxy.yaml"
node_ready() { kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
wait_for "node $NODE Ready" 120 node_ready || die "node $NODE did not become Ready"
diag=1
log "node $NODE Ready ($(kubectl get node "$NODE" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion} {.status.nodeInfo.kubeletVersion}'))"

# ------------------------------------------------------------------ 7. LoadBalancer allocator
if [ ! -x "$NODE_AGENT" ]; then
  log "cargo build -p sweety-node-agent"
  cargo build -p sweety-node-agent
fi
start load-balancer "$NODE_AGENT" load-balancer --bridge "$BRIDGE" --pod-cidr "$POD_CIDR"

# ------------------------------------------------------------------ checks of the node itself
# A pull must fail closed: a Pod asking to pull (imagePullPolicy: Always) an image the node holds gets
# ErrImagePull from the proxy address, never the image.
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pull-check, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: "$ECHO_IMAGE", imagePullPolicy: Always}]
EOF
pull_failed() {
  kubectl -n default get pod pull-check -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}' | grep -qE '^(ErrImagePull|ImagePullBackOff)$'
}
wait_for "a pull to fail closed" 60 pull_failed || die "pod pull-check did not fail to pull: $(kubectl -n default get pod pull-check -o jsonpath='{.status.containerStatuses[0].state}')"
pull_msg=$(kubectl -n default get events --field-selector involvedObject.name=pull-check -o jsonpath='{.items[*].message}')
kubectl -n default delete pod pull-check --wait=false >/dev/null
grep -q '127.0.0.1:9' <<<"$pull_msg" || die "the pull failed, but not at the proxy address: $pull_msg"
log "pulls fail closed (ErrImagePull at 127.0.0.1:9)"

if [ "$helm" = 0 ]; then
  log "done (--no-helm).  export KUBECONFIG=$KUBECONFIG   (teardown: e2e/realnode/down.sh [--purge])"
  exit 0
fi

# ------------------------------------------------------------------ 8. helm install + smoke
# No default-certificate Secret is given: the controller makes one and every replica serves it (the e2e
# suite's three-replica test checks that each presents the same certificate).
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
log "helm upgrade --install $RELEASE charts/sweety -n $NS (image $sweety_ref)"
install_chart "$RELEASE" "$NS" "${sweety_digest#sha256:}" --set image.pullPolicy=Never "${helm_extra[@]}" \
  || die "helm install failed"
log "controller and dataplane Ready: $(kubectl -n "$NS" get pod -l "app.kubernetes.io/instance=$RELEASE" -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP} {.status.containerStatuses[*].imageID}{"\n"}{end}')"
smoke_gateway sweety-smoke "$NET" || die "smoke check failed"
# The Pods' routes, as a dataplane Pod's network namespace has them: the Pod /24 and the Service /24, no default.
pod_name=$(kubectl -n "$NS" get pod -l "app.kubernetes.io/instance=$RELEASE" -o jsonpath='{.items[0].metadata.name}')
pod_pid=""
for p in $(pgrep -f '^(/usr/local/bin/)?sweety-(controller|dataplane)( |$)' || true); do   # whose environment names the pod
  environ=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null || true)
  if grep -qxF "POD_NAME=$pod_name" <<<"$environ"; then pod_pid=$p; fi
done
[ -n "$pod_pid" ] || die "no process of pod $pod_name found (POD_NAME in its environment)"
routes=$(nsenter -t "$pod_pid" -n ip -4 route show | awk '{print $1}' | sort | paste -sd' ')
want=$(printf '%s\n' "$POD_CIDR" "$SERVICE_CIDR" | sort | paste -sd' ')
[ "$routes" = "$want" ] || die "a Pod's routes go to '$routes', not only to the Pod and Service networks ($want)"
log "Pod routes: only $POD_CIDR and $SERVICE_CIDR (no default route)"
log "done.  export KUBECONFIG=$KUBECONFIG   (teardown: e2e/realnode/down.sh [--purge])"
