"""``gyre plan``: search the schedule space for a workload and a cluster, and draw the Pareto front.

    gyre plan [--trace nl2repo-122b|PATH] [--nodes 32] [--cell-sizes 2,4,8] [--target 1.5]
              [--target-max 3] [--budget 200] [--steps 12] [--trace-seeds 3] [--seed 0]
              [--jobs 2 | --ray ADDRESS] [--fix key=value ...] [--costs FILE] [--cost key=value ...] --out DIR

The search and its files are ``gyre.sim.plan`` (``plan.run_plan``); this
module parses the command line, builds the request and draws ``pareto.png``
/ ``.svg``: every evaluated schedule as mean total time against mean
staleness (refused ones are not drawn), the Pareto front joined, the
recommendation ringed, Async and Colocate at the target as labelled marks,
and the target as a vertical line. A trace file (a real run's ``trace.csv``)
is the same executions on every run, so it is simulated with one seed; its
sidecar (``gyre.formats.trace_meta``) gives the cluster.

Bad input (an unknown field in ``--fix``, a cell size larger than the
cluster, a study in ``--out`` made for other arguments) prints ``gyre plan:
error: <message>`` and exits 2.

Invariants: ``pareto_points`` returns exactly what the picture draws.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

STEM = "pareto"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="search the schedule for a workload and a cluster (Optuna, simulated)")
    p.add_argument("--trace", default="nl2repo-122b", help="trace preset (seeded per run) or CSV/Parquet path")
    p.add_argument("--nodes", type=int, help="nodes in the cluster (default: the workload's)")
    p.add_argument("--cell-sizes", help="cell sizes in nodes the model's layout allows, e.g. 2,4,8")
    p.add_argument("--target", type=float, default=1.5, help="mean staleness target E[d] (default 1.5)")
    p.add_argument("--target-max", type=float, help="maximum staleness allowed (default: none)")
    p.add_argument("--budget", type=int, default=200, help="evaluations in the study, in all (default 200)")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per simulation")
    p.add_argument("--trace-seeds", type=int, default=3, help="trace seeds per candidate (0..S-1)")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--batch", type=int, default=4, help="candidates asked of the sampler at a time")
    p.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE",
                   help="hold a searched field at one value, e.g. --fix streaming=true")
    p.add_argument("--costs", dest="cost_file", type=Path, metavar="FILE", help="a TOML [costs] table")
    p.add_argument("--cost", dest="costs", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--ray", metavar="ADDRESS", help="evaluate on the Ray cluster at ADDRESS (HOST:PORT or auto) "
                   "instead of --jobs local processes; same results for the same seeds")
    p.add_argument("--out", type=Path, required=True, help="folder for plan.db and the plan's files")
    p.set_defaults(func=run_command)


def evaluation_mapper(ray_address: str | None, jobs: int) -> Any:
    """A context yielding the mapper evaluations run through: ``jobs`` local processes, or Ray tasks on the
    cluster at ``ray_address``.

    The Ray one lives with the real backend's Ray placement (``gyre.real.cluster.task_map``, which imports
    Ray only when a mapper is made) and is imported here, lazily, as a plain import: the one arrow from
    ``analysis/`` into ``gyre.real``, declared with its reason in ``SEAMS`` of
    tests/core/test_import_contracts.py so the checker sees it. Ray itself stays out of ``sim/`` and
    ``analysis/``. Without Ray installed, entering the context raises one ValueError saying so (the
    commands print it as their error and exit 2)."""
    if ray_address:
        from gyre.real.cluster.task_map import ray_mapper

        return ray_mapper(ray_address)
    from gyre.sim.plan.plan import local_mapper

    return local_mapper(jobs)


def build_request(args: argparse.Namespace) -> Any:
    """The ``PlanRequest`` the arguments describe (ValueError naming a bad one)."""
    from gyre.config import parse_overrides
    from gyre.formats.trace_meta import read_trace_meta
    from gyre.sim.cost_file import load_cost_file
    from gyre.sim.costs import CostModel, parse_cost_overrides
    from gyre.sim.plan.evaluate import Workload
    from gyre.sim.plan.space import SearchSpace, workload_cluster
    from gyre.sim.traces.presets import PRESETS as TRACE_PRESETS

    is_preset = args.trace in TRACE_PRESETS
    meta = None if is_preset else read_trace_meta(args.trace)
    sizes = tuple(int(s) for s in args.cell_sizes.split(",")) if args.cell_sizes else None
    cluster = workload_cluster(args.trace, meta.shape if meta else None, sizes, args.nodes)
    fixed = parse_overrides(args.fix)
    unknown = sorted(set(fixed) - set(SearchSpace().choices()))
    if unknown:
        raise ValueError(f"--fix {unknown}: only searched fields can be fixed: {', '.join(SearchSpace().choices())}")
    costs = {**(load_cost_file(args.cost_file) if args.cost_file else {}), **parse_cost_overrides(args.costs)}
    CostModel(**costs)  # checked here, not in every worker
    seeds = tuple(range(args.trace_seeds)) if is_preset else (0,)
    workload = Workload(trace=str(args.trace), steps=args.steps, seeds=seeds, costs=tuple(sorted(costs.items())))
    from gyre.sim.plan.study import PlanRequest

    return PlanRequest(workload=workload, cluster=cluster, space=SearchSpace(fixed=fixed), target_mean=args.target,
                       target_max=args.target_max, seed=args.seed, batch=args.batch)


def pareto_points(result: Any) -> dict[str, Any]:
    """What ``pareto.png`` draws: all evaluated (time, staleness), the front, the pick and the baselines."""
    from gyre.sim.plan.report import evaluated

    pool = evaluated(result.trials)
    return {"all": [(t.values[1], t.values[0]) for t in pool],
            "front": sorted((t.values[1], t.values[0]) for t in result.front),
            "best": (result.best.values[1], result.best.values[0]) if result.best else None,
            "baselines": {r["method"]: (r["staleness"], r["time_h"]) for r in result.baselines
                          if not r["refused"] and r["method"] != "plan"}}


def draw(result: Any, target: float) -> Any:
    from gyre.analysis.plotting import METHOD_COLORS, house_style, new_figure, style_axes

    data = pareto_points(result)
    with house_style():
        fig, ax = new_figure(5.5, 3.6)
        style_axes(ax)
        if data["all"]:
            ax.scatter(*zip(*data["all"]), s=9, color="#BBBBBB", label="evaluated schedules")
        if data["front"]:
            ax.plot(*zip(*data["front"]), "-o", markersize=4, color=METHOD_COLORS["Gyre"], label="Pareto front")
        if data["best"]:
            ax.plot(*data["best"], "o", markersize=12, markerfacecolor="none", color="black", label="recommended")
        for method, (x, y) in data["baselines"].items():
            ax.plot(x, y, "s", color=METHOD_COLORS[method.capitalize()], label=f"{method.capitalize()} at target")
        ax.axvline(target, color="#7F7F7F", linestyle="--", linewidth=1, label=f"target E[d] = {target:g}")
        ax.set_xlabel("mean staleness (steady state, mean over seeds)")
        ax.set_ylabel("total time (h, mean over seeds)")
        ax.legend(loc="upper right", frameon=False, fontsize=7)
        return fig


def run_command(args: argparse.Namespace) -> int:
    from gyre.analysis.plotting import house_style, save_figure
    from gyre.sim.costs import CostError
    from gyre.sim.plan.plan import run_plan

    try:
        request = build_request(args)
        with evaluation_mapper(args.ray, args.jobs) as mapper:
            result = run_plan(request, args.out, args.budget, mapper,
                              progress=lambda n: print(f"\r{n}/{args.budget} evaluations", end="", file=sys.stderr))
            nodes = getattr(mapper, "nodes", None)
    except (ValueError, CostError, FileNotFoundError) as exc:
        print(f"\ngyre plan: error: {exc}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    with house_style():
        figures = save_figure(draw(result, request.target_mean), args.out, STEM)
    print(result.report)
    if nodes:
        print(f"evaluated on {len(nodes)} Ray node(s): {sum(nodes.values())} tasks")
    print(f"wrote {', '.join(str(p) for p in [*result.files, *figures])}")
    return 0
