"""Per-step durations and the cumulative speedup of one run over another.

Definitions (times in seconds, steps numbered from 0):
- ``duration_s``: the step's training span, StartBatch to StepDone, as the
  simulator records it;
- ``wait_s``: time between the previous step's end (0 for step 0) and this
  step's start: rollout the training plane could not hide, plus publication and
  role switches;
- ``wall_s = wait_s + duration_s``: the step's share of the run's wall clock,
  so the ``wall_s`` column sums to the end time of the last step;
- ``cumulative_speedup(run, baseline)`` at step s is
  ``baseline_end(s) / run_end(s)``, the ratio of the wall-clock times at which
  each run finished step s (above 1: ``run`` is ahead).

Invariants: rows are sorted by step; only completed steps appear; speedups use
the steps both runs completed.
"""

from __future__ import annotations

import pandas as pd

from gyre.analysis.runs import Run

HOUR_S = 3600.0


def step_durations(run: Run) -> pd.DataFrame:
    """One row per completed step: step, start_s, end_s, duration_s, wait_s, wall_s, training_cells_max."""
    steps = run.steps[run.steps["end_s"].notna()].sort_values("step").reset_index(drop=True)
    previous_end = steps["end_s"].shift(1, fill_value=0.0)
    out = pd.DataFrame({
        "step": steps["step"].astype(int),
        "start_s": steps["start_s"],
        "end_s": steps["end_s"],
        "duration_s": steps["end_s"] - steps["start_s"],
        "wait_s": steps["start_s"] - previous_end,
        "training_cells_max": steps["training_cells_max"],
    })
    out["wall_s"] = out["wait_s"] + out["duration_s"]
    return out


def cumulative_speedup(run: Run, baseline: Run) -> pd.DataFrame:
    """Per common step: run_end_s, baseline_end_s and speedup = baseline_end_s / run_end_s."""
    ours = step_durations(run)[["step", "end_s"]].rename(columns={"end_s": "run_end_s"})
    theirs = step_durations(baseline)[["step", "end_s"]].rename(columns={"end_s": "baseline_end_s"})
    both = ours.merge(theirs, on="step", how="inner").sort_values("step").reset_index(drop=True)
    both["speedup"] = both["baseline_end_s"] / both["run_end_s"]
    return both


def step_table(runs: dict[str, Run]) -> pd.DataFrame:
    """Wide table of per-step wall time (hours), one column per named run."""
    columns = {name: step_durations(run).set_index("step")["wall_s"] / HOUR_S for name, run in runs.items()}
    return pd.DataFrame(columns).sort_index()


def total_hours(run: Run) -> float:
    """Wall-clock hours to the end of the last completed step."""
    steps = step_durations(run)
    return float(steps["end_s"].max() / HOUR_S) if len(steps) else 0.0
