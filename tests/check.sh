#!/usr/bin/env bash
# The one command that installs what the checks need and runs every one of them:
# format, lint, types, tests. CI (.ci/run) calls exactly this; so can you: `bash tests/check.sh`.
#
# `bash tests/check.sh --fast` is the edit-test loop (docs/developing.md): the same format, lint and
# types, then the unit and in-process tests only (FAST_TESTS below), with no system packages, no
# PostgreSQL, no llama-server and no agent clients installed. Arguments after it go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

fast=false
if [ "${1:-}" = "--fast" ]; then
  fast=true
  shift
fi

# The fast selection: the unit tests and the tests that drive the gateway in-process against the bundled
# emulators. Left out (the full run has them): real clients (tests/clients), the real llama-server
# (tests/real), the reliability rows, replicas (Redis, PostgreSQL), spend (Chromium, PostgreSQL), the
# ledger and the engine contracts, schemathesis, overload, slow clients and backpressure, routing,
# recovery and learning over emulated time, the commands run as processes, and every test marked slow
# (docs/developing.md lists them). Measured: about 3.5 minutes on a loaded 2-core VM, ~2.5 unloaded.
FAST_TESTS=(
  tests/unit tests/policy tests/doors tests/emulator tests/simulate tests/backends
  tests/hardening/test_hostile_input.py tests/hardening/test_openapi.py
  tests/hardening/test_one_read_stream.py
  tests/test_exchange.py tests/test_bad_input.py tests/test_no_cycles.py
  tests/test_readme.py tests/test_import_graph.py tests/test_request_walk.py
  --ignore=tests/emulator/test_emulate_command.py --ignore=tests/simulate/test_command.py
  --ignore=tests/backends/test_litellm.py
)

export LITELLM_LOCAL_MODEL_COST_MAP=True  # litellm must never fetch its price map from the network
export PIP_DISABLE_PIP_VERSION_CHECK=1

step() { printf '\n== %s\n' "$*"; }

# pip's own output minus the venv-location warning; a failed install stops the run with pip's output.
pip_install() {
  local out
  if ! out="$(.venv/bin/python -m pip install --quiet "$@" 2>&1)"; then
    printf '%s\n' "$out" >&2
    printf '\ncheck.sh: pip install %s failed (output above)\n' "$*" >&2
    exit 1
  fi
  printf '%s\n' "$out" | { grep -v -e '^WARNING: Location' -e '^$' || true; }
}

step "python environment (.venv)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# --fast installs only when .venv has never been installed into or pyproject.toml changed since.
stamp=.venv/.check-installed
if ! $fast || [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  pip_install --upgrade pip
  pip_install -e '.[dev]'
  .venv/bin/python -c 'import gateway.cli, litellm, openai' >/dev/null
  touch "$stamp"
fi

if ! $fast; then
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

  step "Arize Phoenix, the trace store tests/telemetry exports to (its own cached venv, pinned)"
  bash tests/telemetry/setup_phoenix.sh >/dev/null

  step "agent clients: Codex CLI (npm @openai/codex, pinned, cached like llama-server)"
  bash tests/clients/setup_codex.sh >/dev/null
  step "real agent clients (Claude Code from npm, pinned, cached outside the repo)"
  bash tests/clients/setup_claude_code.sh >/dev/null
  step "the engines' own sources at the pinned versions (contract citations are checked against them)"
  ENGINE_SOURCES="$(bash tests/contract/setup_engine_sources.sh)"
  export ENGINE_SOURCES
fi

step "format (ruff format --check)"
.venv/bin/ruff format --check gateway tests bench

step "lint (ruff check)"
.venv/bin/ruff check gateway tests bench

step "types (mypy --strict)"
.venv/bin/mypy

if $fast; then
  # No compiling here: a build older than the sources is never run (gateway/native.py), so this tests
  # the .py files you just edited.
  step "tests, fast selection (pytest -m 'not slow')"
  .venv/bin/pytest -m 'not slow' "${FAST_TESTS[@]}" "$@"
else
  step "compile the hot modules (python -m gateway.build_native build: mypyc, then gcc; minutes)"
  .venv/bin/python -m gateway.build_native build
  native_state="$(.venv/bin/python -m gateway.build_native status)"
  case "$native_state" in
    compiled*) echo "$native_state" ;;
    *) echo "check.sh: the compiled modules are not in use: $native_state" >&2; exit 1 ;;
  esac

  step "tests (pytest, on the compiled modules)"
  .venv/bin/pytest "$@"

  step "the tests that look inside a compiled module, on its .py file (GATEWAY_NATIVE=off pytest -m pure_python)"
  GATEWAY_NATIVE=off .venv/bin/pytest -m pure_python "$@" || [ $? -eq 5 ]  # 5: none among those selected
fi
