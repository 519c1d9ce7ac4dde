"""``gyre theorem``: check Theorem A.1 numerically and compare continuous dispatch.

    gyre theorem [--json FILE] [--steps 60] [--tolerance 0.05] [--jobs J]
                 [--shapes 8x4,16x8,32x16] [--traces nl2repo-122b,deepswe]
                 [--phis 0,0.5,1,1.5,2.5] [--mus 1,2,3,4,5] [--seed 0] [--small]

Prints the measured steady-state staleness beside phi + (mu - 1) / 2 for every
grid point (see ``gyre.analysis.theorem``), the named Colocate/Async rows,
continuous dispatch beside its closed form, and a verdict. Exit status: 0 when
every measured mean is within the tolerance, 1 when one is not, 2 on bad input.
The default grid (116 runs of 60 steps) takes about 25 s of CPU; adding the
paper's own shape (``--shapes 8x4,16x8,32x16``, 174 runs) about 95 s.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("theorem", help="check the staleness identity E[d] = phi + (mu-1)/2 by simulation")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write every row (with distributions) as JSON")
    p.add_argument("--steps", type=int, help="steps per run (default 60)")
    p.add_argument("--tolerance", type=float, help="largest accepted |measured - predicted| (default 0.05)")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="worker processes")
    p.add_argument("--shapes", help="comma-separated BxN pairs, e.g. 8x4,16x8 (B a multiple of 8)")
    p.add_argument("--traces", help="comma-separated trace presets")
    p.add_argument("--phis", help="comma-separated phi values")
    p.add_argument("--mus", help="comma-separated mu values")
    p.add_argument("--seed", type=int, help="trace seed (default 0)")
    p.add_argument("--small", action="store_true", help="start from the small test grid instead of the default")
    p.set_defaults(func=run_command)


def build_grid(args: argparse.Namespace):
    """The TheoremGrid the arguments describe; ValueError names a bad argument."""
    import dataclasses

    from gyre.analysis.theorem import SMALL_GRID, TheoremGrid

    grid = SMALL_GRID if args.small else TheoremGrid()
    changes = {}
    if args.shapes:
        changes["shapes"] = tuple(_pair(text) for text in args.shapes.split(","))
    if args.traces:
        changes["traces"] = tuple(t.strip() for t in args.traces.split(",") if t.strip())
    if args.phis:
        changes["phis"] = tuple(_number(t, "phis", float) for t in args.phis.split(","))
    if args.mus:
        changes["mus"] = tuple(_number(t, "mus", int) for t in args.mus.split(","))
    for name in ("steps", "tolerance", "seed"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    return dataclasses.replace(grid, **changes)


def _pair(text: str) -> tuple[int, int]:
    B, sep, N = text.strip().lower().partition("x")
    if not sep:
        raise ValueError(f"--shapes: {text!r} is not BxN, e.g. 8x4")
    return _number(B, "shapes", int), _number(N, "shapes", int)


def _number(text: str, option: str, kind: type):
    try:
        return kind(text.strip())
    except ValueError:
        raise ValueError(f"--{option}: cannot parse {text!r} as {kind.__name__}") from None


def run_command(args: argparse.Namespace) -> int:
    import json

    from tqdm import tqdm

    from gyre.analysis.theorem import run_theorem, validate
    from gyre.analysis.theorem_report import format_report, report_json
    from gyre.config import ConfigError
    from gyre.sim.traces.presets import UnknownPresetError

    try:
        grid = build_grid(args)
        validate(grid)
        total = len(grid.points())
        with tqdm(total=total, desc="theorem grid", unit="run", disable=None, leave=False) as bar:
            report = run_theorem(grid, jobs=max(1, args.jobs), on_point=lambda i, n, row: bar.update(1))
    except (ConfigError, UnknownPresetError, ValueError) as exc:
        print(f"gyre theorem: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report_json(report), indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.json}")
    return 0 if report.passed else 1
