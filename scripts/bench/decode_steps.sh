#!/usr/bin/env bash
# What the engine's decode steps cost at depth (issue #48): N requests sharing a ~1,400-token
# system prompt, each with its own ~WORDS-word user message (depth ~3,400 tokens at the
# defaults), decode MAX_TOKENS tokens together (greedy, end-of-text tokens biased away so every
# request runs to MAX_TOKENS). The server runs with its step trace on; prints the median step
# time by the number of decodes in the step and the depths seen. Raw server log under OUT.
#
#   scripts/bench/decode_steps.sh AGENTKV_BINARY [OUT]
#
# N (default 4), WORDS (1500), MAX_TOKENS (200), THREADS (2); extra environment (for example
# AGENTKV_* switches) passes through to the server.
set -euo pipefail
cd "$(dirname "$0")/../.."
agentkv=${1:?agentkv binary}; out=${2:-bench-out/decode-steps}
n=${N:-4}; words=${WORDS:-1500}; max_tokens=${MAX_TOKENS:-200}; threads=${THREADS:-2}
mkdir -p "$out"
RUST_LOG=agentkv::step=trace,info AGENTKV_LOG_FORMAT=json "$agentkv" serve \
  --model models/SmolLM2-135M-Instruct.Q4_1.gguf --port 18931 --threads "$threads" \
  >"$out/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf http://127.0.0.1:18931/health >/dev/null && break; sleep 0.5; done
python3 - "$n" "$words" "$max_tokens" <<'PY'
import json, random, sys, threading, urllib.request
n, words, max_tokens = (int(a) for a in sys.argv[1:4])
rng = random.Random(1)
vocab = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega").split()
system = " ".join(rng.choice(vocab) for _ in range(1100))
users = [f"agent {i}: " + " ".join(rng.choice(vocab) for _ in range(words)) for i in range(n)]
def call(i):
    body = {"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": users[i]}],
            "logit_bias": {"0": -100, "1": -100, "2": -100}}
    req = urllib.request.Request("http://127.0.0.1:18931/v1/chat/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    usage = json.load(urllib.request.urlopen(req, timeout=600))["usage"]
    print(f"request {i}: prompt {usage['prompt_tokens']} tokens, generated {usage['completion_tokens']}")
threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
PY
kill $pid; wait $pid 2>/dev/null || true
python3 - "$out/server.log" <<'PY'
import collections, json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and '"agentkv::step"' in l]
by = collections.defaultdict(list)
for s in steps:
    if s["prefill_tokens"] == 0:
        by[s["decodes"]].append(s)
for k, v in sorted(by.items()):
    print(f"{k} decodes: {len(v):4} steps, median {statistics.median(s['took_us'] for s in v) / 1e3:.2f} ms,"
          f" deepest position {min(s['max_depth'] for s in v)}-{max(s['max_depth'] for s in v)}")
PY
