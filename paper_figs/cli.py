"""``gyre figs``: regenerate the paper figures as PNG and SVG.

    gyre figs --out DIR [--quick] [--only fig1_role_timeline,fig3_step_speedup]

Runs ``gyre.paper_figs.make_all`` headlessly, printing one line per figure.
Exit status 0 on success, 2 on bad input (unknown figure name).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("figs", help="regenerate the paper figures (PNG + SVG) from simulations")
    p.add_argument("--out", type=Path, required=True, help="directory for the figure files")
    p.add_argument("--quick", action="store_true", help="tiny runs (seconds; for tests and previews)")
    p.add_argument("--only", help="comma-separated figure names to regenerate (default: all)")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from gyre.paper_figs.make_all import FIGURES, make_all

    only = tuple(n.strip() for n in args.only.split(",") if n.strip()) if args.only else None
    unknown = sorted(set(only or ()) - set(FIGURES))
    if unknown:
        print(f"gyre figs: error: unknown figure(s) {', '.join(unknown)}; known: {', '.join(FIGURES)}",
              file=sys.stderr)
        return 2
    written = make_all(args.out, quick=args.quick, only=only, progress=print)
    print(f"wrote {len(written)} files to {args.out}")
    return 0
