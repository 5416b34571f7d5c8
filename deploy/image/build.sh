#!/usr/bin/env bash
# deploy/image/build.sh: build the Sweety container image without a Docker daemon and without
# pulling anything from a container registry.
#
#   deploy/image/build.sh [--out DIR] [--bin-dir DIR] [--name REPO]
#
# writes DIR/sweety-<version>.oci.tar (default DIR: $CARGO_TARGET_DIR/image, or target/image):
# an OCI image layout in a tar, which also carries a Docker `manifest.json`, so that
# `docker load -i`, `podman load -i`, `kind load image-archive` and `ctr images import` all
# take it and name it REPO:<version> (default REPO: sweety/sweety, the chart's image.repository;
# a registry-qualified REPO such as registry.example/team/sweety or localhost:5000/sweety is kept
# as given, anything else is Docker Hub's, as Docker names it). Prints the manifest digest for
# the chart's image.digest.
#
# What is in it (one layer, reproducible: fixed owners and mtimes from the commit's time):
#   /usr/local/bin/sweety-controller, /usr/local/bin/sweety-dataplane  release builds from this
#       host (`cargo build --release --locked`, the dataplane profile-guided by dataplane/release.sh
#       as in deploy/Dockerfile, or the binaries in --bin-dir), stripped;
#   the shared libraries they load (from `ldd`: glibc, libm, libgcc_s, the dynamic loader);
#   /etc/ssl/certs/ca-certificates.crt  Mozilla's roots as Debian's ca-certificates package ships
#       them (/usr/share/ca-certificates/mozilla), never this machine's local additions;
#   /etc/passwd, /etc/group (root, sweety 65532, nobody), /etc/nsswitch.conf;
#   /tmp (1777) and /var/run/sweety (owned by 65532), the chart's mount points.
# No shell, no package manager. Config: user 65532:65532, CMD ["sweety-dataplane"], the ports
# and the org.opencontainers.image.* labels (source, version, revision, licenses, created).
# deploy/Dockerfile builds the equivalent image for users with Docker; deploy/image/check.sh
# keeps the two consistent and runs the image (CI does both).
#
# Needs: umoci, tar, python3, binutils (strip), ldd (libc-bin), ca-certificates; cargo unless
# --bin-dir is given.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"

out=""
bin_dir=""
name=${SWEETY_IMAGE:-sweety/sweety}
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) out=$2; shift 2 ;;
        --bin-dir) bin_dir=$2; shift 2 ;;
        --name) name=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
target=${CARGO_TARGET_DIR:-$REPO/target}
out=${out:-$target/image}
for tool in umoci tar python3 strip ldd; do
    command -v "$tool" >/dev/null || { echo "build.sh: '$tool' is required (apt-get install umoci binutils libc-bin)" >&2; exit 1; }
done
CA_DIR=/usr/share/ca-certificates/mozilla
[[ -d $CA_DIR ]] || { echo "build.sh: $CA_DIR is missing (apt-get install ca-certificates)" >&2; exit 1; }

version=$(python3 -c 'import sys,tomllib; print(tomllib.load(open("Cargo.toml","rb"))["workspace"]["package"]["version"])')
licenses=$(python3 -c 'import sys,tomllib; print(tomllib.load(open("Cargo.toml","rb"))["workspace"]["package"]["license"])')
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] && ! git diff --quiet HEAD -- 2>/dev/null; then revision="$revision-dirty"; fi
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
source_url=https://github.com/sweety-dev/sweety
bins=(sweety-controller sweety-dataplane)

if [[ -z $bin_dir ]]; then
    echo "== cargo build --release (${bins[*]}; the dataplane profile-guided, as deploy/Dockerfile)" >&2
    bash dataplane/release.sh build --locked >&2
    cargo build --release --locked -p sweety-controller --bin sweety-controller >&2
    bin_dir=$target/release
fi
for b in "${bins[@]}"; do
    [[ -x $bin_dir/$b ]] || { echo "build.sh: no executable $bin_dir/$b" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp" "$root/var/run/sweety"

# The binaries, stripped.
for b in "${bins[@]}"; do
    install -m 0755 "$bin_dir/$b" "$root/usr/local/bin/$b"
    strip --strip-unneeded "$root/usr/local/bin/$b"
done

# Their shared libraries, at the paths the dynamic loader looks them up by (ldd's left-hand
# resolution), and the loader itself at its ELF interpreter path. Symlinks are resolved: the
# image holds plain files.
libs=$(for b in "${bins[@]}"; do ldd "$bin_dir/$b"; done |
    awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
for lib in $libs; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
    chmod 0755 "$root$lib"
done

# Mozilla's CA roots as packaged by Debian (not /etc/ssl/certs: that may hold this machine's
# own additions).
cat "$CA_DIR"/*.crt >"$root/etc/ssl/certs/ca-certificates.crt"
ca_version=$(dpkg-query -W -f '${Version}' ca-certificates 2>/dev/null || echo unknown)

cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/usr/sbin/nologin
sweety:x:65532:65532:sweety:/nonexistent:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
sweety:x:65532:
nogroup:x:65534:
GROUP
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"

chmod 1777 "$root/tmp"
chmod 0755 "$root/var/run/sweety"
tar --create --file "$work/layer.tar" --directory "$root" --sort=name --numeric-owner \
    --owner=0 --group=0 --mtime="@$epoch" --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --exclude=./var/run/sweety .
# /var/run/sweety owned by the runtime user (the chart mounts an emptyDir over it).
tar --append --file "$work/layer.tar" --directory "$root" --numeric-owner \
    --owner=65532 --group=65532 --mtime="@$epoch" --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --no-recursion ./var/run/sweety

layout=$work/layout
umoci init --layout "$layout"
umoci new --image "$layout:$version"
umoci raw add-layer --image "$layout:$version" --history.created "$created" \
    --history.created_by "deploy/image/build.sh" \
    --history.comment "sweety-controller, sweety-dataplane and their runtime files" "$work/layer.tar"
# The same org.opencontainers.image.* keys as config labels (docker/podman inspect) and as
# manifest annotations (registries, skopeo).
labels=(
    "org.opencontainers.image.title=sweety"
    "org.opencontainers.image.description=Sweety ingress controller and Gateway API dataplane (sweety-controller, sweety-dataplane)"
    "org.opencontainers.image.source=$source_url"
    "org.opencontainers.image.url=$source_url"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.revision=$revision"
    "org.opencontainers.image.licenses=$licenses"
    "org.opencontainers.image.created=$created"
)
cfg=(--image "$layout:$version" --no-history --created "$created" --author Sweety
    --architecture amd64 --os linux
    --config.user 65532:65532
    --config.env PATH=/usr/local/bin:/usr/bin:/bin
    --config.cmd sweety-dataplane
    --config.workingdir /
    --config.label "dev.sweety.ca-certificates.version=$ca_version")
for p in 8080/tcp 8443/tcp 8443/udp 9090/tcp 9901/tcp; do cfg+=(--config.exposedports "$p"); done
for l in "${labels[@]}"; do cfg+=(--config.label "$l" --manifest.annotation "$l"); done
umoci config "${cfg[@]}"
umoci gc --layout "$layout"

# Name the image for the loaders: the OCI ref annotations (ctr, podman, skopeo) and a Docker
# manifest.json (docker load before OCI layouts were understood, kind).
python3 - "$layout" "$name" "$version" <<'PY'
import json, os, sys
layout, name, version = sys.argv[1:]
# Docker's rule: the first path component names a registry when it has a "." or a ":" or is
# "localhost" (registry.example/team/sweety, localhost:5000/sweety); else Docker Hub.
first = name.split("/")[0]
full = name if "/" in name and ("." in first or ":" in first or first == "localhost") else f"docker.io/{name}"
idx_path = os.path.join(layout, "index.json")
index = json.load(open(idx_path))
assert len(index["manifests"]) == 1, index
desc = index["manifests"][0]
desc["annotations"] = {
    "org.opencontainers.image.ref.name": f"{full}:{version}",
    "io.containerd.image.name": f"{full}:{version}",
}
json.dump(index, open(idx_path, "w"), separators=(",", ":"))
def blob(d):
    algo, hexd = d["digest"].split(":")
    return f"blobs/{algo}/{hexd}"
manifest = json.load(open(os.path.join(layout, blob(desc))))
json.dump([{
    "Config": blob(manifest["config"]),
    "RepoTags": [f"{name}:{version}"],
    "Layers": [blob(l) for l in manifest["layers"]],
}], open(os.path.join(layout, "manifest.json"), "w"), separators=(",", ":"))
PY

mkdir -p "$out"
tarball=$out/sweety-$version.oci.tar
chmod -R a+rX "$layout"
find "$layout" -exec touch -h -d "@$epoch" {} +
tar --create --file "$tarball.tmp" --directory "$layout" --sort=name --numeric-owner \
    --owner=0 --group=0 --mtime="@$epoch" --format=ustar oci-layout index.json manifest.json blobs
mv "$tarball.tmp" "$tarball"
size=$(stat -c %s "$tarball")
unpacked=$(du -sb "$root" | cut -f1)
digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$layout/index.json")
echo "image: $tarball ($name:$version, revision $revision)"
# The manifest digest: what a registry serves the image under when it is pushed without conversion
# (check with `skopeo inspect docker://<name>:<version>` after the push); the chart's image.digest.
echo "digest: $digest (chart: --set image.repository=$name --set image.digest=$digest once pushed unconverted)"
echo "size: $size bytes as an OCI archive ($((size / 1024 / 1024)) MiB); root filesystem $((unpacked / 1024 / 1024)) MiB unpacked"
