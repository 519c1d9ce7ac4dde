"""Real-runtime benchmark on this machine: one small job, wall time of a burst split by phase.

Runs ``runtime_job.run_job`` (2 cells = 2 SGLang CPU engines + 2 training
cells, scripted harnesses, mu = 2, 2 bursts) and reports, from the run's own
measurements: burst wall time; rollout (mean harness execution duration);
role transitions into training (drain + wait for in-flight requests + release
+ enter_training) and back (leave + resume + weight load + undrain); training
(per-step wall time on the core cell); publication (checkpoint export +
update_weights_from_disk); and the harness-side cost of a reroute: the admin
route change (in-flight requests move) and the wait for the drained engine to
go idle. Run: ``.venv/bin/python -m bench runtime``.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path


def main() -> dict:
    import pandas as pd

    from gyre.real.runtime_job import JobConfig, run_job

    with tempfile.TemporaryDirectory(prefix="gyre-bench-runtime-") as tmp:
        s = run_job(JobConfig(workdir=str(Path(tmp) / "run"), model_dir=str(Path(tmp) / "tok"), steps=4,
                              N=4, B=2, C_e=4, timeout_s=600.0))
        trace = pd.read_csv(s["trace"])
    mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
    to_train = [t for t in s["transitions"] if t["role"] == "training"]
    to_roll = [t for t in s["transitions"] if t["role"] == "rollout"]
    return {
        "bursts": s["steps"] // s["config"]["mu"],
        "burst_wall_s": s["timings"]["run_s"] / max(1, s["steps"] // s["config"]["mu"]),
        "startup_s": s["timings"]["startup_s"],
        "rollout_execution_s": float(trace["duration_s"].mean()),
        "transition_to_training_s": mean([t["total_s"] for t in to_train]),
        "transition_wait_idle_s": mean([t["wait_idle_s"] for t in to_train]),
        "transition_to_rollout_s": mean([t["total_s"] for t in to_roll]),
        "training_step_s": mean(s["step_wall_s"]),
        "publication_s": mean([p["wall_s"] for p in s["publishes"]]),
        "reroutes": s["reroutes"],
        "replay_identical": s["replay_identical"],
        "staleness_mean": s["staleness_mean"], "staleness_predicted": s["staleness_predicted"],
    }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
