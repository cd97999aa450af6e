#!/usr/bin/env bash
# The device check of issue #47, for a machine with an NVIDIA GPU and no Rust toolchain: build
# here and strip the binary (its line tables take it past what a device call can carry):
#   cargo build --release -p agentkv && mkdir -p .device && strip -o .device/agentkv target/release/agentkv
# carry .device there (ignored: `echo /.device/ >> .git/info/exclude`), and run
#   scripts/gpu/check.sh .device/agentkv OUT_DIR
# It records the device and driver (nvidia-smi), finds NVRTC and cuBLAS (the CUDA toolkit's or a
# pip wheel's, e.g. PyTorch's), and runs `agentkv gpu-check`: every CUDA kernel and the cuBLAS
# product against a CPU computation, their timings, and the forward pass on the GPU against the
# CPU backend for every architecture fixture of crates/model/tests/data/arch (they travel with
# the working tree), a random-weight model of SmolLM2-135M's exact shape that agentkv builds
# itself (the real 98 MB file does not fit a call), and every GGUF under models/ that was
# carried. Raw output:
# OUT_DIR/gpu-check.txt (commit it beside the other raw reports, under docs/reports/). Exits non-zero when a check fails.
# A few minutes of device time (most of it the CPU side of the comparisons).
set -uo pipefail
BIN="${1:?usage: scripts/gpu/check.sh AGENTKV_BINARY OUT_DIR}"
OUT_DIR="${2:?usage: scripts/gpu/check.sh AGENTKV_BINARY OUT_DIR}"
mkdir -p "$OUT_DIR"
REPORT="$OUT_DIR/gpu-check.txt"

find_lib() { # NAME: the first match under the usual CUDA and Python locations
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
  dirs+=($(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null))
  for d in "${dirs[@]}"; do
    [ -d "$d" ] || continue
    local hit
    hit=$(find "$d" -maxdepth 5 -name "$1" 2>/dev/null | sort | tail -1)
    [ -n "$hit" ] && { echo "$hit"; return; }
  done
}

{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm)"
  echo "== nvidia-smi"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1
  : "${AGENTKV_LIBNVRTC:=$(find_lib 'libnvrtc.so.1[0-9]*' | grep -v builtins)}"
  : "${AGENTKV_LIBCUBLAS:=$(find_lib 'libcublas.so.1[0-9]*')}"
  export AGENTKV_LIBNVRTC AGENTKV_LIBCUBLAS
  # cuBLAS loads cuBLASLt from its own directory.
  export LD_LIBRARY_PATH="$(dirname "${AGENTKV_LIBCUBLAS:-/nonexistent}"):${LD_LIBRARY_PATH:-}"
  echo "== libraries: nvrtc=${AGENTKV_LIBNVRTC:-?} cublas=${AGENTKV_LIBCUBLAS:-?}"
  echo "== agentkv gpu-check"
  models=()
  for m in crates/model/tests/data/arch/*.gguf models/*.gguf; do
    [ -f "$m" ] && models+=(--model "$m")
  done
  RUST_BACKTRACE=0 "$BIN" gpu-check --threads "$(nproc)" --synthetic-smollm2 "${models[@]}" 2>&1
  echo "exit status $?"
} | tee "$REPORT"
grep -q '^exit status 0$' "$REPORT"
