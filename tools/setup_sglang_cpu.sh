#!/usr/bin/env bash
# Build the separate SGLang CPU virtualenv used by the real-engine proxy tests.
#
# Follows docs/cpu-stack.md: torch 2.13.0 CPU (a wheel on this
# machine's disk), SGLang's non-CUDA requirements, then sglang itself with
# --no-deps. The two import shims it needs on CPU live in tools/shims/ and are
# put on PYTHONPATH by the tests (never installed into the venv).
# Usage: tools/setup_sglang_cpu.sh [VENV_DIR]   (default .venv-sglang)
set -euo pipefail
VENV="${1:-.venv-sglang}"
PY="${PY:-python3}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
HERE="$(cd "$(dirname "$0")" && pwd)"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import sglang" 2>/dev/null; then
  echo "sglang already installed in $VENV"; exit 0
fi
"$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
# sglang_cpu_constraints.txt pins every package to the versions tested together
# (and torch to the CPU build on disk, so nothing can pull a CUDA torch).
$PIP install -q --upgrade pip
$PIP install -q "torch==2.13.0"
$PIP install -q -c "$HERE/sglang_cpu_constraints.txt" -r "$HERE/sglang_cpu_requirements.txt"
$PIP install -q --no-deps "sglang==$SGLANG_VERSION"
"$VENV/bin/python" -m pip list 2>/dev/null | grep -E '^(torch|sglang|transformers) '
