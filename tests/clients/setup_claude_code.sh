#!/usr/bin/env bash
# Installs Claude Code (npm @anthropic-ai/claude-code) at its pinned version, cached outside the repo, and
# prints the path of its `claude` command; tests/clients/test_claude_code.py finds it at the same path.
# Usage: bash tests/clients/setup_claude_code.sh
set -euo pipefail
CLAUDE_CODE_VERSION=2.1.332  # keep in step with tests/clients/test_claude_code.py
exec bash "$(dirname "$0")/setup_npm_client.sh" claude-code @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude
