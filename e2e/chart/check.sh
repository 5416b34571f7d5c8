#!/usr/bin/env bash
# Checks of the Helm chart (charts/sweety), the rendered deploy/sweety.yaml, the Kubernetes
# examples (deploy/examples/k8s) and the README's values table:
#   1. builds helm and kubeconform with `go install` (pinned, cached in ~/.cache/sweety/tools);
#   2. `helm lint --strict`;
#   3. values that the schema or the templates must reject are rejected, with the expected message;
#   4. golden tests: e2e/chart/tests/helm/<case>.values.yaml rendered by `helm template` must equal
#      <case>.out.yaml (SWEETY_BLESS=1 rewrites them; review the diff); rendered as for a cluster
#      that serves the Gateway API (--api-versions), except the no-gateway-api* cases;
#   5. deploy/sweety.yaml equals the default render (namespace sweety, our CRDs included, the
#      Gateway API CRDs not: they are one file of their own) (SWEETY_BLESS=1 rewrites it);
#      charts/sweety/crds/gateway-api-standard.yaml is the Gateway API v1.6.3 standard channel
#      (e2e/chart/gateway-api-crds.py; SWEETY_BLESS=1 rewrites it);
#   6. the README values table is current (e2e/chart/values-table.py; SWEETY_BLESS=1 rewrites it);
#      the PrometheusRule's rules file passes `promtool check rules` (built with `go install`,
#      cached like helm) and renders unchanged; (the dashboard's and rules' metric names are
#      checked against real scrapes by cargo test);
#   7. kubeconform -strict on every rendered manifest and example, with JSON schemas generated
#      from the cluster's own OpenAPI (built-in kinds, our CRDs, Gateway API CRDs); kinds with no
#      schema there (ServiceMonitor: the Prometheus Operator CRD is not installed) are skipped
#      with -ignore-missing-schemas, and the script says which;
#   8. `kubectl apply --dry-run=server` of the same manifests against the cluster, which runs the
#      apiserver's full validation (strict field validation, CEL rules of the CRDs);
#      `helm install --dry-run=server` (also renders NOTES.txt);
#   9. RBAC: `kubectl auth can-i` as the chart's ServiceAccount, allowed and denied verbs;
#  10. smoke run (e2e/chart/smoke.py): the controller and dataplane binaries
#      ($CARGO_TARGET_DIR/debug, or SWEETY_CONTROLLER_BIN / SWEETY_DATAPLANE_BIN) started with
#      each golden's rendered command lines must both report /healthz and /readyz 200.
# Steps 7-10 need a cluster: SWEETY_KUBECONFIG (as .ci/run sets it) or KUBECONFIG, with the
# Gateway API CRDs installed (e2e/cluster/gateway-api.sh crds standard); this script installs
# our CRDs and creates the namespace `sweety` in it. Without a cluster they are skipped with a
# note, unless SWEETY_REQUIRE_CLUSTER=1.
#
# Usage: e2e/chart/check.sh     (SWEETY_BLESS=1 to regenerate goldens, deploy/sweety.yaml, README table)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
PROMTOOL_VERSION=v0.316.0
KUBE_VERSION=1.34.0
TOOLS=${SWEETY_TOOLS:-$HOME/.cache/sweety/tools}
CHART=charts/sweety
GOLDEN=e2e/chart/tests/helm
bless=${SWEETY_BLESS:-}

tool() { # tool NAME VERSION MODULE_PATH
    local dir="$TOOLS/$1-$2"
    if [[ ! -x $dir/$1 ]]; then
        command -v go >/dev/null || { echo "Go is required to build $1" >&2; exit 1; }
        echo "== building $1 $2 (cached in $dir)" >&2
        mkdir -p "$dir"
        # Bounded: a cold build of promtool (the Prometheus module) is the longest, minutes.
        GOBIN="$dir" GOFLAGS=-buildvcs=false GOTOOLCHAIN=local timeout 1200 go install "$3@$2" >&2 ||
            { echo "building $1 $2 failed or took over 20 minutes" >&2; exit 1; }
    fi
    echo "$dir/$1"
}
HELM=$(tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm)
KUBECONFORM=$(tool kubeconform "$KUBECONFORM_VERSION" github.com/yannh/kubeconform/cmd/kubeconform)
# promtool of Prometheus 3.16.0 (the module's v0.316.0), to check the PrometheusRule's groups.
PROMTOOL=$(tool promtool "$PROMTOOL_VERSION" github.com/prometheus/prometheus/cmd/promtool)

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }

# What a cluster with the Gateway API CRDs reports (.Capabilities.APIVersions gates the GatewayClass).
GWAPI=(--api-versions gateway.networking.k8s.io/v1/GatewayClass)
render() { # render OUT [helm args...]
    local out=$1; shift
    "$HELM" template sweety "$CHART" --namespace sweety --kube-version "$KUBE_VERSION" "$@" >"$out"
}

echo "== helm lint"
"$HELM" lint --strict --kube-version "$KUBE_VERSION" "$CHART"
for case in "$GOLDEN"/*.values.yaml; do
    "$HELM" lint --strict --kube-version "$KUBE_VERSION" "$CHART" -f "$case" >/dev/null ||
        fail "helm lint with $case"
done

echo "== bad values are rejected with a clear message"
reject() { # reject 'EXPECTED MESSAGE' --set ...
    local want=$1; shift
    if "$HELM" template sweety "$CHART" --kube-version "$KUBE_VERSION" "$@" >/dev/null 2>"$WORK/err"; then
        fail "accepted: $*"
    elif ! grep -qF -- "$want" "$WORK/err"; then
        fail "rejected $* without '$want':"; cat "$WORK/err" >&2
    else
        echo "ok: $* -> $want"
    fi
}
reject "at '/service/type': value must be one of" --set service.type=External
reject "at '/controller/metricsPort': minimum: got 80" --set controller.metricsPort=80
reject "at '/runAsUser': minimum: got 0" --set runAsUser=0
reject "at '/service/externalTrafficPolicy': value must be 'Cluster'" \
    --set service.type=ClusterIP,service.externalTrafficPolicy=Local
reject "additional properties 'replicas' not allowed" --set replicas=2
reject "at '/controller/debounce'" --set controller.debounce=soon
reject "controller.leaderElection must be true when more than one pod can run" \
    --set replicaCount=2,controller.leaderElection=false
reject "autoscaling.minReplicas must not be greater than autoscaling.maxReplicas" \
    --set autoscaling.enabled=true,autoscaling.minReplicas=5,autoscaling.maxReplicas=3
reject "metrics.serviceMonitor.enabled needs metrics.service.enabled" \
    --set metrics.serviceMonitor.enabled=true,metrics.service.enabled=false
reject "at '/kind': value must be one of" --set kind=StatefulSet
reject "at '/controller/gatewayServiceType': value must be one of" --set controller.gatewayServiceType=External
reject "at '/image/digest'" --set image.digest=latest
reject "at '/containerSecurityContext/privileged'" --set containerSecurityContext.privileged=true
reject "at '/containerSecurityContext/allowPrivilegeEscalation'" --set containerSecurityContext.allowPrivilegeEscalation=true
reject "at '/podSecurityContext/runAsNonRoot'" --set podSecurityContext.runAsNonRoot=false
reject "at '/containerSecurityContext/runAsUser': minimum: got 0" --set containerSecurityContext.runAsUser=0
# What else would undo the chart's securityContext (the Pod Security Standards' restricted profile).
reject "at '/containerSecurityContext/capabilities/add/0'" --set 'containerSecurityContext.capabilities.add={SYS_ADMIN}'
reject "at '/containerSecurityContext/capabilities/drop'" --set 'containerSecurityContext.capabilities.drop={NET_RAW}'
reject "at '/containerSecurityContext/seccompProfile/type'" --set containerSecurityContext.seccompProfile.type=Unconfined
reject "at '/podSecurityContext/seccompProfile/type'" --set podSecurityContext.seccompProfile.type=Unconfined
reject "at '/containerSecurityContext/appArmorProfile/type'" --set containerSecurityContext.appArmorProfile.type=Unconfined
reject "at '/containerSecurityContext/procMount'" --set containerSecurityContext.procMount=Unmasked
reject "at '/podSecurityContext/fsGroup': minimum: got 0" --set podSecurityContext.fsGroup=0
reject "at '/podSecurityContext/supplementalGroups/0': minimum: got 0" --set 'podSecurityContext.supplementalGroups={0}'
reject "at '/podSecurityContext/sysctls/0/name'" \
    --set 'podSecurityContext.sysctls[0].name=kernel.msgmax,podSecurityContext.sysctls[0].value=1'
reject "at '/podSecurityContext/seLinuxOptions': additional properties 'user' not allowed" \
    --set podSecurityContext.seLinuxOptions.user=system_u
reject "at '/containerSecurityContext': additional properties 'windowsOptions' not allowed" \
    --set containerSecurityContext.windowsOptions.hostProcess=true
reject "at '/controller/extraArgs/0'" --set 'controller.extraArgs={-v}'
reject "autoscaling.enabled needs kind Deployment" --set kind=DaemonSet,autoscaling.enabled=true
reject "controller.leaderElection must be true" --set kind=DaemonSet,controller.leaderElection=false

echo "== what the chart renders by default"
render "$WORK/default.yaml" "${GWAPI[@]}"
python3 - "$WORK/default.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cls = next(d for d in docs if d["kind"] == "IngressClass")
if "ingressclass.kubernetes.io/is-default-class" in (cls["metadata"].get("annotations") or {}):
    sys.exit("FAIL: the IngressClass is the cluster default by default (it would take other controllers' class-less Ingresses)")
if not any(d["kind"] == "GatewayClass" for d in docs):
    sys.exit("FAIL: no GatewayClass where the cluster serves the Gateway API")
print("ok: the IngressClass is not the cluster default; the GatewayClass is there with the Gateway API")
PY
"$HELM" template sweety "$CHART" --kube-version "$KUBE_VERSION" >"$WORK/no-gwapi.yaml"
if grep -q '^kind: GatewayClass' "$WORK/no-gwapi.yaml"; then
    fail "a GatewayClass is rendered for a cluster without the Gateway API"
else
    echo "ok: no GatewayClass without gateway.networking.k8s.io/v1 in .Capabilities.APIVersions"
fi

echo "== helm template goldens ($GOLDEN)"
cases=()
for values in "$GOLDEN"/*.values.yaml; do
    case=${values%.values.yaml}
    cases+=("$case.out.yaml")
    case_args=("${GWAPI[@]}")
    [[ $(basename "$case") == no-gateway-api* ]] && case_args=()
    render "$WORK/out.yaml" -f "$values" "${case_args[@]}"
    if [[ -n $bless ]]; then
        cp "$WORK/out.yaml" "$case.out.yaml"
        echo "blessed $case.out.yaml"
    elif ! diff -u "$case.out.yaml" "$WORK/out.yaml" >"$WORK/diff"; then
        head -40 "$WORK/diff" >&2
        fail "$case.out.yaml differs from the render (SWEETY_BLESS=1 $0 to accept after review)"
    else
        echo "ok: $case"
    fi
done

echo "== deploy/sweety.yaml is the default render"
{
    echo "# Rendered from charts/sweety with default values by e2e/chart/check.sh"
    echo "# (SWEETY_BLESS=1 e2e/chart/check.sh regenerates it). Do not edit."
    echo "# Install (the Gateway API CRDs first: its GatewayClass needs them):"
    echo "#   kubectl apply --server-side -f charts/sweety/crds/gateway-api-standard.yaml"
    echo "#   kubectl apply --server-side -f deploy/sweety.yaml"
    echo "apiVersion: v1"
    echo "kind: Namespace"
    echo "metadata:"
    echo "  name: sweety"
    # Without the Gateway API CRDs (and the comment-only header of their file).
    "$HELM" template sweety "$CHART" --namespace sweety --kube-version "$KUBE_VERSION" --include-crds \
        "${GWAPI[@]}" | python3 -c '
import re, sys
docs = re.split(r"(?m)^---\n", sys.stdin.read())
def content(d):
    return any(l.strip() and not l.startswith("#") for l in d.splitlines())
keep = [d for d in docs if content(d)
        and not ("kind: CustomResourceDefinition" in d and "group: gateway.networking.k8s.io" in d)]
sys.stdout.write("".join("---\n" + d for d in keep))'
} >"$WORK/sweety.yaml"
if [[ -n $bless ]]; then
    cp "$WORK/sweety.yaml" deploy/sweety.yaml
    echo "blessed deploy/sweety.yaml"
elif ! diff -q deploy/sweety.yaml "$WORK/sweety.yaml" >/dev/null; then
    fail "deploy/sweety.yaml is stale (SWEETY_BLESS=1 $0)"
else
    echo "ok: deploy/sweety.yaml"
fi

echo "== the bundled Gateway API CRDs"
if [[ -n $bless ]]; then
    python3 e2e/chart/gateway-api-crds.py
else
    python3 e2e/chart/gateway-api-crds.py --check || failed=1
fi

echo "== README values table"
if [[ -n $bless ]]; then
    python3 e2e/chart/values-table.py
else
    python3 e2e/chart/values-table.py --check || failed=1
fi

# The dashboard's and the alert rules' metric names are checked against what the binaries
# expose by tests that scrape them (cargo test: dataplane/tests/metrics.rs
# dashboard_and_alert_rules_name_only_exposed_dataplane_metrics, controller metrics
# dashboard_and_alert_rules_name_only_exposed_controller_metrics).
echo "== PrometheusRule: promtool check rules, and the chart renders the rules file as it is"
"$PROMTOOL" check rules "$CHART/files/prometheus-rules.yaml" || fail "promtool check rules"
render "$WORK/rules.yaml" --set metrics.prometheusRule.enabled=true
python3 - "$WORK/rules.yaml" "$CHART/files/prometheus-rules.yaml" <<'PY' || failed=1
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
rule = [d for d in docs if d["kind"] == "PrometheusRule"]
if len(rule) != 1:
    sys.exit(f"FAIL: {len(rule)} PrometheusRule objects rendered with metrics.prometheusRule.enabled")
if rule[0]["spec"] != yaml.safe_load(open(sys.argv[2])):
    sys.exit("FAIL: the rendered PrometheusRule's spec differs from files/prometheus-rules.yaml")
alerts = [r["alert"] for g in rule[0]["spec"]["groups"] for r in g["rules"]]
print(f"ok: PrometheusRule with {len(alerts)} alerts: {', '.join(alerts)}")
PY
render "$WORK/norules.yaml"
if grep -q '^kind: PrometheusRule' "$WORK/norules.yaml"; then
    fail "a PrometheusRule is rendered by default"
fi

manifests=("${cases[@]}" deploy/sweety.yaml deploy/examples/k8s/*.yaml)

kubeconfig=${SWEETY_KUBECONFIG:-${KUBECONFIG:-}}
if [[ -z $kubeconfig ]] || ! kubectl --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1; then
    if [[ -n ${SWEETY_REQUIRE_CLUSTER:-} ]]; then
        fail "no reachable cluster (SWEETY_KUBECONFIG/KUBECONFIG) for kubeconform schemas and the server-side dry run"
    else
        echo "NOTE: no reachable cluster (SWEETY_KUBECONFIG/KUBECONFIG): skipping kubeconform and the server-side dry run"
    fi
else
    k() { kubectl --kubeconfig "$kubeconfig" "$@"; }
    echo "== our CRDs and namespace sweety in the cluster"
    k apply --server-side --force-conflicts -f "$CHART/crds/" >/dev/null
    k wait --for=condition=Established --timeout=60s -f "$CHART/crds/" >/dev/null
    # sweety, and the namespaces the ha case watches (its Roles live there).
    for ns in sweety web api; do
        k get namespace "$ns" >/dev/null 2>&1 || k create namespace "$ns" >/dev/null
    done

    echo "== helm install --dry-run=server (cluster checks, NOTES.txt)"
    if "$HELM" install sweety "$CHART" --namespace sweety --kubeconfig "$kubeconfig" --dry-run=server \
        >"$WORK/install.out" 2>&1 && grep -q "kubectl -n sweety get pods" "$WORK/install.out"; then
        echo "ok: helm install --dry-run=server"
    else
        cat "$WORK/install.out" >&2
        fail "helm install --dry-run=server"
    fi

    echo "== RBAC is least privilege (kubectl auth can-i as the chart's ServiceAccount)"
    "$HELM" template sweety "$CHART" --namespace sweety --kube-version "$KUBE_VERSION" \
        --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml >"$WORK/rbac.yaml"
    k apply -f "$WORK/rbac.yaml" >/dev/null
    can() { # can yes|no VERB RESOURCE [can-i args...]
        local want=$1; shift
        local got
        got=$(k auth can-i --as=system:serviceaccount:sweety:sweety "$@" 2>/dev/null || true)
        if [[ $got == "$want" ]]; then echo "ok: $want: $*"; else fail "can-i $*: got '$got', want '$want'"; fi
    }
    can yes watch secrets -A
    can yes list secrets -n default
    # The shared default certificate: created in the release namespace (RBAC cannot limit
    # `create` to a name), updated or deleted there under its own name only; nowhere else.
    can yes create secrets -n sweety
    can no create secrets -n default
    can yes update secrets/sweety-default-certificate -n sweety
    can yes delete secrets/sweety-default-certificate -n sweety
    can no update secrets/other -n sweety
    can no delete secrets/other -n sweety
    can no update secrets -n default
    can no delete secrets -n sweety
    for r in ingressclasses.networking.k8s.io ingresses.networking.k8s.io \
        gatewayclasses.gateway.networking.k8s.io gateways.gateway.networking.k8s.io \
        httproutes.gateway.networking.k8s.io grpcroutes.gateway.networking.k8s.io \
        tlsroutes.gateway.networking.k8s.io tcproutes.gateway.networking.k8s.io \
        udproutes.gateway.networking.k8s.io referencegrants.gateway.networking.k8s.io \
        backendtlspolicies.gateway.networking.k8s.io sweetysites.sweety.dev \
        sweetyproxyconfigs.sweety.dev sweetysecuritypolicies.sweety.dev configmaps namespaces; do
        can yes watch "$r" -A
        can no update "$r" -n default
    done
    # Per-Gateway Services live in the release namespace by default (gatewayServiceNamespace=
    # release): Services are written there only (a Role), EndpointSlices nowhere; both are read
    # cluster-wide.
    for r in services endpointslices.discovery.k8s.io; do
        can yes watch "$r" -A
        can no create "$r" -n default
        can no update "$r" -n default
        can no patch "$r" -n default
        can no delete "$r" -n default
    done
    for v in create update patch delete; do
        can yes "$v" services -n sweety
        can no "$v" endpointslices.discovery.k8s.io -n sweety
    done
    for r in gateways.gateway.networking.k8s.io httproutes.gateway.networking.k8s.io \
        gatewayclasses.gateway.networking.k8s.io backendtlspolicies.gateway.networking.k8s.io \
        ingresses.networking.k8s.io sweetysites.sweety.dev sweetysecuritypolicies.sweety.dev; do
        can yes patch "$r" --subresource=status -n default
        can yes get "$r" --subresource=status -n default
    done
    can no patch sweetyproxyconfigs.sweety.dev --subresource=status -n default
    can no create sweetysecuritypolicies.sweety.dev -n default
    can no delete sweetysecuritypolicies.sweety.dev -n default
    can yes create events -n default
    can yes create events.events.k8s.io -n default
    can yes update leases.coordination.k8s.io -n sweety
    can no update leases.coordination.k8s.io -n default
    can no create pods -n sweety
    can no create configmaps -n sweety
    # The Lease's owner: the chart's own ServiceAccount, read only.
    can yes get serviceaccounts/sweety -n sweety
    can no get serviceaccounts/default -n sweety
    can no update serviceaccounts/sweety -n sweety
    k delete -f "$WORK/rbac.yaml" --wait=false >/dev/null

    echo "== RBAC with defaultCertificateSecret: no Secret is written anywhere"
    "$HELM" template sweety "$CHART" --namespace sweety --kube-version "$KUBE_VERSION" \
        --set controller.defaultCertificateSecret=sweety/mine \
        --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml >"$WORK/rbac.yaml"
    k apply -f "$WORK/rbac.yaml" >/dev/null
    can yes get secrets/mine -n sweety
    for v in create update delete; do
        can no "$v" secrets -n sweety
        can no "$v" secrets/sweety-default-certificate -n sweety
    done
    k delete -f "$WORK/rbac.yaml" --wait=false >/dev/null

    echo "== RBAC with gatewayServiceNamespace=gateway: Services and EndpointSlices written cluster-wide"
    "$HELM" template sweety "$CHART" --namespace sweety --kube-version "$KUBE_VERSION" \
        --set controller.gatewayServiceNamespace=gateway \
        --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml >"$WORK/rbac.yaml"
    k apply -f "$WORK/rbac.yaml" >/dev/null
    for r in services endpointslices.discovery.k8s.io; do
        can yes watch "$r" -A
        can yes create "$r" -n default
        can yes delete "$r" -n default
        can yes patch "$r" -n sweety
    done
    k delete -f "$WORK/rbac.yaml" --wait=false >/dev/null

    echo "== RBAC with gatewayServiceNamespace=gateway and watchNamespaces: Services and EndpointSlices written only there"
    "$HELM" template sweety "$CHART" --namespace sweety --kube-version "$KUBE_VERSION" \
        --set controller.gatewayServiceNamespace=gateway --set 'controller.watchNamespaces={web}' \
        --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml >"$WORK/rbac.yaml"
    k apply -f "$WORK/rbac.yaml" >/dev/null
    for r in services endpointslices.discovery.k8s.io; do
        can yes watch "$r" -A
        can yes create "$r" -n web
        can yes delete "$r" -n web
        can yes delete "$r" -n sweety
        can no create "$r" -n default
        can no delete "$r" -n api
    done
    k delete -f "$WORK/rbac.yaml" --wait=false >/dev/null

    echo "== RBAC with watchNamespaces (release namespace default): Services written only in the release namespace"
    "$HELM" template sweety "$CHART" --namespace sweety --kube-version "$KUBE_VERSION" \
        --set 'controller.watchNamespaces={web}' \
        --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml >"$WORK/rbac.yaml"
    k apply -f "$WORK/rbac.yaml" >/dev/null
    can yes create services -n sweety
    can no create services -n web
    can no create endpointslices.discovery.k8s.io -n web
    can no create endpointslices.discovery.k8s.io -n sweety
    k delete -f "$WORK/rbac.yaml" --wait=false >/dev/null

    echo "== smoke run: both binaries with the rendered command lines (e2e/chart/smoke.py)"
    target=${CARGO_TARGET_DIR:-$REPO/target}
    controller_bin=${SWEETY_CONTROLLER_BIN:-$target/debug/sweety-controller}
    dataplane_bin=${SWEETY_DATAPLANE_BIN:-$target/debug/sweety-dataplane}
    if [[ -x $controller_bin && -x $dataplane_bin ]]; then
        for out in "${cases[@]}"; do
            echo "-- $out"
            python3 e2e/chart/smoke.py "$out" "$kubeconfig" "$controller_bin" "$dataplane_bin" ||
                fail "smoke run with $out"
        done
    elif [[ -n ${SWEETY_REQUIRE_CLUSTER:-} ]]; then
        fail "no binaries at $controller_bin / $dataplane_bin (cargo build first)"
    else
        echo "NOTE: no binaries at $controller_bin / $dataplane_bin: skipping the smoke run"
    fi

    echo "== kubeconform -strict (schemas from the cluster's OpenAPI)"
    python3 e2e/chart/openapi-schemas.py "$kubeconfig" "$WORK/schemas"
    "$KUBECONFORM" -strict -summary -output text -kubernetes-version "$KUBE_VERSION" \
        -schema-location "$WORK/schemas/{{ .ResourceKind }}-{{ .Group }}-{{ .ResourceAPIVersion }}.json" \
        -ignore-missing-schemas -verbose "${manifests[@]}" >"$WORK/kubeconform" 2>&1 || {
        cat "$WORK/kubeconform" >&2
        fail "kubeconform"
    }
    grep -v ' is valid$' "$WORK/kubeconform" || true
    if grep -q 'skipped' "$WORK/kubeconform"; then
        echo "NOTE: kinds skipped by kubeconform (no schema in this cluster):" \
            "$(grep ' skipped$' "$WORK/kubeconform" | awk '{print $(NF-1)}' | sort -u | tr '\n' ' ')"
    fi

    echo "== kubectl apply --dry-run=server"
    for m in "${manifests[@]}"; do
        # ServiceMonitor and PodMonitor need the Prometheus Operator CRDs, which this cluster does not have.
        awk 'BEGIN{RS="\n---\n"; ORS="\n---\n"} !/\nkind: (ServiceMonitor|PodMonitor|PrometheusRule)\n/' "$m" >"$WORK/dry.yaml"
        if k apply --dry-run=server --validate=strict -f "$WORK/dry.yaml" >"$WORK/dry.out" 2>&1; then
            echo "ok: $m ($(grep -c 'server dry run' "$WORK/dry.out") objects)"
        else
            cat "$WORK/dry.out" >&2
            fail "server-side dry run of $m"
        fi
    done
fi

if [[ $failed -ne 0 ]]; then
    echo "e2e/chart/check.sh: FAILED" >&2
    exit 1
fi
echo "e2e/chart/check.sh: all checks passed"
