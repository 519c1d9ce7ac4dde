"""The ``gyre`` command line.

Each subcommand lives in its own module exposing ``register(subparsers)``,
which adds one sub-parser and sets ``func(args) -> int``. Modules import their
heavy dependencies inside ``func`` so ``gyre --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES: tuple[str, ...] = (
    "gyre.sim.cli",
    "gyre.sim.traces.cli",
    "gyre.real.store.cli",
    "gyre.analysis.theorem_cli",
    "gyre.analysis.sweep",
    "gyre.analysis.sensitivity",
    "gyre.analysis.sim_vs_real",
    "gyre.analysis.run_trace",
    "gyre.analysis.plan",
    "gyre.paper_figs.cli",
    "gyre.real.proxy.cli",
    "gyre.real.runtime.cli",
    "gyre.real.supervisor.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gyre", description="Elastic RL for long-horizon LLM agents.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
