#!/usr/bin/env bash
# GPU acceptance check: one table of what matters on a real device, non-zero exit on any miss.
#
#   tools/gpu_smoke.sh [CHECKPOINT]        (or: make gpu-smoke; CHECKPOINT=... make gpu-smoke)
#   tools/gpu_smoke.sh --cpu               (only the device-independent rows, on the CPU)
#
# It cannot pass by accident: on a machine whose torch is a CPU-only build, or sees no GPU, it
# FAILS (it was asked to check a GPU). Rows: torch build, weights on the device after every role
# switch, bf16 master weights moving at lr 1e-6 (Megatron's optimizer), engine memory actually freed
# by SGLang's memory saver (measured), and two bursts of a small-model version of
# configs/gpu_node_qwen.toml (publication seconds, reward per step and trend, replay check).
# CHECKPOINT (or $GYRE_SMOKE_CHECKPOINT): a small Hugging Face Qwen folder, e.g.
# Qwen2.5-0.5B-Instruct; without one a tiny random Qwen2 is built offline. Nothing is downloaded.
# GYRE_SGLANG_PYTHON: the python of an SGLang build with CUDA (the default .venv-sglang is the CPU
# build). See docs/gpu.md, "GPU smoke check"; the checks live in real/train/gpu_smoke.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || true
fi
exec "$PY" -m gyre.real.train.gpu_smoke "$@"
