#!/usr/bin/env python3
"""Issue #44's goals, measured from outside against a real `agentkv serve` (stdlib only).

Usage: scripts/bench/hostile.py AGENTKV_BINARY [--calls N] [--skip-tenants]

1. Rejected constraints: each hostile constraint of issue #44 (and a few it did not show) is sent
   5 times; for each, the answer (status, code) and the server process's CPU time per request
   (utime + stime from /proc, median of 5) and the client's wall time. Goal: every rejected
   constraint costs <= 100 ms of server CPU, and nothing answers 5xx or garbage.
2. Two tenants, one hostile: tenant `victim` runs N sequential agent-like calls (a ~300-token
   prompt that grows, 32 tokens out) alone, then again while tenant `hostile`, from another
   client address (127.0.0.2), floods: priority -63 on every request, 20 one-hour sessions, 12
   streams of 1,000 tokens that it never reads, 30 idle sockets (the server's cap is 40) and, in
   a second run, also two closed loops of 200-token generations (load any server shares).
   Reported: the victim's call p50/p95 alone and under the flood, and their ratio. Goal: p95
   under the flood <= 1.5x alone.
Prints a plain-text report (kept under docs/reports/).
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CONFIG = """server: {model_name: m}
model: {threads: 2}
tenants:
  - {name: victim, api_keys: ["kv"], priority: 20}
  - {name: hostile, api_keys: ["kh"], priority: 20}
limits: {max_connections: 40}
"""


def start(binary):
    d = tempfile.mkdtemp()
    cfg = os.path.join(d, "agentkv.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    p = subprocess.Popen([binary, "serve", "--port", "0", "--config", cfg], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    addr = line.strip().removeprefix("listening on http://")
    host, port = addr.rsplit(":", 1)
    return p, host, int(port)


def cpu_ms(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) * 1000.0 / ticks


def post(host, port, key, body, source=None, timeout=600):
    c = http.client.HTTPConnection(host, port, timeout=timeout,
                                   source_address=(source, 0) if source else None)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, data


def msgs(text):
    return [{"role": "user", "content": text}]


def constraint_cases():
    chain = "start: r0\n" + "".join(f'r{i}: "t" r{i + 1}\n' for i in range(1000)) + 'r1000: "end"\n'
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(1000)}
    defs["d1000"] = {"type": "string"}
    yield "guided_choice 100,000 options", {"guided_choice": [f"o{i}" for i in range(100_000)]}
    yield "regex matching nothing", {"guided_regex": "[^\\x00-\\x{10FFFF}]"}
    yield "regex a{1000}{1000}", {"guided_regex": "a{1000}{1000}"}
    yield "$ref loop", {"guided_json": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"},
                                                                       "b": {"$ref": "#/$defs/a"}}}}
    yield "GBNF 20,000 nested groups", {"grammar": "root ::= " + "(" * 20000 + '"a"' + ")" * 20000}
    yield "Lark 2,000-way choice", {"guided_grammar": "start: " + " | ".join(f'"c{i}x"' for i in range(2000))}
    yield "schema of 200 KB", {"guided_json": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "description": "x" * 40} for i in range(3000)}}}
    yield "Lark chain 1,000 (served)", {"guided_grammar": chain}
    yield "$ref chain 1,000 (served)", {"guided_json": {"$ref": "#/$defs/d0", "$defs": defs}}
    yield "anyOf of 3,000 (served)", {"guided_json": {"anyOf": [{"const": f"v{i}"} for i in range(3000)]}}


def bench_constraints(p, host, port, out):
    out.append("== rejected constraints: server CPU per request (median of 5) and wall time")
    out.append(f"{'case':34} {'status':>6} {'code':24} {'cpu ms':>8} {'wall ms':>8}")
    worst = 0.0
    for name, extra in constraint_cases():
        cpus, walls, status, code = [], [], None, None
        for _ in range(5):
            body = {"model": "m", "messages": msgs("Answer."), "max_tokens": 8, "temperature": 0, **extra}
            c0, t0 = cpu_ms(p.pid), time.time()
            status, data = post(host, port, "kv", body)
            walls.append((time.time() - t0) * 1000)
            cpus.append(cpu_ms(p.pid) - c0)
            try:
                code = json.loads(data).get("error", {}).get("code") if status != 200 else "-"
            except ValueError:
                code = "(not JSON)"
        cpu = statistics.median(cpus)
        if status >= 400:
            worst = max(worst, cpu)
        out.append(f"{name:34} {status:>6} {str(code):24} {cpu:8.1f} {statistics.median(walls):8.1f}")
    out.append(f"worst rejected: {worst:.1f} ms of server CPU (goal <= 100)")


def victim_calls(host, port, n):
    lat = []
    history = "You are a coding agent. " + " ".join(f"Rule {i}: read before you edit." for i in range(30))
    for i in range(n):
        history += f" Observation {i}: the tests passed in module {i}."
        t0 = time.time()
        status, data = post(host, port, "kv", {"model": "m", "messages": msgs(history), "max_tokens": 32,
                                               "temperature": 0, "ignore_eos": True})
        assert status == 200, data
        lat.append(time.time() - t0)
    return lat


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def flood(host, port, stop, loops):
    src = "127.0.0.2"
    threads = []

    def loop(k):
        i = 0
        while not stop.is_set():
            post(host, port, "kh", {"model": "m", "messages": msgs(f"Write a long story {k}-{i}."),
                                    "max_tokens": 200, "ignore_eos": True, "priority": -63}, source=src)
            i += 1

    for k in range(loops):
        t = threading.Thread(target=loop, args=(k,), daemon=True)
        t.start()
        threads.append(t)
    for i in range(20):
        post(host, port, "kh", {"model": "m", "messages": msgs(f"Session {i}: " + "context " * 300),
                                "max_tokens": 2, "prompt_cache_key": f"s{i}", "priority": -63,
                                "prompt_cache_retention": "24h"}, source=src)
    socks = []
    for i in range(12):
        body = json.dumps({"model": "m", "messages": msgs(f"A very long story {i}."), "max_tokens": 1000,
                           "stream": True, "logprobs": True, "top_logprobs": 20, "ignore_eos": True,
                           "priority": -63}).encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.bind((src, 0))
        s.connect((host, port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer kh\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(s)
    idle = []
    for i in range(30):
        s = socket.socket()
        s.bind((src, 0))
        try:
            s.connect((host, port))
            idle.append(s)
        except OSError:
            break
    return threads, socks + idle


def bench_tenants(binary, calls, loops, out):
    out.append("")
    out.append(f"== two tenants, one hostile ({loops} closed loops of 200-token generations beside the "
               f"sessions, stalled streams and idle sockets): victim's {calls} sequential calls")
    p, host, port = start(binary)
    try:
        victim_calls(host, port, 2)  # warm-up
        alone = victim_calls(host, port, calls)
        stop = threading.Event()
        _, held = flood(host, port, stop, loops)
        time.sleep(3)
        loaded = victim_calls(host, port, calls)
        stop.set()
        for s in held:
            s.close()
    finally:
        p.kill()
    a50, a95, l50, l95 = pct(alone, .5), pct(alone, .95), pct(loaded, .5), pct(loaded, .95)
    out.append(f"alone:        p50 {a50:.2f} s  p95 {a95:.2f} s")
    out.append(f"under flood:  p50 {l50:.2f} s  p95 {l95:.2f} s")
    out.append(f"p95 ratio: {l95 / a95:.2f}x (goal <= 1.5x); p50 ratio {l50 / a50:.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--skip-tenants", action="store_true")
    a = ap.parse_args()
    out = [f"agentkv {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}"
           f" on {os.uname().machine}, {os.cpu_count()} cpus"]
    p, host, port = start(a.binary)
    try:
        bench_constraints(p, host, port, out)
        st = subprocess.run(["curl", "-s", f"http://{host}:{port}/health"], capture_output=True, text=True)
        out.append(f"/health afterwards: {st.stdout.strip()!r}")
    finally:
        p.kill()
    if not a.skip_tenants:
        for loops in (0, 2):
            bench_tenants(a.binary, a.calls, loops, out)
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
