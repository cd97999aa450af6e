#!/usr/bin/env python3
"""Soak test of `agentkv serve` (not in CI; issue #13, must-have 8).

Starts a throw-away redis-server (a Redis tier behind a small RAM pool, so blocks are demoted
and looked up), starts the server binary with that config, and for --minutes runs --streams
concurrent streaming chat clients with a shared agent-style prefix; each stream is abandoned
(socket closed mid-stream) with probability --disconnect. A third of the way in, redis-server is
frozen with SIGSTOP for --freeze-s seconds, then thawed. Every --sample-s seconds it records the
server's RSS, the KV blocks in use and the latency of GET /health. At the end it waits for the
server to be idle and reads the blocks in use (must be 0).

Counts as an error: any HTTP status other than 200 (429/503 are reported separately as
"overload"), a stream that ends without [DONE] or with an error event, a client exception that
is not our own disconnect, and a /health that fails or takes over 1 s.

Usage: scripts/bench/soak.py [--binary target/release/agentkv] [--minutes 30] [--streams 32]
                       [--disconnect 0.2] [--freeze-s 60] [--out soak.json]
Prints a JSON summary (also written to --out) and exits non-zero on errors, RSS growth over 5 %
(last quarter vs first quarter after warm-up) or blocks in use when idle.
"""
import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SYSTEM = ("You are a careful coding agent working in a large repository. Read files before "
          "editing them, run the tests after every change, and explain what you did briefly. ")
TASKS = ["List the files in src/.", "Open README.md and summarise it.", "Run the unit tests.",
         "Fix the failing test in parser.rs.", "Add a docstring to main().", "Rename foo to bar.",
         "Explain the build script.", "Find where the config is parsed."]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {"requests": 0, "completed": 0, "disconnected": 0, "overload": 0, "errors": 0}
        self.error_kinds = {}

    def add(self, key, n=1):
        with self.lock:
            self.c[key] += n

    def error(self, kind):
        with self.lock:
            self.c["errors"] += 1
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


def stream_once(port, rng, disconnect, stats):
    history = [{"role": "system", "content": SYSTEM}]
    for _ in range(rng.randint(1, 3)):
        history.append({"role": "user", "content": rng.choice(TASKS)})
        history.append({"role": "assistant", "content": "Done: " + rng.choice(TASKS)})
    history.append({"role": "user", "content": rng.choice(TASKS)})
    body = json.dumps({"model": "soak", "messages": history, "stream": True,
                       "max_tokens": rng.randint(8, 64), "temperature": 0.7,
                       "seed": rng.randint(0, 1 << 30)})
    abandon_after = rng.randint(1, 6) if rng.random() < disconnect else None
    stats.add("requests")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", body,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status in (429, 503):
            resp.read()
            stats.add("overload")
            return
        if resp.status != 200:
            stats.error(f"status {resp.status}: {resp.read()[:200]!r}")
            return
        events, done = 0, False
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            if '"error"' in data and '"choices"' not in data:
                stats.error("error event: " + data[:200])
                return
            events += 1
            if abandon_after is not None and events >= abandon_after:
                conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()
                stats.add("disconnected")
                return
        if done:
            stats.add("completed")
        else:
            stats.error("stream ended without [DONE]")
    except Exception as e:  # noqa: BLE001 - every failure is counted
        stats.error(f"client exception: {type(e).__name__}: {e}")
    finally:
        conn.close()


def get(port, path, timeout=5):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def blocks_in_use(port):
    _, text = get(port, "/metrics")
    for line in text.splitlines():
        if line.startswith('agentkv_kv_blocks{state="in_use"}'):
            return int(float(line.split()[-1]))
    return None


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/agentkv")
    ap.add_argument("--model", default=None)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--disconnect", type=float, default=0.2)
    ap.add_argument("--freeze-s", type=float, default=60)
    ap.add_argument("--sample-s", type=float, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="agentkv-soak-")
    rport = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cfg = os.path.join(tmp, "agentkv.yaml")
    with open(cfg, "w") as f:
        f.write(f"""server: {{model_name: soak, shutdown_timeout_s: 5}}
kv_cache_config: {{max_size: 32MiB, tier_write_on_publish: true}}
tiers:
  - {{kind: redis, url: "redis://127.0.0.1:{rport}", ttl_secs: 3600}}
limits: {{max_requests: 256, max_requests_per_tenant: 256}}
""")
    args = [a.binary, "serve", "--port", "0", "--config", cfg]
    if a.model:
        args += ["--model", a.model]
    if a.threads:
        args += ["--threads", str(a.threads)]
    log = open(os.path.join(tmp, "server.log"), "w")
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    first = server.stdout.readline().strip()
    port = int(first.rsplit(":", 1)[1])
    stats = Stats()
    stop = threading.Event()

    def worker(i):
        rng = random.Random(i)
        while not stop.is_set():
            stream_once(port, rng, a.disconnect, stats)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.streams)]
    t0 = time.time()
    for t in threads:
        t.start()
    duration = a.minutes * 60
    freeze_at, thaw_at = duration / 3, duration / 3 + a.freeze_s
    frozen = False
    samples = []
    health_max = 0.0
    next_sample = 0.0
    while True:
        now = time.time() - t0
        if now >= duration:
            break
        if not frozen and freeze_at <= now < thaw_at:
            os.kill(redis.pid, signal.SIGSTOP)
            frozen = True
        if frozen and now >= thaw_at:
            os.kill(redis.pid, signal.SIGCONT)
            frozen = False
        if now >= next_sample:
            h0 = time.time()
            try:
                st, _ = get(port, "/health", timeout=10)
                ok = st == 200
            except Exception:  # noqa: BLE001
                ok = False
            h = time.time() - h0
            health_max = max(health_max, h)
            if not ok or h > 1.0:
                stats.error(f"/health {'failed' if not ok else 'slow'} ({h:.2f} s, redis "
                            f"{'frozen' if frozen else 'up'})")
            samples.append({"t_s": round(now, 1), "rss_kib": rss_kib(server.pid),
                            "in_use_blocks": blocks_in_use(port), "health_s": round(h, 4),
                            "redis_frozen": frozen})
            next_sample = now + a.sample_s
        time.sleep(0.2)
    if frozen:
        os.kill(redis.pid, signal.SIGCONT)
    stop.set()
    for t in threads:
        t.join(timeout=180)
    idle_blocks = None
    for _ in range(60):
        idle_blocks = blocks_in_use(port)
        if idle_blocks == 0:
            break
        time.sleep(0.5)
    rss = [s["rss_kib"] for s in samples if s["rss_kib"]]
    q = max(1, len(rss) // 4)
    warm = rss[q:] if len(rss) > 4 else rss  # skip the first quarter (warm-up, allocator growth)
    early, late = warm[:q], warm[-q:]
    growth = (sum(late) / len(late)) / (sum(early) / len(early)) - 1 if early and late else 0.0
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
    redis.kill()
    summary = {
        "minutes": a.minutes, "streams": a.streams, "disconnect_p": a.disconnect,
        "redis_frozen_s": a.freeze_s, **stats.c, "error_kinds": stats.error_kinds,
        "rss_kib_first": rss[0] if rss else None, "rss_kib_last": rss[-1] if rss else None,
        "rss_kib_max": max(rss) if rss else None, "rss_growth_after_warmup": round(growth, 4),
        "health_max_s": round(health_max, 3), "in_use_blocks_idle": idle_blocks,
        "server_exit": server.returncode, "server_log": log.name, "samples": samples,
    }
    text = json.dumps(summary, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    bad = stats.c["errors"] > 0 or abs(growth) > 0.05 or idle_blocks != 0
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
