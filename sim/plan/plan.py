"""``run_plan``: search, then write what the plan found into its output folder.

OUT/ after a plan:

| file                 | what it holds                                                              |
|----------------------|----------------------------------------------------------------------------|
| ``plan.db``          | the Optuna study (SQLite): rerun to resume, or with a larger budget to extend |
| ``trials.csv``       | every trial: the schedule, the three objectives and their spread, refusals |
| ``pareto.csv``       | the Pareto front (total time vs mean and max staleness)                    |
| ``baselines.csv``    | the recommended schedule beside Async and Colocate at the same mean staleness |
| ``recommendation.json`` | the recommended schedule, its predictions and spread over seeds        |
| ``job.toml``         | a ``gyre run --config`` file for the recommended schedule                   |

``local_mapper(jobs)`` runs (candidate, seed) simulations in ``jobs`` worker
processes (1: in this process); any mapper gives the same result
(``gyre.sim.plan.study``).

Invariants: the files are rewritten from the whole study after every run, so
they always describe every trial stored; a plan whose study finished without
a feasible schedule writes no ``job.toml`` and says so in ``recommendation.json``.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from gyre.formats.tables import write_csv
from gyre.sim.plan.evaluate import Mapper, evaluate
from gyre.sim.plan.evaluate import baseline as baseline_schedule
from gyre.sim.plan.report import job_file, pareto_front, recommend, spread_line, trial_row
from gyre.sim.plan.space import Refused, describe
from gyre.sim.plan.study import PlanRequest, TrialRecord, run_study

DB = "plan.db"


@contextlib.contextmanager
def local_mapper(jobs: int) -> Iterator[Mapper]:
    """A mapper over ``jobs`` worker processes kept for the whole plan (1: no process at all)."""
    if jobs <= 1:
        yield lambda fn, items: [fn(item) for item in items]
        return
    import gyre.sim.runner  # noqa: F401  imported once here, before the workers fork
    from gyre.sim.workers import collecting, simulation_pool

    with simulation_pool(jobs) as pool:
        yield lambda fn, items: list(pool.map(collecting(fn), items))


@dataclass
class PlanResult:
    trials: list[TrialRecord]
    front: list[TrialRecord]
    best: TrialRecord | None
    baselines: list[dict[str, Any]]
    files: list[Path]
    report: str


def _baseline_rows(request: PlanRequest, best: TrialRecord | None, mapper: Mapper) -> list[dict[str, Any]]:
    size = best.evaluated_schedule["nodes_per_cell"] if best else request.cluster.cell_sizes[0]
    rows = []
    if best is not None:
        rows.append({"method": "plan", "schedule": describe(best.evaluated_schedule, request.cluster),
                     **{k: round(best.attrs[k], 6) for k in ("time_h", "time_h_std", "staleness", "staleness_max")},
                     "refused": ""})
    for method in ("async", "colocate"):
        row: dict[str, Any] = {"method": method, "schedule": "", "time_h": "", "time_h_std": "",
                               "staleness": "", "staleness_max": "", "refused": ""}
        try:
            schedule = baseline_schedule(request.cluster, method, request.target_mean, size)
            result = evaluate(request.workload, schedule, mapper)
            row.update(schedule=f"{method}: phi {schedule['phi']:g}, mu {schedule['mu']}, {schedule['K']} cells x "
                                f"{schedule['nodes_per_cell']} nodes", time_h=round(result.time_h, 6),
                       time_h_std=round(result.time_h_std, 6), staleness=round(result.staleness, 6),
                       staleness_max=result.staleness_max)
        except Refused as exc:
            row["refused"] = str(exc)
        rows.append(row)
    return rows


def run_plan(request: PlanRequest, out: Path, budget: int, mapper: Mapper,
             progress: Callable[[int], None] | None = None) -> PlanResult:
    """Search (resuming any study in ``out``) and write the files of the module docstring."""
    out.mkdir(parents=True, exist_ok=True)
    trials = run_study(request, out / DB, budget, mapper, progress)
    front, best = pareto_front(trials), recommend(trials)
    baselines = _baseline_rows(request, best, mapper)
    files = _write(request, out, trials, front, best, baselines)
    return PlanResult(trials, front, best, baselines, files, _report(request, trials, front, best, baselines))


def _write(request: PlanRequest, out: Path, trials: list[TrialRecord], front: list[TrialRecord],
           best: TrialRecord | None, baselines: list[dict[str, Any]]) -> list[Path]:
    rows = [trial_row(t, request.cluster) for t in trials]
    columns = tuple(rows[0]) if rows else ("trial",)
    files = [write_csv(out / "trials.csv", columns, rows),
             write_csv(out / "pareto.csv", columns, [trial_row(t, request.cluster) for t in front]),
             write_csv(out / "baselines.csv", tuple(baselines[0]), baselines)]
    rec: dict[str, Any] = {"target_mean": request.target_mean, "target_max": request.target_max,
                           "trials": len(trials), "refused": sum(t.refused is not None for t in trials)}
    job = out / "job.toml"
    if best is None:
        rec["recommendation"] = None
        rec["why"] = "no evaluated schedule meets the staleness target; extend the budget or relax the target"
        job.unlink(missing_ok=True)
    else:
        keys = ("time_h", "time_h_std", "time_h_min", "time_h_max", "step_h", "step_h_std", "staleness",
                "staleness_std", "staleness_max", "seeds")
        rec["recommendation"] = {"trial": best.number, "schedule": best.evaluated_schedule,
                                 "description": describe(best.evaluated_schedule, request.cluster),
                                 **{k: best.attrs[k] for k in keys}}
        job.write_text(job_file(best.evaluated_schedule, request.cluster, request.workload.steps,
                                f"{describe(best.evaluated_schedule, request.cluster)}\n"
                                f"predicted: {spread_line(best.attrs, len(request.workload.seeds))}"))
        files.append(job)
    (out / "recommendation.json").write_text(json.dumps(rec, indent=2, sort_keys=True, default=str) + "\n")
    return files + [out / "recommendation.json"]


def _report(request: PlanRequest, trials: list[TrialRecord], front: list[TrialRecord], best: TrialRecord | None,
            baselines: list[dict[str, Any]]) -> str:
    refused = sum(t.refused is not None for t in trials)
    target = f"mean staleness <= {request.target_mean:g}" + (
        f", max <= {request.target_max:g}" if request.target_max is not None else "")
    lines = [f"{len(trials)} trials ({refused} refused); target: {target}", "", "Pareto front (time vs staleness):"]
    for t in front:
        mark = "*" if best is not None and t.number == best.number else " "
        lines.append(f" {mark} {t.scores[0]:8.3f} h  staleness {t.scores[1]:.3f} (max {t.scores[2]:g})  "
                     f"{describe(t.evaluated_schedule, request.cluster)}")
    lines.append("")
    if best is None:
        lines.append("no evaluated schedule meets the target: extend the budget (--budget) or relax the target")
    else:
        lines += [f"recommended (trial {best.number}): {describe(best.evaluated_schedule, request.cluster)}",
                  f"  {spread_line(best.attrs, len(request.workload.seeds))}"]
    lines.append("")
    for row in baselines:
        if row["refused"]:
            lines.append(f"  {row['method']:>8}: refused: {row['refused']}")
        else:
            lines.append(f"  {row['method']:>8}: {row['time_h']:8.3f} h  staleness {row['staleness']:.3f} "
                         f"(max {row['staleness_max']:g})  {row['schedule']}")
    return "\n".join(lines)
