#!/bin/bash
# Issue #16 must-have 6: `agentkv bench agent` through vllm-router 0.1.17 in front of two
# `agentkv serve` replicas (1 thread each) vs one server (2 threads, and 1 thread).
# Not in CI (a benchmark: run it on an idle machine, e.g. through a script that pauses other work).
# AGENTKV, VLLM_ROUTER, MODEL override the binary, the router (pip: vllm-router==0.1.17) and the model.
# Each configuration starts fresh servers (cold caches) and runs the same seeded agent load for
# DURATION_S seconds (calls in flight then finish); results go to OUTDIR/NAME.txt and OUTDIR/NAME/.
# usage: route.sh OUTDIR DURATION_S SEED ORDER...   (ORDER: single2 single1 kv_aware cache_aware cache_aware_b2 round_robin)
# cache_aware_b2: cache_aware with --balance-abs-threshold 2 (the default, 64 in-flight calls, never balances 8 agents)
OUT=$1; DUR=$2; SEED=$3; shift 3
B=${AGENTKV:-target/release/agentkv}
R=${VLLM_ROUTER:-.venv-routers/bin/vllm-router}
M=${MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}
M=$(realpath "$M"); B=$(realpath "$B"); R=$(realpath "$R")
mkdir -p $OUT; cd $OUT
ARGS="--model agentkv --workload react --agents 8 --tasks 20 --steps 6 --system-tokens 600 --observation-tokens 100..200 --output-tokens 16 --seed $SEED --max-duration-s $DUR --no-progress"
PIDS=()
cfg() { # name port threads events_port replay_port
  cat > $1.yaml <<Y
server: {model_name: agentkv, port: $2}
kv_cache_config: {block_size: 16}
kv_events: {endpoint: "tcp://127.0.0.1:$4", replay_endpoint: "tcp://127.0.0.1:$5"}
model: {threads: $3, path: $M}
Y
}
start() { # name port threads ev rp
  cfg "$@"; $B serve -c $1.yaml > $1.log 2>&1 & PIDS+=($!)
  for i in $(seq 100); do curl -sf http://127.0.0.1:$2/health >/dev/null && return; sleep 0.2; done; echo "server $1 did not start"
}
stop() { for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; wait "${PIDS[@]}" 2>/dev/null; PIDS=(); }
router() { # name args...
  n=$1; shift
  $R --host 127.0.0.1 --port 8320 --worker-urls http://127.0.0.1:8301 http://127.0.0.1:8302 --prometheus-port 8399 "$@" > router_$n.log 2>&1 & PIDS+=($!)
  for i in $(seq 100); do curl -sf http://127.0.0.1:8320/health >/dev/null && return; sleep 0.2; done; echo "router did not start"
}
bench() { # name url
  $B bench agent --url $2 $ARGS --out $1 > $1.txt 2>&1
  echo "== $1"; grep -E "calls ok|not run|TTFT p50|TTFT p95|calls/s|generated tok/s|prompt tokens|cached fraction" $1.txt
}
for c in "$@"; do
  case $c in
    single2) start s2 8303 2 5653 5753; bench single2 http://127.0.0.1:8303/v1 ;;
    single1) start s1 8303 1 5653 5753; bench single1 http://127.0.0.1:8303/v1 ;;
    round_robin|cache_aware|cache_aware_b2|kv_aware)
      start r1 8301 1 5651 5751; start r2 8302 1 5652 5752
      if [ $c = kv_aware ]; then
        router $c --policy kv_aware --kv-event-source http://127.0.0.1:8301=tcp://127.0.0.1:5651 --kv-event-source http://127.0.0.1:8302=tcp://127.0.0.1:5652 \
          --kv-event-replay-source http://127.0.0.1:8301=tcp://127.0.0.1:5751 --kv-event-replay-source http://127.0.0.1:8302=tcp://127.0.0.1:5752 \
          --kv-event-block-size 16 --kv-event-model agentkv
      elif [ $c = cache_aware_b2 ]; then router $c --policy cache_aware --balance-abs-threshold 2
      else router $c --policy $c; fi
      bench $c http://127.0.0.1:8320/v1
      for p in 8301 8302; do echo "replica $p: $(curl -s http://127.0.0.1:$p/metrics | grep -E '^vllm:(prompt_tokens_total|prefix_cache_hits_total)' | tr '\n' ' ')"; done ;;
  esac
  stop; sleep 1
done
