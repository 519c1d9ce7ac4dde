"""Theorem A.1, numerically: measured staleness over a (phi, mu, B, N, trace) grid.

Each grid point runs the full simulator (policy core + SimPy driver, boundary
dispatch, the ``preset`` schedule, default ``E0``) for ``steps`` steps on a
generated trace, keeps the steady-state window of whole bursts
(``gyre.staleness.steady_window``), and compares the group-weighted mean staleness
with phi + (mu - 1) / 2. It also records what the identity does not cover:
the token-weighted mean, the maximum, percentiles and the distribution.

Continuous dispatch runs the same simulator with the policy core's
``dispatch="continuous"`` and is compared with its closed form
phi + mu + (mu - 1) / 2; the group-level queue model
(``dispatch.simulate_queue``) cross-checks both policies
(``model_boundary_measured``, ``model_continuous_measured``). ``difference`` =
continuous mean - boundary mean (both simulator), predicted to be exactly mu.

Named rows run the Colocate and Async method presets themselves (global
switch; static split) rather than E0 with their (phi, mu).

Cluster per (B, N): ``scaled_shape`` keeps the paper's geometry per batch: 8
cells, one node per group of a batch (nodes = B), and rollout capacity for 2.25
batches (36 concurrent executions per node at N = 16, scaled with N), so a
step costs the same training time at every (B, N): training follows trained
tokens (``gyre.sim.sizes``), so ``paper_step_costs`` scales the utilisation
by the trace's trained tokens per group over a paper group's. B must be a multiple of 8
and phi * B whole.

Invariants: points are run in a fixed order and each is deterministic (trace
seeded by ``seed``), so equal grids give equal reports except wall time.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from gyre.analysis.dispatch import QueueModel, predicted_mean, simulate_queue
from gyre.analysis.staleness import staleness_distribution, staleness_stats
from gyre.config import SchedulerConfig
from gyre.formats.trace import Trace
from gyre.presets import ClusterShape, build_preset
from gyre.sim.costs import CostModel
from gyre.sim.driver import Simulation
from gyre.sim.traces.presets import generate_trace, get_preset
from gyre.staleness import steady_window

TRACE_QUERIES = 400
#: Seconds of training per group in the queue model: an E0 step at paper scale
#: takes 2,500-4,900 s of training (steps.csv), about 2,700 s for B groups.
MODEL_STEP_S = 2700.0
NAMED_PRESETS = ("colocate-1.5", "colocate-1", "async-1.5", "async-1")


@dataclass(frozen=True, kw_only=True)
class TheoremGrid:
    """What ``gyre theorem`` runs; the defaults are its default grid (116 runs, about 25 s of CPU).

    Adding the paper's own (32, 16) (``--shapes 8x4,16x8,32x16``) makes 174
    runs and about 95 s of CPU.
    """

    phis: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.5)
    mus: tuple[int, ...] = (1, 2, 3, 4, 5)
    shapes: tuple[tuple[int, int], ...] = ((8, 4), (16, 8))  # (B, N)
    traces: tuple[str, ...] = ("nl2repo-122b", "deepswe")
    steps: int = 60
    seed: int = 0
    tolerance: float = 0.05
    preset: str = "E0"
    named: tuple[str, ...] = NAMED_PRESETS

    def points(self) -> list[GridPoint]:
        out = []
        for trace in self.traces:
            for B, N in self.shapes:
                out += [GridPoint(trace, B, N, phi, mu, self.preset, self.steps, self.seed)
                        for phi in self.phis for mu in self.mus]
                out += [GridPoint(trace, B, N, None, None, name, self.steps, self.seed) for name in self.named]
        return out


#: A grid small enough for the test suite (about 5 s).
SMALL_GRID = TheoremGrid(phis=(0.0, 0.5, 1.5), mus=(1, 2, 3), shapes=((8, 4),), traces=("deepswe",),
                         steps=30, named=("colocate-1", "async-1"))


@dataclass(frozen=True)
class GridPoint:
    """One run; ``phi``/``mu`` None means a named method preset with its own values."""

    trace: str
    B: int
    N: int
    phi: float | None
    mu: int | None
    preset: str
    steps: int
    seed: int

    @property
    def named(self) -> bool:
        return self.phi is None


def scaled_shape(B: int, N: int) -> ClusterShape:
    """The paper cluster (8 cells, B = 32, N = 16) scaled to (B, N); see the module docstring."""
    if B % 8:
        raise ValueError(f"B must be a multiple of 8 (8 cells of B/8 nodes), got {B}")
    return ClusterShape(nodes=B, nodes_per_cell=B // 8, per_node_capacity=max(1, round(36 * N / 16)), N=N, B=B)


@functools.lru_cache(maxsize=16)
def _trace(name: str, N: int, seed: int) -> Trace:
    return generate_trace(name, TRACE_QUERIES, np.random.default_rng(seed), N=N)


def case_label(phi: float, mu: int) -> str:
    if phi == 0 and mu == 1:
        return "Colocate+Async"
    return "Colocate (phi=0)" if phi == 0 else "Async (mu=1)" if mu == 1 else ""


def _config(point: GridPoint) -> SchedulerConfig:
    shape = scaled_shape(point.B, point.N)
    if point.named:
        return build_preset(point.preset, shape)
    return build_preset(point.preset, shape, phi=point.phi, mu=point.mu)


def _stats_row(prefix: str, groups: pd.DataFrame, window: tuple[int, int], predicted: float) -> dict[str, Any]:
    stats = staleness_stats(groups, window)
    row = {f"{prefix}{k}": v for k, v in stats.items() if k != "mean"}
    row[f"{prefix}predicted"] = predicted
    row[f"{prefix}measured"] = stats["mean"]
    row[f"{prefix}error"] = stats["mean"] - predicted
    dist = staleness_distribution(groups, window)
    row[f"{prefix}distribution"] = {str(int(k)): float(v) for k, v in dist.items()}
    return row


def _model_groups(cfg: SchedulerConfig, trace: Trace, policy: str, steps: int) -> pd.DataFrame:
    tokens = trace.column("output_tokens")
    model = QueueModel(B=cfg.B, phi=cfg.phi, mu=cfg.mu, policy=policy, train_s_per_group=MODEL_STEP_S / cfg.B,
                       publish_s=CostModel().publish_s, capacity_groups=(cfg.C_s + cfg.K * cfg.C_e) // cfg.N)
    return simulate_queue(model, trace.durations_s.max(axis=1), steps,
                          tokens=None if tokens is None else tokens.sum(axis=1))


def paper_step_costs(trace: Trace) -> CostModel:
    """Default costs with the utilisation scaled so a group trains as long as a paper group (16 executions of
    ``FALLBACK_EXECUTION_TOKENS``) on its one node: a step costs the same at every (B, N) and trace."""
    from gyre.sim.sizes import FALLBACK_EXECUTION_TOKENS, trained_tokens

    base = CostModel()
    group_tokens = float(trained_tokens(trace, base.j_max).sum(axis=1).mean())
    scale = max(group_tokens, 1.0) / (16 * FALLBACK_EXECUTION_TOKENS)
    return CostModel(train_utilisation=min(1.0, base.train_utilisation * scale))


def validate(grid: TheoremGrid) -> None:
    """Raise ValueError (or ConfigError) naming the first impossible grid point, before any run."""
    if grid.steps < 1 or grid.tolerance < 0:
        raise ValueError(f"need steps >= 1 and tolerance >= 0, got {grid.steps} and {grid.tolerance}")
    for name in grid.traces:
        get_preset(name)
    for point in grid.points():
        cfg = _config(point)
        steady_window(cfg.phi, cfg.mu, point.steps)


def run_point(point: GridPoint) -> dict[str, Any]:
    """Measure one grid point; a flat dict (see ``theorem_report`` for the columns)."""
    cfg = _config(point)
    trace = _trace(point.trace, point.N, point.seed)
    window = steady_window(cfg.phi, cfg.mu, point.steps)
    costs = paper_step_costs(trace)
    record = Simulation(cfg, trace, costs, point.steps).run()
    groups = pd.DataFrame(record.consumed_groups(point.steps))
    row: dict[str, Any] = {
        "kind": "named" if point.named else "grid", "preset": point.preset, "trace": point.trace,
        "B": cfg.B, "N": cfg.N, "phi": cfg.phi, "mu": cfg.mu, "steps": point.steps,
        "case": point.preset if point.named else case_label(cfg.phi, cfg.mu),
        "window_first": window[0], "window_stop": window[1],
        **_stats_row("", groups, window, predicted_mean("boundary", cfg.phi, cfg.mu)),
    }
    if not point.named:
        cont_cfg = cfg.replace_fields(dispatch="continuous")
        cont = pd.DataFrame(Simulation(cont_cfg, trace, costs, point.steps).run().consumed_groups(point.steps))
        row.update(_stats_row("continuous_", cont, window, predicted_mean("continuous", cfg.phi, cfg.mu)))
        model_cont = _model_groups(cfg, trace, "continuous", point.steps)
        row["model_continuous_measured"] = staleness_stats(model_cont, window)["mean"]
        bound = _model_groups(cfg, trace, "boundary", point.steps)
        bound_stats = staleness_stats(bound, window)
        row["model_boundary_measured"], row["model_boundary_max"] = bound_stats["mean"], bound_stats["max"]
        row["difference"] = row["continuous_measured"] - row["measured"]
        row["predicted_difference"] = float(cfg.mu)
    return row


@dataclass
class TheoremReport:
    grid: TheoremGrid
    rows: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    def frame(self, kind: str | None = None) -> pd.DataFrame:
        rows = [r for r in self.rows if kind is None or r["kind"] == kind]
        return pd.DataFrame(rows)

    def max_abs_error(self, column: str = "error") -> float:
        values = [abs(r[column]) for r in self.rows if column in r]
        return max(values) if values else float("nan")

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Rows whose boundary or continuous mean misses its prediction by more than the tolerance."""
        tol = self.grid.tolerance
        return [r for r in self.rows
                if not abs(r["error"]) <= tol or ("continuous_error" in r and not abs(r["continuous_error"]) <= tol)]

    @property
    def passed(self) -> bool:
        return not self.failures


def run_theorem(grid: TheoremGrid, jobs: int = 1,
                on_point: Callable[[int, int, dict[str, Any]], None] | None = None) -> TheoremReport:
    """Run every grid point (``jobs`` processes); ``on_point(done, total, row)`` after each."""
    points = grid.points()
    t0 = time.perf_counter()
    report = TheoremReport(grid)
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = pool.map(run_point, points, chunksize=4)
            _collect(report, results, len(points), on_point)
    else:
        _collect(report, map(run_point, points), len(points), on_point)
    report.wall_s = time.perf_counter() - t0
    return report


def _collect(report: TheoremReport, results: Any, total: int,
             on_point: Callable[[int, int, dict[str, Any]], None] | None) -> None:
    for i, row in enumerate(results, start=1):
        report.rows.append(row)
        if on_point:
            on_point(i, total, row)
