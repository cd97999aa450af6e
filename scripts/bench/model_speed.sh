#!/usr/bin/env bash
# Prefill (512 tokens) and decode (128 tokens) speed of the model runtime from empty and at a
# cached depth of 4,096 tokens: agentkv `bench-model` (f16 KV, 5 repetitions, median) and, when
# given, llama.cpp's `llama-bench` on the same model and threads.
#
#   scripts/bench/model_speed.sh AGENTKV_BINARY [LLAMA_BENCH_BINARY]
set -euo pipefail
cd "$(dirname "$0")/../.."
agentkv=${1:?agentkv binary}; llama=${2:-}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=${THREADS:-2}
echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"; echo "threads: $threads"
for depth in 0 4096; do
  echo "== agentkv bench-model --depth $depth"
  "$agentkv" bench-model --model "$model" --threads "$threads" --reps 5 --depth "$depth" 2>&1 | grep -v '^{'
done
if [ -n "$llama" ]; then
  echo "== llama-bench"
  "$llama" -m "$model" -t "$threads" -p 512 -n 128 -d 0,4096 -fa 1 -r 5
fi
