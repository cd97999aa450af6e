#!/usr/bin/env bash
# BFCL (Berkeley Function Calling Leaderboard) FC-mode run against agentkv and llama-server,
# both serving the same GGUF, plus BFCL's AST evaluation and scripts/bench/bfcl/classify.py.
# Manual tool: not used by CI and not called from scripts/test.sh.
#
# Usage:
#   scripts/bench/bfcl/run.sh AGENTKV_BIN LLAMA_SERVER_BIN MODEL_GGUF [WORK_DIR]
#
#   AGENTKV_BIN       e.g. target/debug/agentkv
#   LLAMA_SERVER_BIN  a CPU llama-server; how s26 built it (outside this repo):
#                       pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
#                       (or fetch the sdist from PyPI directly; sha256 832db069...c1a2e)
#                       tar xzf llama_cpp_python-0.3.36.tar.gz; cd llama_cpp_python-0.3.36/vendor/llama.cpp
#                       cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_AMX=OFF -DGGML_NATIVE=ON \
#                         -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
#                         -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_COMMIT=0c1e57098
#                       cmake --build build --target llama-server -j2
#   MODEL_GGUF        e.g. models/SmolLM2-135M-Instruct.Q4_1.gguf
#   WORK_DIR          default bench-out/bfcl (gitignored: results, scores, logs, report.txt)
#
# Environment:
#   N_PER_CAT=50      first N ids of each category (same ids for both servers); "all" = full set
#   BFCL_VENV=bench-out/bfcl-venv   created with bfcl-eval==$BFCL_VERSION if missing
#   BFCL_VERSION=2026.3.23
#   SERVERS=""       only re-classify the runs under WORK_DIR and rewrite report.txt
#   THREADS=2  PORT_BASE=18200  NICE=10   SERVERS="agentkv llama-server"
#   LLAMA_N_PREDICT=1024  llama-server -n: BFCL sends no output cap; agentkv's default cap is
#                     limits.default_max_tokens = 1024, llama-server's is none (it can run to -c)
#   LLAMA_CPP_VERSION="llama-cpp-python 0.3.36 sdist, llama.cpp 0c1e57098"  (for the report)
#
# How BFCL is pointed at the servers: the registry entry gpt-4o-2024-11-20-FC (OpenAI FC
# handler, OpenAIResponsesHandler) reads OPENAI_BASE_URL / OPENAI_API_KEY and POSTs
# {model: "gpt-4o-2024-11-20", input, tools, temperature: 0.001, store: false} to
# $OPENAI_BASE_URL/responses. Each server's BFCL_PROJECT_ROOT is WORK_DIR/<server>; BFCL
# writes result/gpt-4o-2024-11-20-FC/non_live/*_result.json and score/... there. A small
# recording proxy between BFCL and the server keeps every raw HTTP exchange in
# WORK_DIR/<server>/raw.jsonl (classify.py uses it for detail only).
#
# agentkv runs with server: {unknown_fields: reject} (its default). If that run has HTTP 400s
# naming unknown fields, a second, separately labelled run "agentkv-ignore-unknown" is made
# with unknown_fields: ignore.
set -euo pipefail

AGENTKV_BIN=$(readlink -f "${1:?usage: run.sh AGENTKV_BIN LLAMA_SERVER_BIN MODEL_GGUF [WORK_DIR]}")
LLAMA_BIN=$(readlink -f "${2:?llama-server binary}")
MODEL=$(readlink -f "${3:?model gguf}")
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
WORK=$(mkdir -p "${4:-$REPO/bench-out/bfcl}" && cd "${4:-$REPO/bench-out/bfcl}" && pwd)
N_PER_CAT=${N_PER_CAT:-50}
BFCL_VENV=${BFCL_VENV:-$REPO/bench-out/bfcl-venv}
BFCL_VERSION=${BFCL_VERSION:-2026.3.23}
THREADS=${THREADS:-2}
PORT_BASE=${PORT_BASE:-18200}
NICE=${NICE:-10}
SERVERS=${SERVERS-"agentkv llama-server"}
LLAMA_N_PREDICT=${LLAMA_N_PREDICT:-1024}
LLAMA_CPP_VERSION=${LLAMA_CPP_VERSION:-"llama-cpp-python 0.3.36 sdist, vendored llama.cpp 0c1e57098 (CHANGELOG)"}
BFCL_MODEL=gpt-4o-2024-11-20-FC
SENT_MODEL=gpt-4o-2024-11-20
CATS=simple_python,multiple,parallel,parallel_multiple,irrelevance

mkdir -p "$WORK"
PY=$BFCL_VENV/bin/python
if [ ! -x "$BFCL_VENV/bin/bfcl" ]; then
  python3 -m venv "$BFCL_VENV"
  # soundfile: imported by qwen_agent, which bfcl-eval imports but does not declare
  nice -n "$NICE" "$BFCL_VENV/bin/pip" install "bfcl-eval==$BFCL_VERSION" jsonschema soundfile
fi

# --- recording proxy (stdlib only) -------------------------------------------------------
cat > "$WORK/record_proxy.py" <<'EOF'
import json, sys, threading, time, urllib.request, urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, upstream, log_path = int(sys.argv[1]), sys.argv[2].rstrip("/"), sys.argv[3]
lock, seq = threading.Lock(), [0]
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def _go(self):
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else None
        hdrs = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization", "accept")}
        t0 = time.time()
        try:
            r = urllib.request.urlopen(urllib.request.Request(upstream + self.path, data=body, headers=hdrs, method=self.command), timeout=900)
            status, data, ctype = r.status, r.read(), r.headers.get("content-type", "application/json")
        except urllib.error.HTTPError as e:
            status, data, ctype = e.code, e.read(), e.headers.get("content-type", "application/json")
        except Exception as e:
            status, data, ctype = 502, json.dumps({"proxy_error": repr(e)}).encode(), "application/json"
        dt = time.time() - t0
        def parse(b):
            try: return json.loads(b)
            except Exception: return b.decode("utf-8", "replace") if b else None
        with lock:
            seq[0] += 1
            with open(log_path, "a") as f:
                f.write(json.dumps({"seq": seq[0], "t": t0, "latency_s": round(dt, 3), "method": self.command,
                                    "path": self.path, "request": parse(body), "status": status,
                                    "response": parse(data)}) + "\n")
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    do_GET = do_POST = do_DELETE = _go
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
EOF

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_http() { # url timeout_s
  for _ in $(seq 1 "$2"); do curl -sf -o /dev/null "$1" && return 0; sleep 1; done
  echo "timeout waiting for $1" >&2; return 1
}

write_ids() { # root
  "$PY" - "$1" "$N_PER_CAT" "$CATS" <<'EOF'
import json, sys, bfcl_eval
from pathlib import Path
root, n, cats = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
data = Path(bfcl_eval.__file__).parent / "data"
ids = {}
for c in cats:
    all_ids = [json.loads(l)["id"] for l in open(data / f"BFCL_v4_{c}.json")]
    ids[c] = all_ids if n == "all" else all_ids[: int(n)]   # dataset order = BFCL's id order
json.dump(ids, open(Path(root) / "test_case_ids_to_generate.json", "w"), indent=1)
print(" ".join(f"{c}={len(v)}" for c, v in ids.items()))
EOF
}

run_one() { # label port
  local label=$1 port=$2 root="$WORK/$1" pport=$(( $2 + 50 ))
  rm -rf "$root"; mkdir -p "$root"
  echo "== $label: ids $(write_ids "$root")"
  case $label in
    agentkv|agentkv-ignore-unknown)
      local uf=reject; [ "$label" = agentkv-ignore-unknown ] && uf=ignore
      cat > "$root/agentkv.yaml" <<EOF
server: {model_name: agentkv-bfcl, model_aliases: [$SENT_MODEL], unknown_fields: $uf}
model: {threads: $THREADS}
EOF
      nice -n "$NICE" "$AGENTKV_BIN" serve --port "$port" --config "$root/agentkv.yaml" --model "$MODEL" \
        > "$root/server.stdout" 2> "$root/server.stderr" &
      PIDS+=($!); local spid=$!
      for _ in $(seq 1 120); do grep -q "listening on http" "$root/server.stdout" 2>/dev/null && break; sleep 1; done
      grep -q "listening on http" "$root/server.stdout" ;;
    llama-server)
      nice -n "$NICE" "$LLAMA_BIN" -m "$MODEL" --jinja --port "$port" -t "$THREADS" -c 8192 -n "$LLAMA_N_PREDICT" --alias "$SENT_MODEL" \
        > "$root/server.stdout" 2> "$root/server.stderr" &
      PIDS+=($!); local spid=$!
      wait_http "http://127.0.0.1:$port/health" 180 ;;
  esac
  "$PY" "$WORK/record_proxy.py" "$pport" "http://127.0.0.1:$port" "$root/raw.jsonl" &
  PIDS+=($!); local ppid=$!
  sleep 1
  local t0=$(date +%s)
  local bin=$LLAMA_BIN; [[ $label == agentkv* ]] && bin=$AGENTKV_BIN
  local binfo="server binary at start: $bin sha256 $(sha256sum "$bin" | cut -c1-16)... mtime $(date -u -r "$bin" +%FT%TZ); load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  ( export BFCL_PROJECT_ROOT=$root OPENAI_BASE_URL=http://127.0.0.1:$pport/v1 OPENAI_API_KEY=sk-bfcl-local
    cd "$root" && "$BFCL_VENV/bin/bfcl" generate --model "$BFCL_MODEL" --run-ids --num-threads 1 \
      --include-input-log > "$root/generate.log" 2>&1 )
  local t1=$(date +%s)
  kill "$spid" "$ppid" 2>/dev/null || true; wait "$spid" "$ppid" 2>/dev/null || true
  ( export BFCL_PROJECT_ROOT=$root OPENAI_API_KEY=sk-bfcl-local
    cd "$root" && "$BFCL_VENV/bin/bfcl" evaluate --model "$BFCL_MODEL" --test-category "$CATS" \
      --partial-eval > "$root/evaluate.log" 2>&1 )
  local nq; nq=$(cat "$root"/result/$BFCL_MODEL/non_live/*_result.json | wc -l)
  echo "$label generate: $((t1 - t0)) s for $nq questions ($(awk -v a=$((t1 - t0)) -v b="$nq" 'BEGIN{printf "%.2f", a/b}') s/question)" \
    | tee "$root/timing.txt"
  { echo "run started $(date -u -d @"$t0" +%FT%TZ), generate took $((t1 - t0)) s"
    echo "agentkv git HEAD at run time: $(git -C "$REPO" rev-parse HEAD)"
    echo "$binfo; load at end: $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$root/run-info.txt"
}

i=0
for s in $SERVERS; do run_one "$s" $((PORT_BASE + i)); i=$((i + 1)); done
if [[ " $SERVERS " == *" agentkv "* ]] && grep -qiE '"status": 400.*unknown|unknown field' "$WORK/agentkv/raw.jsonl" 2>/dev/null; then
  echo "agentkv rejected unknown fields: second run with unknown_fields: ignore"
  run_one agentkv-ignore-unknown $((PORT_BASE + i))
fi

# --- report ------------------------------------------------------------------------------
REPORT=$WORK/report.txt
{
  echo "BFCL FC-mode run (s26): agentkv vs llama-server, same GGUF"
  echo "date: $(date -u +%FT%TZ)"
  echo "model file: $MODEL ($(sha256sum "$MODEL" | cut -c1-16)...)"
  echo "bfcl-eval: $("$PY" -c 'import importlib.metadata as m; print(m.version("bfcl-eval"))')  (registry entry $BFCL_MODEL, OpenAIResponsesHandler -> POST /v1/responses, model=\"$SENT_MODEL\", temperature 0.001, --num-threads 1)"
  echo "llama.cpp: $LLAMA_CPP_VERSION; binary $LLAMA_BIN: $("$LLAMA_BIN" --version 2>&1 | grep -iE 'version|built' | tr '\n' ' ')"
  echo "llama-server flags: -m MODEL --jinja -t $THREADS -c 8192 -n $LLAMA_N_PREDICT --alias $SENT_MODEL"
  echo "agentkv: git $(git -C "$REPO" rev-parse HEAD)$(git -C "$REPO" diff --quiet HEAD -- crates 2>/dev/null || echo ' (+uncommitted changes under crates/)'); binary $AGENTKV_BIN (at report time: mtime $(date -u -r "$AGENTKV_BIN" +%FT%TZ), sha256 $(sha256sum "$AGENTKV_BIN" | cut -c1-16)...; at run time: see each run's "server binary at start"); config: server: {model_name: agentkv-bfcl, model_aliases: [$SENT_MODEL], unknown_fields: reject}, model: {threads: $THREADS}"
  echo "questions: N_PER_CAT=$N_PER_CAT (first N ids of each category in BFCL's order, same ids for every server)"
  echo "categories: $CATS"
  echo
  echo "machine (lscpu | head -20):"; lscpu | head -20
  for d in "$WORK"/*/; do
    label=$(basename "$d"); [ -f "$d/timing.txt" ] || continue
    "$PY" "$HERE/classify.py" --bfcl-root "$d" --label "$label" --raw-log "$d/raw.jsonl" \
      --json "$d/classify.json" > "$d/classify.txt"
    echo; echo "################ $label ################"
    cat "$d/timing.txt" "$d/run-info.txt" 2>/dev/null
    echo "-- BFCL score files (header line of each score/$BFCL_MODEL/non_live/*_score.json):"
    for c in ${CATS//,/ }; do printf '  %-18s %s\n' "$c" "$(head -n 1 "$d/score/$BFCL_MODEL/non_live/BFCL_v4_${c}_score.json")"; done
    echo "-- BFCL score/data_non_live.csv:"
    "$PY" -c 'import csv,sys; rows=list(csv.reader(open(sys.argv[1]))); [print("  "+" | ".join(r)) for r in rows]' "$d/score/data_non_live.csv"
    echo "-- BFCL score/data_overall.csv (selected columns):"
    "$PY" -c 'import csv,sys
rows=list(csv.DictReader(open(sys.argv[1])))
cols=["Model","Overall Acc","Non-Live AST Acc","Irrelevance Detection","Latency Mean (s)"]
for r in rows: print("  "+" | ".join(f"{c}={r.get(c)}" for c in cols))' "$d/score/data_overall.csv"
    echo; cat "$d/classify.txt"
  done
} > "$REPORT"
echo "report: $REPORT"
