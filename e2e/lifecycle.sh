#!/usr/bin/env bash
# e2e/lifecycle.sh — the chart's life on a cluster, as a new user meets it, on a REAL node (e2e/realnode: kubelet,
# containerd, runc, CNI bridge, kube-proxy) running the image deploy/image/build.sh makes:
#   1. a cluster WITHOUT the Gateway API CRDs (e2e/realnode/up.sh --no-helm, SWEETY_GATEWAY_API_CHANNEL=none);
#      `helm install --skip-crds` of charts/sweety (our two CRDs applied by hand, as docs/install.md says):
#      the release deploys, no GatewayClass is rendered, and an Ingress answers through the `sweety`
#      Service's load-balancer address;
#   2. the Gateway API CRDs arrive (charts/sweety/crds/gateway-api-standard.yaml); `helm upgrade` (same
#      values) adds the GatewayClass; a Gateway + HTTPRoute become Programmed/Accepted and answer — with
#      the SAME controller container (same pod uid, restartCount 0): the controller discovered the kinds;
#   3. `helm uninstall`: nothing of ours is left (per-Gateway Services and EndpointSlices, the Lease, the default-certificate Secret,
#      every object with the release's labels, cluster-scoped ones too, Helm's release records: `ours`
#      lists them; `installed` first checks that the listing finds each kind while installed);
#   4. the previous chart version (charts/sweety as of $PREVIOUS_CHART_REF, from git) installed with the
#      Gateway API CRDs present, a Gateway serving; `helm upgrade` to this chart: it still serves, the
#      Lease gains its owner; `helm uninstall` again leaves nothing.
# Both chart versions run this tree's image (image.tag = the workspace version, imagePullPolicy Never: nothing is
# pulled); the node agent's only part here is the LoadBalancer address allocator (e2e/realnode/up.sh, step 7).
#
# Usage: e2e/lifecycle.sh [--down]   (--down: tear the cluster down afterwards, also on failure, as CI does)
# Environment: as e2e/realnode/up.sh (SWEETY_CLUSTER_DIR [~/.cache/sweety/cluster-lifecycle], ports, SWEETY_BRIDGE,
#   SWEETY_POD_CIDR, SWEETY_IMAGE_TAR (empty: the image is built), ...);
#   PREVIOUS_CHART_REF [the commit before the chart's 0.2.0]  git ref of the previous chart version.
# Needs root, go, cargo, curl, git (a clone with history back to PREVIOUS_CHART_REF).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
export SWEETY_CLUSTER_DIR=${SWEETY_CLUSTER_DIR:-$HOME/.cache/sweety/cluster-lifecycle}
# shellcheck source=e2e/realnode/env.sh
. e2e/realnode/env.sh
# shellcheck source=e2e/lib.sh
. e2e/lib.sh
# The last commit with chart version 0.1.0 (ingressClass.default true, GatewayClass always rendered).
PREVIOUS_CHART_REF=${PREVIOUS_CHART_REF:-526aad9cd3816ef4b49168e19b043306832cdb26}

down=0
for a in "$@"; do
  case $a in
    --down) down=1 ;;
    *) echo "unknown argument $a (see the header of $0)" >&2; exit 2 ;;
  esac
done
t0=$(date +%s)
log() { echo "[lifecycle $(( $(date +%s) - t0 ))s] $*"; }
WORK=$(mktemp -d)
cleanup() {
  rm -rf "$WORK"
  if [ "$down" = 1 ]; then bash e2e/realnode/down.sh --purge >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
die() {
  echo "lifecycle: $*" >&2
  kubectl get pods -A -o wide >&2 || true
  kubectl get gateways,httproutes -A >&2 2>/dev/null || true
  exit 1
}

# ------------------------------------------------------------------ 0. a cluster without the Gateway API
SWEETY_GATEWAY_API_CHANNEL=none bash e2e/realnode/up.sh --no-helm
HELM=$(helm_bin)
if kubectl get crd gateways.gateway.networking.k8s.io >/dev/null 2>&1; then
  die "the cluster already serves the Gateway API (an earlier run?): e2e/realnode/down.sh --purge first"
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

# The image up.sh imported, by tag, never pulled; per-Gateway Services are LoadBalancers (the allocator's addresses).
helm_args=(--set image.pullPolicy=Never --set-string "image.tag=$version" --wait --timeout 5m)

wait_http() { # wait_http URL HOST NEEDLE: the body of URL (Host HOST) contains NEEDLE within 60 s
  local body=""
  for _ in $(seq 1 60); do
    body=$(curl -sf --max-time 2 -H "Host: $2" "$1" || true)
    if grep -q "$3" <<<"$body"; then return 0; fi
    sleep 1
  done
  die "$1 (Host $2) did not answer with '$3': ${body:-no answer}"
}

lb_ip() { # lb_ip NAMESPACE SERVICE: its load-balancer address, within 60 s
  local ip=""
  for _ in $(seq 1 60); do
    ip=$(kubectl -n "$1" get service "$2" -o jsonpath='{.status.loadBalancer.ingress[0].ip}' 2>/dev/null || true)
    case $ip in "$NET".*) echo "$ip"; return 0 ;; esac
    sleep 1
  done
  die "Service $1/$2 got no load-balancer address"
}

gateway() { # gateway NAMESPACE HOST: a Gateway of class sweety and an HTTPRoute to echo; waits until it answers
  http_gateway "$1" web "$2" ||
    die "Gateway $1/web not Programmed: $(kubectl -n "$1" get gateway web -o jsonpath='{.status.conditions}')"
  local addr
  addr=$(kubectl -n "$1" get gateway web -o jsonpath='{.status.addresses[0].value}')
  wait_http "http://$addr/" "$2" "\"namespace\": *\"$1\""
  log "Gateway $1/web at $addr answers (Host $2)"
}

controller_state() { # controller_state NAMESPACE: "<pod uid> <controller restartCount>"
  kubectl -n "$1" get pods -l app.kubernetes.io/instance=sweety \
    -o jsonpath='{.items[0].metadata.uid} {.items[0].status.containerStatuses[?(@.name=="controller")].restartCount}'
}

ours() { # ours NAMESPACE: every object of ours, as kubectl's kind.group/name, one a line; fails if kubectl does
  local ns=$1
  # The per-Gateway Services and their EndpointSlices (the controller's label, wherever they live),
  kubectl get services,endpointslices -A -l app.kubernetes.io/managed-by=sweety -o name &&
    # the release's namespaced objects, every Lease of its namespace (the controller's),
    kubectl -n "$ns" get leases,deployments,daemonsets,pods,services,serviceaccounts,roles,rolebindings,configmaps,secrets,sweetyproxyconfigs \
      -l app.kubernetes.io/instance=sweety -o name &&
    kubectl -n "$ns" get leases -o name &&
    # the Secret of the shared default certificate (the controller's label),
    kubectl -n "$ns" get secrets -l app.kubernetes.io/managed-by=sweety -o name &&
    # its cluster-scoped objects and Helm's release records.
    kubectl get clusterroles,clusterrolebindings,ingressclasses,gatewayclasses -l app.kubernetes.io/instance=sweety -o name &&
    kubectl get secrets -n "$ns" -l owner=helm -o name
}

installed() { # installed NAMESPACE KIND/NAME-PREFIX...: before uninstalling, `ours` lists each, so the empty list after it means something
  local ns=$1 have want; shift
  have=$(ours "$ns") || die "listing our objects in $ns failed"
  for want in "$@"; do
    grep -q "^$want" <<<"$have" || die "before helm uninstall, no $want among our objects: $(echo "$have" | tr '\n' ' ')"
  done
}

nothing_left() { # nothing_left NAMESPACE: after helm uninstall, `ours` lists nothing (GC: 90 s)
  local ns=$1 left=""
  for _ in $(seq 1 90); do
    if left=$(ours "$ns" 2>"$WORK/ours.err"); then
      [ -z "$left" ] && return 0
    else
      left="(listing failed: $(cat "$WORK/ours.err"))"
    fi
    sleep 1
  done
  die "left behind after helm uninstall in $ns: $(echo "$left" | tr '\n' ' ')"
}

# ------------------------------------------------------------------ 1. install without the Gateway API
NS=sweety
kubectl apply --server-side -f charts/sweety/crds/sweetysites.yaml -f charts/sweety/crds/sweetyproxyconfigs.yaml >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd/sweetysites.sweety.dev crd/sweetyproxyconfigs.sweety.dev >/dev/null
log "1. helm install --skip-crds on a cluster without the Gateway API"
"$HELM" install sweety charts/sweety -n "$NS" --create-namespace --skip-crds "${helm_args[@]}" >/dev/null ||
  die "helm install without the Gateway API CRDs failed"
if "$HELM" get manifest sweety -n "$NS" | grep -q '^kind: GatewayClass'; then
  die "the release has a GatewayClass although the cluster does not serve the Gateway API"
fi
echo_app lc-ingress
kubectl apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: echo, namespace: lc-ingress}
spec:
  ingressClassName: sweety
  rules:
    - host: ingress.example
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}]}
EOF
ingress_ip=$(lb_ip "$NS" sweety)
wait_http "http://$ingress_ip/" ingress.example '"namespace": *"lc-ingress"'
log "1. ok: installed without the Gateway API; Ingress answers at $ingress_ip"
before=$(controller_state "$NS")

# ------------------------------------------------------------------ 2. the Gateway API arrives
log "2. Gateway API CRDs installed after the controller started"
kubectl apply --server-side -f charts/sweety/crds/gateway-api-standard.yaml >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd/gatewayclasses.gateway.networking.k8s.io crd/gateways.gateway.networking.k8s.io crd/httproutes.gateway.networking.k8s.io >/dev/null
"$HELM" upgrade sweety charts/sweety -n "$NS" --reuse-values "${helm_args[@]}" >/dev/null || die "helm upgrade after the CRDs failed"
"$HELM" get manifest sweety -n "$NS" | grep -q '^kind: GatewayClass' || die "helm upgrade did not add the GatewayClass"
kubectl wait --for=condition=Accepted gatewayclass/sweety --timeout=60s >/dev/null || die "GatewayClass sweety not Accepted"
echo_app lc-gateway
gateway lc-gateway gateway.example
after=$(controller_state "$NS")
[ "$before" = "$after" ] || die "the controller restarted or was replaced (before '$before', after '$after')"
log "2. ok: Gateways work, same controller container ($after)"
wait_http "http://$ingress_ip/" ingress.example '"namespace": *"lc-ingress"'
# The per-Gateway Service lives in the release namespace (gatewayServiceNamespace=release), owned by
# the GatewayClass (a Gateway in another namespace cannot own it), nothing of ours in the Gateway's.
kubectl -n "$NS" get service -l app.kubernetes.io/managed-by=sweety,sweety.dev/gateway-namespace=lc-gateway \
  -o jsonpath='{.items[0].metadata.ownerReferences[0].kind}' | grep -qx GatewayClass ||
  die "the per-Gateway Service in $NS has no GatewayClass owner"
[ -z "$(kubectl -n lc-gateway get services,endpointslices -l app.kubernetes.io/managed-by=sweety -o name)" ] ||
  die "per-Gateway objects in the Gateway's namespace lc-gateway (expected in $NS)"
kubectl -n "$NS" get lease sweety-controller -o jsonpath='{.metadata.ownerReferences[0].kind}' | grep -qx ServiceAccount ||
  die "the leader Lease has no ServiceAccount owner"
kubectl -n "$NS" get secret sweety-default-certificate -o jsonpath='{.metadata.ownerReferences[0].kind}' | grep -qx ServiceAccount ||
  die "the shared default certificate Secret has no ServiceAccount owner"

# ------------------------------------------------------------------ 3. uninstall
log "3. helm uninstall"
# What uninstall must remove (the GatewayClass owns the per-Gateway Service and its EndpointSlices).
installed "$NS" service/ endpointslice.discovery.k8s.io/ lease.coordination.k8s.io/sweety-controller deployment.apps/sweety \
  secret/sweety-default-certificate serviceaccount/sweety clusterrole.rbac.authorization.k8s.io/ ingressclass.networking.k8s.io/sweety \
  gatewayclass.gateway.networking.k8s.io/sweety sweetyproxyconfig.sweety.dev/ secret/sh.helm.release.v1.sweety.
"$HELM" uninstall sweety -n "$NS" --wait --timeout 3m >/dev/null
nothing_left "$NS"
log "3. ok: nothing of ours left (Services, EndpointSlices, Lease, default-certificate Secret, release objects)"
kubectl delete namespace lc-ingress lc-gateway --wait=false >/dev/null

# ------------------------------------------------------------------ 4. upgrade from the previous chart version
NS=sweety-upgrade
git -C "$REPO" archive "$PREVIOUS_CHART_REF" charts/sweety | tar -x -C "$WORK"
prev_version=$(sed -n 's/^version: *//p' "$WORK/charts/sweety/Chart.yaml")
this_version=$(sed -n 's/^version: *//p' charts/sweety/Chart.yaml)
log "4. helm install of chart $prev_version ($PREVIOUS_CHART_REF), then helm upgrade to $this_version"
"$HELM" install sweety "$WORK/charts/sweety" -n "$NS" --create-namespace "${helm_args[@]}" >/dev/null ||
  die "helm install of the previous chart failed"
echo_app lc-upgrade
gateway lc-upgrade upgrade.example
"$HELM" upgrade sweety charts/sweety -n "$NS" "${helm_args[@]}" >/dev/null || die "helm upgrade to $this_version failed"
kubectl -n "$NS" rollout status deployment/sweety --timeout=180s >/dev/null
gateway lc-upgrade upgrade.example
for _ in $(seq 1 30); do
  kubectl -n "$NS" get lease sweety-controller -o jsonpath='{.metadata.ownerReferences[0].kind}' 2>/dev/null | grep -qx ServiceAccount && break
  sleep 1
done
kubectl -n "$NS" get lease sweety-controller -o jsonpath='{.metadata.ownerReferences[0].kind}' | grep -qx ServiceAccount ||
  die "the Lease of the previous release did not gain its owner"
installed "$NS" endpointslice.discovery.k8s.io/ lease.coordination.k8s.io/sweety-controller deployment.apps/sweety \
  secret/sweety-default-certificate gatewayclass.gateway.networking.k8s.io/sweety secret/sh.helm.release.v1.sweety.
"$HELM" uninstall sweety -n "$NS" --wait --timeout 3m >/dev/null
nothing_left "$NS"
kubectl delete namespace lc-upgrade --wait=false >/dev/null
log "4. ok: upgraded from $prev_version, Gateway served throughout the checks, uninstall left nothing"
log "all lifecycle checks passed"
