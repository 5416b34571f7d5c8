# shellcheck shell=bash
# e2e/lib.sh — what the e2e scripts share: bounded kubectl calls, the processes a harness starts (pid and log
# files), and the objects of the smoke checks (install.sh, realnode/up.sh, lifecycle.sh, bench/convergence.sh).
# Source it once kubectl is on PATH and KUBECONFIG is set. The arguments are namespaces, object names and
# hostnames the scripts choose themselves (never user input).

# ---------------------------------------------------------------- kubectl, bounded
# Every kubectl call of a script that sources this file is bounded: each request by --request-timeout
# (SWEETY_KUBECTL_REQUEST_TIMEOUT, default 30s), and `wait` / `rollout status`, which watch, by the --timeout
# they must pass (refused without one) and a hard stop 30 s after it.
kubectl() {
  local a prev="" watch="" t=""
  for a in "$@"; do
    case $a in
      --timeout=*) t=${a#--timeout=} ;;
      wait) watch="wait" ;;
      status) [ "$prev" != rollout ] || watch="rollout status" ;;
    esac
    prev=$a
  done
  if [ -z "$watch" ]; then
    command kubectl --request-timeout="${SWEETY_KUBECTL_REQUEST_TIMEOUT:-30s}" "$@"
    return
  fi
  case $t in
    [0-9]*s) timeout -k 5 $(( ${t%s} + 30 )) kubectl "$@" ;;
    *) echo "kubectl $watch needs --timeout=<seconds>s here (got '${t:-none}')" >&2; return 2 ;;
  esac
}

# ---------------------------------------------------------------- processes
# For scripts that start programs in the background: RUN (pid files) and LOG (their logs) must be set, and
# `log MESSAGE...`.

# running NAME: true while $RUN/NAME.pid names a live process that is the named program (a stale pid file
# from an earlier run may name a pid that the kernel has since given to something else).
running() {
  local pid
  [ -f "$RUN/$1.pid" ] || return 1
  pid=$(cat "$RUN/$1.pid")
  kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$1"
}
# start NAME CMD...: CMD in the background (output in $LOG/NAME.log, pid in $RUN/NAME.pid) unless it runs.
start() {
  local name=$1; shift
  if running "$name"; then log "$name already running (pid $(cat "$RUN/$name.pid"))"; return; fi
  nohup "$@" > "$LOG/$name.log" 2>&1 &
  echo $! > "$RUN/$name.pid"
  log "started $name pid $!"
}
# stop NAME [GRACE]: SIGTERM to the process of $RUN/NAME.pid (only if `running`), SIGKILL after GRACE seconds
# (default 10); removes the pid file.
stop() {
  local name=$1 grace=${2:-10} pid
  running "$name" || { rm -f "$RUN/$name.pid"; return 0; }
  pid=$(cat "$RUN/$name.pid")
  kill "$pid"
  for _ in $(seq 1 $((grace * 5))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then echo "$name ($pid) did not exit in $grace s, sending SIGKILL"; kill -9 "$pid"; fi
  rm -f "$RUN/$name.pid"
  echo "stopped $name ($pid)"
}
# wait_for WHAT SECONDS CMD...: runs CMD (output discarded) every 0.2 s until it succeeds ("WHAT ready"), or
# logs the timeout and returns 1 after SECONDS.
wait_for() {
  local what=$1 to=$2; shift 2
  local end=$(( $(date +%s) + to ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$end" ]; then log "TIMEOUT ($to s) waiting for $what"; return 1; fi
    sleep 0.2
  done
  log "$what ready"
}

# diagnostics FILE...: on a failure, what the cluster says (every pod, the last events) and the last lines of
# each FILE that exists (component and container logs), all on stderr.
diagnostics() {
  local f
  echo "---- diagnostics: pods, recent events, log tails" >&2
  kubectl get pods -A -o wide >&2 || true
  kubectl get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -15 >&2 || true
  for f in "$@"; do
    [ -f "$f" ] && { echo "-- $f" >&2; tail -15 "$f" >&2; }
  done
  return 0
}

# ---------------------------------------------------------------- objects

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
          # A local name: the node agent maps images containing echo-basic to the binary; a real node has it
          # imported (e2e/realnode/up.sh) and must never pull it.
          image: sweety-e2e/echo-basic:v1.6.3
          imagePullPolicy: Never
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

# install_chart RELEASE NAMESPACE BUILD_ID [helm args...]: `helm upgrade --install` of charts/sweety (pod
# annotation sweety.dev/build=BUILD_ID, so a new build rolls the pods), then waits until the Deployment is rolled
# out and its pods are Ready.
install_chart() {
  local release=$1 ns=$2 build=$3 helm
  shift 3
  helm=$(helm_bin)
  "$helm" upgrade --install "$release" charts/sweety --namespace "$ns" --create-namespace \
    --set-string "podAnnotations.sweety\.dev/build=$build" --wait --timeout 5m "$@" || return
  kubectl -n "$ns" rollout status "deployment/$release" --timeout=180s || return
  kubectl -n "$ns" wait --for=condition=Ready pod -l "app.kubernetes.io/instance=$release" --timeout=120s >/dev/null
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
