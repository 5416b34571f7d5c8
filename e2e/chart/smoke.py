#!/usr/bin/env python3
"""Runs the chart's two containers as local processes, with the exact command lines the chart
renders, and waits until both are ready: proves the flags parse, the control socket and content
dir are shared as the chart wires them, and the controller's push makes the dataplane ready.

Rewrites for a local run (nothing else is changed): /var/run/sweety -> a temporary directory,
0.0.0.0:<port> -> 127.0.0.1:<free port>; the controller also gets --kubeconfig, and watches only
a fresh, empty namespace with an unused IngressClass and controller name, so no listener is
created (nothing binds outside 127.0.0.1). POD_NAMESPACE is that namespace (its Lease goes there).

Usage: smoke.py RENDERED_YAML KUBECONFIG CONTROLLER_BIN DATAPLANE_BIN
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import yaml


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def main():
    rendered, kubeconfig, controller_bin, dataplane_bin = sys.argv[1:5]
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    deploy = next(d for d in docs if d["kind"] in ("Deployment", "DaemonSet"))
    containers = {c["name"]: c for c in deploy["spec"]["template"]["spec"]["containers"]}
    tmp = tempfile.mkdtemp(prefix="sweety-chart-smoke-")
    ns = "chart-smoke-" + uuid.uuid4().hex[:8]
    kubectl = ["kubectl", "--kubeconfig", kubeconfig]
    ports = {}

    def local(arg):
        arg = arg.replace("/var/run/sweety", tmp)
        if "=0.0.0.0:" in arg:
            flag, addr = arg.split("=", 1)
            ports[flag] = free_port()
            arg = f"{flag}=127.0.0.1:{ports[flag]}"
        return arg

    def argv(name, binary, overrides):
        c = containers[name]
        args = [local(a) for a in c["args"]]
        args = [a for a in args if a.split("=", 1)[0] not in overrides]
        return [binary] + args + [f"{k}={v}" for k, v in overrides.items()]

    dp = argv("dataplane", dataplane_bin, {})
    ctl = argv("controller", controller_bin, {
        "--kubeconfig": kubeconfig,
        "--watch-namespaces": ns,
        "--ingress-class": ns,
        "--controller-name": f"sweety.dev/{ns}",
        # The chart's ServiceAccount does not exist in the smoke namespace: no Lease owner.
        "--lease-owner-service-account": "",
    })
    assert containers["dataplane"]["command"] == ["sweety-dataplane"], containers["dataplane"]["command"]
    assert containers["controller"]["command"] == ["sweety-controller"], containers["controller"]["command"]
    env = dict(os.environ, POD_NAMESPACE=ns, POD_NAME="chart-smoke", RUST_LOG="info")
    subprocess.run(kubectl + ["create", "namespace", ns], check=True, capture_output=True)
    procs, ok = [], False
    try:
        os.makedirs(os.path.join(tmp, "content"), exist_ok=True)
        logs = {n: open(os.path.join(tmp, f"{n}.log"), "w") for n in ("dataplane", "controller")}
        print("dataplane: " + " ".join(dp[1:]))
        procs.append(subprocess.Popen(dp, env=env, stdout=subprocess.DEVNULL, stderr=logs["dataplane"]))
        print("controller: " + " ".join(ctl[1:]))
        procs.append(subprocess.Popen(ctl, env=env, stdout=subprocess.DEVNULL, stderr=logs["controller"]))
        admin = f"http://127.0.0.1:{ports['--admin']}"
        metrics = f"http://127.0.0.1:{ports['--metrics-address']}"
        for _ in range(120):  # 60 s at most
            if any(p.poll() is not None for p in procs):
                break
            got = {u: status(u) for u in (f"{admin}/healthz", f"{admin}/readyz",
                                          f"{metrics}/healthz", f"{metrics}/readyz")}
            if all(v == 200 for v in got.values()):
                ok = True
                break
            time.sleep(0.5)
        if ok:
            print("ok: dataplane and controller both /healthz and /readyz 200 with the chart's flags")
        else:
            print(f"FAIL: not ready: {got}; exit codes {[p.poll() for p in procs]}")
            for n, f in logs.items():
                f.flush()
                print(f"--- {n} log (tail)")
                print("".join(open(f.name).readlines()[-25:]))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(kubectl + ["delete", "namespace", ns, "--wait=false"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
