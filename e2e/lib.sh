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
