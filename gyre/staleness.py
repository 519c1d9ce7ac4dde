"""Staleness, the one formula (docs/staleness.md#staleness-identity, Theorem A.1) and its steady-state window.

Every place that measures, predicts or windows staleness imports from here:
the scheduler's snapshot, the simulator's record, the real backend's metrics,
the analysis tables and the figures.

- ``group_staleness(v_d, v_t)``: a consumed group's staleness d = v_t - v_d,
  the policy versions between the weights that rolled it out (dispatched at
  v_d) and the step that trains on it (v_t).
- ``staleness_by_group(v_d, v_t)``: d of every consumed group, in group
  order (a group in ``v_t`` only: fed, so it was dispatched).

- ``predicted_staleness(phi, mu, dispatch)``: the group-weighted steady-state
  mean E[d]. Boundary dispatch: phi + (mu - 1) / 2. Continuous dispatch at the
  same depth refills a burst's freed slots with the weights the burst started
  from, so each group is mu versions staler: phi + mu + (mu - 1) / 2
  (derivation in ``gyre.analysis.dispatch``).
- ``steady_window(phi, mu, steps)``: a run starts with one dispatch of
  (phi + mu) * B groups all at version 0, so its first bursts are fresher
  than the steady state. The window keeps whole bursts only, after
  ``warmup_bursts(phi, mu) = ceil(phi / mu) + 2`` of them (enough for the
  queue to hold only groups dispatched after the first publication, under
  either dispatch policy), up to the last burst completed within ``steps``.
  Whole bursts matter: a burst trains versions k*mu .. k*mu + mu - 1, and a
  window cut mid-burst biases the mean.

Invariants: pure functions of their arguments; an unknown dispatch policy or
a run too short for any steady burst raises ValueError naming the problem; a
group trained before it was dispatched (v_t < v_d) raises ValueError.
"""

from __future__ import annotations

import math
from typing import Mapping

DISPATCH_POLICIES: tuple[str, ...] = ("boundary", "continuous")


def group_staleness(v_d: int, v_t: int) -> int:
    """d = v_t - v_d of one consumed group; never negative."""
    if v_t < v_d:
        raise ValueError(f"a group dispatched at version {v_d} cannot be trained at version {v_t}")
    return v_t - v_d


def staleness_by_group(v_d: Mapping[int, int], v_t: Mapping[int, int]) -> dict[int, int]:
    """Group -> d for every consumed group (those in ``v_t``), in group order."""
    return {g: group_staleness(v_d[g], v_t[g]) for g in sorted(v_t)}


def predicted_staleness(phi: float, mu: int, dispatch: str = "boundary") -> float:
    """E[d] = phi + (mu - 1) / 2 (boundary); phi + mu + (mu - 1) / 2 (continuous)."""
    if dispatch not in DISPATCH_POLICIES:
        raise ValueError(f"dispatch must be one of {', '.join(DISPATCH_POLICIES)}, got {dispatch!r}")
    lag_in_batches = phi if dispatch == "boundary" else phi + mu
    return lag_in_batches + (mu - 1) / 2


def warmup_bursts(phi: float, mu: int) -> int:
    """Bursts dropped as warm-up before the steady-state window."""
    return math.ceil(phi / mu - 1e-9) + 2


def steady_window(phi: float, mu: int, steps: int) -> tuple[int, int]:
    """Steps [first, stop) of the steady-state window: whole bursts after the warm-up.

    Raises ValueError when ``steps`` leaves no whole burst after the warm-up.
    """
    first = warmup_bursts(phi, mu) * mu
    stop = (steps // mu) * mu
    if stop <= first:
        raise ValueError(f"{steps} steps leave no steady-state burst for phi={phi}, mu={mu}: "
                         f"need more than {first + mu - 1} steps")
    return first, stop
