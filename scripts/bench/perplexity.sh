#!/usr/bin/env bash
# Perplexity of the default model on the reference corpus (llama.cpp's `llama-perplexity -c 512`
# method; its own figure, 15.5130 with an f16 cache, is in crates/model/tests/data/REFERENCE.md)
# and on the held-out text, with the f16 cache and the quantized KV codecs worth choosing.
#
#   scripts/bench/perplexity.sh AGENTKV_BINARY
set -euo pipefail
cd "$(dirname "$0")/../.."
agentkv=${1:?agentkv binary}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"
for text in crates/model/tests/data/corpus.txt crates/model/tests/data/heldout_kvc.txt; do
  for codec in f16 bf16 int8 k=int8,v=bf16 k=int4c,v=int4 int4; do
    echo "== $text kv=$codec"
    "$agentkv" perplexity --model "$model" -f "$text" --kv-dtype "$codec" 2>&1 | tail -1
  done
done
