"""What a plan reports: the Pareto front, the recommended schedule, the baselines, and a job file.

- ``pareto_front(trials)``: the evaluated schedules that no other evaluated
  schedule beats on all three objectives (mean total time, mean staleness,
  max staleness) while being strictly better on one; each schedule once
  (a re-proposed point is its first trial), sorted by time.
- ``recommend(trials)``: the fastest schedule meeting the staleness target
  (mean, and max if given), ties broken by lower mean staleness, then by
  trial number; None when no evaluated schedule meets it.
- ``job_file(...)``: a ``gyre run`` job file (TOML) for a schedule: the
  preset ``gyre-1`` on the job's cells with every planned field in
  ``[job.schedule]``, and ``steps`` rounded up to whole bursts. The real
  backend runs single-node cells (one engine each), so ``nodes`` is the cell
  count; ``nodes_per_cell`` stays the planned one (the cost model's).

Invariants: pure functions of the trial records; every front member is
non-dominated and every non-dominated evaluated schedule is on the front;
the recommendation, when there is one, meets the target and no feasible
schedule is faster.
"""

from __future__ import annotations

import math
from typing import Any

from gyre.sim.plan.space import Cluster
from gyre.sim.plan.study import OBJECTIVES, TrialRecord

SCHEDULE_KEYS = ("K", "C_e", "C_s", "nodes_per_cell", "phi", "mu", "rho_min", "tau", "streaming", "granularity")


def evaluated(trials: list[TrialRecord]) -> list[TrialRecord]:
    """Trials with values, each schedule once (its first trial)."""
    seen, out = set(), []
    for t in sorted(trials, key=lambda t: t.number):
        key = repr(sorted((t.schedule or {}).items()))
        if t.values is not None and key not in seen:
            seen.add(key)
            out.append(t)
    return out


def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def pareto_front(trials: list[TrialRecord]) -> list[TrialRecord]:
    pool = evaluated(trials)
    front = [t for t in pool if not any(dominates(o.scores, t.scores) for o in pool if o is not t)]
    return sorted(front, key=lambda t: (t.values, t.number))


def recommend(trials: list[TrialRecord]) -> TrialRecord | None:
    feasible = [t for t in evaluated(trials) if t.feasible]
    return min(feasible, key=lambda t: (t.scores[0], t.scores[1], t.number), default=None)


def trial_row(t: TrialRecord, cluster: Cluster) -> dict[str, Any]:
    """One flat row per trial for ``trials.csv`` and the tables."""
    row: dict[str, Any] = {"trial": t.number, "refused": t.refused or ""}
    row.update({k: (t.schedule or {}).get(k, "") for k in SCHEDULE_KEYS})
    row["separate_nodes"] = (cluster.nodes - t.schedule["K"] * t.schedule["nodes_per_cell"]) if t.schedule else ""
    values = t.values or (None,) * len(OBJECTIVES)
    row.update({name: ("" if v is None else round(v, 6)) for name, v in zip(OBJECTIVES, values)})
    row.update({k: round(t.attrs[k], 6) if k in t.attrs else "" for k in ("time_h_std", "time_h_min", "time_h_max",
                                                                        "step_h", "step_h_std", "staleness_std")})
    row["meets_target"] = t.feasible
    row["reused"] = t.attrs.get("reused", "")
    return row


def spread_line(attrs: dict[str, Any], seeds: int) -> str:
    return (f"total {attrs['time_h']:.3f} h (sd {attrs['time_h_std']:.3f}, {attrs['time_h_min']:.3f}.."
            f"{attrs['time_h_max']:.3f} over {seeds} seed(s)); per step {attrs['step_h']:.3f} h "
            f"(sd {attrs['step_h_std']:.3f}); staleness mean {attrs['staleness']:.3f} "
            f"(sd {attrs['staleness_std']:.3f}), max {attrs['staleness_max']:g}")


def job_file(schedule: dict[str, Any], cluster: Cluster, steps: int, comment: str) -> str:
    """A ``gyre run --config`` file for ``schedule`` (module docstring)."""
    mu = int(schedule["mu"])
    lines = [f"# {line}" for line in comment.splitlines()] + [
        "# Written by gyre plan. The real backend's cells are single-node (one engine each), so nodes = K here.",
        "[job]",
        'workdir = "runs/plan"',
        'preset = "gyre-1"',
        f"nodes = {schedule['K']}",
        f"C_e = {schedule['C_e']}",
        f"N = {cluster.N}",
        f"B = {cluster.B}",
        f"steps = {math.ceil(steps / mu) * mu}",
        "",
        "[job.schedule]",
    ]
    for key in SCHEDULE_KEYS:
        lines.append(f"{key} = {_toml(schedule[key])}")
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        return repr(float(value))
    return str(value)
