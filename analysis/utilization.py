"""Where the cells' time went: roles, overlap of rollout and training, transitions.

Definitions (seconds; the run spans ``[0, run.end_s]``):
- role utilization of a cell: the share of the run it spent in each role class,
  ``rollout``, ``training`` or ``switching`` (``to_training`` plus
  ``to_rollout``: the transition cost, including the core's wait for a
  publication before it re-shards). The three shares of a cell sum to 1 when
  its role intervals tile the run, which the simulator guarantees.
- training time T: the union of the step intervals [start_s, end_s] (a batch
  is open). Rollout time R: the union of execution intervals [start_s, end_s]
  (an execution still running at the end counts up to ``run.end_s``).
- **slack** = |T ∩ R| / |T|: the share of training time during which rollout is
  also running, i.e. how much of training is masked by rollout. Colocate,
  whose training waits for the burst's rollouts, has slack 0; a static Async
  split, whose rollout never stops, has slack near 1. A run without training
  time has slack NaN.
- transitions: every ``to_training`` / ``to_rollout`` interval in roles.csv is
  one transition of one cell; its cost is the interval's length. A transition
  cut off by the end of the run counts with its recorded (truncated) length.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from gyre.analysis.runs import Run

ROLE_CLASSES = ("rollout", "training", "switching")
_ROLE_CLASS = {"rollout": "rollout", "training": "training", "to_training": "switching",
               "to_rollout": "switching"}


def role_utilization(run: Run) -> pd.DataFrame:
    """Per cell: seconds and shares in rollout / training / switching, and total_s.

    Columns ``rollout``, ``training``, ``switching`` are shares of ``run.end_s``;
    ``*_s`` columns are the seconds.
    """
    roles = run.roles.assign(seconds=run.roles["end_s"] - run.roles["start_s"],
                             role_class=run.roles["role"].map(_ROLE_CLASS))
    if roles["role_class"].isna().any():
        unknown = sorted(set(roles.loc[roles["role_class"].isna(), "role"]))
        raise ValueError(f"unknown roles in roles.csv: {unknown}")
    seconds = roles.pivot_table(index="cell", columns="role_class", values="seconds", aggfunc="sum",
                                fill_value=0.0).reindex(columns=list(ROLE_CLASSES), fill_value=0.0)
    total = run.end_s
    out = seconds.add_suffix("_s")
    for name in ROLE_CLASSES:
        out[name] = seconds[name] / total if total > 0 else np.nan
    out["total_s"] = total
    out.columns.name = None
    return out.reset_index()


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of closed intervals as a sorted list of disjoint ones (empty ones dropped)."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted((float(s), float(e)) for s, e in intervals if e > s):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlap_seconds(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two unions returned by ``merge_intervals``."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _length(intervals: list[tuple[float, float]]) -> float:
    return float(sum(end - start for start, end in intervals))


def overlap(run: Run) -> dict[str, float]:
    """training_s, rollout_s, both_s, neither_s, total_s and slack = both_s / training_s."""
    end = run.end_s
    steps = run.steps[run.steps["end_s"].notna()]
    training = merge_intervals(zip(steps["start_s"], steps["end_s"]))
    execs = run.executions
    rollout = merge_intervals(zip(execs["start_s"], execs["end_s"].fillna(end)))
    both = overlap_seconds(training, rollout)
    t, r = _length(training), _length(rollout)
    return {"training_s": t, "rollout_s": r, "both_s": both, "neither_s": max(0.0, end - t - r + both),
            "total_s": end, "slack": both / t if t > 0 else float("nan")}


def slack(run: Run) -> float:
    """Share of training time during which rollout is also running (see module docstring)."""
    return overlap(run)["slack"]


def transitions(run: Run) -> pd.DataFrame:
    """Per (cell, direction): count and cost_s; direction is ``to_training`` or ``to_rollout``."""
    rows = run.roles[run.roles["role"].isin(["to_training", "to_rollout"])]
    rows = rows.assign(cost_s=rows["end_s"] - rows["start_s"], direction=rows["role"])
    table = rows.groupby(["cell", "direction"], as_index=False).agg(count=("cost_s", "size"),
                                                                     cost_s=("cost_s", "sum"))
    return table.sort_values(["cell", "direction"]).reset_index(drop=True)


def transition_summary(run: Run) -> dict[str, float]:
    """Totals over cells: count, cost_s (cell-seconds), and each direction's count and cost."""
    table = transitions(run)
    out: dict[str, float] = {"count": int(table["count"].sum()), "cost_s": float(table["cost_s"].sum())}
    for direction in ("to_training", "to_rollout"):
        part = table[table["direction"] == direction]
        out[f"{direction}_count"] = int(part["count"].sum())
        out[f"{direction}_cost_s"] = float(part["cost_s"].sum())
    return out
