#!/usr/bin/env bash
# deploy/image/check.sh: checks of the image deploy/image/build.sh wrote.
#
#   deploy/image/check.sh [--no-run] IMAGE.oci.tar
#
# 1. Both loaders' views of the archive: `skopeo inspect` as an OCI archive (podman, ctr,
#    `kind load image-archive`) and as a Docker archive (`docker load`, through manifest.json).
# 2. Consistency with deploy/Dockerfile, the build for users with Docker (image-consistency.py):
#    the same binaries in /usr/local/bin, the same USER, ENTRYPOINT/CMD, EXPOSEd ports and LABELs.
# 3. Run (unless --no-run; needs root, runc, umoci, iproute2, curl): the image is unpacked into
#    an OCI runtime bundle and started with runc as the image's user (65532, checked in
#    /proc), with a read-only root, no capabilities, a tmpfs on /tmp and /var/run/sweety (what
#    the chart mounts) and a network namespace of its own; the default command (the dataplane's
#    demo config) must answer /readyz on its admin port and serve its demo page; the controller
#    binary must start from the same root (`sweety-controller --version`).
# Prints the archive's size. Everything it creates (runc state, netns, temp dirs) is removed.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
run=1
if [[ ${1:-} == --no-run ]]; then run=""; shift; fi
[[ $# -eq 1 && -f $1 ]] || { echo "usage: $0 [--no-run] IMAGE.oci.tar" >&2; exit 2; }
tarball=$(realpath "$1")
for tool in skopeo python3; do
    command -v "$tool" >/dev/null || { echo "check.sh: '$tool' is required (apt-get install skopeo)" >&2; exit 1; }
done

work=$(mktemp -d)
id=sweety-image-check-$$
netns=sweetyimg$$
cleanup() {
    if [[ -n $run ]]; then
        runc --root "$work/runc" kill "$id" KILL >/dev/null 2>&1 || true
        runc --root "$work/runc" delete --force "$id" >/dev/null 2>&1 || true
        ip netns delete "$netns" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "== the archive as the loaders read it"
skopeo inspect --config "oci-archive:$tarball" >"$work/config.json"
skopeo inspect "docker-archive:$tarball" >"$work/docker.json"
python3 - "$work/docker.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
# skopeo names no tag for a docker-archive; the layer list must match the OCI view.
assert d["Layers"], d
print(f"ok: docker-archive view: {len(d['Layers'])} layer(s), {d['Os']}/{d['Architecture']}")
PY
echo "ok: oci-archive view"

echo "== consistent with deploy/Dockerfile (binaries, user, entrypoint, ports, labels, workspace members copied)"
python3 "$REPO/deploy/image/image-consistency.py" "$REPO/deploy/Dockerfile" "$tarball"

size=$(stat -c %s "$tarball")
echo "image size: $size bytes ($((size / 1024 / 1024)) MiB) as an OCI archive"

[[ -n $run ]] || exit 0
[[ $(id -u) == 0 ]] || { echo "check.sh: running the image needs root (runc, network namespaces)" >&2; exit 1; }
for tool in runc umoci ip curl; do
    command -v "$tool" >/dev/null || { echo "check.sh: '$tool' is required to run the image" >&2; exit 1; }
done

echo "== run the image with runc (non-root, read-only root, own network namespace)"
mkdir -p "$work/layout"
tar -xf "$tarball" -C "$work/layout"
# umoci addresses an image by a plain tag: name the one manifest `check` in this copy.
python3 - "$work/layout/index.json" <<'PY'
import json, sys
i = json.load(open(sys.argv[1]))
i["manifests"][0].setdefault("annotations", {})["org.opencontainers.image.ref.name"] = "check"
json.dump(i, open(sys.argv[1], "w"))
PY
umoci unpack --image "$work/layout:check" "$work/bundle" >/dev/null
ip netns add "$netns"
ip -n "$netns" link set lo up
python3 - "$work/bundle/config.json" "/var/run/netns/$netns" <<'PY'
import json, sys
path, netns = sys.argv[1:]
c = json.load(open(path))
p = c["process"]
assert p["user"]["uid"] == 65532 and p["user"]["gid"] == 65532, p["user"]
p["terminal"] = False
p["noNewPrivileges"] = True
p["capabilities"] = {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}
p["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}]
c["root"]["readonly"] = True
c["mounts"] += [
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/var/run/sweety", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "nodev", "mode=0755", "uid=65532", "gid=65532", "size=65536k"]},
]
for ns in c["linux"]["namespaces"]:
    if ns["type"] == "network":
        ns["path"] = netns
json.dump(c, open(path, "w"), indent=1)
PY

# The controller binary starts from the image's root (its libraries, its loader).
cp "$work/bundle/config.json" "$work/config.dataplane.json"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["process"]["args"]=["sweety-controller","--version"]; json.dump(c,open(sys.argv[1],"w"))' "$work/bundle/config.json"
if ! runc --root "$work/runc" run --bundle "$work/bundle" "$id-ctl" </dev/null >"$work/ctl.out" 2>&1; then
    cat "$work/ctl.out" >&2
    echo "FAIL: sweety-controller --version did not run from the image" >&2
    exit 1
fi
echo "ok: $(head -1 "$work/ctl.out") (from the image's root, uid 65532)"
cp "$work/config.dataplane.json" "$work/bundle/config.json"

# The default command: the dataplane with its embedded demo config (admin 127.0.0.1:9901).
runc --root "$work/runc" run --detach --bundle "$work/bundle" "$id" </dev/null >"$work/dataplane.log" 2>&1
pid=$(runc --root "$work/runc" state "$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
uid=$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$pid/status")
caps=$(awk '/^CapEff:/ {print $2}' "/proc/$pid/status")
[[ $uid == "65532 65532 65532 65532" ]] || { echo "FAIL: the dataplane runs as uid '$uid', not 65532" >&2; exit 1; }
[[ $caps == 0000000000000000 ]] || { echo "FAIL: the dataplane has capabilities $caps" >&2; exit 1; }
# Its root as the process sees it (mount point "/" in its own mount table): read-only, as the chart
# runs it (readOnlyRootFilesystem), so a write to the image's files would have failed the checks below.
root_opts=$(awk '$5 == "/" {print $6}' "/proc/$pid/mountinfo" | tail -1)
[[ ,$root_opts, == *,ro,* ]] || { echo "FAIL: the dataplane's root filesystem is mounted '$root_opts', not read-only" >&2; exit 1; }
echo "ok: the dataplane runs as uid 65532 with no capabilities and a read-only root (pid $pid)"
ready=""
for _ in $(seq 1 100); do
    if code=$(ip netns exec "$netns" curl -s -o /dev/null -w '%{http_code}' --max-time 2 http://127.0.0.1:9901/readyz) &&
        [[ $code == 200 ]]; then
        ready=1
        break
    fi
    sleep 0.2
done
if [[ -z $ready ]]; then
    cat "$work/dataplane.log" >&2
    echo "FAIL: /readyz of the dataplane in the image did not answer 200 within 20 s" >&2
    exit 1
fi
echo "ok: /readyz answers 200"
page=$(ip netns exec "$netns" curl -fsS --max-time 5 http://127.0.0.1:8080/)
grep -qi sweety <<<"$page" || { echo "FAIL: the demo page does not mention Sweety" >&2; exit 1; }
echo "ok: the demo page is served on :8080"
echo "deploy/image/check.sh: all checks passed"
