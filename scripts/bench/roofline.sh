#!/usr/bin/env bash
# The roofline of the model runtime (issue #48): for a prefill of 512 tokens and a decode of 128,
# from empty and at a cached depth of 4,096, the measured rate beside the bounds this machine
# allows — memory (bytes a decoded token reads ÷ the read bandwidth measured with the same
# threads, and the same for a working set of that size) and compute (the step's integer and f32
# operations ÷ the vector units' peak rates measured with the same threads), and what an empty
# call of the thread pool costs (on a shared host it tells which phase the run met). `bench-model
# --membw --roofline`, f16 KV unless KV_DTYPE says otherwise.
#
#   scripts/bench/roofline.sh AGENTKV_BINARY
set -euo pipefail
cd "$(dirname "$0")/../.."
agentkv=${1:?agentkv binary}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=${THREADS:-2}; kv=${KV_DTYPE:-f16}
echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"
echo "vector extensions: $(grep -o -w 'avx2\|avx512f\|avx512_vnni\|avx512_bf16\|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "threads: $threads, KV $kv"
for depth in 0 4096; do
  echo "== agentkv bench-model --depth $depth --membw --roofline"
  "$agentkv" bench-model --model "$model" --threads "$threads" --reps 5 --depth "$depth" \
    --kv-dtype "$kv" --membw --roofline 2>&1
done
