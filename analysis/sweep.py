"""``gyre sweep``: simulate every combination of schedule fields and map total time and staleness.

    gyre sweep --sweep phi=0,0.5,1 --sweep mu=1..4 [--sweep K=4,8,16] [--preset E0]
               [--trace nl2repo-122b] [--steps 12] [--seeds 3] [--jobs 2 | --ray ADDRESS] --out DIR

Writes ``DIR/sweep.csv`` (one row per point and seed, ``gyre.sim.sweep``) and
``DIR/sweep.png`` / ``.svg``: a heatmap of the mean total time (h) and one of
the mean steady-state staleness over the first two axes, means over the
seeds and over any further axes; refused points are blank and counted in the
title. Prints the table of means. Exit status 2, with the reason, on a bad
``--sweep``.

Invariants: ``sweep_means`` averages exactly the rows without an error; the
heatmaps draw exactly ``heatmap_grid``'s cells.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

STEM = "sweep"
MEASURES = (("total_hours", "total time (h)"), ("staleness_steady_mean", "steady-state staleness"))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sweep", help="simulate every combination of schedule fields (design-space search)")
    p.add_argument("--sweep", action="append", required=True, metavar="KEY=V1,V2|A..B", help="one axis")
    p.add_argument("--preset", default="E0", help="the schedule the axes override (default E0)")
    p.add_argument("--trace", default="nl2repo-122b", help="trace preset (seeded per run) or path")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seeds", type=int, default=1, help="runs per point, seeds 0..S-1")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--ray", metavar="ADDRESS", help="simulate on the Ray cluster at ADDRESS (HOST:PORT or auto) "
                   "instead of --jobs local processes; same rows")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=run_command)


def sweep_means(rows: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    """Per point: the mean of every measure over its seeds (rows with an error left out) and the count."""
    ok = rows[rows["error"].isna()]
    measures = [m for m, _ in MEASURES if m in ok]
    table = ok.groupby(axes, dropna=False)[measures].mean()
    table["runs"] = ok.groupby(axes, dropna=False).size()
    return table.reset_index()


def heatmap_grid(means: pd.DataFrame, axes: list[str], measure: str) -> tuple[list, list, np.ndarray]:
    """(x values, y values, grid[y, x]) of ``measure`` over the first two axes, NaN where no run succeeded."""
    x_key, y_key = axes[0], axes[1] if len(axes) > 1 else None
    xs = sorted(means[x_key].unique())
    ys = sorted(means[y_key].unique()) if y_key else [None]
    grid = np.full((len(ys), len(xs)), np.nan)
    collapsed = means.groupby([x_key] + ([y_key] if y_key else []))[measure].mean()
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            key = (x, y) if y_key else x
            if key in collapsed.index:
                grid[i, j] = collapsed[key]
    return xs, ys, grid


def draw(means: pd.DataFrame, axes: list[str], refused: int):
    from gyre.analysis.plotting import house_style, new_figure

    with house_style():
        fig, panels = new_figure(8.0, 3.4, 1, len(MEASURES))
        for ax, (measure, label) in zip(np.atleast_1d(panels), MEASURES):
            xs, ys, grid = heatmap_grid(means, axes, measure)
            image = ax.imshow(np.ma.masked_invalid(grid), origin="lower", aspect="auto", cmap="viridis")
            low, high = np.nanmin(grid), np.nanmax(grid)
            for (i, j), value in np.ndenumerate(grid):
                if not math.isnan(value):
                    bright = high > low and (value - low) / (high - low) > 0.6
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                            color="black" if bright else "white")
            ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
            ax.set_yticks(range(len(ys)), ["" if y is None else f"{y:g}" for y in ys])
            ax.set_xlabel(axes[0])
            ax.set_ylabel(axes[1] if len(axes) > 1 else "")
            ax.set_title(label)
            fig.colorbar(image, ax=ax, shrink=0.85)
        rest = f"; mean over {', '.join(axes[2:])}" if len(axes) > 2 else ""
        fig.suptitle(f"sweep: mean over seeds{rest}; {refused} refused point(s) blank")
        return fig


def run_command(args: argparse.Namespace) -> int:
    from gyre.analysis.plan import evaluation_mapper
    from gyre.analysis.plotting import save_figure
    from gyre.config import ConfigError
    from gyre.formats.tables import write_csv
    from gyre.sim.report import format_table
    from gyre.sim.sweep import RESULT_KEYS, parse_sweep, run_sweep

    try:
        axes = parse_sweep(args.sweep)
        if args.ray:
            with evaluation_mapper(args.ray, args.jobs) as mapper:
                rows = run_sweep(axes, preset=args.preset, trace=args.trace, steps=args.steps, seeds=args.seeds,
                                 mapper=mapper)
        else:
            rows = run_sweep(axes, preset=args.preset, trace=args.trace, steps=args.steps, seeds=args.seeds,
                             jobs=args.jobs)
    except (ConfigError, ValueError) as exc:
        print(f"gyre sweep: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    keys = list(axes)
    write_csv(args.out / "sweep.csv", [*keys, "seed", *RESULT_KEYS, "wall_seconds", "error"], rows)
    frame = pd.DataFrame(rows)
    refused = int(frame.drop_duplicates(keys)["error"].notna().sum())
    means = sweep_means(frame, keys)
    print(format_table([*keys, *(m for m, _ in MEASURES), "runs"], means.to_dict("records")))
    if not means.empty:
        save_figure(draw(means, keys, refused), args.out, STEM)
    print(f"wrote {args.out}/sweep.csv and {STEM}.png/.svg ({len(rows)} runs, {refused} refused point(s))")
    return 0
