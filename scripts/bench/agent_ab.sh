#!/usr/bin/env bash
# A/B of two agentkv binaries on the ReAct-shaped agent load (as agent_load.sh: 4 agents × 2
# tasks × 10 calls): both servers up at once, calls alternating between them (`bench agent
# --compare`), so per-call figures compare side by side (wall time does not: each server's calls
# wait on the other's). Writes the table to OUT (default bench-out/agent-ab/).
#
#   scripts/bench/agent_ab.sh AGENTKV_A AGENTKV_B [OUT]
#
# CONFIG_A / CONFIG_B: a YAML config for that server (e.g. the same binary twice, two settings).
set -euo pipefail
cd "$(dirname "$0")/../.."
a=${1:?binary A}; b=${2:?binary B}; out=${3:-bench-out/agent-ab}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=${THREADS:-2}
mkdir -p "$out"
wait_up() { for _ in $(seq 300); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }
echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"; echo "threads: $threads each"
"$a" serve --model "$model" --port 18911 --threads "$threads" ${CONFIG_A:+--config "$CONFIG_A"} \
  >"$out/a.log" 2>&1 &
pa=$!
"$b" serve --model "$model" --port 18912 --threads "$threads" ${CONFIG_B:+--config "$CONFIG_B"} \
  >"$out/b.log" 2>&1 &
pb=$!
trap 'kill $pa $pb 2>/dev/null || true' EXIT
wait_up http://127.0.0.1:18911; wait_up http://127.0.0.1:18912
"$a" bench agent --url http://127.0.0.1:18911 --compare http://127.0.0.1:18912 \
  --model SmolLM2-135M-Instruct.Q4_1 --workload react --agents 4 --tasks 2 --steps 10 \
  --observation-tokens 150..500 --output-tokens 48 --system-tokens 1200 --no-progress \
  --out "$out" >/dev/null
cat "$out/table.txt"
