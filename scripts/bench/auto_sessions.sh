#!/usr/bin/env bash
# Retention without hints on a live server (issue #49): the ReAct-shaped agent load with more
# agents than the pool holds (its working set ~4x the pool), run three times against a fresh
# agentkv each time:
#   hints    - the default server, clients name their sessions (`prompt_cache_key`);
#   no-hints - the default server, clients send nothing (conversations inferred);
#   lru      - plain LRU: replacement_policy lru, no inferred conversations, no tool pauses,
#              clients send nothing (what a server without agent-aware retention does).
# Prints cached share, TTFT p50/p95 and wall per run; raw results under OUT.
#
#   scripts/bench/auto_sessions.sh AGENTKV_BINARY [OUT]
#
# AGENTS, STEPS, OBS (observation tokens LO..HI), TOOL_MS (tool latency LO..HI ms) and
# POOL_BLOCKS shape the load; the defaults pause agents long enough that most are waiting for a
# tool at any time (the case retention is for) and size the pool to a quarter of the agents'
# contexts.
set -euo pipefail
cd "$(dirname "$0")/../.."
agentkv=${1:?agentkv binary}; out=${2:-bench-out/auto-sessions}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
agents=${AGENTS:-12}; steps=${STEPS:-6}; obs=${OBS:-150..300}; tool_ms=${TOOL_MS:-8000..16000}
# SmolLM2-135M f16 KV: 368,640 bytes per 16-token block.
pool_blocks=${POOL_BLOCKS:-360}
mkdir -p "$out"
load=(--workload react --agents "$agents" --tasks 2 --steps "$steps" --observation-tokens "$obs"
      --tool-latency-ms "$tool_ms" --output-tokens 48 --system-tokens 1200 --no-progress)

wait_up() { for _ in $(seq 300); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }

run_one() { # name config-extra client-extra...
  local name=$1 extra=$2; shift 2
  printf 'kv_cache_config: {max_size: %d%s}\nmodel: {threads: 2}\n' \
    "$((pool_blocks * 368640))" "$extra" > "$out/$name.yaml"
  "$agentkv" serve --model "$model" --port 18911 --config "$out/$name.yaml" >"$out/$name.log" 2>&1 &
  local pid=$!
  wait_up http://127.0.0.1:18911
  "$agentkv" bench agent --url http://127.0.0.1:18911 --model SmolLM2-135M-Instruct.Q4_1 \
    "${load[@]}" "$@" --out "$out/$name" >/dev/null
  curl -s http://127.0.0.1:18911/metrics | grep -E '^agentkv_(inferred|kv_reuse|tool_pause)' \
    > "$out/$name/metrics.txt" || true
  kill $pid; wait $pid 2>/dev/null || true
  python3 - "$name" "$out/$name/results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2])); t = r["targets"][0]
print(f"{sys.argv[1]:9s} cached {100*t['cached_fraction']:5.1f}%  TTFT p50 {t['ttft_s']['p50']:.2f} s"
      f"  p95 {t['ttft_s']['p95']:.2f} s  wall {r['wall_s']:.1f} s  calls ok {t['calls_ok']}")
PY
}

echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"
echo "== agents $agents, steps $steps, observations $obs tokens, tools $tool_ms ms, pool $pool_blocks blocks ($((pool_blocks * 16)) tokens)"
run_one hints "" --session-keys
run_one no-hints ""
run_one lru ", replacement_policy: lru, infer_conversations: false, tool_pause_retention: false"
