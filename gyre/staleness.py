"""Staleness, the one formula (docs/staleness.md#staleness-identity, Theorem A.1) and its steady-state window.

Every place that predicts or windows staleness imports from here: the
scheduler's config, the simulator's summary, the real job's summary, the
analysis tables and the figures.

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
a run too short for any steady burst raises ValueError naming the problem.
"""

from __future__ import annotations

import math

DISPATCH_POLICIES: tuple[str, ...] = ("boundary", "continuous")


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
