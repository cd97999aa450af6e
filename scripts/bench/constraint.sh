#!/usr/bin/env bash
# Constrained-decoding cost per token (JSON schema, tool-call grammars) against the decode step,
# and the compile time per request.
#
#   scripts/bench/constraint.sh AGENTKV_BINARY
set -euo pipefail
cd "$(dirname "$0")/../.."
agentkv=${1:?agentkv binary}
echo "== machine"; lscpu | grep -E "Model name|^CPU\(s\)"
"$agentkv" bench-constraint --threads "${THREADS:-2}" --reps 20 --gen-tokens 64
