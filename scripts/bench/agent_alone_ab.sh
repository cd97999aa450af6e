#!/usr/bin/env bash
# Two agentkv binaries on row 1's agent load (agent_load.sh: 4 agents x 2 tasks x 10 calls), each
# server alone and fresh, in the order A B B A, so a slow phase of the machine falls on both;
# prints each run's table and a summary of wall time and call latency. Writes under OUT (default
# bench-out/agent-alone-ab/).
#
# CONFIG_A / CONFIG_B name a YAML config for each side's server (the defaults otherwise), so one
# binary can be run against itself with two settings.
#
#   scripts/bench/agent_alone_ab.sh AGENTKV_A AGENTKV_B [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
a=${1:?binary A}; b=${2:?binary B}; out=${3:-bench-out/agent-alone-ab}
mkdir -p "$out"
i=0
for which in A B B A; do
  i=$((i + 1))
  bin=$a; config=${CONFIG_A:-}
  [ "$which" = B ] && { bin=$b; config=${CONFIG_B:-}; }
  echo "== run $i: $which"
  AGENTKV_CONFIG=$config scripts/bench/agent_load.sh "$bin" "" "$out/run$i-$which" |
    sed -n '/== agentkv/,$p'
done
echo "== summary (wall s, call latency mean / p95 ms)"
for d in "$out"/run*; do
  python3 - "$d/agentkv/results.json" "$(basename "$d")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[2], "wall", round(r["wall_s"], 1))
PY
  grep -E "call latency (mean|p95)" "$d/agentkv/table.txt" | sed "s/^/  /"
done
