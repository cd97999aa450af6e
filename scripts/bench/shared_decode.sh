#!/usr/bin/env bash
# Decodes behind one long shared prompt (shared_decode.py: N concurrent calls, the same ~4,300-
# token system prompt, different questions) for two agentkv binaries, each server alone and
# fresh, in the order A B B A.
#
#   scripts/bench/shared_decode.sh AGENTKV_A AGENTKV_B [N] [MAX_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/../.."
a=${1:?binary A}; b=${2:?binary B}; n=${3:-8}; max_tokens=${4:-128}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=${THREADS:-2}
wait_up() { for _ in $(seq 300); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }
echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"; echo "threads: $threads; $n calls, $max_tokens tokens each"
for which in A B B A; do
  bin=$a; [ "$which" = B ] && bin=$b
  "$bin" serve --model "$model" --port 18941 --threads "$threads" >/dev/null 2>&1 &
  pid=$!
  wait_up http://127.0.0.1:18941
  echo "== $which ($bin)"
  python3 scripts/bench/shared_decode.py http://127.0.0.1:18941 SmolLM2-135M-Instruct.Q4_1 "$n" "$max_tokens" 3
  kill $pid; wait $pid 2>/dev/null || true
done
