#!/usr/bin/env bash
# The one command that installs what the checks need and runs every one of them:
# format, lint, types, tests. CI (.ci/run) calls exactly this; so can you: `bash tests/check.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

export LITELLM_LOCAL_MODEL_COST_MAP=True  # litellm must never fetch its price map from the network
export PIP_DISABLE_PIP_VERSION_CHECK=1

step() { printf '\n== %s\n' "$*"; }

step "python environment (.venv)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install --quiet -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c 'import gateway.cli, litellm, openai' >/dev/null

step "system tools: promtool and chromium (spend tests), redis-server (replica tests start their own)"
if ! command -v promtool >/dev/null || ! command -v chromium >/dev/null || ! command -v redis-server >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus chromium redis-server >/dev/null
fi

step "PostgreSQL on 127.0.0.1:5432 (ledger tests; installed and started only where none answers)"
GATEWAY_TEST_POSTGRES="$(bash tests/setup_postgres.sh)"
export GATEWAY_TEST_POSTGRES

step "real llama.cpp upstream (llama-server, built once from source and cached, + Gemma 3 270M GGUF)"
bash tests/real/setup_llamacpp.sh

step "agent clients: Codex CLI (npm @openai/codex, pinned, cached like llama-server)"
bash tests/clients/setup_codex.sh >/dev/null
step "real agent clients (Claude Code from npm, pinned, cached outside the repo)"
bash tests/clients/setup_claude_code.sh >/dev/null

step "format (ruff format --check)"
.venv/bin/ruff format --check gateway tests bench

step "lint (ruff check)"
.venv/bin/ruff check gateway tests bench

step "types (mypy --strict)"
.venv/bin/mypy

step "tests (pytest)"
.venv/bin/pytest "$@"
