# shellcheck shell=bash
# e2e/lib.sh — objects shared by the e2e scripts (install.sh's smoke check, lifecycle.sh,
# bench/convergence.sh). Source it once kubectl is on PATH and KUBECONFIG is set. The arguments are
# namespaces, object names and hostnames the scripts choose themselves (never user input).

# echo_app NAMESPACE: the Namespace, an echo-basic Deployment and its Service echo:8080; waits until
# the Deployment is Available.
echo_app() {
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: $1}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: $1}
spec:
  replicas: 1
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: echo
          # A local name: the node agent maps images containing echo-basic to the binary.
          image: sweety-e2e/echo-basic:v1.6.3
          env:
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
          ports: [{name: http, containerPort: 3000}]
          readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: $1}
spec:
  selector: {app: echo}
  ports: [{name: http, port: 8080, targetPort: http}]
YAML
  kubectl -n "$1" wait --for=condition=Available deployment/echo --timeout=120s >/dev/null
}

# http_gateway NAMESPACE NAME [HOSTNAME]: a Gateway NAME of class sweety with one HTTP listener on
# port 80 (routes of its own namespace) and, with HOSTNAME, an HTTPRoute NAME for that host to
# echo:8080; waits until the Gateway is Programmed.
http_gateway() {
  local ns=$1 name=$2 host=${3:-}
  {
    cat <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: $name, namespace: $ns}
spec:
  gatewayClassName: sweety
  listeners: [{name: http, protocol: HTTP, port: 80, allowedRoutes: {namespaces: {from: Same}}}]
YAML
    [ -z "$host" ] || cat <<YAML
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: $name, namespace: $ns}
spec:
  parentRefs: [{name: $name}]
  hostnames: [$host]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
YAML
  } | kubectl apply -f - >/dev/null || return
  kubectl -n "$ns" wait --for=condition=Programmed "gateway/$name" --timeout=120s >/dev/null
}

# helm_bin: prints the helm to use: $SWEETY_HELM, or helm v3.22.0 built once into ~/.cache/sweety/tools.
helm_bin() {
  if [ -n "${SWEETY_HELM:-}" ]; then echo "$SWEETY_HELM"; return; fi
  local h=$HOME/.cache/sweety/tools/helm-v3.22.0/helm
  if [ ! -x "$h" ]; then
    echo "building helm v3.22.0 (cached in $(dirname "$h"))" >&2
    mkdir -p "$(dirname "$h")"
    GOBIN=$(dirname "$h") GOFLAGS=-buildvcs=false GOTOOLCHAIN=local go install helm.sh/helm/v3/cmd/helm@v3.22.0 >&2
  fi
  echo "$h"
}

# smoke_gateway NAMESPACE NET: echo_app + http_gateway in NAMESPACE, waits for the HTTPRoute's Accepted and
# ResolvedRefs, then curls the Gateway's status address (which must be NET.x: inside the cluster's Pod /24)
# until echo-basic answers from a pod of NAMESPACE (30 tries).
smoke_gateway() {
  local s=$1 net=$2 addr body="" _
  echo_app "$s"
  http_gateway "$s" smoke smoke.example || return
  kubectl -n "$s" wait --for=jsonpath='{.status.parents[0].conditions[?(@.type=="Accepted")].status}'=True httproute/smoke --timeout=60s >/dev/null || return
  kubectl -n "$s" wait --for=jsonpath='{.status.parents[0].conditions[?(@.type=="ResolvedRefs")].status}'=True httproute/smoke --timeout=60s >/dev/null || return
  addr=$(kubectl -n "$s" get gateway smoke -o jsonpath='{.status.addresses[0].value}')
  case $addr in "$net".*) ;; *) echo "smoke: Gateway address '$addr' is not in $net.0/24" >&2; return 1 ;; esac
  for _ in $(seq 1 30); do
    body=$(curl -sf --max-time 2 -H 'Host: smoke.example' "http://$addr/smoke" || true)
    if grep -q "\"namespace\": *\"$s\"" <<<"$body" && grep -q '"pod": *"echo-' <<<"$body"; then
      echo "smoke: http://$addr/smoke (Host smoke.example) answered by echo-basic pod $(sed -n 's/.*"pod": *"\([^"]*\)".*/\1/p' <<<"$body")"
      return 0
    fi
    sleep 1
  done
  echo "smoke: http://$addr/smoke did not reach echo-basic: ${body:-no answer}" >&2
  return 1
}
