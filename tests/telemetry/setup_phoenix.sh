#!/usr/bin/env bash
# Makes Arize Phoenix (the trace store tests/telemetry reads the gateway's traces back from) available:
# `arize-phoenix`, pinned, in a virtual environment of its own, cached outside the repo (its many
# dependencies must not meet ours). Idempotent: with it in place a run takes a second. Prints the path
# of the virtual environment's python (`python -m phoenix.server.main serve` starts it).
# Usage: bash tests/telemetry/setup_phoenix.sh
set -euo pipefail

PHOENIX_VERSION=20.26.1

CACHE="${GATEWAY_CACHE:-$HOME/.cache/gateway}"
VENV="$CACHE/phoenix-$PHOENIX_VERSION"
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf '[setup_phoenix] %s\n' "$*" >&2; }

if [ ! -f "$VENV/.installed" ]; then
  say "installing arize-phoenix $PHOENIX_VERSION into $VENV (once; a few minutes)"
  rm -rf "$VENV.partial"
  python3 -m venv "$VENV.partial"
  out=$("$VENV.partial/bin/python" -m pip install --quiet "arize-phoenix==$PHOENIX_VERSION" 2>&1) || {
    printf '%s\n' "$out" >&2
    exit 1
  }
  touch "$VENV.partial/.installed"
  rm -rf "$VENV"
  mv "$VENV.partial" "$VENV"
fi
# Its scripts' first lines still name the .partial path; the interpreter (a link) and `-m` do not care.
"$VENV/bin/python" -c 'import phoenix' >/dev/null
printf '%s\n' "$VENV/bin/python"
