#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (issue #13, must-have 7), keeping each
# target's corpus under fuzz/corpus/<target>/ (committed, grown by each run) and crashes under
# fuzz/artifacts/<target>/ (gitignored). Needs a nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`); the tokenizer and chat targets need the default model
# (`cargo run -p agentkv -- fetch-model`, or $AGENTKV_MODEL).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]      (default 60 s, every target)
#
# FUZZ_RUNS=N stops each target after N executions (whichever of time and runs comes first);
# FUZZ_SANITIZER=none|address (default address) is passed to `cargo fuzz run -s`.
#
# Prints each target's executions; exits non-zero if a target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(gguf_reader tier_object tokenizer_roundtrip chat_prompt structured_compile)
fi
command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz missing: cargo install cargo-fuzz" >&2; exit 1; }
export AGENTKV_MODEL="${AGENTKV_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
status=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  echo "== $t (${secs}s)"
  log="$(mktemp)"
  runs=()
  [ -n "${FUZZ_RUNS:-}" ] && runs=(-runs="$FUZZ_RUNS")
  if cargo +nightly fuzz run -s "${FUZZ_SANITIZER:-address}" "$t" "fuzz/corpus/$t" -- \
       -max_total_time="$secs" -max_len=65536 "${runs[@]}" \
       -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1; then
    grep -E "^(#[0-9]+\s+DONE|Done [0-9]+ runs)" "$log" | tail -2
  else
    status=1
    tail -40 "$log"
    echo "!! $t crashed; the input is under fuzz/artifacts/$t/" >&2
  fi
  rm -f "$log"
done
exit "$status"
