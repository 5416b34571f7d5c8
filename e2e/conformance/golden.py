#!/usr/bin/env python3
"""e2e/conformance/golden.py — turn a conformance test manifest into a translate golden input.

    golden.py TEST.yaml [--what "what it checks"] -o controller/testdata/translate/conf-NAME.in.yaml

Builds what the suite would have in the cluster when that test runs: the base Namespaces and
Gateways its routes use (from conformance/base/manifests.yaml), the test's own objects, the
GatewayClass `sweety` owned by our controller, one EndpointSlice per Service (Pod IPs 10.244.0.x,
since no kubelet runs here), the TLS Secrets and CA ConfigMaps the suite creates in Setup (one
self-signed certificate for all of them, made with openssl), and a load-balancer address per
Gateway Service (in the controller's namespace `sweety`, the default --gateway-service-namespace). Deployments are dropped. The result is a plain golden input: bless it with
SWEETY_BLESS=1 and review the .out.yaml.
"""
import argparse
import base64
import os
import subprocess
import sys
import tempfile

import yaml

SUITE_DIR = os.environ.get(
    "SWEETY_CONFORMANCE_DIR",
    os.path.expanduser("~/go/pkg/mod/sigs.k8s.io/gateway-api/conformance@v1.6.3"),
)
SUITE_SECRETS = [
    ("gateway-conformance-web-backend", "certificate"),
    ("gateway-conformance-infra", "tls-validity-checks-certificate"),
    ("gateway-conformance-infra", "tls-checks-certificate"),
    ("gateway-conformance-infra", "tls-passthrough-checks-certificate"),
    ("gateway-conformance-app-backend", "tls-passthrough-checks-certificate"),
    ("gateway-conformance-infra", "tls-terminate-checks-certificate"),
    ("gateway-conformance-infra", "tls-checks-client-certificate"),
    ("gateway-conformance-infra", "tls-validity-checks-client-certificate"),
    ("gateway-conformance-infra", "tls-validity-checks-per-port-client-certificate"),
]
SUITE_CA_CONFIGMAPS = [
    ("gateway-conformance-web-backend", "web-backend-cm"),
    ("gateway-conformance-infra", "tls-validity-checks-ca-certificate"),
    ("gateway-conformance-infra", "tls-validity-checks-per-port-ca-certificate"),
    ("gateway-conformance-infra", "tls-checks-ca-certificate"),
    ("gateway-conformance-infra", "mismatch-ca-certificate"),
]


def load(path):
    with open(path, encoding="utf-8") as f:
        text = f.read().replace("{GATEWAY_CLASS_NAME}", "sweety").replace(
            "{GATEWAY_CONTROLLER_NAME}", "sweety.dev/gateway-controller")
    return [d for d in yaml.safe_load_all(text) if d]


def service_name(ns, name):
    """addressing::service_name of the controller: sweety-gw-<readable>-<hash>, where readable is
    <ns>-<name> with characters outside [a-z0-9] as '-', cut to 32 characters, and hash is the
    first 20 hex digits of SHA-256(<ns>/<name>) (always present, so distinct Gateways never
    share a name)."""
    import hashlib
    h = hashlib.sha256(f"{ns}/{name}".encode()).hexdigest()[:20]
    readable = "".join(c if (c.islower() and c.isascii()) or c.isdigit() else "-"
                       for c in f"{ns}-{name}")[:32].strip("-")
    return f"sweety-gw-{readable}-{h}" if readable else f"sweety-gw-{h}"


def cert():
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{d}/k", "-out", f"{d}/c", "-days", "36500", "-subj", "/CN=conformance",
             "-addext", "subjectAltName=DNS:*.org,DNS:*.wildcard.org,DNS:abc.example.com,"
             "DNS:tls.example.com,DNS:other.example.com"],
            check=True, capture_output=True)
        return open(f"{d}/c").read(), open(f"{d}/k").read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("test")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--what", default="")
    a = ap.parse_args()
    test_path = a.test if os.path.exists(a.test) else os.path.join(SUITE_DIR, "tests", a.test)
    base = load(os.path.join(SUITE_DIR, "base", "manifests.yaml"))
    test = load(test_path)
    objs = [o for o in base + test if o["kind"] != "Deployment"]
    # Only the base Gateways that the test's routes name (keeps the golden small).
    named = set()
    for o in test:
        for p in (o.get("spec") or {}).get("parentRefs") or []:
            if p.get("kind", "Gateway") == "Gateway":
                named.add((p.get("namespace") or o["metadata"].get("namespace"), p["name"]))
    test_ids = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in test}
    out = []
    for o in objs:
        key = (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        if o["kind"] == "Gateway" and key not in test_ids and (key[1], key[2]) not in named:
            continue
        if o["kind"] == "Service" and key not in test_ids:
            # base Services: keep those the test's routes reference
            refs = set()
            for t in test:
                for rule in (t.get("spec") or {}).get("rules") or []:
                    for b in rule.get("backendRefs") or []:
                        refs.add((b.get("namespace") or t["metadata"].get("namespace"), b["name"]))
                    for f in rule.get("filters") or []:
                        m = f.get("requestMirror")
                        if m:
                            b = m["backendRef"]
                            refs.add((b.get("namespace") or t["metadata"].get("namespace"), b["name"]))
            if (key[1], key[2]) not in refs:
                continue
        o.setdefault("metadata", {}).setdefault("generation", 1)
        o["metadata"].pop("creationTimestamp", None)
        out.append(o)
    out.insert(0, {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                   "metadata": {"name": "sweety", "generation": 1},
                   "spec": {"controllerName": "sweety.dev/gateway-controller"}})
    ip = 10
    extra = []
    for o in out:
        if o["kind"] == "Service" and (o.get("spec") or {}).get("selector"):
            ip += 1
            ports = [{"name": p.get("name"), "port": p.get("targetPort", p["port"]),
                      **({"appProtocol": p["appProtocol"]} if p.get("appProtocol") else {})}
                     for p in o["spec"].get("ports", [])]
            extra.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                          "metadata": {"name": o["metadata"]["name"] + "-1", "namespace": o["metadata"]["namespace"],
                                       "labels": {"kubernetes.io/service-name": o["metadata"]["name"]}},
                          "addressType": "IPv4", "ports": ports,
                          "endpoints": [{"addresses": [f"10.244.0.{ip}"], "conditions": {"ready": True}}]})
        if o["kind"] == "Gateway":
            ip += 1
            ns, name = o["metadata"]["namespace"], o["metadata"]["name"]
            ports = sorted({l["port"] for l in o["spec"].get("listeners", [])})
            extra.append({"apiVersion": "v1", "kind": "Service",
                          "metadata": {"name": service_name(ns, name), "namespace": "sweety",
                                       "labels": {"app.kubernetes.io/managed-by": "sweety",
                                                  "sweety.dev/gateway-name": name}},
                          "spec": {"type": "LoadBalancer",
                                   "ports": [{"name": f"tcp-{p}", "port": p, "targetPort": 20000 + i}
                                             for i, p in enumerate(ports)]},
                          "status": {"loadBalancer": {"ingress": [{"ip": f"10.244.0.{200 + ip % 50}"}]}}})
    have = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in out}
    c, k = cert()
    text = yaml.safe_dump_all(out)
    # Only the suite-made Secrets and ConfigMaps that the included objects name.
    for ns, name in SUITE_SECRETS:
        if ("Secret", ns, name) not in have and name in text:
            extra.append({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                          "metadata": {"name": name, "namespace": ns},
                          "data": {"tls.crt": base64.b64encode(c.encode()).decode(),
                                   "tls.key": base64.b64encode(k.encode()).decode()}})
    for ns, name in SUITE_CA_CONFIGMAPS:
        if ("ConfigMap", ns, name) not in have and name in text:
            extra.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
                          "data": {"ca.crt": c}})
    what = a.what or f"the objects of conformance test {os.path.basename(test_path)}"
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(f"# Conformance v1.6.3 {os.path.basename(test_path)}: {what}. Generated by "
                "e2e/conformance/golden.py (base Gateways and Services it uses, suite Secrets, "
                "EndpointSlices and Gateway Service addresses standing in for the cluster).\n")
        f.write(yaml.safe_dump_all(out + extra, sort_keys=False, width=200))
    return 0


if __name__ == "__main__":
    sys.exit(main())
