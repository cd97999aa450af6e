#!/usr/bin/env python3
"""Decodes behind one long shared prompt: N concurrent chat calls whose system prompt (~4,300
tokens) is the same and whose questions differ, against a running server (the prompt is cached
first by one call). Prints, per repetition, the wall time, the tokens generated and their rate.

    scripts/bench/shared_decode.py URL MODEL [N] [MAX_TOKENS] [REPS]
"""
import json
import sys
import threading
import time
import urllib.request

url, model = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 8
max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 128
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
system = "You are a helpful assistant. Tool catalogue: " + " ".join(
    f"item{i} is a tool that does thing {i * 7 % 13}." for i in range(330))


def call(i, out):
    body = {"model": model, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"Question {i}: describe item{i * 3} in detail, step by step."}]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    out[i] = json.load(urllib.request.urlopen(req, timeout=600))["usage"]


call(10_000, {})  # caches the shared prompt
for rep in range(reps):
    out = {}
    threads = [threading.Thread(target=call, args=(i, out)) for i in range(n)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    gen = sum(u["completion_tokens"] for u in out.values())
    prompt = out[0]["prompt_tokens"]
    cached = out[0].get("prompt_tokens_details", {}).get("cached_tokens")
    print(f"rep {rep}: {n} calls, wall {wall:.2f} s, generated {gen} tokens, {gen / wall:.1f} tok/s"
          f" (prompt {prompt}, cached {cached})")
