#!/usr/bin/env bash
# GPU smoke check: two bursts of a small-model version of configs/gpu_node_qwen.toml on this machine's GPUs.
#
#   tools/gpu_smoke.sh [CHECKPOINT]      (or: make gpu-smoke; CHECKPOINT=... make gpu-smoke)
#
# Where no CUDA GPU is visible it says so and exits 0 (nothing to check). Otherwise it runs
# `gyre run` on the GPU job with: min(2, GPUs) cells of one GPU each (TP = PP = 1), the CUDA training
# cells and SGLang engines (GYRE_SGLANG_PYTHON: an SGLang build with CUDA; the default .venv-sglang is
# the CPU build), the repair task family with the scripted harness, steps = 4 (two bursts of mu = 2),
# and CHECKPOINT (or $GYRE_SMOKE_CHECKPOINT: a small Hugging Face Qwen folder, e.g. Qwen2.5-0.5B-Instruct)
# or, when none is given, a tiny random Qwen2 built offline. Nothing is downloaded.
# It prints what it measured: start-up and run time, per-step wall time, publications, transitions,
# outcomes, rewards, staleness, the replay check, and each GPU's peak memory. Exit status: gyre run's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORK=${GYRE_SMOKE_DIR:-runs/gpu-smoke}

gpus=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
fi
if [ "$gpus" -lt 1 ]; then
  echo "gpu-smoke: no GPU here (no nvidia-smi device, or torch.cuda.is_available() is False): nothing to run."
  echo "gpu-smoke: on a CUDA machine this runs 2 bursts of configs/gpu_node_qwen.toml with a small model."
  exit 0
fi

cells=$(( gpus < 2 ? gpus : 2 ))
checkpoint=${1:-${GYRE_SMOKE_CHECKPOINT:-}}
mkdir -p "$WORK"
if [ -z "$checkpoint" ]; then
  checkpoint="$WORK/tiny-qwen2"
  "$PY" -c "import sys; from gyre.real.toy.tiny_model import build_tiny_qwen2; build_tiny_qwen2(sys.argv[1])" \
    "$checkpoint"
fi
echo "gpu-smoke: $gpus GPU(s) visible; $cells cell(s) of 1 GPU; checkpoint $checkpoint"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader

mem_log="$WORK/gpu-memory.csv"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 1 >"$mem_log" 2>/dev/null &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT

status=0
"$PY" -m gyre.cli run --config configs/gpu_node_qwen.toml \
  --set "workdir=\"$WORK/run\"" --set "nodes=$cells" --set "steps=4" --set "C_e=4" --set "N=4" --set "B=2" \
  --set "max_tokens=64" --set "token_budget=8192" --set "timeout_s=1800.0" \
  --set "harness=\"scripted\"" --set "harness_options={calls = 2}" \
  --set "harness_timeout_s=300.0" --set "overall_timeout_s=600.0" \
  --set "layout={gpus_per_node = $gpus, tensor_parallel = 1, pipeline_parallel = 1, engine_tensor_parallel = 1, publication = \"disk\", engine_mem_fraction = 0.2}" \
  --set "model={checkpoint = \"$checkpoint\", dtype = \"bfloat16\"}" || status=$?
kill "$sampler" 2>/dev/null || true

"$PY" - "$WORK/run/summary.json" "$mem_log" <<'EOF' || true
import json, sys
from collections import defaultdict
from pathlib import Path

summary_path, mem_path = Path(sys.argv[1]), Path(sys.argv[2])
if not summary_path.exists():
    sys.exit(f"gpu-smoke: no summary at {summary_path}: the run did not finish (see the log above)")
s = json.loads(summary_path.read_text())
print("gpu-smoke: measured")
print(f"  steps {s['steps']}, published {s['published']}, bursts {s.get('bursts')}, replay identical {s['replay_identical']}")
print(f"  start-up {s['timings'].get('startup_s', 0):.1f} s, run {s['timings'].get('run_s', 0):.1f} s")
print(f"  step wall s: {[round(x, 2) for x in s.get('step_wall_s', [])]}")
print(f"  publications: {len(s.get('publishes', []))}, transitions: {len(s.get('transitions', []))}, reroutes: {s.get('reroutes')}")
print(f"  outcomes: {s.get('outcomes')}, excluded: {len(s.get('excluded_executions', []))}")
print(f"  reward per step: {[round(x, 3) for x in s.get('reward_curve', [])]}")
print(f"  staleness mean {s.get('staleness_mean')} (predicted {s.get('staleness_predicted')})")
peak = defaultdict(int)
for line in mem_path.read_text().splitlines() if mem_path.exists() else []:
    try:
        index, used = (int(v) for v in line.split(","))
    except ValueError:
        continue
    peak[index] = max(peak[index], used)
print(f"  peak GPU memory MiB: {dict(sorted(peak.items()))}")
EOF
exit "$status"
