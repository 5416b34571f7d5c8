#!/usr/bin/env python3
"""Helper for e2e/bench/run.sh (Python 3 standard library only).

Subcommands:
  port-state PORT WANT TIMEOUT   wait until 127.0.0.1:PORT is "open" or "free"; exit 1 on timeout
  mem PID                        print "VmRSS VmHWM" in kB, summed over PID and its descendants
  measure [options] -- CMD...    run one load-generator command and append one JSON result line
  oha-probe                      read oha's JSON (one request) on stdin, print "STATUS SIZEB"
  report RESULTS [--out FILE]    print the markdown report (and write it to FILE)

`measure` samples the server's CPU time (utime+stime from /proc/PID/stat, summed over the
server process and its descendants, e.g. nginx master + worker) and page faults right before
and right after the client runs, reads peak memory (VmHWM) at the end (and VmRSS again
`--settle` seconds later), parses the client's output (h2load,
wrk or oha's JSON), and appends everything as one JSON line to the results file.
"""

import argparse
import json
import math
import os
import re
import signal
import socket
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- /proc helpers


def children_of(pid):
    """Direct children of pid, from /proc/*/stat (the field after the command name is ppid)."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[1]) == pid:
            kids.append(int(entry))
    return kids


def tree(pid):
    """pid and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children_of(p))
    return out


def cpu_ticks(pids):
    """Sum of utime+stime (clock ticks) of pids; a vanished pid counts as 0."""
    return sum(user_system_ticks(pids))


def user_system_ticks(pids):
    """(utime, stime) summed over pids, in clock ticks; a vanished pid counts as 0."""
    user = system = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            # after ")": state(0) ppid(1) ... utime is field 14 overall -> index 11, stime 12
            user += int(rest[11])
            system += int(rest[12])
        except (OSError, IndexError, ValueError):
            pass
    return user, system


def faults(pids):
    """Sum of minor+major page faults of pids; a vanished pid counts as 0."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            # after ")": state(0) ppid(1) pgrp session tty tpgid flags minflt(7) cminflt majflt(9)
            total += int(rest[7]) + int(rest[9])
        except (OSError, IndexError, ValueError):
            pass
    return total


def mem_kb(pids):
    """(VmRSS, VmHWM) in kB summed over pids."""
    rss = hwm = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
                    elif line.startswith("VmHWM:"):
                        hwm += int(line.split()[1])
        except OSError:
            pass
    return rss, hwm


# --------------------------------------------------------------------------- ports


def port_open(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def cmd_port_state(a):
    deadline = time.monotonic() + a.timeout
    want_open = a.want == "open"
    while True:
        if port_open(a.port) == want_open:
            return 0
        if time.monotonic() > deadline:
            return 1
        time.sleep(0.1)


def cmd_mem(a):
    rss, hwm = mem_kb(tree(a.pid))
    print(rss, hwm)
    return 0


# --------------------------------------------------------------------------- client output parsing

UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def to_ms(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    return float(m.group(1)) * UNIT_MS[m.group(2)] if m else None


def parse_h2load(out, log_path):
    r = {"rps": None, "done": 0, "failed": 0, "bad_status": 0, "p99_ms": None}
    m = re.search(r"finished in ([\d.]+)s, ([\d.]+) req/s", out)
    if m:
        r["seconds"] = float(m.group(1))
        r["rps"] = float(m.group(2))
    m = re.search(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
        r"(\d+) failed, (\d+) errored, (\d+) timeout",
        out,
    )
    if m:
        r["done"] = int(m.group(3))
        # "failed" already includes "errored" and "timeout" in h2load's accounting
        r["failed"] = int(m.group(5))
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if m:
        r["bad_status"] = int(m.group(2)) + int(m.group(3)) + int(m.group(4))
    # p99 from the per-request log: start_us <TAB> status <TAB> elapsed_us
    if log_path and os.path.exists(log_path):
        lat = []
        with open(log_path) as f:
            for line in f:
                cols = line.split("\t")
                if len(cols) >= 3:
                    try:
                        lat.append(int(cols[2]))
                    except ValueError:
                        pass
        if lat:
            lat.sort()
            r["p99_ms"] = lat[max(0, math.ceil(0.99 * len(lat)) - 1)] / 1000.0
    return r


def parse_wrk(out):
    r = {"rps": None, "done": 0, "failed": 0, "bad_status": 0, "p99_ms": None}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m:
        r["rps"] = float(m.group(1))
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+),", out)
    if m:
        r["done"] = int(m.group(1))
    m = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    if m:
        r["p99_ms"] = to_ms(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        r["bad_status"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        r["failed"] = sum(int(g) for g in m.groups())
    return r


def parse_oha(out):
    """oha --output-format json: requests/s, p99 (seconds in the JSON), status codes, errors."""
    r = {"rps": None, "done": 0, "failed": 0, "bad_status": 0, "p99_ms": None}
    # with --db-url oha prints "Storing results to FILE" on stderr, which the output file
    # shares with the JSON: anywhere in it, even before the JSON's last brace
    out = "\n".join(line for line in out.splitlines() if not line.startswith("Storing results to "))
    start = out.find("{")
    try:
        j = json.loads(out[start:]) if start >= 0 else {}
    except ValueError:
        return r
    r["rps"] = j.get("summary", {}).get("requestsPerSec")
    p99 = j.get("latencyPercentiles", {}).get("p99")
    r["p99_ms"] = p99 * 1000.0 if p99 is not None else None
    codes = j.get("statusCodeDistribution", {}) or {}
    r["done"] = sum(codes.values())
    r["bad_status"] = sum(v for k, v in codes.items() if not k.startswith("2"))
    # oha cancels the requests still in flight when -z runs out; those are not failures
    errors = j.get("errorDistribution", {}) or {}
    r["failed"] = sum(v for k, v in errors.items() if "aborted due to deadline" not in k)
    r["errors"] = errors
    return r


def oha_db_latencies(db_path, skip_s):
    """The rate cells' per-request record (oha --db-url, a SQLite table `oha`: one row per
    successful request, times in seconds from oha's start; with --latency-correction
    `start_latency_correction` is when the request was due and `duration` runs from then to
    its end). Returns (p99 over the requests due at skip_s or later, ms; the longest oha took
    to send a request due before skip_s, after it was due, ms: its start; p99 of each 0.5 s
    window of due times, ms)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        rows = con.execute(
            "SELECT COALESCE(start_latency_correction, start), start, duration FROM oha"
        ).fetchall()
        con.close()
    except sqlite3.Error:
        return None, None, []
    if not rows:
        return None, None, []
    p99 = lambda xs: sorted(xs)[max(0, math.ceil(0.99 * len(xs)) - 1)] * 1000.0
    steady = [d for due, _, d in rows if due >= skip_s]
    lag = max((s - due for due, s, _ in rows if due < skip_s), default=0.0) * 1000.0
    windows = {}
    for due, _, d in rows:
        windows.setdefault(int(due / 0.5), []).append(d)
    per_window = [round(p99(windows[k]), 2) for k in sorted(windows)]
    return (p99(steady) if steady else None), lag, per_window


def parse_wsbench(out):
    """dataplane/examples/ws_bench.rs client: one JSON line (messages/s as rps)."""
    r = {"rps": None, "done": 0, "failed": 0, "bad_status": 0, "p99_ms": None}
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
        except ValueError:
            continue
        r.update({k: j.get(k, r[k]) for k in ("rps", "done", "failed", "p99_ms")})
    return r


def cmd_oha_probe(_a):
    try:
        j = json.loads(sys.stdin.read())
    except ValueError:
        print("no answer")
        return 0
    codes = j.get("statusCodeDistribution", {}) or {}
    size = j.get("summary", {}).get("sizePerRequest")
    print(f"{','.join(codes) or 'error'} {size if size is not None else 0}B")
    return 0


# --------------------------------------------------------------------------- measure


def run_bounded(cmd, stdout_path, timeout):
    """Runs cmd with stdout+stderr to a file; returns (exit status, client CPU seconds, wall)."""
    with open(stdout_path, "wb") as out:
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                os.execvp(cmd[0], cmd)
            finally:
                os._exit(127)
        killed = False
        while True:
            wpid, status, usage = os.wait4(pid, os.WNOHANG)
            if wpid == pid:
                break
            if not killed and time.monotonic() - t0 > timeout:
                os.kill(pid, signal.SIGKILL)
                killed = True
            time.sleep(0.05)
    wall = time.monotonic() - t0
    code = -1 if killed else os.waitstatus_to_exitcode(status)
    return code, usage.ru_utime + usage.ru_stime, wall


def cmd_measure(a):
    pids = tree(a.server_pid)
    (u0, s0), f0 = user_system_ticks(pids), faults(pids)
    code, client_cpu, wall = run_bounded(a.command, a.client_out, a.timeout)
    (u1, s1), f1 = user_system_ticks(pids), faults(pids)
    t0, t1 = u0 + s0, u1 + s1
    alive = os.path.exists(f"/proc/{a.server_pid}")
    rss, hwm = mem_kb(pids)
    settled = None
    if a.settle > 0 and alive:
        time.sleep(a.settle)  # the load is over: what the server keeps once idle
        settled, _ = mem_kb(pids)
    with open(a.client_out, errors="replace") as f:
        out = f.read()
    if a.tool == "h2load":
        r = parse_h2load(out, a.log)
    elif a.tool == "oha":
        r = parse_oha(out)
    elif a.tool == "wsbench":
        r = parse_wsbench(out)
    else:
        r = parse_wrk(out)
    if a.log and os.path.exists(a.log):
        os.unlink(a.log)  # can be tens of MB
    if a.oha_db:
        r["p99_steady_ms"], r["start_lag_ms"], r["p99_windows_ms"] = oha_db_latencies(
            a.oha_db, a.steady_skip)
        r["steady_skip_s"] = a.steady_skip
        if os.path.exists(a.oha_db) and not a.keep_db:
            os.unlink(a.oha_db)
    cpu_s = (t1 - t0) / CLK_TCK
    r.update(
        cell=a.cell,
        server=a.server,
        run=a.run,
        client_exit=code,
        server_alive=alive,
        server_cpu_s=cpu_s,
        server_cpu_pct=100.0 * cpu_s / wall if wall > 0 else None,
        cpu_us_per_req=(cpu_s * 1e6 / r["done"]) if r["done"] else None,
        # the user / system split of it (HISTORY.md "User and system time per request")
        user_us_per_req=((u1 - u0) / CLK_TCK * 1e6 / r["done"]) if r["done"] else None,
        sys_us_per_req=((s1 - s0) / CLK_TCK * 1e6 / r["done"]) if r["done"] else None,
        faults_per_req=((f1 - f0) / r["done"]) if r["done"] else None,
        client_cpu_pct=100.0 * client_cpu / wall if wall > 0 else None,
        idle_rss_kb=a.idle_rss,
        peak_rss_kb=hwm,
        end_rss_kb=rss,
        settled_rss_kb=settled,
        probe=a.probe,
        expect=a.expect,
        probe_ok=(not a.expect) or a.probe == a.expect,
    )
    with open(a.results, "a") as f:
        f.write(json.dumps(r) + "\n")
    print(
        f"  {a.server:7s} {a.cell:8s} run {a.run}: {fmt_rps(r['rps'])} rps, "
        f"p99 {fmt_ms(r['p99_ms'])}"
        + ("" if r.get("p99_steady_ms") is None else
           f" (after {a.steady_skip:g} s: {fmt_ms(r['p99_steady_ms'])}, "
           f"sent up to {fmt_num(r['start_lag_ms'], 1)} ms late before)")
        + f", {fmt_num(r['cpu_us_per_req'])} CPU-us/req, "
        f"server CPU {fmt_num(r['server_cpu_pct'], 0)}%, client CPU "
        f"{fmt_num(r['client_cpu_pct'], 0)}%, {fmt_num(r['faults_per_req'], 2)} faults/req, "
        f"peak RSS {fmt_mb(hwm)}{'' if settled is None else ', settled ' + fmt_mb(settled)}, "
        f"failed {r['failed']}, non-2xx {r['bad_status']} (probe: {a.probe}"
        f"{'' if r['probe_ok'] else ', UNEXPECTED: want ' + a.expect})",
        file=sys.stderr,
    )
    if code != 0:
        print(f"  client exited with {code}; output in {a.client_out}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- report


def fmt_num(v, digits=1):
    return "—" if v is None else f"{v:,.{digits}f}"


def fmt_rps(v):
    if v is None:
        return "—"
    return f"{v / 1000:.1f}k" if v >= 10000 else f"{v:,.0f}"


def fmt_ms(v):
    return "—" if v is None else (f"{v:.2f} ms" if v < 100 else f"{v:,.0f} ms")


def fmt_mb(kb):
    return "—" if not kb else f"{kb / 1024:.1f} MiB"


def fmt_ratio(a, b):
    return "—" if not a or not b else f"{a / b:.2f}"


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def md_table(header, rows):
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def pair_row(label, a, b, b_over_a):
    """A row of a side-by-side table of the aggregates `a` and `b` (either may be None): rps,
    p99, CPU-µs per request and peak RSS of each, the ratio of their µs (b's over a's when
    `b_over_a`, else a's over b's), and b's failures."""
    g = lambda d, k: d[k] if d else None
    num, den = (b, a) if b_over_a else (a, b)
    return [
        label,
        fmt_rps(g(a, "rps")),
        fmt_rps(g(b, "rps")),
        fmt_ms(g(a, "p99")),
        fmt_ms(g(b, "p99")),
        fmt_num(g(a, "us")),
        fmt_num(g(b, "us")),
        fmt_ratio(g(num, "us"), g(den, "us")),
        fmt_mb(g(a, "rss")),
        fmt_mb(g(b, "rss")),
        "—" if b is None else b["fail"],
    ]


PROXY_FRONT = {"proxy-h1", "proxy-h1s", "proxy-h1s-4k", "proxy-h2", "proxy-h2-4k", "proxy-h2c",
               "proxy-h2c-4k"}


def goal_checks(cell, agg):
    """Issue 23's goal for CELL as (text, [(label, (ratio, met))]), both None where a figure
    is missing."""
    g = lambda d, k: d[k] if d else None
    le = lambda x, y, f: (None, None) if not x or not y else (x / y, x <= f * y)
    s = agg(cell, "sweety")
    if cell in PROXY_FRONT or cell in ("proxy-h3", "proxy-h3-4k"):
        ref = cell if cell in PROXY_FRONT else cell.replace("h3", "h2")
        h = agg(ref, "haproxy")
        text = "µs ≤ 0.8x H, p99 ≤ H" + ("" if ref == cell else f" (H of {ref})")
        return text, [("µs", le(g(s, "us"), g(h, "us"), 0.8)), ("p99", le(g(s, "p99"), g(h, "p99"), 1.0))]
    if cell.endswith("-rate"):
        # the steady state: oha's late start sets the whole run's p99 for every server
        h = agg(cell, "haproxy")
        return "p99 ≤ H at the same rate (steady)", [("p99", le(g(s, "p99s"), g(h, "p99s"), 1.0))]
    if cell in ("proxy-h1-100k", "proxy-h2-100k"):
        return "RSS ≤ 1.5x N", [("RSS", le(g(s, "rss"), g(agg(cell, "nginx"), "rss"), 1.5))]
    if cell in ("h1-100k", "h2-100k"):
        n = agg(cell, "nginx")
        return "µs ≤ 1.0x N, RSS ≤ 1.5x N", [("µs", le(g(s, "us"), g(n, "us"), 1.0)),
                                             ("RSS", le(g(s, "rss"), g(n, "rss"), 1.5))]
    if cell in ("h1-1m", "h2-1m"):
        return "µs ≤ 1.0x N", [("µs", le(g(s, "us"), g(agg(cell, "nginx"), "us"), 1.0))]
    if cell == "h3-100k":
        return "µs ≤ 1.5x our h2-100k, RSS ≤ 1.5x N's h2-100k", [
            ("µs", le(g(s, "us"), g(agg("h2-100k", "sweety"), "us"), 1.5)),
            ("RSS", le(g(s, "rss"), g(agg("h2-100k", "nginx"), "rss"), 1.5))]
    if cell.endswith("-c1000"):
        return "RSS reported", []
    return "", []


def goal_table(cells, agg, by):
    """The report's first table: every cell, the three servers side by side, ratios to the
    best peer and issue 23's goal for the cell."""
    servers = ("sweety", "nginx", "haproxy")
    g = lambda d, k: d[k] if d else None
    trio = lambda c, k, f: " · ".join(f(g(agg(c, srv), k)) for srv in servers)
    mib = lambda kb: "—" if not kb else f"{kb / 1024:.1f}"
    ms = lambda v: "—" if v is None else (f"{v:.2f}" if v < 100 else f"{v:,.0f}")
    rows = []
    for c in cells:
        s = agg(c, "sweety")
        peers = [agg(c, srv) for srv in servers[1:]]
        best_us = min((p["us"] for p in peers if p and p["us"]), default=None)
        best_rss = min((p["rss"] for p in peers if p and p["rss"]), default=None)
        text, checks = goal_checks(c, agg)
        if not checks:
            met = "—"
        else:
            mark = lambda r: "?" if r[1] is None else f"{r[0]:.2f}x {'✅' if r[1] else '❌'}"
            met = ", ".join(f"{label} {mark(r)}" for label, r in checks)
            if c.endswith("-rate"):  # the whole run's ratio beside, for reference
                s_all, h_all = g(s, "p99"), g(agg(c, "haproxy"), "p99")
                met += f" (whole run {fmt_ratio(s_all, h_all)}x)" if s_all and h_all else ""
        fails = sum((agg(c, srv) or {"fail": 0})["fail"] for srv in servers)
        rows.append([
            c,
            trio(c, "us", fmt_num),
            fmt_ratio(g(s, "us"), best_us),
            trio(c, "rps", fmt_rps),
            trio(c, "p99s" if c.endswith("-rate") else "p99", ms),
            trio(c, "rss", mib),
            fmt_ratio(g(s, "rss"), best_rss),
            fails,
            text or "—",
            met,
        ])
    idle = {}
    for (cell, srv), rs in by.items():
        idle.setdefault(srv, []).extend(r["idle_rss_kb"] for r in rs if r.get("idle_rss_kb"))
    rng = lambda v: "—" if not v else (mib(min(v)) if mib(min(v)) == mib(max(v)) else f"{mib(min(v))}–{mib(max(v))}")
    si = idle.get("sweety") or []
    best_idle = min((mean(idle.get(srv) or [None]) for srv in servers[1:] if idle.get(srv)), default=None)
    rows.append([
        "idle RSS (min–max over starts)", "", "", "", "",
        " · ".join(rng(idle.get(srv)) for srv in servers),
        fmt_ratio(mean(si or [None]), best_idle), "", "max ≤ 8 MiB",
        "—" if not si else f"max {mib(max(si))} MiB {'✅' if max(si) <= 8 * 1024 else '❌'}",
    ])
    return md_table(
        ["cell", "µs/req S · N · H", "µs S/best", "rps S · N · H", "p99 ms S · N · H",
         "peak RSS MiB S · N · H", "RSS S/best", "fail", "issue 23 goal", "met"],
        rows,
    )


def cmd_report(a):
    rows = []
    with open(a.results) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    by = {}
    for r in rows:
        by.setdefault((r["cell"], r["server"]), []).append(r)

    def agg(cell, server):
        rs = by.get((cell, server), [])
        if not rs:
            return None
        return {
            "rps": mean(r["rps"] for r in rs),
            "p99": mean(r["p99_ms"] for r in rs),
            "p99s": mean(r.get("p99_steady_ms") for r in rs),
            "lag": mean(r.get("start_lag_ms") for r in rs),
            "skip": next((r["steady_skip_s"] for r in rs if r.get("steady_skip_s") is not None), None),
            "us": mean(r["cpu_us_per_req"] for r in rs),
            "rss": max((r["peak_rss_kb"] or 0) for r in rs),
            "fail": sum(r["failed"] + r["bad_status"] for r in rs),
            "n": len(rs),
        }

    current = goal_table(cells, agg, by)

    summary = []
    for c in cells:
        s, n = agg(c, "sweety"), agg(c, "nginx")
        g = lambda d, k: d[k] if d else None
        summary.append(
            [
                c,
                fmt_rps(g(s, "rps")),
                fmt_rps(g(n, "rps")),
                fmt_ms(g(s, "p99")),
                fmt_ms(g(n, "p99")),
                fmt_num(g(s, "us")),
                fmt_num(g(n, "us")),
                fmt_ratio(g(s, "us"), g(n, "us")),
                fmt_mb(g(s, "rss")),
                fmt_mb(g(n, "rss")),
                fmt_ratio(g(s, "rss"), g(n, "rss")),
                "—" if s is None else s["fail"],
                "—" if n is None else n["fail"],
            ]
        )
    idle = {}
    for r in rows:
        if r.get("idle_rss_kb"):
            idle.setdefault(r["server"], []).append(r["idle_rss_kb"])

    def idle_txt(srv):
        v = idle.get(srv)
        if not v:
            return "—"
        lo, hi = min(v), max(v)
        return fmt_mb(lo) if fmt_mb(lo) == fmt_mb(hi) else f"{fmt_mb(lo)}–{fmt_mb(hi)}"

    si, ni = idle.get("sweety"), idle.get("nginx")
    summary.append(
        ["idle RSS", "", "", "", "", "", "", "", idle_txt("sweety"), idle_txt("nginx"),
         fmt_ratio(mean(si or [None]), mean(ni or [None])), "", ""]
    )

    raw = []
    for r in rows:
        raw.append(
            [
                r["cell"],
                r["server"],
                r["run"],
                fmt_rps(r["rps"]),
                fmt_ms(r["p99_ms"]),
                fmt_ms(r.get("p99_steady_ms")),
                fmt_num(r["cpu_us_per_req"]),
                f"{fmt_num(r.get('user_us_per_req'))} / {fmt_num(r.get('sys_us_per_req'))}",
                fmt_num(r["server_cpu_pct"], 0),
                fmt_num(r["client_cpu_pct"], 0),
                fmt_mb(r["idle_rss_kb"]),
                fmt_mb(r["peak_rss_kb"]),
                fmt_num(r.get("faults_per_req"), 2),
                fmt_mb(r["settled_rss_kb"]) if r.get("settled_rss_kb") else "—",
                r["done"],
                r["failed"],
                r["bad_status"],
                r.get("probe", ""),
            ]
        )

    meta = {}
    for kv in a.meta or []:
        k, _, v = kv.partition("=")
        meta[k] = v
    out = ["# Sweety vs nginx and HAProxy", ""]
    out += [f"- {k}: {v}" for k, v in meta.items()]
    bad = [r for r in rows if not r.get("probe_ok", True)]
    if bad:
        out += ["", "**WARNING**: the probe before the load got an unexpected answer, so these "
                "rows measure something else (an error page, another route):", ""]
        out += [f"- {r['cell']} {r['server']} run {r['run']}: got `{r.get('probe')}`, expected "
                f"`{r.get('expect')}`" for r in bad]
    out += [
        "",
        "## Every cell against issue 23's goals",
        "",
        "Means over runs; S · N · H = Sweety · nginx · HAProxy (— where one does not serve the "
        "cell). µs = server CPU-µs per request; best = the lower of nginx's and HAProxy's; p99 "
        "in ms; peak RSS in MiB (VmHWM). Goals (issue 23): the proxy cells ≤ 0.8x HAProxy's µs "
        "and p99 ≤ HAProxy's, also at a fixed request rate (*-rate cells; HTTP/3 front: against HAProxy's HTTP/2 front, it has no HTTP/3 "
        "here); the *-rate cells' p99 here is the steady state's (requests due after the "
        "first seconds, see \"The rate cells\" below; the whole run's ratio is in brackets); the 100 KB cells peak RSS ≤ 1.5x nginx's (HTTP/3: nginx's HTTP/2), H1/H2 100 KB "
        "and 1 MB µs ≤ 1.0x nginx's, H3 100 KB µs ≤ 1.5x our H2's; idle RSS ≤ 8 MiB. met: "
        "Sweety's figure over the goal's reference, ✅ within the goal. Cells without a goal "
        "are there for regressions.",
        "",
        current,
        "",
        "## Sweety vs nginx",
        "",
        "Means over runs. µs = server CPU-microseconds per request (utime+stime of the server's "
        "processes over the run / completed requests); lower is better, and it is the fair "
        "figure when the load generator is the bottleneck (client CPU ≥ 90% in the raw table). "
        "Ratios are Sweety / nginx (below 1.00: Sweety uses less). Peak RSS = VmHWM summed over "
        "the server's processes (nginx: master + worker), each server started fresh for every "
        "cell and run, so it is per cell. Idle RSS = VmRSS right after start (min–max over "
        "starts). fail = failed requests + non-2xx responses (all runs).",
        "",
        md_table(
            ["cell", "rps S", "rps N", "p99 S", "p99 N", "µs/req S", "µs/req N", "µs S/N",
             "peak RSS S", "peak RSS N", "RSS S/N", "fail S", "fail N"],
            summary,
        ),
    ]
    h3rows = []
    for c in cells:
        if not c.startswith("h3-"):
            continue
        h3, h2 = agg(c, "sweety"), agg("h2-" + c[3:], "sweety")
        h3rows.append(pair_row(c[3:], h2, h3, b_over_a=True))
    if h3rows:
        out += [
            "",
            "## Sweety HTTP/3 vs HTTP/2",
            "",
            "Same files, same server settings; H2 load from h2load (-m 10), H3 load from oha "
            "(-p 10). µs H3/H2 is the ratio of server CPU-µs per request.",
            "",
            md_table(
                ["file", "rps H2", "rps H3", "p99 H2", "p99 H3", "µs/req H2", "µs/req H3",
                 "µs H3/H2", "peak RSS H2", "peak RSS H3", "fail H3"],
                h3rows,
            ),
        ]
    trrows = []
    for c in cells:
        if c.startswith("proxy-h2-trace"):
            trrows.append(pair_row(c, agg("proxy-h2", "sweety"), agg(c, "sweety"), b_over_a=True))
    if trrows:
        out += [
            "",
            "## Sweety tracing cost (proxy-h2, tracing off vs on)",
            "",
            "Same run, same load: proxy-h2 (tracing off) beside proxy-h2-trace0 (tracing on, "
            "sampling 0: trace context only) and proxy-h2-trace1 (1 % sampled and exported). "
            "µs on/off is the ratio of server CPU-µs per request.",
            "",
            md_table(
                ["cell", "rps off", "rps on", "p99 off", "p99 on", "µs/req off", "µs/req on",
                 "µs on/off", "peak RSS off", "peak RSS on", "fail on"],
                trrows,
            ),
        ]
    rate_rows = []
    for c in cells:
        if not c.endswith("-rate"):
            continue
        h = agg(c, "haproxy")
        for srv in ("sweety", "nginx", "haproxy"):
            d = agg(c, srv)
            if d is None:
                continue
            rate_rows.append([
                c, srv, d["n"], fmt_rps(d["rps"]), fmt_ms(d["p99"]), fmt_ms(d["p99s"]),
                fmt_ratio(d["p99"], h and h["p99"]), fmt_ratio(d["p99s"], h and h["p99s"]),
                " · ".join(fmt_num(r.get("p99_steady_ms")) for r in by[(c, srv)]),
                fmt_num(d["lag"]),
                " · ".join(fmt_num(r.get("start_lag_ms")) for r in by[(c, srv)]),
            ])
    if rate_rows:
        skip = next((agg(c, "sweety") or {}).get("skip") for c in cells if c.endswith("-rate"))
        out += [
            "",
            "## The rate cells: p99 over the steady state and over the whole run",
            "",
            "oha at a fixed rate with --latency-correction: a request's latency runs from when it "
            "was due, so a late start counts against every request due meanwhile. oha sends its "
            "first request tens of ms late in most runs (its connections' TLS handshakes on the "
            "CPU it shares with the backend; with HTTP/1.1's 100 connections its sends lag for "
            "the first half second or more), for every server, and those requests set the whole "
            f"run's p99. p99 steady counts only the requests due {skip if skip is not None else '?'} s "
            "or more after the start (oha --db-url records every request; the same cut for every "
            "server); the goal (p99 ≤ HAProxy's at the same load) is read on it. late = the "
            "longest oha took to send a request due in the part left out, after it was due (the "
            "mean over runs; then every run). Means over runs; ratios to HAProxy's. On a loaded "
            "machine a run's steady p99 can still jump (other processes stall the client or the "
            "backend on CPU 1 for whole seconds, whichever server runs): read the runs beside "
            "the mean.",
            "",
            md_table(["cell", "server", "runs", "rps", "p99 whole run", "p99 steady",
                      "whole / H", "steady / H", "steady ms per run", "late ms",
                      "late ms per run"], rate_rows),
        ]
    harows = []
    for c in cells:
        s, h = agg(c, "sweety"), agg(c, "haproxy")
        if h is not None:
            harows.append(pair_row(c, s, h, b_over_a=False))
    if harows:
        out += [
            "",
            "## Sweety vs HAProxy (proxy and cache cells)",
            "",
            "Same backend, ports and load as above; HAProxy with one thread. µs S/H is Sweety's "
            "server CPU-µs per request over HAProxy's.",
            "",
            md_table(
                ["cell", "rps S", "rps H", "p99 S", "p99 H", "µs/req S", "µs/req H", "µs S/H",
                 "peak RSS S", "peak RSS H", "fail H"],
                harows,
            ),
        ]
    out += [
        "",
        "## Every run",
        "",
        "user / sys µs: µs/req split into the server's user and kernel time (utime, stime). "
        "non-2xx: h2load and oha count 3xx/4xx/5xx, wrk counts 4xx/5xx. probe: status and size "
        "of one request made before the load (curl; oha for h3). faults/req: the server's page "
        "faults (minor + major, /proc/PID/stat) over the run per completed request. settled "
        "RSS: VmRSS SETTLE seconds after the load ended (run.sh's SETTLE; — when 0).",
        "",
        md_table(
            ["cell", "server", "run", "rps", "p99", "p99 steady", "µs/req", "user / sys µs", "server CPU %", "client CPU %",
             "idle RSS", "peak RSS", "faults/req", "settled RSS", "done", "failed", "non-2xx",
             "probe"],
            raw,
        ),
        "",
    ]
    text = "\n".join(out)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


# --------------------------------------------------------------------------- main


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="sub", required=True)

    s = sub.add_parser("port-state")
    s.add_argument("port", type=int)
    s.add_argument("want", choices=["open", "free"])
    s.add_argument("timeout", type=float)
    s.set_defaults(fn=cmd_port_state)

    s = sub.add_parser("mem")
    s.add_argument("pid", type=int)
    s.set_defaults(fn=cmd_mem)

    s = sub.add_parser("measure")
    s.add_argument("--results", required=True)
    s.add_argument("--cell", required=True)
    s.add_argument("--server", required=True)
    s.add_argument("--run", type=int, default=1)
    s.add_argument("--tool", choices=["h2load", "wrk", "oha", "wsbench"], required=True)
    s.add_argument("--server-pid", type=int, required=True)
    s.add_argument("--idle-rss", type=int, default=0)
    s.add_argument("--probe", default="")
    s.add_argument("--expect", default="", help="the probe answer expected, e.g. '200 1024B'")
    s.add_argument("--log", help="h2load --log-file path, for p99")
    s.add_argument("--oha-db", help="oha --db-url file (the rate cells), for the steady p99")
    s.add_argument("--keep-db", action="store_true", help="keep the --oha-db file")
    s.add_argument("--steady-skip", type=float, default=1.0,
                   help="the steady p99 counts the requests due this many seconds in or later")
    s.add_argument("--client-out", required=True)
    s.add_argument("--timeout", type=float, required=True)
    s.add_argument("--settle", type=float, default=0,
                   help="seconds to wait after the load before reading VmRSS again (0: no)")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- CLIENT COMMAND...")
    s.set_defaults(fn=cmd_measure)

    s = sub.add_parser("oha-probe")
    s.set_defaults(fn=cmd_oha_probe)

    s = sub.add_parser("report")
    s.add_argument("results")
    s.add_argument("--out")
    s.add_argument("--meta", action="append", help="KEY=VALUE shown in the header")
    s.set_defaults(fn=cmd_report)

    a = p.parse_args()
    if a.sub == "measure":
        if a.command[:1] == ["--"]:
            a.command = a.command[1:]
        if not a.command:
            p.error("measure: missing client command after --")
    sys.exit(a.fn(a))


if __name__ == "__main__":
    main()
