"""``gyre sim``: simulate a schedule on a trace, or a grid of schedules.

    gyre sim [--preset E0] [--trace nl2repo-122b|PATH] [--steps 12] [--seed 0]
             [--set section.field=value ...] [--costs FILE] [--cost key=value ...] [--out DIR]
    gyre sim --grid ablation|methods [--steps 12] [--seeds S] [--out DIR]

``--set`` takes the dotted syntax ``gyre run`` takes too (``gyre.overrides``):
``schedule.<field>`` (a ``SchedulerConfig`` field) or ``costs.<field>`` (a
``CostModel`` constant, as ``--cost``); the section may be left out
(``--set phi=0.5``). A trace's ``trace.json`` (a real run's) supplies the
preset, cluster and schedule it ran under: what it supplies is printed (stderr).

Bad input (unknown preset or field, malformed trace, impossible config) prints
``gyre sim: error: <message naming the problem>`` (an override's names the
flag and the field) and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sim", help="simulate a schedule from a rollout-duration trace")
    p.add_argument("--preset", help="schedule preset (A0..E2, async, colocate, gyre, ...); default: the "
                   "trace's recorded preset (a real run's trace.json), else E0")
    p.add_argument("--trace", default="nl2repo-122b", help="trace preset name or CSV/Parquet path")
    p.add_argument("--steps", type=int, help="optimizer steps to simulate (default: a real run's own steps, "
                   "from RUN/log/events.csv beside its trace; else 12)")
    p.add_argument("--seed", type=int, default=0, help="seed for generated traces")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a schedule field or a cost constant, e.g. --set schedule.phi=0.5 "
                        "(section optional: --set phi=0.5), --set costs.publish_s=60")
    p.add_argument("--costs", dest="cost_file", type=Path, metavar="FILE",
                   help="a TOML [costs] table, e.g. the costs.toml `gyre calibrate RUN_DIR` writes")
    p.add_argument("--cost", dest="costs", action="append", default=[], metavar="KEY=VALUE",
                   help="override a cost constant, e.g. --cost publish_s=60")
    p.add_argument("--grid", choices=("ablation", "methods"), help="run a grid of presets instead of one")
    p.add_argument("--seeds", type=int, default=1, help="grid: trace seeds SEED..SEED+S-1; figures as mean and "
                   "spread, with the orderings that hold on every seed")
    p.add_argument("--out", type=Path, help="directory for summary.json and the CSV tables")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from gyre.config import ConfigError
    from gyre.formats.trace import TraceError
    from gyre.sim.costs import CostError, CostModel, parse_cost_overrides

    try:
        if args.steps is None:
            from gyre.sim.run_folder import recorded_steps

            args.steps = recorded_steps(args.trace) or 12
        overrides, cost_pairs = _overrides(args.overrides)
        from gyre.sim.cost_file import load_cost_file

        base = load_cost_file(args.cost_file) if args.cost_file else {}
        costs = CostModel(**{**base, **parse_cost_overrides(cost_pairs + args.costs)})
        if args.grid:
            return _grid(args, overrides, costs)
        return _single(args, overrides, costs)
    except (ConfigError, CostError, TraceError, ValueError, FileNotFoundError) as exc:
        print(f"gyre sim: error: {exc}", file=sys.stderr)
        return 2


def _overrides(items: list[str]) -> tuple[dict, list[str]]:
    """``--set`` assignments: typed schedule fields, and cost pairs for ``parse_cost_overrides``."""
    import dataclasses

    from gyre.config import ConfigError, SchedulerConfig, parse_overrides
    from gyre.overrides import parse_assignments
    from gyre.sim.costs import CostError, CostModel

    sections = {"schedule": [f.name for f in dataclasses.fields(SchedulerConfig)],
                "costs": [f.name for f in dataclasses.fields(CostModel)]}
    schedule, costs = {}, []
    for a in parse_assignments("--set", items, sections):
        pair = f"{a.field}={a.raw}"
        if a.section == "costs":
            costs.append(pair)
            continue
        try:
            schedule.update(parse_overrides([pair]))
        except (ConfigError, CostError) as exc:
            raise a.problem(str(exc)) from None
    return schedule, costs


def _say_trace_defaults(args) -> None:
    """What a trace's ``trace.json`` supplies (its preset, cluster and schedule), so no default is silent."""
    from gyre.formats.trace_meta import read_trace_meta
    from gyre.sim.traces.presets import PRESETS as TRACE_PRESETS

    if args.trace in TRACE_PRESETS:
        return
    meta = read_trace_meta(args.trace)
    if meta is None:
        return
    preset = args.preset or meta.preset
    schedule = dict(meta.schedule) if preset == meta.preset else {}
    print(f"gyre sim: {args.trace} has a trace.json (written by {meta.source}): cluster {meta.shape}, "
          f"preset {preset}{' (from trace.json)' if not args.preset else ''}, schedule from trace.json "
          f"{schedule or '{}'}; --preset and --set override them", file=sys.stderr)


def _single(args, overrides, costs) -> int:
    from gyre.sim.progress import step_progress
    from gyre.sim.report import format_summary
    from gyre.sim.runner import run_simulation

    _say_trace_defaults(args)
    with step_progress(args.steps, f"{args.preset or 'schedule'} on {args.trace}") as on_step:
        result = run_simulation(args.preset, args.trace, steps=args.steps, seed=args.seed,
                                overrides=overrides, costs=costs, on_step=on_step)
    print(format_summary(result.summary))
    if args.out:
        result.write(args.out)
        print(f"wrote {args.out}/summary.json, steps.csv, groups.csv, roles.csv, executions.csv, events.csv")
    return 0


def _grid(args, overrides, costs) -> int:
    from gyre.sim.grids import run_ablation_grid, run_methods_grid

    runner = run_ablation_grid if args.grid == "ablation" else run_methods_grid
    extra = {"seeds": args.seeds} if args.seeds != 1 else {}
    table = runner(trace=args.trace, steps=args.steps, seed=args.seed, overrides=overrides, costs=costs,
                   out=args.out, **extra)
    print(table)
    return 0
