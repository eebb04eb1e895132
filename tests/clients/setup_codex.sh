#!/usr/bin/env bash
# Installs OpenAI's Codex CLI (npm @openai/codex, which carries its native binary) at a pinned version,
# cached outside the repo like the llama-server binary, and prints the path of its `codex` command.
# tests/clients/test_codex.py runs it against the gateway. Idempotent: a cached install takes a second.
# Usage: CODEX=$(bash tests/clients/setup_codex.sh)
set -euo pipefail

CODEX_VERSION=0.171.0

CACHE="${GATEWAY_CACHE:-$HOME/.cache/gateway}"
PREFIX="$CACHE/npm/codex-$CODEX_VERSION"
CODEX="$PREFIX/node_modules/.bin/codex"

say() { printf '[setup_codex] %s\n' "$*" >&2; }

if ! command -v npm >/dev/null; then
  say "installing node and npm (apt)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

if [ ! -x "$CODEX" ] || ! "$CODEX" --version 2>/dev/null | grep -q "$CODEX_VERSION"; then
  say "installing @openai/codex@$CODEX_VERSION into $PREFIX"
  mkdir -p "$PREFIX"
  # The platform's binary comes as an optional dependency of the same version (~400 MB unpacked).
  npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "@openai/codex@$CODEX_VERSION" >&2
fi
"$CODEX" --version >/dev/null
printf '%s\n' "$CODEX"
