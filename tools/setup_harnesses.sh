#!/usr/bin/env bash
# Install the real agent harnesses the proxy tests drive (tests/real/proxy/test_proxy_harnesses.py):
# Claude Code and Codex CLI from npm into a git-ignored folder (default .harness/).
# mini-swe-agent is a Python package and goes into the project's virtualenv instead.
# Usage: tools/setup_harnesses.sh [DIR]
set -euo pipefail
DIR="${1:-.harness}"
CLAUDE_CODE_VERSION="${CLAUDE_CODE_VERSION:-2.1.197}"
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"
mkdir -p "$DIR"
cd "$DIR"
[ -f package.json ] || echo '{"private": true}' > package.json
npm install --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"
./node_modules/.bin/claude --version
./node_modules/.bin/codex --version
