#!/usr/bin/env bash
# e2e/conformance/run.sh — run the Gateway API conformance suite (v1.6.3) against Sweety on a local
# cluster, write the official report into e2e/conformance/reports/ and regenerate docs/conformance.md.
#
#   e2e/conformance/run.sh [--full | --subset | --profiles P1,P2 | --test NAME] [--keep] [-- suite flags...]
#
#   --full       every gateway profile (GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS,GATEWAY-TCP,GATEWAY-UDP),
#                official report + docs/conformance.md (default)
#   --subset     the CI subset: GATEWAY-HTTP and GATEWAY-TLS, report under $SWEETY_CONF_OUT, docs untouched
#   --profiles   these profiles (comma-separated); report and docs like --full
#   --test NAME  one test (the suite's -run-test; features then come from the suite flags, so
#                nothing is inferred from the GatewayClass and no report is written)
#   --keep       leave the cluster running afterwards (default: e2e/install.sh's teardown)
#   --no-install use the cluster already in $KUBECONFIG (Sweety installed, GatewayClass "sweety")
#
# Supported features are inferred by the suite from GatewayClass sweety's status.supportedFeatures,
# so the report claims exactly what the controller advertises.
# The cluster is our own: state in $SWEETY_CLUSTER_DIR (default ~/.cache/sweety/cluster-conf), its
# own apiserver/etcd/KCM ports and node bridge sweetybr3 on 10.247.0.0/24 (see the env defaults below);
# e2e/install.sh brings it up (control plane, Gateway API CRDs, node agent, helm install of charts/sweety).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
GWAPI_VERSION=v1.6.3
mode=full profiles="GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS,GATEWAY-TCP,GATEWAY-UDP" test="" keep=0 install=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --full) mode=full ;;
    --subset) mode=subset; profiles=GATEWAY-HTTP,GATEWAY-TLS ;;
    --profiles) shift; profiles=${1:?--profiles needs a list}; mode=full ;;
    --test) shift; test=${1:?--test needs a name}; mode="test" ;;
    --keep) keep=1 ;;
    --no-install) install=0 ;;
    --) shift; extra=("$@"); break ;;
    *) sed -n 2,22p "$0"; exit 2 ;;
  esac
  shift
done

# Not under /root: the suite's coredns Pod mounts a volume at /root, which would hide the node agent's
# volume sources below it (its root dir is inside the cluster dir).
export SWEETY_CLUSTER_DIR=${SWEETY_CLUSTER_DIR:-/var/tmp/sweety/cluster-conf}
export APISERVER_PORT=${APISERVER_PORT:-16643} ETCD_PORT=${ETCD_PORT:-16679} ETCD_PEER_PORT=${ETCD_PEER_PORT:-16680}
export KCM_PORT=${KCM_PORT:-16657} SCHED_PORT=${SCHED_PORT:-16659}
export SWEETY_BRIDGE=${SWEETY_BRIDGE:-sweetybr3} SWEETY_POD_CIDR=${SWEETY_POD_CIDR:-10.247.0.0/24}
export SWEETY_NODE=${SWEETY_NODE:-sweety-conf-node}
# Experimental CRDs: Retry, the TLSRoute modes etc. are experimental fields (standard CRDs drop them).
export SWEETY_GATEWAY_API_CHANNEL=${SWEETY_GATEWAY_API_CHANNEL:-experimental}
# With --no-install the suite uses $KUBECONFIG as given; otherwise always our own cluster's.
if [ "$install" = 1 ] || [ -z "${KUBECONFIG:-}" ]; then export KUBECONFIG=$SWEETY_CLUSTER_DIR/run/kubeconfig; fi
export PATH="${SWEETY_K8S_BIN:-$HOME/.cache/sweety/k8s/k8s-${K8S_VERSION:-1.34.4}-etcd-${ETCD_VERSION:-3.6.16}/bin}:$PATH"

GWBIN=$("$HERE/build.sh")
export SWEETY_GWAPI_BIN=$GWBIN
# The UDPRoute tests' DNS server (base manifests' coredns Deployment) runs as a real CoreDNS.
# Built when UDP tests run; mapped whenever it is there (a running node agent keeps its first maps).
coredns=/var/tmp/sweety/tools/coredns-v1.12.2/coredns
case "$profiles,$test" in *UDP*) coredns=$("$HERE/build.sh" --coredns) ;; esac
[ -x "$coredns" ] && export SWEETY_IMAGE_MAPS="${SWEETY_IMAGE_MAPS:-} coredns/coredns=$coredns"
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -1)
out=${SWEETY_CONF_OUT:-$SWEETY_CLUSTER_DIR/conformance}
mkdir -p "$out"
rm -f "$out/official-report"
log=$out/suite.log

if [ "$install" = 1 ]; then
  "$REPO/e2e/install.sh" --no-smoke
  if [ "$keep" = 0 ]; then trap '"$REPO/e2e/install.sh" down || true' EXIT; fi
fi
kubectl wait --for=condition=Accepted gatewayclass/sweety --timeout=120s

# GatewayStaticAddresses: the node agent's load balancer gives a Service the address it asks for when that is
# in the load-balancer range (.200-.250 of the Pod CIDR) and free, so the last one of the range is usable
# (dynamic addresses are handed out from the bottom) and TEST-NET-1's 192.0.2.1 is not.
lb_usable=${SWEETY_POD_CIDR%.*/*}.250
flags=(-gateway-class=sweety -cleanup-base-resources=false -allow-crds-mismatch=false
  -organization=sweety-dev -project=sweety -url=https://github.com/sweety-dev/sweety
  -version="v$version" -contact=@sweety-dev/maintainers -mode=default
  -usable-address="$lb_usable" -unusable-address=192.0.2.1)
case "$mode" in
  # -run-test turns off the inference: pass the class's features (a later -supported-features after
  # `--` overrides them, to try a feature not claimed yet).
  test) flags+=(-run-test="$test" -supported-features="$(kubectl get gatewayclass sweety \
          -o jsonpath='{.status.supportedFeatures[*].name}' | tr ' ' ,)") ;;
  *) flags+=(-conformance-profiles="$profiles" -report-output="$out/report.yaml") ;;
esac
if [ -f "$HERE/skip-tests.txt" ] && [ "$mode" != test ]; then
  skips=$(awk -F'|' '!/^#/ && NF{gsub(/ /,"",$1); print $1}' "$HERE/skip-tests.txt" | paste -sd, -)
  [ -n "$skips" ] && flags+=(-skip-tests="$skips")
fi

echo "conformance $GWAPI_VERSION: $mode ${test:-$profiles}, log $log"
rc=0
( cd "$out" && timeout "${SWEETY_CONF_TIMEOUT:-5400}" "$GWBIN/sweety-conformance.test" -test.run TestConformance -test.v \
    -test.timeout 90m "${flags[@]}" "${extra[@]}" ) > "$log" 2>&1 || rc=$?
grep -oE '^ {0,4}--- (PASS|FAIL|SKIP): TestConformance/[A-Za-z0-9]+ ' "$log" | awk '{print $2}' | sort | uniq -c || true
echo "suite exit $rc"

if [ "$mode" = full ] && [ -f "$out/report.yaml" ]; then
  dest=$HERE/reports/$GWAPI_VERSION
  mkdir -p "$dest"
  channel=$(sed -n 's/^gatewayAPIChannel: *//p' "$out/report.yaml")
  # The official file name: <channel>-<version>-<mode>-report.yaml
  rep=$dest/$channel-v$version-default-report.yaml
  # The code the run tested: this checkout's commit, marked when files other than the report and its page
  # differ from it (the report's first line, a YAML comment; docs/conformance.md's "Suite:" line).
  revision=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
  if [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no -- . ':!e2e/conformance/reports' ':!docs/conformance.md' 2>/dev/null)" ]; then
    revision="$revision+local-changes"
  fi
  # The suite lists the profiles in a random order (a Go map): sort them by name, so two runs with the same
  # results write the same file (ci.sh compares it with the committed one, the date and revision aside).
  python3 - "$out/report.yaml" "$rep" "$revision" <<'PY'
import re, sys
src, dst, revision = sys.argv[1:]
lines = open(src).read().splitlines(keepends=True)
out, items, i = ["# revision: " + revision + "\n"], [], 0
while i < len(lines):
    out.append(lines[i])
    if lines[i].rstrip("\n") == "profiles:":
        i += 1
        while i < len(lines) and lines[i].startswith("- "):
            item = [lines[i]]
            i += 1
            while i < len(lines) and lines[i].startswith("  "):
                item.append(lines[i])
                i += 1
            items.append(item)
        name = lambda it: next((re.sub(r"^  name: *", "", l).strip() for l in it if l.startswith("  name:")), "")
        for it in sorted(items, key=name):
            out.extend(it)
        continue
    i += 1
open(dst, "w").write("".join(out))
PY
  python3 "$HERE/gen-docs.py" --report "$rep" --log "$log" --skips "$HERE/skip-tests.txt" \
    --features-why "$HERE/unclaimed-features.txt" --revision "$revision" --out "$REPO/docs/conformance.md"
  # For ci.sh, which keeps a copy: where this run wrote the report (repo-relative).
  echo "${rep#"$REPO"/}" >"$out/official-report"
  echo "report: $rep; docs/conformance.md regenerated"
fi
exit $rc
