"""Grids of simulations: the ablation family and the method comparison.

- ablation: the eleven presets of docs/scheduler.md#baselines-and-ablations on one trace and seed, written to
  ``ablation.csv`` (preset, total_hours, vs_E0) where ``vs_E0`` is a preset's
  total time divided by E0's (above 1: slower than E0).
- methods: Async, Colocate and Gyre at E[d] 1 and 1.5 on each workload preset,
  written to ``methods.csv`` with Gyre's speedups (other's time / Gyre's time).
Each run's own tables go to ``DIR/<name>/`` when an output folder is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre.formats.tables import write_csv
from gyre.presets import ABLATION_NAMES, WORKLOAD_SHAPES
from gyre.sim.costs import CostModel
from gyre.sim.report import format_table
from gyre.sim.runner import run_simulation


def _run(name: str, trace: str, steps: int, seed: int, overrides: dict[str, Any], costs: CostModel,
         out: Path | None, sub: str) -> dict[str, Any]:
    result = run_simulation(name, trace, steps=steps, seed=seed, overrides=overrides, costs=costs)
    if out is not None:
        result.write(out / sub)
    return result.summary


def run_ablation_grid(trace: str = "nl2repo-122b", steps: int = 12, seed: int = 0,
                      overrides: dict[str, Any] | None = None, costs: CostModel | None = None,
                      out: Path | None = None) -> str:
    costs = costs or CostModel()
    summaries = {n: _run(n, trace, steps, seed, overrides or {}, costs, out, n) for n in ABLATION_NAMES}
    base = summaries["E0"]["total_hours"]
    rows = [{"preset": n, "total_hours": s["total_hours"], "vs_E0": round(s["total_hours"] / base, 6),
             "staleness_mean": s["staleness_mean"], "transitions": s["transitions"]}
            for n, s in summaries.items()]
    columns = ("preset", "total_hours", "vs_E0", "staleness_mean", "transitions")
    if out is not None:
        write_csv(out / "ablation.csv", columns, rows)
    return format_table(columns, rows)


def run_methods_grid(trace: str | None = None, steps: int = 12, seed: int = 0,
                     overrides: dict[str, Any] | None = None, costs: CostModel | None = None,
                     out: Path | None = None) -> str:
    costs = costs or CostModel()
    workloads = [trace] if trace in WORKLOAD_SHAPES and trace != "nl2repo-122b" else list(WORKLOAD_SHAPES)
    rows = []
    for workload in workloads:
        for ed in ("1", "1.5"):
            hours = {m: _run(f"{m}-{ed}", workload, steps, seed, overrides or {}, costs, out,
                             f"{workload}/{m}-{ed}")["total_hours"] for m in ("async", "colocate", "gyre")}
            rows.append({"workload": workload, "E[d]": ed, "async_hours": hours["async"],
                         "colocate_hours": hours["colocate"], "gyre_hours": hours["gyre"],
                         "speedup_vs_async": round(hours["async"] / hours["gyre"], 6),
                         "speedup_vs_colocate": round(hours["colocate"] / hours["gyre"], 6)})
    columns = ("workload", "E[d]", "async_hours", "colocate_hours", "gyre_hours", "speedup_vs_async",
               "speedup_vs_colocate")
    if out is not None:
        write_csv(out / "methods.csv", columns, rows)
    return format_table(columns, rows)
