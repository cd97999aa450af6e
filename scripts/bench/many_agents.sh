#!/usr/bin/env bash
# Many agents at once (issue #48): the ReAct-shaped load (1,200-token system prompt, 150-500-token
# observations, 48 tokens out, greedy, closed loop) at each agent count of AGENTS, against
# agentkv with its KV pool sized to a quarter of the load's working set and a RAM tier below it,
# llama.cpp's llama-server when LLAMA_SERVER names its binary (one slot per agent, each with an
# agent's whole context; built as agent_load.sh says), and, when VLLM_START is given, vLLM's CPU
# build (see agent_load.sh). Each server alone and
# fresh, one after the other. Prints per server and agent count: wall, call latency p50/p95/p99,
# TTFT p50/p95, cached share; raw results under OUT.
#
#   scripts/bench/many_agents.sh AGENTKV_BINARY [OUT]
#
# AGENTS (default "4 16"), TASKS (default 1) and STEPS (default 10) shape the load;
# LLAMA_MAX_S and VLLM_MAX_S stop starting calls against that peer after so many seconds (its
# calls in flight finish; the report counts the rest as not run), for agent counts where a peer
# would take hours. The working
# set is taken as AGENTS x 5,400 tokens (an agent's context after 10 steps); the pool is a
# quarter of it in 16-token f16 blocks of SmolLM2-135M (368,640 bytes each).
set -euo pipefail
cd "$(dirname "$0")/../.."
agentkv=${1:?agentkv binary}; out=${2:-bench-out/many-agents}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=${THREADS:-2}; agent_counts=${AGENTS:-4 16}; tasks=${TASKS:-1}; steps=${STEPS:-10}
mkdir -p "$out"
wait_up() { for _ in $(seq 1200); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }

report() { # name results.json
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[2])); t = r["targets"][0]
e, f = t["e2e_s"], t["ttft_s"]
print(f"{sys.argv[1]:22s} wall {r['wall_s']:7.1f} s  call p50 {e['p50']:6.2f} p95 {e['p95']:6.2f} p99 {e['p99']:6.2f} s"
      f"  TTFT p50 {f['p50']:5.2f} p95 {f['p95']:5.2f} s  cached {100 * t['cached_fraction']:5.1f}%"
      f"  calls ok {t['calls_ok']}/{t['calls_ok'] + t['calls_failed'] + t['calls_skipped'] + t['calls_not_run']}")
PY
}

run_load() { # name url model agents [max seconds]
  "$agentkv" bench agent --url "$2" --model "$3" --workload react --agents "$4" --tasks "$tasks" \
    ${5:+--max-duration-s "$5"} \
    --steps "$steps" --observation-tokens 150..500 --output-tokens 48 --system-tokens 1200 \
    --no-progress --out "$out/$1" >/dev/null 2>"$out/$1.bench.log"
  report "$1" "$out/$1/results.json"
}

echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"; echo "threads: $threads; tasks $tasks x steps $steps per agent"
for n in $agent_counts; do
  pool_blocks=$(( (n * 5400 / 4 + 15) / 16 ))
  printf 'kv_cache_config: {max_size: %d}\ntiers:\n  - {kind: ram, max_size: 4GB}\n' \
    "$((pool_blocks * 368640))" > "$out/agentkv-$n.yaml"
  echo "== $n agents (agentkv pool $pool_blocks blocks = a quarter of ~$((n * 5400)) tokens, RAM tier below)"
  "$agentkv" serve --model "$model" --port 18921 --threads "$threads" --config "$out/agentkv-$n.yaml" \
    >"$out/agentkv-$n.log" 2>&1 &
  pid=$!
  wait_up http://127.0.0.1:18921
  run_load "agentkv-$n" http://127.0.0.1:18921 SmolLM2-135M-Instruct.Q4_1 "$n"
  kill $pid; wait $pid 2>/dev/null || true
  if [ -n "${LLAMA_SERVER:-}" ]; then
    # One slot per agent, each with room for an agent's whole context (~5,400 tokens).
    "$LLAMA_SERVER" -m "$model" -t "$threads" -np "$n" -c $((n * 6144)) --port 18922 \
      >"$out/llama-server-$n.log" 2>&1 &
    lpid=$!
    wait_up http://127.0.0.1:18922
    run_load "llama-server-$n" http://127.0.0.1:18922 SmolLM2-135M-Instruct.Q4_1 "$n" "${LLAMA_MAX_S:-}"
    kill $lpid; wait $lpid 2>/dev/null || true
  fi
  if [ -n "${VLLM_START:-}" ]; then
    setsid bash -c "$VLLM_START" >"$out/vllm-$n.log" 2>&1 &
    vpid=$!
    wait_up http://127.0.0.1:18903
    run_load "vllm-$n" http://127.0.0.1:18903 "${VLLM_MODEL:-smollm2}" "$n" "${VLLM_MAX_S:-}"
    kill -- -$vpid 2>/dev/null || true; wait $vpid 2>/dev/null || true
    sleep 2
  fi
done
