"""Where the time goes in one simulated run, and the slack of docs/workload.md#training-cost-and-slack.

Wall-clock breakdown: every instant of ``[0, end_s]`` falls in exactly one
category, decided in this order (first match wins):

1. ``rollout_full``: executions running fill the rollout capacity C_R(t)
   (an execution runs from its start until its harness stops: its
   evaluation retries after a HarnessStopped hold no rollout slot);
2. ``rollout_tail``: some executions run, but fewer than C_R(t) (the pool is
   under-used: the heavy tail of a burst);
3. ``training_exposed``: no execution runs and a training step is in
   progress: training on the critical path, not hidden behind rollout;
4. ``publication``: none of the above and a weight publication is in flight;
5. ``transitions``: none of the above and some cell is switching roles;
6. ``waiting``: nothing runs, trains, publishes or switches (waiting for
   supply: evaluations, the supply timer, a dispatch).

Training that overlaps rollout is *hidden* and counted as rollout: the
categories answer "what is the run waiting for", not "what is busy".

Node-time per role (node-seconds, ``nodes_per_cell`` per cell; the separate
pool is not in a cell and not counted):
- ``rollout``: busy share = execution slots in use / slots offered by the
  cells in the rollout role (running executions on the cells, capped at
  their capacity, over their capacity);
- ``training``: busy share = node-seconds the simulated training plane spent
  on micro-steps, warm-ups, drains and updates over node-seconds in the
  training role;
- ``switching``: always busy (a transition's cost).
**Slack** (docs/workload.md#training-cost-and-slack: "about a fifth of the time the training cells hold is
spare") is our measure ``1 - training busy share``: the idle share of
training-role node time.

Invariants: the six categories sum to ``end_s``; busy shares lie in [0, 1].
"""

from __future__ import annotations

from typing import Iterable

from gyre.driver_rules import CATEGORIES, breakdown_category

ROLE_CLASS = {"rollout": "rollout", "training": "training", "to_training": "switching", "to_rollout": "switching"}


def _deltas(intervals: Iterable[tuple[float, float | None]], end_s: float, weight: float = 1.0):
    for start, end in intervals:
        stop = end_s if end is None else min(end, end_s)
        if stop > start:
            yield start, weight
            yield stop, -weight


def time_breakdown(*, end_s: float, executions: Iterable[tuple[float, float | None]],
                   roles: Iterable[tuple[int, str, float, float]], steps: Iterable[tuple[float, float | None]],
                   publications: Iterable[tuple[float, float | None]], C_e: int, C_s: int) -> dict[str, float]:
    """Seconds per category (see the module docstring) from plain interval lists."""
    roles = list(roles)
    series = {
        "running": list(_deltas(executions, end_s)),
        "capacity": list(_deltas(((s, e) for _, r, s, e in roles if r == "rollout"), end_s, C_e)),
        "training": list(_deltas(steps, end_s)),
        "publishing": list(_deltas(publications, end_s)),
        "switching": list(_deltas(((s, e) for _, r, s, e in roles if ROLE_CLASS[r] == "switching"), end_s)),
    }
    changes = sorted({0.0, end_s, *(t for points in series.values() for t, _ in points)})
    level = {name: 0.0 for name in series}
    by_time = {name: _group(points) for name, points in series.items()}
    out = dict.fromkeys(CATEGORIES, 0.0)
    for left, right in zip(changes, changes[1:]):
        for name in series:
            level[name] += by_time[name].get(left, 0.0)
        if right > end_s or left >= end_s:
            break
        out[_category(level, C_s)] += right - left
    return out


def _group(points: list[tuple[float, float]]) -> dict[float, float]:
    grouped: dict[float, float] = {}
    for t, delta in points:
        grouped[t] = grouped.get(t, 0.0) + delta
    return grouped


def _category(level: dict[str, float], C_s: int) -> str:
    return breakdown_category(running=level["running"], capacity=level["capacity"] + C_s,
                              training=level["training"] > 0, publishing=level["publishing"] > 0,
                              switching=level["switching"] > 0)


def role_node_seconds(roles: Iterable[tuple[int, str, float, float]], nodes_per_cell: int) -> dict[str, float]:
    """Node-seconds each role class held, over all cells."""
    out = {"rollout": 0.0, "training": 0.0, "switching": 0.0}
    for _cell, role, start, end in roles:
        out[ROLE_CLASS[role]] += (end - start) * nodes_per_cell
    return out


def rollout_busy_share(*, end_s: float, executions_on_cells: Iterable[tuple[float, float | None]],
                       roles: Iterable[tuple[int, str, float, float]], C_e: int) -> float:
    """Execution slots in use on rollout-role cells over the slots they offer (see docstring)."""
    roles = list(roles)
    offered = sum((e - s) * C_e for _, r, s, e in roles if r == "rollout")
    if offered <= 0:
        return float("nan")
    running = _group(list(_deltas(executions_on_cells, end_s)))
    capacity = _group(list(_deltas(((s, e) for _, r, s, e in roles if r == "rollout"), end_s, C_e)))
    times = sorted({0.0, end_s, *running, *capacity})
    used, level_x, level_c = 0.0, 0.0, 0.0
    for left, right in zip(times, times[1:]):
        level_x += running.get(left, 0.0)
        level_c += capacity.get(left, 0.0)
        used += min(level_x, level_c) * (right - left)
    return used / offered
