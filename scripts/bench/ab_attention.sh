#!/usr/bin/env bash
# A/B of two builds of the `attn_depth` example (one layer's attention at depth, the forward
# pass's own plan and kernels), interleaved (A B, B A, ...) so the machine's drift falls on both
# alike. Build each with `cargo build --release -p model --example attn_depth` at its commit and
# copy `target/release/examples/attn_depth` aside.
#
#   scripts/bench/ab_attention.sh ATTN_DEPTH_A ATTN_DEPTH_B [ROUNDS]
#
# Per codec (CODECS, default `k=int8,v=bf16 bf16`) and setting — one layer on one thread (the
# layer's K/V, 2.4 MB at depth 4096, stay in cache: the kernels' own speed) and 30 layers on two
# threads (K/V from memory, as a forward pass reads them) — it prints every run's microseconds
# per layer for a decode (one token) and a prefill of 64 tokens at depth DEPTH (default 4096),
# then the medians and B/A (and each side's fastest run: on a shared host, the least disturbed).
set -euo pipefail
a=${1:?attn_depth binary A}; b=${2:?attn_depth binary B}; rounds=${3:-8}; depth=${DEPTH:-4096}
codecs=(${CODECS:-k=int8,v=bf16 bf16})
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs"
out=$(mktemp)
for codec in "${codecs[@]}"; do
  for setting in "1 1 41" "30 2 9"; do
    read -r layers threads reps <<<"$setting"
    for ((i = 0; i < rounds; i++)); do
      if ((i % 2 == 0)); then order=("A:$a" "B:$b"); else order=("B:$b" "A:$a"); fi
      for tagged in "${order[@]}"; do
        tag=${tagged%%:*}; bin=${tagged#*:}
        for prefill in 1 64; do
          line=$(ATTN_LAYERS=$layers ATTN_THREADS=$threads "$bin" "$depth" "$prefill" "$reps" "$codec" | tail -1)
          step=$([ "$prefill" = 1 ] && echo decode || echo prefill)
          us=$(awk -v s="$step" '{for (i = 1; i <= NF; i++) if ($i == s) { print $(i + 3); exit }}' <<<"$line")
          echo "$codec ${layers}x${threads} $step $tag $us" | tee -a "$out"
        done
      done
    done
  done
done
python3 - "$out" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    codec, setting, step, tag, us = line.split()
    runs.setdefault((codec, setting, step), {}).setdefault(tag, []).append(float(us))
print("codec | layers x threads | step | A us/layer | B us/layer | B/A   (medians; min in brackets)")
for (codec, setting, step), t in runs.items():
    a, b = t["A"], t["B"]
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{codec} | {setting} | {step} | {ma:.1f} [{min(a):.1f}] | {mb:.1f} [{min(b):.1f}] | {mb / ma:.3f}")
PY
