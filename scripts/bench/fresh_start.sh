#!/usr/bin/env bash
# A fresh server's start and first requests, two binaries alternating (A B, ROUNDS times): the
# time from launch to /health answering, the page faults the server takes while it serves its
# first 20 calls (4 ReAct agents x 5 calls, 1,200-token system prompt), and those calls' wall
# time and TTFT. Shows where the K/V pool's first touch is paid: at start (`KvRows` prefaults
# its buffers) or inside the first requests' steps.
#
#   scripts/bench/fresh_start.sh AGENTKV_A AGENTKV_B [ROUNDS] [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
a=${1:?binary A}; b=${2:?binary B}; rounds=${3:-3}; out=${4:-bench-out/fresh-start}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$out"
echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"; uname -r
one() { # label binary
  local dir=$out/$1 bin=$2
  mkdir -p "$dir"
  local t0 t1 pid f0 f1
  t0=$(date +%s.%N)
  "$bin" serve --model "$model" --port 18921 --threads 2 >"$dir/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do curl -sf http://127.0.0.1:18921/health >/dev/null && break; sleep 0.05; done
  t1=$(date +%s.%N)
  f0=$(awk '{print $10}' "/proc/$pid/stat")
  "$bin" bench agent --url http://127.0.0.1:18921 --model SmolLM2-135M-Instruct.Q4_1 \
    --workload react --agents 4 --tasks 1 --steps 5 --observation-tokens 150..500 \
    --output-tokens 48 --system-tokens 1200 --no-progress --out "$dir" >/dev/null
  f1=$(awk '{print $10}' "/proc/$pid/stat")
  kill $pid; wait $pid 2>/dev/null || true
  python3 - "$dir/results.json" "$1" "$t0" "$t1" "$f0" "$f1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["targets"][0]
print(f"{sys.argv[2]:10s} start {float(sys.argv[4]) - float(sys.argv[3]):.2f} s  "
      f"faults while serving {int(sys.argv[6]) - int(sys.argv[5])}  wall {r['wall_s']:.2f} s  "
      f"TTFT p50 {t['ttft_s']['p50']:.3f} s  p95 {t['ttft_s']['p95']:.3f} s")
PY
}
for ((i = 1; i <= rounds; i++)); do
  one "A-$i" "$a"
  one "B-$i" "$b"
done
