"""What each trace row puts on an engine: its work, its model-call share and its wall-clock limit.

Time limits are deadlines on an execution's wall clock (docs/simulator.md
section 1): its harness stops at its start plus the limit, however lightly or
heavily its engine is loaded, and a reroute neither resets nor stretches that
clock. So:

- a trace row that timed out (``harness_timeout`` or ``overall_timeout``) is
  *stuck*: its harness stops at exactly ``start + harness_s`` (the ceiling),
  never earlier. Its engine work is infinite (it never runs out: only its
  deadline ends it, and its engine arms no finish timer for it that would
  wait unfired in the clock's heap until then); an overall timeout then spends ``duration_s - harness_s`` in evaluation
  retries, ending at ``start + duration_s``, inside its total budget;
- any other row brings its ``harness_s`` as work; where a slow engine could
  stretch it to the trace's ceiling (the longest ``harness_s`` of a timed-out
  row: every timed-out row of a preset stops at the ceiling; a real run's
  rows at the ceiling plus their start-up jitter), it also gets that deadline, and an execution still working then is
  cut there as a harness timeout;
- only the row's model-call share of its harness time slows with load
  (``gyre.sim.engines.effective_speed``), rounded to two decimals:
  an engine keeps one virtual clock per distinct share, so a real run's
  trace (a share per row) costs at most 101 clocks per engine, not one per
  execution.

Invariants: a stuck row's limit is its ``harness_s``; a non-stuck row has a
limit (the ceiling) exactly when its slowest possible wall time reaches the
ceiling; without a timed-out row there is no ceiling and no other limit.
"""

from __future__ import annotations

import functools

import numpy as np

from gyre.formats.trace import Outcome, Trace
from gyre.sim.engines import EngineCurve

TIMED_OUT = frozenset({Outcome.HARNESS_TIMEOUT.value, Outcome.OVERALL_TIMEOUT.value})

Grid = list[list]


def trace_ceiling_s(trace: Trace) -> float | None:
    """The harness ceiling a trace shows: the longest harness time of a timed-out row (None without one)."""
    stuck = np.isin(trace.outcomes, list(TIMED_OUT))
    return float(trace.harness_s[stuck].max()) if stuck.any() else None


@functools.lru_cache(maxsize=8)
def execution_plan(trace: Trace, curve: EngineCurve,
                   capacities: tuple[int, ...]) -> tuple[Grid, Grid, Grid, float | None, Grid]:
    """(work, model-call share, wall-clock limit or None) grids by (query, index), the ceiling, and the
    three as one grid of (work, share, limit) per cell (the driver reads it once per execution).

    A pure function of a trace (never modified), a curve and the capacities, kept for the last few: a
    sweep simulates hundreds of schedules on one trace and cell size. The grids are shared: read only."""
    harness = trace.harness_s
    shares = np.round(trace.model_call_share, 2)
    stuck = np.isin(trace.outcomes, list(TIMED_OUT))
    ceiling = trace_ceiling_s(trace)
    ranges = [curve.speed_range(c) for c in capacities if c > 0] or [(1.0, 1.0)]
    slowest = min(r[0] for r in ranges)
    work = np.where(stuck, np.inf, harness)  # a stuck row runs until its deadline
    if not (np.all(work >= 0.0) and np.all((shares >= 0.0) & (shares <= 1.0))):  # EngineBank.start's checks, once
        raise ValueError("a trace row has negative harness time or a model-call share outside [0, 1]")
    limits = np.full(harness.shape, np.nan)
    limits[stuck] = harness[stuck]
    if ceiling is not None:
        slowest_wall = harness * ((1.0 - shares) + shares / slowest)  # 1 / effective_speed(share, slowest)
        reach = ~stuck & (slowest_wall >= ceiling)
        limits[reach] = ceiling
    limit_grid = [[None if v != v else v for v in row] for row in limits.tolist()]  # NaN (v != v): no limit
    work_grid, share_grid = work.tolist(), shares.astype(float).tolist()
    cells = [list(zip(*rows)) for rows in zip(work_grid, share_grid, limit_grid)]
    return work_grid, share_grid, limit_grid, ceiling, cells
