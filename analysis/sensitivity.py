"""``gyre sensitivity``: how the ranking of schedules moves when one cost constant moves.

    gyre sensitivity [--presets A0,C2,E0,...] [--trace nl2repo-122b] [--steps 12]
                     [--only publish_s,train_utilisation] [--jobs 2] --out DIR

Every cost constant of ``gyre.sim.costs.CostModel``, and the scheduler
constants ``rho_min`` and ``tau`` (the paper does not give them), is set, one
at a time, to a low and a high value (its stated uncertainty, ``ranges()``)
with all others at their defaults, and every preset is simulated on the same
trace and seed. For each variation the table gives each preset's total time
relative to the focal preset (E0), the focal preset's rank (1 = fastest),
Kendall's tau between that ranking and the default one (1 = unchanged) and
the ranking itself. The tornado figure shows, per constant, the focal
preset's speedup over the fastest other preset at the low and the high
value, around the default's. docs/simulator.md section 5 holds the table.

Ranges (ours, stated): x0.5 and x2 of each non-zero default, except
``train_utilisation`` 0.15-0.40 (the derivation's range, ``sim.costs``),
``engine_reference_load`` 0.5-1.0 (a share of capacity), ``publish_engine_s`` 0-5 s
(default 0: engines load in parallel), ``rho_min``
0.25-0.75 (default 0.5), ``tau`` 0-120 s (default 30 s);
``micro_step_tokens`` 2048 and 4,194,304 (2^22, ours: five or six mean executions
of the 122B trace, 7.4e5 trained tokens each, share a micro-step; at 4096 each is
a micro-step of its own); ``j_max`` 1 and 10; ``evaluation_s`` 0 and 600 s (scoring
folded into the trace vs ten minutes); ``reroute_recompute_s`` 0 and 60 s.

Invariants: the default row is the unvaried CostModel; a variation changes
exactly one constant; rankings are computed from the same runs the table
shows.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

FOCAL = "E0"
STEM = "sensitivity"
SKIPPED = ("slowdown_per_load", "satellite_to_training_s", "satellite_to_rollout_s")  # None: the core's
FIXED_RANGES = {"micro_step_tokens": (2048, 4_194_304), "j_max": (1, 10),
                "evaluation_s": (0.0, 600.0),
                "reroute_recompute_s": (0.0, 60.0), "train_utilisation": (0.15, 0.40),
                "engine_reference_load": (0.5, 1.0), "publish_engine_s": (0.0, 5.0)}
SCHEDULER_RANGES = {"rho_min": (0.25, 0.75), "tau": (0.0, 120.0)}  # SchedulerConfig fields, not costs


def ranges() -> dict[str, tuple[Any, Any]]:
    """The (low, high) value of every varied constant (module docstring)."""
    from gyre.sim.costs import CostModel

    out = {}
    for field in dataclasses.fields(CostModel):
        if field.name in SKIPPED:
            continue
        out[field.name] = FIXED_RANGES.get(field.name, (field.default * 0.5, field.default * 2.0))
    return {**SCHEDULER_RANGES, **out}


def variations(only: list[str] | None = None) -> list[tuple[str, str, Any]]:
    """(constant, "low"/"high"/"default", value) rows, the default first."""
    table = ranges()
    unknown = sorted(set(only or ()) - set(table))
    if unknown:
        raise ValueError(f"unknown cost constant(s) {unknown}; known: {', '.join(table)}")
    rows: list[tuple[str, str, Any]] = [("default", "default", None)]
    for name in only or table:
        low, high = table[name]
        rows += [(name, "low", low), (name, "high", high)]
    return rows


def _run(job: tuple[str, str, int, str, Any]) -> float:
    from gyre.sim.costs import CostModel
    from gyre.sim.runner import run_simulation

    preset, trace, steps, constant, value = job
    if constant in SCHEDULER_RANGES:
        return run_simulation(preset, trace, steps=steps, seed=0, overrides={constant: value}).summary["total_hours"]
    costs = CostModel() if constant == "default" else CostModel(**{constant: value})
    return run_simulation(preset, trace, steps=steps, seed=0, costs=costs).summary["total_hours"]


def run_sensitivity(presets: list[str], *, trace: str = "nl2repo-122b", steps: int = 12,
                    only: list[str] | None = None, jobs: int = 2) -> pd.DataFrame:
    """One row per variation: each preset's total hours, ratio to the focal preset, rank and Kendall's tau."""
    if FOCAL not in presets:
        raise ValueError(f"the presets must include the focal preset {FOCAL}")
    rows = variations(only)
    work = [(p, trace, steps, c, v) for c, _, v in rows for p in presets]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        hours = list(pool.map(_run, work))
    table = pd.DataFrame([{"constant": c, "side": s, "value": v} for c, s, v in rows])
    grid = np.array(hours).reshape(len(rows), len(presets))
    for j, preset in enumerate(presets):
        table[f"{preset}_h"] = grid[:, j]
        table[f"{preset}_vs_{FOCAL}"] = grid[:, j] / grid[:, presets.index(FOCAL)]
    order = np.argsort(np.argsort(grid, axis=1), axis=1) + 1  # rank 1 = fastest
    table[f"{FOCAL}_rank"] = order[:, presets.index(FOCAL)]
    table["kendall_tau"] = [kendalltau(order[0], order[i]).statistic if len(presets) > 1 else 1.0
                            for i in range(len(rows))]
    table["ranking"] = [" < ".join(presets[j] for j in np.argsort(grid[i], kind="stable")) for i in range(len(rows))]
    others = [j for j, p in enumerate(presets) if p != FOCAL]
    table[f"{FOCAL}_speedup_over_best_other"] = (grid[:, others].min(axis=1) / grid[:, presets.index(FOCAL)]
                                                 if others else np.nan)
    return table


def draw(table: pd.DataFrame):
    """Tornado: per constant, the focal preset's speedup over the best other at its low and high value."""
    from gyre.analysis.plotting import house_style, new_figure

    key = f"{FOCAL}_speedup_over_best_other"
    base = float(table.loc[table.side == "default", key].iloc[0])
    varied = table[table.side != "default"].pivot(index="constant", columns="side", values=key)
    varied = varied.reindex(varied.sub(base).abs().max(axis=1).sort_values().index)
    with house_style():
        fig, ax = new_figure(6.5, 0.35 * len(varied) + 1.2)
        for i, (_, row) in enumerate(varied.iterrows()):
            for side, colour in (("low", "#4C8BD6"), ("high", "#D1495B")):
                ax.barh(i, row[side] - base, left=base, color=colour, height=0.6,
                        label=f"{side} value" if i == 0 else None)
        ax.axvline(base, color="black", lw=1.0)
        ax.set_yticks(range(len(varied)), list(varied.index))
        ax.set_xlabel(f"{FOCAL} speedup over the fastest other preset (default {base:.3f})")
        ax.legend(frameon=False, loc="lower right")
        return fig


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sensitivity", help="how the ranking of presets moves with each cost constant")
    p.add_argument("--presets", default="A0,A2,C0,C1,C2,C3,E0,E1,E2",
                   help="comma-separated presets (must include E0)")
    p.add_argument("--trace", default="nl2repo-122b")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--only", help="comma-separated cost constants (default: all but slowdown_per_load)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from gyre.analysis.plotting import save_figure
    from gyre.config import ConfigError
    from gyre.formats.tables import write_csv
    from gyre.sim.report import format_table

    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    only = [c.strip() for c in args.only.split(",")] if args.only else None
    try:
        table = run_sensitivity(presets, trace=args.trace, steps=args.steps, only=only, jobs=args.jobs)
    except (ConfigError, ValueError) as exc:
        print(f"gyre sensitivity: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    columns = ["constant", "side", "value", *(f"{p}_vs_{FOCAL}" for p in presets), f"{FOCAL}_rank", "kendall_tau",
               f"{FOCAL}_speedup_over_best_other", "ranking"]
    write_csv(args.out / "sensitivity.csv", list(table.columns), table.to_dict("records"))
    print(format_table(columns, table[columns].to_dict("records")))
    save_figure(draw(table), args.out, STEM)
    print(f"wrote {args.out}/sensitivity.csv and {STEM}.png/.svg")
    return 0
