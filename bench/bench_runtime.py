"""Real-runtime benchmark on this machine: one small job, wall time of a burst split by phase.

Runs the CPU demo (``configs/cpu_demo.toml``: 2 cells = 2 SGLang CPU engines +
2 training cells, N = 8, B = 2, scripted harnesses, mu = 2) for 8 steps = 4
bursts through ``runtime.job.run_job`` and reports, from the run's own
measurements: burst wall time; rollout (mean harness execution duration);
role transitions into training (drain + wait for in-flight requests + release
+ enter_training) and back (leave + resume + weight load + undrain); training
(per-step wall time on the core cell); publication (checkpoint export +
update_weights_from_disk); and the harness-side cost of a reroute: the admin
route change (in-flight requests move), the wait for the drained engine to go
idle, and the pause a harness sees in its stream when its call is moved (last
token from the source engine to the first from the destination, recorded by
the proxy per moved call). Run: ``.venv/bin/python -m bench runtime``.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

CPU_DEMO = Path(__file__).resolve().parents[1] / "configs" / "cpu_demo.toml"
STEPS = 8  # 4 bursts at the demo's mu = 2


def main() -> dict:
    import pandas as pd

    from gyre.real.runtime.job import load_job_config, run_job

    with tempfile.TemporaryDirectory(prefix="gyre-bench-runtime-") as tmp:
        job = load_job_config(CPU_DEMO, workdir=str(Path(tmp) / "run"), model_dir=str(Path(tmp) / "tok"),
                              steps=STEPS, timeout_s=600.0)
        s = run_job(job, progress=lambda line: print(f"   {line}", flush=True))
        trace = pd.read_csv(s["trace"])
    mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
    to_train = [t for t in s["transitions"] if t["role"] == "training"]
    to_roll = [t for t in s["transitions"] if t["role"] == "rollout"]
    stalls = s["move_stalls_ms"]
    return {
        "bursts": s["bursts"],
        "burst_wall_s": s["timings"]["run_s"] / max(1, s["bursts"]),
        "startup_s": s["timings"]["startup_s"],
        "rollout_execution_s": float(trace["duration_s"].mean()),
        "transition_to_training_s": mean([t["total_s"] for t in to_train]),
        "transition_wait_idle_s": mean([t["wait_idle_s"] for t in to_train]),
        "transition_to_rollout_s": mean([t["total_s"] for t in to_roll]),
        "training_step_s": mean(s["step_wall_s"]),
        "publication_s": mean([p["wall_s"] for p in s["publishes"]]),
        "reroutes": s["reroutes"],
        "moved_calls": len(stalls),
        "move_stall_ms_p50": _quantile(stalls, 0.5), "move_stall_ms_p90": _quantile(stalls, 0.9),
        "move_stall_ms_max": max(stalls) if stalls else None,
        "steps_with_satellites": sum(len(p) > 1 for p in s["participants"]),
        "replay_identical": s["replay_identical"],
        "staleness_mean": s["staleness_mean"], "staleness_predicted": s["staleness_predicted"],
    }


def _quantile(values: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.quantile(values, q, method="inverted_cdf")) if values else None


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
