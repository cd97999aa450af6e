#!/usr/bin/env bash
# Hit rate without hints (issue #49): `cache-sim` on Mooncake's public FAST'25 traces (the
# conversation and synthetic traces; the tool-and-agent one is stored as a large file there) and
# on generated agent traces, for LRU, adaptive SLRU, the server's default (reuse-aware LRU +
# inferred conversations + the policy duel), the default with both options always on, the
# default with displacement by retention value (`--displace`, off by default), the
# sessions-known reference (conversations inferred over the whole trace, released at their last
# call: knows the future) and the offline optimum. One JSON line per run in OUT/raw.jsonl and a
# table on stdout.
#
#   scripts/bench/mooncake.sh AGENTKV_BINARY [TRACE_DIR] [OUT]
#
# TRACE_DIR holds conversation_trace.jsonl and synthetic_trace.jsonl (fetched from
# github.com/kvcache-ai/Mooncake, FAST25-release/traces/, Apache-2.0, when missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
agentkv=${1:?agentkv binary}; traces=${2:-bench-out/mooncake-traces}; out=${3:-bench-out/mooncake}
mkdir -p "$traces" "$out"
base=https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces
for t in conversation_trace synthetic_trace; do
  [ -s "$traces/$t.jsonl" ] || curl -sfL "$base/$t.jsonl" -o "$traces/$t.jsonl"
done
for k in react webshop swarm; do
  "$agentkv" trace-gen --kind $k --agents 16 --tasks 4 --seed 5 --out "$traces/gen-$k.jsonl"
done
: > "$out/raw.jsonl"
run() { # trace pool label args...
  local trace=$1 pool=$2 label=$3; shift 3
  "$agentkv" cache-sim --trace "$traces/$trace.jsonl" --capacity-blocks "$pool" "$@" \
    | python3 -c 'import json,sys; r=json.load(sys.stdin); r.update(trace=sys.argv[1], pool=int(sys.argv[2]), label=sys.argv[3]); print(json.dumps(r))' \
      "$trace" "$pool" "$label" >> "$out/raw.jsonl"
}
for tp in conversation_trace:5000 conversation_trace:20000 synthetic_trace:3000 synthetic_trace:10000 \
          gen-react:4786 gen-react:9572 gen-webshop:4992 gen-webshop:9984 gen-swarm:1970 gen-swarm:3940; do
  trace=${tp%%:*}; pool=${tp##*:}
  run "$trace" "$pool" lru --policy lru --retention none
  run "$trace" "$pool" adaptive-slru --policy adaptive-slru --retention none
  run "$trace" "$pool" default
  run "$trace" "$pool" no-duel --no-duel
  run "$trace" "$pool" displace --displace
  run "$trace" "$pool" sessions-known --policy lru --retention oracle --session-ttl-s 600
done
echo "== machine: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p')"
python3 - "$out/raw.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
labels = ["lru", "adaptive-slru", "default", "no-duel", "displace", "sessions-known"]
print("| trace | pool (blocks) | " + " | ".join(labels) + " | optimum |")
print("|---|---:|" + "---:|" * (len(labels) + 1))
keys = []
for r in rows:
    k = (r["trace"], r["pool"])
    if k not in keys:
        keys.append(k)
for k in keys:
    by = {r["label"]: r for r in rows if (r["trace"], r["pool"]) == k}
    cells = [f"{100 * by[l]['hit_rate']:.1f}%" for l in labels]
    print(f"| {k[0]} | {k[1]:,} | " + " | ".join(cells) + f" | {100 * by['lru']['optimum_hit_rate']:.1f}% |")
PY
