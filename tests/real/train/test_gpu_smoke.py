"""The GPU acceptance check (``real/train/gpu_smoke.py``, ``tools/gpu_smoke.sh``) on a machine without a GPU.

Checked: asked for a GPU (the default) on a CPU-only torch, the script fails
with the torch row naming the CPU build and every other row "not run"; its
``--cpu`` mode runs the device-independent rows for real (weights on the
training device after three role switches, bf16 masters moving at lr 1e-6)
and they pass, while the same rows could never make the GPU mode pass.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from gyre.real.train.gpu_smoke import Row, run_checks, table, verdict

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch runs the real check")
def test_the_smoke_script_fails_on_a_cpu_torch():
    done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_smoke.sh")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("  ")]
    assert rows[0][:2] == ["torch", "FAIL"] and "CPU-only build" in done.stdout
    assert len(rows) == 5 and all("not run" in " ".join(row) for row in rows[1:])
    assert done.stdout.rstrip().endswith("gpu-smoke: FAIL")


def test_cpu_mode_runs_the_device_independent_rows(megatron):
    rows = run_checks(gpu=False)
    by_name = {row.name: row for row in rows}
    assert by_name["device after role switches"].ok, table(rows)
    assert by_name["bf16 masters at lr 1e-6"].ok and "TorchUpdater" in by_name["bf16 masters at lr 1e-6"].value
    assert by_name["engine memory released"].ok is None and by_name["two bursts"].ok is None
    assert verdict(rows, gpu=False) == 0
    assert verdict(rows, gpu=True) == 1  # rows that did not run never pass the GPU check
    rows[2] = Row(rows[2].name, "0.0% of masters moved", False)
    assert verdict(rows, gpu=False) == 1
