#!/usr/bin/env python3
"""Checks that the image deploy/image/build.sh wrote matches what deploy/Dockerfile builds.

    image-consistency.py deploy/Dockerfile IMAGE.oci.tar

From the Dockerfile's last stage (the runtime image): USER, ENTRYPOINT, CMD, EXPOSE, LABEL and the
files its `COPY --from=<stage> /out/ DEST` lines bring in (the names the build stage installs
under /out/). From the archive: the image config (index.json -> manifest -> config) and the
regular files of its layers. They must agree: the same executables in the same directory, the
same user, entrypoint, command, exposed ports and labels (with the Dockerfile's ARG defaults, so
a version bump in Cargo.toml must reach its VERSION too; the revision is a build argument there).
The build stage must also copy every workspace member of the Cargo.toml beside it (cargo
reads them all). Exits 1 with every difference listed.
"""
import gzip
import io
import json
import re
import shlex
import sys
import tarfile


def dockerfile_facts(path):
    lines, cur = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if line.lstrip().startswith("#") and not cur:
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            lines.append(cur.strip())
        cur = ""
    stages = [i for i, l in enumerate(lines) if l.upper().startswith("FROM ")]
    if not stages:
        sys.exit(f"{path}: no FROM line")
    final = lines[stages[-1]:]
    # Every name the build stages install into /out/ (`install ... /out/NAME`, `cp ... /out/NAME`).
    out_names = set()
    for l in lines[: stages[-1]]:
        out_names |= set(re.findall(r"/out/([A-Za-z0-9._-]+)", l))
    # What the build stages copy from the build context (`COPY SRC... DEST`, not `--from=`).
    context = set()
    for l in lines[: stages[-1]]:
        word, _, rest = l.partition(" ")
        if word.upper() == "COPY" and "--from=" not in rest:
            context |= {a.rstrip("/") for a in shlex.split(rest)[:-1] if not a.startswith("--")}
    facts = {"context": context, "user": None, "entrypoint": None, "cmd": None, "ports": set(), "files": set(), "labels": {}}
    args = {}
    for l in final:
        word, _, rest = l.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "ARG" and "=" in rest:
            k, _, v = rest.partition("=")
            args[k] = v
        elif word == "LABEL":
            for kv in shlex.split(rest):
                k, _, v = kv.partition("=")
                facts["labels"][k] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), v)
        elif word == "USER":
            facts["user"] = rest
        elif word in ("CMD", "ENTRYPOINT"):
            try:
                facts[word.lower()] = json.loads(rest)
            except json.JSONDecodeError:
                sys.exit(f"{path}: {word} must be in exec (JSON) form, got {rest!r}")
        elif word == "EXPOSE":
            for p in rest.split():
                facts["ports"].add(p if "/" in p else p + "/tcp")
        elif word == "COPY":
            args = [a for a in shlex.split(rest) if not a.startswith("--")]
            if "--from=" in rest and len(args) == 2 and args[0].rstrip("/") == "/out":
                dest = args[1].rstrip("/")
                facts["files"] |= {f"{dest}/{n}" for n in out_names}
    return facts


def image_facts(path):
    with tarfile.open(path) as t:
        def blob(desc):
            algo, digest = desc["digest"].split(":")
            return t.extractfile(f"blobs/{algo}/{digest}").read()
        index = json.loads(t.extractfile("index.json").read())
        if len(index["manifests"]) != 1:
            sys.exit(f"{path}: expected one manifest, found {len(index['manifests'])}")
        manifest = json.loads(blob(index["manifests"][0]))
        config = json.loads(blob(manifest["config"]))["config"]
        files = {}
        for layer in manifest["layers"]:
            data = blob(layer)
            if layer["mediaType"].endswith("gzip"):
                data = gzip.decompress(data)
            with tarfile.open(fileobj=io.BytesIO(data)) as lt:
                for m in lt.getmembers():
                    files["/" + m.name.lstrip("./")] = m
    return {
        "user": config.get("User"),
        "entrypoint": config.get("Entrypoint"),
        "cmd": config.get("Cmd"),
        "ports": set(config.get("ExposedPorts", {})),
        "files": files,
        "labels": config.get("Labels") or {},
    }


def workspace_members(dockerfile):
    """The members of the workspace the Dockerfile builds (the Cargo.toml two levels up)."""
    import os
    import tomllib
    root = os.path.join(os.path.dirname(os.path.abspath(dockerfile)), "..")
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["workspace"]["members"]


def patched_paths(dockerfile):
    """The paths of the crates Cargo.toml's [patch] tables replace (vendor/...)."""
    import os
    import tomllib
    root = os.path.join(os.path.dirname(os.path.abspath(dockerfile)), "..")
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        patch = tomllib.load(f).get("patch", {})
    return [dep["path"] for table in patch.values() for dep in table.values() if "path" in dep]


def main():
    dockerfile, tarball = sys.argv[1:3]
    d, i = dockerfile_facts(dockerfile), image_facts(tarball)
    errors = []
    # cargo loads every member's manifest: a member the build stage does not copy breaks
    # `docker build` (which CI does not run) while build.sh still works.
    for m in workspace_members(dockerfile):
        if not any(m == c or m.startswith(c + "/") for c in d["context"]):
            errors.append(f"workspace member {m}: not copied into the Dockerfile's build stage")
    # A [patch] path cargo cannot find breaks `docker build` the same way.
    for p in patched_paths(dockerfile):
        if not any(p == c or p.startswith(c + "/") for c in d["context"]):
            errors.append(f"patched crate {p}: not copied into the Dockerfile's build stage")
    for key in ("user", "entrypoint", "cmd", "ports"):
        if d[key] != i[key]:
            errors.append(f"{key}: Dockerfile {d[key]!r}, image {i[key]!r}")
    # Every label the Dockerfile sets, with its ARG defaults (version, licences, source...); the
    # revision is a build argument there (default "unknown") and the commit here.
    for k, v in sorted(d["labels"].items()):
        if k != "org.opencontainers.image.revision" and i["labels"].get(k) != v:
            errors.append(f"label {k}: Dockerfile {v!r}, image {i['labels'].get(k)!r}")
    if not d["files"]:
        errors.append("the Dockerfile's last stage copies no binaries from /out/")
    dirs = {f.rsplit("/", 1)[0] for f in d["files"]}
    image_bins = {n for n, m in i["files"].items() if m.isfile() and n.rsplit("/", 1)[0] in dirs}
    for f in sorted(d["files"] - image_bins):
        errors.append(f"{f}: in the Dockerfile's image, not in this one")
    for f in sorted(image_bins - d["files"]):
        errors.append(f"{f}: in this image, not in the Dockerfile's")
    for f in sorted(d["files"] & image_bins):
        if not i["files"][f].mode & 0o111:
            errors.append(f"{f}: not executable in this image")
    if errors:
        print("FAIL: the image and deploy/Dockerfile differ:", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: same user {i['user']}, entrypoint {i['entrypoint']}, cmd {i['cmd']}, "
          f"ports {' '.join(sorted(i['ports']))}, binaries {' '.join(sorted(image_bins))}")


if __name__ == "__main__":
    main()
