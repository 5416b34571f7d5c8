#!/usr/bin/env bash
# e2e/conformance/ci.sh [--real-node] — the conformance run of CI (.ci/run runs it with --real-node).
#   --real-node  the FULL run: every gateway profile (GATEWAY-HTTP, -GRPC, -TLS, -TCP, -UDP, core and every
#                extended feature GatewayClass sweety claims) on the cluster of e2e/realnode/up.sh, which must be
#                up with --conformance and SWEETY_GATEWAY_API_CHANNEL=experimental (the same environment:
#                SWEETY_CLUSTER_DIR, SWEETY_POD_CIDR, ...). run.sh writes the official report into
#                reports/v1.6.3/ (its first line: the revision tested) and regenerates docs/conformance.md; this
#                script keeps both and the suite log under ~/.cache/sweety/conformance-reports/<time>-<revision>/
#                (SWEETY_CONF_KEEP; the 10 newest; `latest` links the last), prints where, then fails when either
#                differs from what is committed (the run's date and revision line aside): the committed report
#                is the one produced from the code under test. Commit the kept copy when the difference is intended.
#                A failing run also keeps the controller's and dataplane's logs with the suite log and report
#                under ~/.cache/sweety/conformance-failures/<time>-<revision>/ (SWEETY_CONF_FAILURES; the 3
#                newest) and prints where.
#   (default)    the GATEWAY-HTTP and GATEWAY-TLS subset on a fresh node-agent cluster of its own (no report).
# Both fail when a test fails that is not listed in known-failures.txt (regressions), and also when a listed
# test now passes (so the list is kept honest and shrinks). Bounded by SWEETY_CONF_TIMEOUT (default 1500 s).
# The suite's log and report: $SWEETY_CONF_OUT (default $SWEETY_CLUSTER_DIR/conformance).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
real=0
[ "${1:-}" = --real-node ] && { real=1; shift; }
if [ "$real" = 1 ]; then
  # shellcheck source=e2e/realnode/env.sh disable=SC1091
  . "$REPO/e2e/realnode/env.sh"
  export SWEETY_POD_CIDR=$POD_CIDR
  kubectl --request-timeout=20s get gatewayclass sweety >/dev/null || { echo "ci: no real-node cluster with Sweety at $KUBECONFIG (e2e/realnode/up.sh --conformance)"; exit 1; }
else
  export SWEETY_CLUSTER_DIR=${SWEETY_CLUSTER_DIR:-/var/tmp/sweety/cluster-conf-ci}
  # Its own ports, bridge and Pod network, apart from run.sh's defaults (a developer's cluster may be up).
  export APISERVER_PORT=${APISERVER_PORT:-17643} ETCD_PORT=${ETCD_PORT:-17679} ETCD_PEER_PORT=${ETCD_PEER_PORT:-17680}
  export KCM_PORT=${KCM_PORT:-17657} SCHED_PORT=${SCHED_PORT:-17659}
  export SWEETY_BRIDGE=${SWEETY_BRIDGE:-sweetybr4} SWEETY_POD_CIDR=${SWEETY_POD_CIDR:-10.248.0.0/24}
  export SWEETY_NODE=${SWEETY_NODE:-sweety-conf-ci-node}
fi
export SWEETY_CONF_OUT=${SWEETY_CONF_OUT:-$SWEETY_CLUSTER_DIR/conformance}
export SWEETY_CONF_TIMEOUT=${SWEETY_CONF_TIMEOUT:-1500}
if [ "$real" = 1 ]; then
  "$HERE/run.sh" --no-install --full "$@"
  rc=$?
else
  # Start from nothing: a previous run's state (pid files, etcd data) must not leak into this one.
  bash "$HERE/../install.sh" down --purge >/dev/null 2>&1 || true
  "$HERE/run.sh" --subset "$@"
  rc=$?
fi
log=$SWEETY_CONF_OUT/suite.log
[ -f "$log" ] || { echo "ci: no suite log (run.sh exit $rc)"; exit 1; }
failed=$(sed -n 's/^ *--- FAIL: TestConformance\/\([A-Za-z0-9]*\) .*/\1/p' "$log" | sort -u)
passed=$(sed -n 's/^ *--- PASS: TestConformance\/\([A-Za-z0-9]*\) .*/\1/p' "$log" | sort -u)
skipped=$(sed -n 's/^ *--- SKIP: TestConformance\/\([A-Za-z0-9]*\) .*/\1/p' "$log" | sort -u)
known=$(awk -F'|' '!/^#/ && NF{gsub(/ /,"",$1); print $1}' "$HERE/known-failures.txt" 2>/dev/null | sort -u)
new=$(comm -23 <(echo "$failed" | sed '/^$/d') <(echo "$known" | sed '/^$/d'))
fixed=$(comm -12 <(echo "$passed" | sed '/^$/d') <(echo "$known" | sed '/^$/d'))
count() { sed '/^$/d' | wc -l; }
echo "ci: $(echo "$passed" | count) passed, $(echo "$failed" | count) failed ($(echo "$known" | count) known), $(echo "$skipped" | count) skipped"
status=0
# (test names are single words: unquoted, each becomes one line)
# shellcheck disable=SC2086
if [ -n "$new" ]; then echo "ci: new failures:"; printf '  %s\n' $new; status=1; fi
# shellcheck disable=SC2086
if [ -n "$fixed" ]; then echo "ci: now passing, remove from known-failures.txt:"; printf '  %s\n' $fixed; status=1; fi
# A suite killed partway (go test timeout, SWEETY_CONF_TIMEOUT) leaves no FAIL line for what never ran.
if [ "$rc" -ne 0 ] && [ -z "$failed" ]; then echo "ci: suite aborted (exit $rc) without a FAIL line"; status=1; fi
if grep -q "panic: test timed out" "$log"; then echo "ci: suite timed out"; status=1; fi
if [ -z "$passed" ]; then echo "ci: nothing passed (setup failure?), suite exit $rc"; status=1; fi
if [ "$real" = 1 ]; then
  # What this run wrote (report, page, suite log), kept outside the repo whatever the outcome, under the
  # revision it tested: the copy to commit (e2e/conformance/README.md, "Refreshing the committed report").
  paths=(e2e/conformance/reports docs/conformance.md)
  rep=$(cat "$SWEETY_CONF_OUT/official-report" 2>/dev/null)
  if [ -n "$rep" ] && [ -f "$REPO/$rep" ]; then
    revision=$(sed -n '1s/^# revision: //p' "$REPO/$rep")
    keep_root=${SWEETY_CONF_KEEP:-$HOME/.cache/sweety/conformance-reports}
    kept=$keep_root/$(date -u +%Y%m%dT%H%M%SZ)-${revision:-unknown}
    mkdir -p "$kept"
    (cd "$REPO" && cp --parents "$rep" docs/conformance.md "$kept/") && cp "$log" "$kept/suite.log"
    ln -sfn "$kept" "$keep_root/latest"
    # Bounded: the 10 newest runs are kept.
    find "$keep_root" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -r | tail -n +11 | while read -r old; do
      rm -rf "${keep_root:?}/$old"
    done
    echo "ci: this run's report (revision ${revision:-unknown}): $kept/$rep"
    echo "ci:   its page and the suite log: $kept/docs/conformance.md $kept/suite.log"
    echo "ci:   to commit them: cp -r $kept/e2e $kept/docs <repo>/"
  else
    echo "ci: the run wrote no report (nothing kept)"; status=1
  fi
  # The committed report and page must be what this run of this code wrote (the run's date and the
  # revision line aside: the committed copy names the revision CI tested, the commit that adds it is later).
  untracked=$(cd "$REPO" && git status --porcelain -- "${paths[@]}" | grep '^??')
  if ! (cd "$REPO" && git diff --quiet -I '^date: ' -I '^# revision: ' -I '^Suite: Gateway API ' -- "${paths[@]}") || [ -n "$untracked" ]; then
    echo "ci: the conformance report or docs/conformance.md differ from what this run wrote; commit them:"
    (cd "$REPO" && git diff --stat -- "${paths[@]}"; git status --short -- "${paths[@]}")
    status=1
  else
    echo "ci: the committed report and docs/conformance.md are this run's (date aside)"
  fi
  # A failing run's evidence, kept before .ci/run purges the node: the suite log and report, the Sweety
  # Pods' container logs as the kubelet wrote them (controller and dataplane, restarted containers and
  # rotated files too), the Gateways, Services and EndpointSlices as the run left them, and the end of the
  # kube-proxy log. Under SWEETY_CONF_FAILURES (default ~/.cache/sweety/conformance-failures); the 3 newest.
  if [ "$status" -ne 0 ]; then
    fail_root=${SWEETY_CONF_FAILURES:-$HOME/.cache/sweety/conformance-failures}
    rev=${revision:-$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)}
    fdir=$fail_root/$(date -u +%Y%m%dT%H%M%SZ)-$rev
    mkdir -p "$fdir"
    cp "$log" "$fdir/suite.log"
    if [ -n "${rep:-}" ] && [ -f "$REPO/$rep" ]; then cp "$REPO/$rep" "$fdir/"; fi
    (cd "$NODE_DIR/pod-logs" 2>/dev/null && tar -czf "$fdir/pod-logs-$NS.tar.gz" "${NS}"_*) \
      || echo "ci: no Pod logs of namespace $NS under $NODE_DIR/pod-logs"
    kubectl --request-timeout=30s get gateways,services,endpointslices -A -o yaml 2>&1 | gzip > "$fdir/objects.yaml.gz"
    if [ -f "$LOG/kube-proxy.log" ]; then tail -c 5000000 "$LOG/kube-proxy.log" | gzip > "$fdir/kube-proxy.log.gz"; fi
    find "$fail_root" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -r | tail -n +4 | while read -r old; do
      rm -rf "${fail_root:?}/$old"
    done
    echo "ci: this failing run's logs (suite log, report, controller and dataplane logs, objects): $fdir"
  fi
fi
exit $status
