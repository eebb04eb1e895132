#!/usr/bin/env bash
# Installs an agent client from npm (its native binary comes inside the package, as a per-platform
# optional dependency) at a pinned version, cached outside the repo like the llama-server binary, and
# prints the path of its command. Idempotent: a cached install takes a moment. Nothing reaches beyond
# the npm registry (and Debian's, for node itself where it is missing).
# Usage: bash tests/clients/setup_npm_client.sh NAME PACKAGE VERSION COMMAND
#   (setup_claude_code.sh and setup_codex.sh call it with their pins)
set -euo pipefail

NAME=$1 PACKAGE=$2 VERSION=$3 COMMAND=$4
CACHE="${GATEWAY_CACHE:-$HOME/.cache/gateway}"
PREFIX="$CACHE/npm/$NAME-$VERSION"
BIN="$PREFIX/node_modules/.bin/$COMMAND"

say() { printf '[setup %s] %s\n' "$NAME" "$*" >&2; }

if ! command -v npm >/dev/null; then
  say "installing nodejs and npm (apt)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

if [ ! -x "$BIN" ] || ! "$BIN" --version 2>/dev/null | grep -qF "$VERSION"; then
  say "installing $PACKAGE@$VERSION into $PREFIX"
  # Into a side folder first, so an interrupted install is never taken for a cached one.
  rm -rf "$PREFIX.partial"
  mkdir -p "$PREFIX.partial"
  npm install --prefix "$PREFIX.partial" --no-audit --no-fund --loglevel=error "$PACKAGE@$VERSION" >&2
  rm -rf "$PREFIX"
  mv "$PREFIX.partial" "$PREFIX"
fi
say "ready: $BIN ($("$BIN" --version 2>/dev/null || echo 'version unknown'))"
printf '%s\n' "$BIN"
