#!/usr/bin/env bash
# Installs OpenAI's Codex CLI (npm @openai/codex) at its pinned version, cached outside the repo, and
# prints the path of its `codex` command; tests/clients/test_codex.py runs it against the gateway.
# Usage: CODEX=$(bash tests/clients/setup_codex.sh)
set -euo pipefail
CODEX_VERSION=0.171.0
exec bash "$(dirname "$0")/setup_npm_client.sh" codex @openai/codex "$CODEX_VERSION" codex
