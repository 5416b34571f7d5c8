#!/usr/bin/env python3
"""Writes kubeconform JSON schemas for every kind a cluster serves, from its OpenAPI v3.

kubeconform cannot download its schema catalogue here, so the schemas come from the apiserver
itself (built-in kinds, installed CRDs). One file per kind, named the way kubeconform's
`-schema-location '<dir>/{{ .ResourceKind }}-{{ .Group }}-{{ .ResourceAPIVersion }}.json'`
template looks them up (core kinds: group `v1`). Like kubeconform's "-strict" schema catalogue,
every object schema with `properties` and no `additionalProperties` (and not marked
x-kubernetes-preserve-unknown-fields) gets `additionalProperties: false`, so unknown fields fail.

Usage: openapi-schemas.py KUBECONFIG OUTDIR
"""
import json
import os
import subprocess
import sys


def get(kubeconfig, path):
    out = subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, "get", "--raw", path],
        check=True, capture_output=True,
    ).stdout
    return json.loads(out)


def strict(node):
    if isinstance(node, dict):
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for v in node.values():
            strict(v)
    elif isinstance(node, list):
        for v in node:
            strict(v)


def main():
    kubeconfig, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    index = get(kubeconfig, "/openapi/v3")
    written = 0
    for path, ref in sorted(index["paths"].items()):
        if not (path == "api/v1" or (path.startswith("apis/") and path.count("/") == 2)):
            continue
        doc = get(kubeconfig, "/" + ref["serverRelativeURL"].lstrip("/"))
        schemas = doc.get("components", {}).get("schemas", {})
        strict(schemas)
        for name, schema in schemas.items():
            for gvk in schema.get("x-kubernetes-group-version-kind", []):
                group, version, kind = gvk.get("group", ""), gvk["version"], gvk["kind"]
                if f"{group}/{version}".strip("/") != path.split("/", 1)[1]:
                    continue
                fname = f"{kind.lower()}-{group or version}-{version}.json"
                with open(os.path.join(outdir, fname), "w") as f:
                    json.dump({"$ref": f"#/components/schemas/{name}",
                               "components": {"schemas": schemas}}, f)
                written += 1
    print(f"{written} kind schemas written to {outdir}")


if __name__ == "__main__":
    main()
