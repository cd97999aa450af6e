#!/usr/bin/env bash
# A/B of two agentkv binaries on `bench-model`, interleaved (A B, B A, ...) so slow drift of the
# machine falls on both alike. Prints each run's JSON line tagged with its binary, then the
# medians per depth.
#
#   scripts/bench/ab_model.sh BINARY_A BINARY_B [ROUNDS] [DEPTHS...]
#
# Defaults: 6 rounds, depths 0 and 4096 (512 prompt tokens, 128 generated, 3 repetitions per
# run, all cores); KV_DTYPE=CODEC measures another KV codec than f16, and KV_DTYPE_B=CODEC
# another codec for B than for A (then the same binary twice compares two codecs).
set -euo pipefail
a=${1:?binary A}; b=${2:?binary B}; rounds=${3:-6}; shift 3 || shift $#
depths=("$@"); [ ${#depths[@]} -gt 0 ] || depths=(0 4096)
out=$(mktemp)
for depth in "${depths[@]}"; do
  for ((i = 0; i < rounds; i++)); do
    if ((i % 2 == 0)); then order=("A:$a" "B:$b"); else order=("B:$b" "A:$a"); fi
    for tagged in "${order[@]}"; do
      tag=${tagged%%:*}; bin=${tagged#*:}
      codec=${KV_DTYPE:-f16}; [ "$tag" = B ] && codec=${KV_DTYPE_B:-$codec}
      line=$("$bin" bench-model --reps 3 --depth "$depth" --kv-dtype "$codec" 2>/dev/null | grep '^{')
      echo "$tag $line" | tee -a "$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    tag, js = line.split(" ", 1)
    r = json.loads(js)
    rows.setdefault((r["depth"], tag), []).append(r)
print("depth | A prefill | B prefill | B/A | A decode | B decode | B/A   (tok/s, medians)")
for depth in sorted({d for d, _ in rows}):
    a, b = rows[(depth, "A")], rows[(depth, "B")]
    med = lambda rs, k: statistics.median(x[k] for x in rs)
    pa, pb = med(a, "prefill_tok_s"), med(b, "prefill_tok_s")
    da, db = med(a, "decode_tok_s"), med(b, "decode_tok_s")
    print(f"{depth} | {pa:.1f} | {pb:.1f} | {pb/pa:.3f} | {da:.1f} | {db:.1f} | {db/da:.3f}")
PY
rm -f "$out"
