"""Sweeps for design-space search: every combination of some schedule fields, over seeds, in parallel.

``parse_sweep(["phi=0,0.5,1", "mu=1..4", "K=4,8,16"])`` gives the axes (a
``key=a..b`` range is every integer from a to b inclusive); ``points(axes)``
their cartesian product in a fixed order; ``run_sweep`` simulates each point
once per seed (seed s generates the built-in trace with seed s) in
``jobs`` worker processes and returns one row per (point, seed).

A point the policy core refuses (e.g. phi * B not a whole number of groups)
is a row with ``error`` set and no results: one impossible corner never
stops a sweep.

Invariants: rows come back in the order of ``points`` x seeds whatever the
number of workers, and equal arguments give equal rows (except
``wall_seconds``); values are coerced to the field's type exactly as
``--set`` does.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from gyre.config import ConfigError, parse_overrides

RESULT_KEYS = ("total_hours", "mean_step_hours", "staleness_mean", "staleness_steady_mean", "staleness_predicted",
               "staleness_token_weighted_mean", "staleness_max", "transitions", "slack", "events")


def parse_sweep(specs: list[str]) -> dict[str, list[Any]]:
    """``key=v1,v2`` or ``key=a..b`` per axis -> {field: [typed values]}; errors name the spec."""
    axes: dict[str, list[Any]] = {}
    for spec in specs:
        key, sep, raw = spec.partition("=")
        key = key.strip()
        if not sep or not raw.strip():
            raise ConfigError(f"sweep {spec!r} is not key=v1,v2,... or key=a..b")
        if key in axes:
            raise ConfigError(f"sweep axis {key!r} given twice")
        if ".." in raw:
            low, _, high = raw.partition("..")
            try:
                values = [str(v) for v in range(int(low), int(high) + 1)]
            except ValueError:
                raise ConfigError(f"sweep {spec!r}: a range a..b needs two integers") from None
            if not values:
                raise ConfigError(f"sweep {spec!r}: empty range")
        else:
            values = [v.strip() for v in raw.split(",") if v.strip()]
        axes[key] = [parse_overrides([f"{key}={v}"])[key] for v in values]
    return axes


def points(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the axes, first axis slowest."""
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


def _one(job: tuple[str, str, int, int, dict[str, Any]]) -> dict[str, Any]:
    from gyre.sim.runner import run_simulation

    preset, trace, steps, seed, point = job
    row: dict[str, Any] = {**point, "seed": seed, "error": None}
    try:
        summary = run_simulation(preset, trace, steps=steps, seed=seed, overrides=point, breakdown=False).summary
    except (ConfigError, ValueError) as exc:
        row["error"] = str(exc)
        return row
    row.update({k: summary.get(k) for k in RESULT_KEYS}, wall_seconds=summary["wall_seconds"])
    return row


def run_sweep(axes: dict[str, list[Any]], *, preset: str = "E0", trace: str = "nl2repo-122b", steps: int = 12,
              seeds: int = 1, jobs: int = 2,
              mapper: Callable[[Callable, list], list] | None = None) -> list[dict[str, Any]]:
    """One row per (point, seed); see the module docstring. ``mapper(fn, items)``, when given, runs the
    simulations instead of ``jobs`` local processes (``gyre sweep --ray``: Ray tasks), in item order."""
    if seeds < 1 or jobs < 1 or steps < 1:
        raise ValueError(f"seeds, jobs and steps must be >= 1, got {seeds}, {jobs}, {steps}")
    work = [(preset, trace, steps, seed, point) for point in points(axes) for seed in range(seeds)]
    if mapper is not None:
        return mapper(_one, work)
    if jobs == 1:
        return [_one(job) for job in work]
    from gyre.sim.runner import warm_caches  # imported once here, before the workers fork, not once in each
    from gyre.sim.workers import collecting, simulation_pool

    try:  # the first schedule's trace and plan, built here once for both workers (they inherit them at fork)
        warm_caches(preset, trace, steps=steps, seed=0, overrides=work[0][4])
    except (ConfigError, ValueError):
        pass  # a refused first point: each worker builds what it needs

    with simulation_pool(jobs) as pool:
        return list(pool.map(collecting(_one), work, chunksize=max(1, len(work) // (4 * jobs))))
