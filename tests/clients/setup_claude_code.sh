#!/usr/bin/env bash
# Installs Claude Code (npm @anthropic-ai/claude-code, pinned) once, cached outside the repo like the
# llama-server binary, and prints the path of its `claude` executable. Idempotent: with the package in
# place a run takes a moment. The tests in tests/clients find it at the same path.
# Usage: bash tests/clients/setup_claude_code.sh
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.332  # keep in step with tests/clients/claude_code.py

CACHE="${GATEWAY_CACHE:-$HOME/.cache/gateway}"
PREFIX="$CACHE/npm/claude-code-$CLAUDE_CODE_VERSION"
CLAUDE="$PREFIX/node_modules/.bin/claude"

say() { printf '[setup_claude_code] %s\n' "$*" >&2; }

if ! command -v npm >/dev/null; then
  say "installing nodejs and npm (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

if [ ! -x "$CLAUDE" ] || ! "$CLAUDE" --version >/dev/null 2>&1; then
  say "installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION into $PREFIX"
  rm -rf "$PREFIX.partial"
  mkdir -p "$PREFIX.partial"
  # The package is a launcher plus a native binary in a per-platform optional dependency; no scripts
  # of ours run, and nothing reaches beyond the npm registry.
  npm install --prefix "$PREFIX.partial" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >&2
  rm -rf "$PREFIX"
  mv "$PREFIX.partial" "$PREFIX"
fi

say "ready: $CLAUDE ($("$CLAUDE" --version 2>/dev/null || echo 'version unknown'))"
printf '%s\n' "$CLAUDE"
