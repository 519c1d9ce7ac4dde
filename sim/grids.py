"""Grids of simulations: the ablation family and the method comparison.

- ablation: the eleven presets of docs/scheduler.md#baselines-and-ablations on one trace and seed, written to
  ``ablation.csv`` (preset, total_hours, vs_E0) where ``vs_E0`` is a preset's
  total time divided by E0's (above 1: slower than E0).
- methods: Async, Colocate and Gyre at E[d] 1 and 1.5 on each workload preset,
  written to ``methods.csv`` with Gyre's speedups (other's time / Gyre's time).
Each run's own tables go to ``DIR/<name>/`` when an output folder is given.
``seeds`` > 1 repeats every run on trace seeds ``seed .. seed+seeds-1`` and
reports each figure as a mean with its spread, and the orderings of total
time that hold on every seed (``gyre.sim.seeds``), into ``*_seeds.csv``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre.formats.tables import write_csv
from gyre.presets import ABLATION_NAMES, WORKLOAD_SHAPES
from gyre.sim.costs import CostModel
from gyre.sim.report import format_table
from gyre.sim.runner import run_simulation
from gyre.sim.seeds import format_orderings, orderings, seed_rows, spread_row


def _run(name: str, trace: str, steps: int, seed: int, overrides: dict[str, Any], costs: CostModel,
         out: Path | None, sub: str) -> dict[str, Any]:
    result = run_simulation(name, trace, steps=steps, seed=seed, overrides=overrides, costs=costs)
    if out is not None:
        result.write(out / sub)
    return result.summary


def run_ablation_grid(trace: str = "nl2repo-122b", steps: int = 12, seed: int = 0,
                      overrides: dict[str, Any] | None = None, costs: CostModel | None = None,
                      out: Path | None = None, seeds: int = 1) -> str:
    costs = costs or CostModel()
    if seeds > 1:
        return _ablation_over_seeds(trace, steps, seed, seeds, overrides or {}, costs, out)
    summaries = {n: _run(n, trace, steps, seed, overrides or {}, costs, out, n) for n in ABLATION_NAMES}
    base = summaries["E0"]["total_hours"]
    rows = [{"preset": n, "total_hours": s["total_hours"], "vs_E0": round(s["total_hours"] / base, 6),
             "staleness_mean": s["staleness_mean"], "transitions": s["transitions"]}
            for n, s in summaries.items()]
    columns = ("preset", "total_hours", "vs_E0", "staleness_mean", "transitions")
    if out is not None:
        write_csv(out / "ablation.csv", columns, rows)
    return format_table(columns, rows)


SEED_FIGURES = ("total_hours", "vs_E0", "staleness_mean", "slack", "transitions")


def _ablation_over_seeds(trace: str, steps: int, seed: int, seeds: int, overrides: dict[str, Any],
                         costs: CostModel, out: Path | None) -> str:
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    per_seed: dict[str, list[dict[str, Any]]] = {n: [] for n in ABLATION_NAMES}
    for s in range(seed, seed + seeds):
        runs = {n: _run(n, trace, steps, s, overrides, costs, out, f"seed{s}/{n}") for n in ABLATION_NAMES}
        for n, summary in runs.items():
            per_seed[n].append({**summary, "vs_E0": summary["total_hours"] / runs["E0"]["total_hours"]})
    rows = seed_rows("preset", ABLATION_NAMES, per_seed, SEED_FIGURES)
    settled, unsettled = orderings({n: [r["total_hours"] for r in per_seed[n]] for n in ABLATION_NAMES})
    columns = ("preset", "seeds", *(f"{k}_{m}" for k in SEED_FIGURES for m in ("mean", "sd")))
    if out is not None:
        write_csv(out / "ablation_seeds.csv", columns, rows)
        write_csv(out / "orderings.csv", ("ordering", "holds_on_every_seed"),
                  [{"ordering": o, "holds_on_every_seed": True} for o in settled]
                  + [{"ordering": o, "holds_on_every_seed": False} for o in unsettled])
    return format_table(columns, rows) + "\n" + format_orderings(settled, unsettled, seeds)


def run_methods_grid(trace: str | None = None, steps: int = 12, seed: int = 0,
                     overrides: dict[str, Any] | None = None, costs: CostModel | None = None,
                     out: Path | None = None, seeds: int = 1) -> str:
    costs = costs or CostModel()
    workloads = [trace] if trace in WORKLOAD_SHAPES and trace != "nl2repo-122b" else list(WORKLOAD_SHAPES)
    if seeds > 1:
        return _methods_over_seeds(workloads, steps, seed, seeds, overrides or {}, costs, out)
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


def _methods_over_seeds(workloads: list[str], steps: int, seed: int, seeds: int, overrides: dict[str, Any],
                        costs: CostModel, out: Path | None) -> str:
    rows, lines = [], []
    for workload in workloads:
        for ed in ("1", "1.5"):
            hours = {m: [_run(f"{m}-{ed}", workload, steps, s, overrides, costs, out,
                              f"seed{s}/{workload}/{m}-{ed}")["total_hours"] for s in range(seed, seed + seeds)]
                     for m in ("async", "colocate", "gyre")}
            row: dict[str, Any] = {"workload": workload, "E[d]": ed, "seeds": seeds}
            for m, hs in hours.items():
                spread = spread_row(hs)
                row[f"{m}_hours_mean"], row[f"{m}_hours_sd"] = spread["mean"], spread["sd"]
            for other in ("async", "colocate"):
                spread = spread_row([o / g for o, g in zip(hours[other], hours["gyre"])])
                row[f"speedup_vs_{other}_mean"], row[f"speedup_vs_{other}_sd"] = spread["mean"], spread["sd"]
            rows.append(row)
            settled, unsettled = orderings(hours)
            lines.append(f"{workload} E[d]={ed}: " + format_orderings(settled, unsettled, seeds).replace("\n", "; "))
    columns = tuple(rows[0]) if rows else ()
    if out is not None:
        write_csv(out / "methods_seeds.csv", columns, rows)
    return format_table(columns, rows) + "\n" + "\n".join(lines)
