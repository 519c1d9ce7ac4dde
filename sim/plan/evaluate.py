"""Evaluating a schedule for ``gyre plan``: the same simulation on several trace seeds, and its spread.

``Workload`` names what a candidate is simulated on: a trace (a preset, seeded
per run, or a file, the same executions every run), the steps, the trace
seeds and cost overrides. ``simulate(job)`` runs one (schedule, seed) and is
what a worker process (or a Ray task) executes; ``evaluate(workload,
overrides, mapper)`` runs every seed through ``mapper`` and ``aggregate``
folds the rows into an ``Evaluation``:

- ``time_h``: mean total simulated time over the seeds (hours), with its
  standard deviation, minimum and maximum; ``step_h`` the same per step;
- ``staleness``: the group-weighted mean staleness, steady-state (whole bursts
  after the warm-up; the all-steps mean where the run is too short for one),
  averaged over seeds; ``staleness_max`` the largest staleness of any seed.

``baseline(cluster, method, target, nodes_per_cell)`` gives the schedule of
Async (phi = E[d], mu = 1, a static half split) or Colocate (phi = 0,
mu = 2 E[d] + 1, global switch) at the staleness target, on the same cluster
and cells (``gyre.presets``); ``Refused`` when the target cannot be met
(Colocate needs 2 E[d] + 1 whole).

Invariants: ``simulate`` is a pure function of its job (the simulator is
deterministic), so any mapper (local processes, Ray tasks) gives the same
rows; a schedule the simulator refuses comes back as a row with ``error``,
never an exception.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from gyre.config import ConfigError
from gyre.presets import async_split, colocated
from gyre.sim.plan.space import Cluster, Refused

Mapper = Callable[[Callable[[Any], Any], list[Any]], list[Any]]
MEASURES = ("total_hours", "mean_step_hours", "staleness_mean", "staleness_steady_mean", "staleness_max")


@dataclass(frozen=True)
class Workload:
    trace: str  # a trace preset name or a CSV/Parquet path
    steps: int = 12
    seeds: tuple[int, ...] = (0, 1, 2)
    # cost-model overrides (``gyre sim --cost``), sorted; each value typed as its CostModel field (float, int)
    costs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.steps < 1 or not self.seeds:
            raise ValueError(f"a plan needs steps >= 1 and at least one trace seed, got {self.steps}, {self.seeds}")


def simulate(job: tuple[Workload, str, dict[str, Any], int]) -> dict[str, Any]:
    """One simulation of ``(workload, preset, overrides, seed)``: the measures, or ``error``."""
    from gyre.sim.costs import CostModel
    from gyre.sim.runner import run_simulation

    workload, preset, overrides, seed = job
    try:
        summary = run_simulation(preset, workload.trace, steps=workload.steps, seed=seed, overrides=overrides,
                                 costs=CostModel(**dict(workload.costs)), breakdown=False).summary
    except (ConfigError, ValueError) as exc:
        return {"seed": seed, "error": str(exc)}
    return {"seed": seed, "error": None, **{k: summary.get(k) for k in MEASURES}}


def serial_map(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    return [fn(item) for item in items]


@dataclass(frozen=True)
class Evaluation:
    time_h: float
    time_h_std: float
    time_h_min: float
    time_h_max: float
    step_h: float
    step_h_std: float
    staleness: float
    staleness_std: float
    staleness_max: float
    seeds: list[dict[str, Any]] = field(default_factory=list)

    def as_attrs(self) -> dict[str, Any]:
        """Flat JSON-able attributes (what the study stores per trial)."""
        return {k: v for k, v in vars(self).items()}


def _std(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def aggregate(rows: list[dict[str, Any]]) -> Evaluation:
    """Fold per-seed rows into an ``Evaluation``; ``Refused`` with the first error if any seed failed."""
    errors = [r["error"] for r in rows if r.get("error")]
    if errors or not rows:
        raise Refused(errors[0] if errors else "no seed was simulated")
    times = [float(r["total_hours"]) for r in rows]
    steps = [float(r["mean_step_hours"]) for r in rows]
    stale = [float(r["staleness_steady_mean"] if r["staleness_steady_mean"] is not None else r["staleness_mean"])
             for r in rows]
    return Evaluation(time_h=statistics.fmean(times), time_h_std=_std(times), time_h_min=min(times),
                      time_h_max=max(times), step_h=statistics.fmean(steps), step_h_std=_std(steps),
                      staleness=statistics.fmean(stale), staleness_std=_std(stale),
                      staleness_max=float(max(r["staleness_max"] for r in rows)), seeds=list(rows))


def evaluate(workload: Workload, overrides: dict[str, Any], mapper: Mapper = serial_map,
             preset: str = "E0") -> Evaluation:
    """``overrides`` (a full schedule) simulated on every trace seed through ``mapper``, aggregated."""
    return aggregate(mapper(simulate, [(workload, preset, overrides, s) for s in workload.seeds]))


def baseline(cluster: Cluster, method: str, target: float, nodes_per_cell: int) -> dict[str, Any]:
    """The full schedule of ``method`` ("async" or "colocate") at mean staleness ``target`` (module docstring)."""
    shape = cluster.shape(nodes_per_cell)
    try:
        if method == "async":
            cfg = async_split(shape, phi=target, mu=1)
        elif method == "colocate":
            mu = 2 * target + 1
            if abs(mu - round(mu)) > 1e-9:
                raise Refused(f"Colocate reaches E[d] = {target:g} only with mu = 2 E[d] + 1 = {mu:g}, "
                              "not a whole number of steps")
            cfg = colocated(shape, phi=0.0, mu=int(round(mu)), granularity="global")
        else:
            raise ValueError(f"unknown baseline {method!r}; known: async, colocate")
        return vars(cfg.replace_fields())
    except ConfigError as exc:
        raise Refused(f"{method} at E[d] = {target:g}: {exc}") from None
