#!/usr/bin/env python3
"""Controller convergence on a live cluster (Python 3 standard library only); driven by
e2e/bench/convergence.sh, which sets up the namespace, echo backend and Gateway.

Measures, with one long-lived HTTPS connection per thread to the API server (no kubectl process
start in any figure) and keep-alive HTTP/1.1 to the Gateway's address:

1. creation: N HTTPRoutes POSTed by 8 threads; from the last POST's response (accepted) to
   the first 200 for the last route's host (all served: a config with the last route holds
   the earlier ones; a sweep over every host afterwards checks it), and to the moment a
   watch on the routes has seen our Accepted status on every one of them;
2. changes: M single-route changes (a RequestHeaderModifier that echo-basic echoes back), one
   at a time, on routes the background load does not use, while a separate process sends
   RPS requests/s to up to 50 other routes; per change, from the PATCH response to the first
   response that shows the change; failed requests (non-200 or connection errors) of the
   background load and of the pollers during the changes. The changes and their polls run in
   a process of their own (started fresh, one thread: no GIL shared with the background load,
   the route creators or the status watch), with a raw-socket HTTP/1.1 client (one prebuilt
   request, no http.client parsing), at most --poll-gap-ms (0.5) between two polls; the
   poller's own request time (send → whole response) is reported beside the figures;
   with --direct (the dataplane Pod's address and the Gateway listener's container port, as
   convergence.sh finds them), a second change phase of M changes polls there instead of the
   Gateway's address: the same figures without the node agent's user-space load balancer
   (two more hops per request, which a real cluster's kube-proxy or cloud load balancer does
   not add the same way) in every poll (its failed polls are counted apart);
3. controller and dataplane RSS (VmRSS, VmHWM) of the processes run from IMAGE_DIR;
4. where a change's time goes (with --metrics, the controller's /metrics URL): the controller's
   histograms over the change phase only (their difference before and after it): watch event →
   dataplane Ack, translate, reconcile, submit → Ack, as bucket upper bounds at p50/p99, and the
   reconciles by cause, watch events by kind, per-Gateway Service syncs, status writes and
   full translations in that phase; beside them the poller's own
   request time (the floor of every change figure). The rest of a change's time is the API
   server's watch delivery and the poll that shows the change.

Every loop is bounded in count and time. Prints one JSON line and one markdown row.
"""

import argparse
import base64
import gc
import http.client
import json
import multiprocessing
import os
import random
import re
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time

GROUP = "/apis/gateway.networking.k8s.io/v1"
CONTROLLER = "sweety.dev/gateway-controller"


def kubeconfig(path):
    """server, token, CA file from a kubeconfig written by e2e/cluster/up.sh."""
    text = open(path).read()
    server = re.search(r"server:\s*(\S+)", text).group(1)
    token = re.search(r"token:\s*(\S+)", text).group(1)
    ca = re.search(r"certificate-authority-data:\s*(\S+)", text).group(1)
    f = tempfile.NamedTemporaryFile(delete=False, suffix=".crt")
    f.write(base64.b64decode(ca))
    f.close()
    return server, token, f.name


class Api:
    """One keep-alive HTTPS connection to the API server."""

    def __init__(self, server, token, ca):
        m = re.match(r"https://([^:/]+):(\d+)", server)
        self.host, self.port = m.group(1), int(m.group(2))
        self.ctx = ssl.create_default_context(cafile=ca)
        self.token = token
        self.conn = None

    def request(self, method, path, body=None, ctype="application/json", timeout=60):
        for attempt in range(3):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self.ctx, timeout=timeout)
            try:
                data = json.dumps(body).encode() if body is not None else None
                headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
                if data is not None:
                    headers["Content-Type"] = ctype
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None)
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        raise RuntimeError("unreachable")


def route(i, ns, header=None):
    rule = {"backendRefs": [{"name": "echo", "port": 8080}]}
    if header is not None:
        rule["filters"] = [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": "x-bench-change", "value": header}]}}]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": f"r{i}", "namespace": ns},
        "spec": {"parentRefs": [{"name": "bench"}], "hostnames": [f"r{i}.bench.example"],
                 "rules": [rule]},
    }


class Dataplane:
    """A keep-alive HTTP/1.1 client to the Gateway address."""

    def __init__(self, addr):
        self.addr = addr
        self.conn = None

    def get(self, host, timeout=2):
        """(status, body) or (None, error)."""
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.addr, 80, timeout=timeout)
            self.conn.request("GET", "/bench", headers={"Host": host})
            r = self.conn.getresponse()
            body = r.read()
            if r.getheader("connection", "").lower() == "close":
                self.conn.close()
                self.conn = None
            return r.status, body
        except (OSError, http.client.HTTPException) as e:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return None, str(e).encode()


def accepted(obj):
    for p in (obj.get("status") or {}).get("parents") or []:
        if p.get("controllerName") != CONTROLLER:
            continue
        for c in p.get("conditions") or []:
            if c.get("type") == "Accepted" and c.get("status") == "True":
                return True
    return False


def watch_statuses(api, ns, rv, want, seen, done, deadline):
    """Record when each route first carries our Accepted status (bounded by `deadline`)."""
    path = f"{GROUP}/namespaces/{ns}/httproutes?watch=1&resourceVersion={rv}&timeoutSeconds=900"
    while time.monotonic() < deadline and len(seen) < want:
        conn = http.client.HTTPSConnection(api.host, api.port, context=api.ctx, timeout=30)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {api.token}"})
            r = conn.getresponse()
            while time.monotonic() < deadline and len(seen) < want:
                line = r.readline()
                if not line:
                    break
                ev = json.loads(line)
                obj = ev.get("object") or {}
                meta = obj.get("metadata") or {}
                rv = meta.get("resourceVersion", rv)
                name = meta.get("name")
                if ev.get("type") in ("ADDED", "MODIFIED") and name not in seen and accepted(obj):
                    seen[name] = time.monotonic()
        except (OSError, http.client.HTTPException, ValueError):
            time.sleep(0.2)
        finally:
            conn.close()
        path = f"{GROUP}/namespaces/{ns}/httproutes?watch=1&resourceVersion={rv}&timeoutSeconds=900"
    done.set()


def background(addr, hosts, rps, stop, counts, limit_s):
    """RPS requests/s round-robin over `hosts` until `stop` (at most limit_s seconds)."""
    dp = Dataplane(addr)
    ok = failed = 0
    t0 = time.monotonic()
    i = 0
    while not stop.is_set() and time.monotonic() - t0 < limit_s:
        due = t0 + i / rps
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        status, _ = dp.get(hosts[i % len(hosts)])
        if status == 200:
            ok += 1
        else:
            failed += 1
        i += 1
    counts.put({"ok": ok, "failed": failed})


class RawHttp:
    """A minimal keep-alive HTTP/1.1 GET client on one socket (the poller): the request is
    prebuilt bytes, the answer read with Content-Length or chunked framing, at most MAX bytes."""

    MAX = 1 << 20

    def __init__(self, addr, port=80, timeout=2.0):
        self.addr, self.port, self.timeout = addr, port, timeout
        self.sock = None
        self.buf = b""

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise OSError("connection closed by the server")
        self.buf += chunk
        if len(self.buf) > self.MAX:
            raise OSError("answer too large")

    def _until(self, sep):
        while True:
            i = self.buf.find(sep)
            if i >= 0:
                out, self.buf = self.buf[:i], self.buf[i + len(sep):]
                return out
            self._fill()

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def get(self, request):
        """(status, body) or (None, error) for one prebuilt request."""
        try:
            if self.sock is None:
                self.sock = socket.create_connection((self.addr, self.port), timeout=self.timeout)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.sendall(request)
            head = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
            status = int(head[0].split(" ", 2)[1])
            fields = {}
            for line in head[1:]:
                k, _, v = line.partition(":")
                fields[k.strip().lower()] = v.strip().lower()
            if "content-length" in fields:
                body = self._take(int(fields["content-length"]))
            elif fields.get("transfer-encoding") == "chunked":
                parts = []
                for _ in range(10000):
                    size = int(self._until(b"\r\n").split(b";")[0], 16)
                    if size == 0:
                        self._until(b"\r\n")
                        break
                    parts.append(self._take(size))
                    self._take(2)
                body = b"".join(parts)
            else:
                raise OSError("answer without a length")
            if fields.get("connection") == "close":
                self.close()
            return status, body
        except (OSError, ValueError, IndexError) as e:
            self.close()
            return None, str(e).encode()


def changer(server, token, ca, ns, target, candidates, changes, seconds, gap_s, out, first=0):
    """The change phase's own process: M PATCHes, each followed by polls of `target` (address,
    port; one raw-socket client, nothing else in this process) until the change shows, at most
    10 s and 20,000 polls per change and `seconds` in all. Changes are numbered from `first`
    (each sets a value no earlier one did). Puts (latencies ms, poll request times ms, failed
    polls, timeouts) on `out`."""
    gc.disable()  # bounded: a few lists of floats
    end = time.monotonic() + seconds
    api = Api(server, token, ca)
    dp = RawHttp(*target)
    rng = random.Random(7 + first)
    lat, poll_ms, poll_failed, timeouts = [], [], 0, 0
    for j in range(first, first + changes):
        if time.monotonic() > end:
            break
        k = rng.choice(candidates)
        value = f"c{j}"
        patch = {"spec": route(k, ns, value)["spec"]}
        request = (f"GET /bench HTTP/1.1\r\nHost: r{k}.bench.example\r\n\r\n").encode()
        marker = re.compile(rb'x-bench-change"\s*:\s*\[\s*"' + value.encode() + rb'"', re.I)
        s, body = api.request("PATCH", f"{GROUP}/namespaces/{ns}/httproutes/r{k}", patch,
                              ctype="application/merge-patch+json")
        t0 = time.monotonic()
        if s != 200:
            out.put(("error", f"patch r{k}: {s} {str(body)[:200]}"))
            return
        shown = None
        for _ in range(20000):
            t_get = time.monotonic()
            if t_get - t0 > 10:
                break
            s, body = dp.get(request)
            t_done = time.monotonic()
            poll_ms.append((t_done - t_get) * 1000)
            if s != 200:
                poll_failed += 1
            elif marker.search(body):
                shown = t_done
                break
            if gap_s > 0:
                time.sleep(gap_s)
        if shown is None:
            timeouts += 1
        else:
            lat.append((shown - t0) * 1000)
        time.sleep(0.05)
    out.put(("ok", lat, poll_ms, poll_failed, timeouts))


def rss(image_dir):
    """{binary: (VmRSS kB, VmHWM kB)} of processes whose executable lies in image_dir."""
    out = {}
    real = os.path.realpath(image_dir)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            exe = os.path.realpath(f"/proc/{pid}/exe")
            if not exe.startswith(real + "/"):
                continue
            vals = {}
            for line in open(f"/proc/{pid}/status"):
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    vals[k] = int(v.split()[0])
            out[os.path.basename(exe)] = (vals.get("VmRSS", 0), vals.get("VmHWM", 0))
        except OSError:
            continue
    return out


HISTOGRAMS = {
    "event_to_ack": "sweety_controller_watch_event_to_ack_seconds",
    "translate": "sweety_controller_translate_duration_seconds",
    "reconcile": "sweety_controller_reconcile_duration_seconds",
    "submit_to_ack": "sweety_controller_push_latency_seconds",
}


def scrape(url):
    """{series (name + labels): value} of a Prometheus text page; {} when unreachable."""
    if not url:
        return {}
    m = re.match(r"http://([^/:]+):(\d+)(/.*)", url)
    try:
        c = http.client.HTTPConnection(m.group(1), int(m.group(2)), timeout=5)
        c.request("GET", m.group(3))
        text = c.getresponse().read().decode()
        c.close()
    except (OSError, http.client.HTTPException) as e:
        print(f"metrics from {url}: {e}", file=sys.stderr)
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def phase(before, after):
    """The controller's histograms and counters over one phase (after - before)."""
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    res = {}
    for short, name in HISTOGRAMS.items():
        buckets = sorted(
            (float(k[len(name) + 12:-2]) if "+Inf" not in k else float("inf"), v)
            for k, v in d.items() if k.startswith(name + '_bucket{le="'))
        count = d.get(name + "_count", 0.0)
        if not buckets or count <= 0:
            continue

        def upper(q):
            for le, v in buckets:
                if v >= q * count:
                    return le * 1000
            return float("inf")
        res[short] = {"n": int(count), "mean_ms": round(d.get(name + "_sum", 0.0) / count * 1000, 2),
                      "p50_le_ms": upper(0.5), "p99_le_ms": upper(0.99)}
    res["reconciles_by_cause"] = {k.split('"')[1]: int(v) for k, v in d.items()
                                  if k.startswith("sweety_controller_reconciles_total{") and v}
    res["watch_events"] = {k[k.index("{"):]: int(v) for k, v in d.items()
                           if k.startswith("sweety_controller_watch_events_total{") and v}
    # Counts per phase: API work the controller did besides the pushes.
    for short, name in (("gateway_service_syncs", "sweety_controller_gateway_service_syncs_total"),
                        ("status_writes", "sweety_controller_status_writes_total"),
                        ("full_translates", "sweety_controller_full_translates_total")):
        if name in after:
            res[short] = int(d.get(name, 0))
    return res


def pct(v, p):
    if not v:
        return float("nan")
    s = sorted(v)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--ns", required=True)
    ap.add_argument("--gateway", required=True, help="the Gateway's address")
    ap.add_argument("--routes", type=int, required=True)
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--rps", type=float, default=200)
    ap.add_argument("--image-dir", required=True)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--deadline", type=float, default=900, help="seconds for the whole run")
    ap.add_argument("--metrics", default="", help="the controller's /metrics URL (where the time goes)")
    ap.add_argument("--poll-gap-ms", type=float, default=0.5,
                    help="pause between two polls of a change (ms; at most ~1)")
    ap.add_argument("--direct", default="",
                    help="ADDR:PORT of the dataplane Pod's Gateway listener: a second change "
                         "phase polls there")
    a = ap.parse_args()
    start = time.monotonic()
    deadline = start + a.deadline
    server, token, ca = kubeconfig(a.kubeconfig)
    api = Api(server, token, ca)
    st, lst = api.request("GET", f"{GROUP}/namespaces/{a.ns}/httproutes?limit=1")
    if st != 200:
        sys.exit(f"list httproutes: {st} {lst}")
    if lst["items"]:
        sys.exit(f"namespace {a.ns} already has HTTPRoutes; start from an empty namespace")
    rv = lst["metadata"]["resourceVersion"]
    n = a.routes

    # -------------------------------------------------------------- 1. creation
    seen, done = {}, threading.Event()
    watcher = threading.Thread(target=watch_statuses,
                               args=(Api(server, token, ca), a.ns, rv, n, seen, done, deadline),
                               daemon=True)
    watcher.start()
    accepted_at = [0.0] * n
    errors = []

    def create(t):
        c = Api(server, token, ca)
        for i in range(t, n, a.threads):
            if time.monotonic() > deadline:
                errors.append("deadline")
                return
            s, body = c.request("POST", f"{GROUP}/namespaces/{a.ns}/httproutes", route(i, a.ns))
            if s != 201:
                errors.append(f"r{i}: {s} {str(body)[:200]}")
                return
            accepted_at[i] = time.monotonic()

    t_create = time.monotonic()
    workers = [threading.Thread(target=create, args=(t,)) for t in range(min(a.threads, n))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        sys.exit(f"creating routes failed: {errors[:3]}")
    last_i = max(range(n), key=lambda i: accepted_at[i])
    t_last = accepted_at[last_i]
    dp = Dataplane(a.gateway)
    served_at = None
    while time.monotonic() < deadline:
        s, _ = dp.get(f"r{last_i}.bench.example")
        if s == 200:
            served_at = time.monotonic()
            break
        time.sleep(0.001)
    missing = [i for i in range(n) if dp.get(f"r{i}.bench.example")[0] != 200]
    done.wait(max(0.0, deadline - time.monotonic()))
    statuses_at = max(seen.values()) if len(seen) >= n else None

    # -------------------------------------------------------------- 2. changes under load
    bg_hosts = [f"r{i}.bench.example" for i in range(min(n, 50))]
    candidates = list(range(50, n)) if n > 50 else list(range(n))
    # Fresh processes (spawn): the background load and the changes each have their own
    # interpreter; this one only waits (the status watch may still run here).
    ctx = multiprocessing.get_context("spawn")
    stop, counts = ctx.Event(), ctx.Queue()
    bg = ctx.Process(target=background,
                     args=(a.gateway, bg_hosts, a.rps, stop, counts,
                           max(1.0, deadline - time.monotonic())))
    bg.start()
    time.sleep(1.0)
    def change_phase(target, first, required):
        """One change phase (its own process) polling `target`: (its result, the controller's
        figures over it); a failure ends the run when `required`, else gives (None, error)."""
        before = scrape(a.metrics)
        results = ctx.Queue()
        budget = max(1.0, deadline - time.monotonic())
        ch = ctx.Process(target=changer,
                         args=(server, token, ca, a.ns, target, candidates, a.changes, budget,
                               a.poll_gap_ms / 1000, results, first))
        ch.start()
        try:
            got = results.get(timeout=budget + 30)
        except Exception:  # queue.Empty: the changer died or hung
            got = ("error", "the change process gave no result")
        ch.join(30)
        if got[0] != "ok":
            if not required:
                return None, str(got[1])
            stop.set()
            sys.exit(got[1])
        return got[1:], (phase(before, scrape(a.metrics)) if a.metrics else {})

    (lat, poll_ms, poll_failed, timeouts), breakdown = change_phase((a.gateway, 80), 0, True)
    direct = None
    host, _, port = a.direct.rpartition(":")
    got_direct = None
    if a.direct:
        # The target must answer for a served route first (a wrong address would only time out).
        probe = RawHttp(host, int(port)).get(f"GET /bench HTTP/1.1\r\nHost: {bg_hosts[0]}\r\n\r\n".encode())
        if probe[0] == 200:
            got_direct = change_phase((host, int(port)), a.changes, False)
        else:
            got_direct = (None, f"{a.direct} answered {probe[0]} {probe[1][:200]!r}")
    if got_direct is not None and got_direct[0] is None:
        direct = {"target": a.direct, "error": got_direct[1]}
        print(f"direct phase failed: {got_direct[1]}", file=sys.stderr)
    elif got_direct is not None:
        (d_lat, d_poll, d_failed, d_timeouts), d_breakdown = got_direct
        direct = {
            "target": a.direct,
            "changes": len(d_lat),
            "change_timeouts": d_timeouts,
            "change_p50_ms": round(statistics.median(d_lat), 1) if d_lat else None,
            "change_p99_ms": round(pct(d_lat, 99), 1) if d_lat else None,
            "change_max_ms": round(max(d_lat), 1) if d_lat else None,
            "failed_polls": d_failed,
            "poll_request_ms_p50_p99": [round(statistics.median(d_poll), 2),
                                        round(pct(d_poll, 99), 2)] if d_poll else None,
            "controller_during_changes": d_breakdown,
        }
    stop.set()
    try:
        bg_counts = counts.get(timeout=30)
    except Exception:
        bg_counts = {}
    bg.join(30)
    mem = rss(a.image_dir)

    res = {
        "routes": n,
        "create_s": round(t_last - t_create, 2),
        "served_after_last_accepted_ms": round((served_at - t_last) * 1000, 1) if served_at else None,
        "not_served_in_sweep": len(missing),
        "statuses_after_last_accepted_s": round(statuses_at - t_last, 2) if statuses_at else None,
        "statuses_seen": len(seen),
        "changes": len(lat),
        "change_timeouts": timeouts,
        "change_p50_ms": round(statistics.median(lat), 1) if lat else None,
        "change_p99_ms": round(pct(lat, 99), 1) if lat else None,
        "change_max_ms": round(max(lat), 1) if lat else None,
        "failed_requests": poll_failed + bg_counts.get("failed", 0),
        "background_ok": bg_counts.get("ok", 0),
        "rss_kb": mem,
        "poll_request_ms_p50_p99": [round(statistics.median(poll_ms), 2), round(pct(poll_ms, 99), 2)]
        if poll_ms else None,
        "controller_during_changes": breakdown,
    }
    if direct is not None:
        res["direct"] = direct
    print(json.dumps(res))
    c = mem.get("sweety-controller", (0, 0))
    d = mem.get("sweety-dataplane", (0, 0))
    print(f"| {n:,} | {res['served_after_last_accepted_ms']} ms ({len(missing)} not served in the sweep) "
          f"| {res['statuses_after_last_accepted_s']} s ({len(seen)}/{n}) "
          f"| {res['change_p50_ms']} / {res['change_p99_ms']} / {res['change_max_ms']} ms ({len(lat)} changes, {timeouts} timed out) "
          f"| {res['failed_requests']} of {res['background_ok'] + res['failed_requests']} "
          f"| {c[0] // 1024} MB ({c[1] // 1024} MB peak) | {d[0] // 1024} MB ({d[1] // 1024} MB peak) |")
    if direct is not None and "error" not in direct:
        print(f"polled at the dataplane Pod ({direct['target']}): change -> served "
              f"{direct['change_p50_ms']} / {direct['change_p99_ms']} / {direct['change_max_ms']} ms "
              f"({direct['changes']} changes, {direct['change_timeouts']} timed out), "
              f"poll request p50/p99 {direct['poll_request_ms_p50_p99']} ms")


if __name__ == "__main__":
    main()
