"""``gyre trace``: generate, inspect and calibrate rollout-duration traces.

Subcommands (each handler is ``func(args) -> int``):

* ``gen --preset P --queries Q --seed S --out FILE [--N 16]`` writes a
  synthetic trace (CSV or Parquet by suffix) and prints a one-line summary;
* ``stats [FILE] [--preset P] [--N N] [--queries Q] [--seed S]`` prints the
  statistics table of FILE, with the preset's targets beside the achieved
  values when ``--preset`` is given; without FILE it generates Q queries
  (default 20,000, seed 0) from the named preset, or from every preset, and
  prints for each target: its value, its source ("paper" or "ours"), the
  achieved value, the fit error and the verdict (``format_stats_table``);
* ``presets [NAME ...]`` describes presets (all when none is named);
* ``fit --preset P [--queries Q] [--seed S]`` re-derives a preset's fitted
  parameters (how the hard-coded values in ``traces.presets`` were made) and
  prints them as Python keyword arguments beside the achieved table.

A ``TraceError`` or an unknown preset name prints ``gyre trace: error:
<message>`` (the latter listing the known presets) on stderr and returns 2;
nothing else is caught. ``register`` imports nothing beyond argparse: numpy,
pandas and scipy load inside the handlers, so ``gyre --help`` stays fast.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable

PROG = "gyre trace"


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn trace errors into a one-line message and exit status 2."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        from gyre.formats.trace import TraceError
        from gyre.sim.traces.presets import UnknownPresetError

        try:
            return handler(args)
        except (TraceError, UnknownPresetError) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2

    return run


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


@_guarded
def cmd_gen(args: argparse.Namespace) -> int:
    """Generate a synthetic trace from a preset and save it."""
    import numpy as np

    from gyre.formats.trace import save_trace
    from gyre.sim.traces.presets import generate_trace
    from gyre.sim.traces.stats import trace_stats

    trace = generate_trace(args.preset, args.queries, np.random.default_rng(args.seed), N=args.N)
    path = save_trace(trace, args.out)
    s = trace_stats(trace)
    print(
        f"wrote {path}: preset {args.preset}, seed {args.seed}, {trace.queries} queries x N={trace.N}; "
        f"mean execution {s['mean_execution_h']:.2f} h, mean query {s['mean_query_h']:.2f} h, "
        f"{100 * s['queries_over_4h']:.1f}% of queries > 4 h"
    )
    return 0


def _compared(stats: dict, preset) -> str:
    from gyre.sim.traces.stats import format_stats_table

    return format_stats_table(stats, preset.targets, sources=preset.sources, bounds=preset.bounds)


@_guarded
def cmd_stats(args: argparse.Namespace) -> int:
    """Print a trace's statistics beside a preset's targets, or every preset's fit."""
    import numpy as np

    from gyre.formats.trace import load_trace
    from gyre.sim.traces.presets import PRESETS, generate_trace, get_preset
    from gyre.sim.traces.stats import format_stats_table, trace_stats

    named = get_preset(args.preset) if args.preset else None
    if args.file is not None:
        stats = trace_stats(load_trace(args.file, N=args.N))
        print(_compared(stats, named) if named else format_stats_table(stats))
        return 0
    presets = [named] if named else [PRESETS[name] for name in sorted(PRESETS)]
    blocks = []
    for preset in presets:
        trace = generate_trace(preset, args.queries, np.random.default_rng(args.seed), N=args.N or preset.N)
        heading = f"preset {preset.name}: generated, seed {args.seed}"
        blocks.append(f"{heading}\n{_compared(trace_stats(trace), preset)}")
    print("\n\n".join(blocks))
    return 0


@_guarded
def cmd_presets(args: argparse.Namespace) -> int:
    """Describe the named presets, or all of them."""
    from gyre.sim.traces.presets import PRESETS, get_preset

    names = args.names or sorted(PRESETS)
    print("\n\n".join(get_preset(name).describe() for name in names))
    return 0


def _trajectory_shares(model, seed: int, queries: int, N: int) -> dict[str, float]:
    """Kept-token shares of a trace generated from ``model`` (``traces.stats.trajectory_stats``)."""
    import dataclasses

    import numpy as np

    from gyre.sim.traces.presets import TracePreset, generate_trace
    from gyre.sim.traces.stats import trajectory_stats

    preset = TracePreset(name="fitted", model=dataclasses.replace(model), targets={}, sources={})
    return trajectory_stats(generate_trace(preset, queries, np.random.default_rng(seed), N=N))


@_guarded
def cmd_fit(args: argparse.Namespace) -> int:
    """Refit a preset's shape parameters to its targets and print them."""
    import numpy as np

    from gyre.sim.traces.fit import FITTED_FIELDS, TRAJECTORY_FIELDS, fit_model
    from gyre.sim.traces.presets import draw_variates, get_preset, realize_counts, realize_durations
    from gyre.sim.traces.stats import count_stats, duration_stats

    preset = get_preset(args.preset)
    model = fit_model(preset.model, preset.targets, queries=args.queries, seed=args.seed, N=preset.N)
    variates = draw_variates(np.random.default_rng(args.seed + 1), args.queries, preset.N)
    durations_s, codes, active_s = realize_durations(model, variates)
    stats = {"queries": args.queries, "N": preset.N, **duration_stats(durations_s, codes)}
    stats.update(count_stats(realize_counts(model, variates, active_s)))
    stats.update(_trajectory_shares(model, args.seed + 1, min(args.queries, 10_000), preset.N))
    print(f"# {preset.name}: fitted on {args.queries} queries x {preset.N}, seed {args.seed}")
    for field in (*FITTED_FIELDS, "tokens_per_call", *TRAJECTORY_FIELDS):
        print(f"{field}={getattr(model, field):.4f},")
    print(f"\nachieved on a fresh sample (seed {args.seed + 1}):")
    print(_compared(stats, preset))
    return 0


def _help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def show(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return show


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``trace`` command and its subcommands to a ``gyre`` parser."""
    preset_help = "preset name (list them with `gyre trace presets`)"
    trace = subparsers.add_parser("trace", help="generate and inspect rollout-duration traces")
    trace.set_defaults(func=_help(trace))
    sub = trace.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")

    gen = sub.add_parser("gen", help="write a synthetic trace from a preset")
    gen.add_argument("--preset", required=True, help=preset_help)
    gen.add_argument("--queries", required=True, type=_positive_int)
    gen.add_argument("--seed", required=True, type=int)
    gen.add_argument("--out", required=True, help="output file, .csv or .parquet")
    gen.add_argument("--N", type=_positive_int, default=16, help="executions per query (default 16)")
    gen.set_defaults(func=cmd_gen)

    stats = sub.add_parser("stats", help="print a trace's statistics, or every preset's targets vs achieved")
    stats.add_argument("file", nargs="?", help="trace file; without it, generate from the preset(s)")
    stats.add_argument("--preset", help="show this preset's targets beside the achieved values")
    stats.add_argument("--N", type=_positive_int, default=None,
                       help="required group size (default: inferred; for generated traces: the preset's)")
    stats.add_argument("--queries", type=_positive_int, default=20_000, help="generated queries (default 20000)")
    stats.add_argument("--seed", type=int, default=0, help="seed of generated traces (default 0)")
    stats.set_defaults(func=cmd_stats)

    describe = sub.add_parser("presets", help="describe presets")
    describe.add_argument("names", nargs="*", metavar="NAME", help="presets to describe (default: all)")
    describe.set_defaults(func=cmd_presets)

    fit = sub.add_parser("fit", help="refit a preset's parameters to its targets")
    fit.add_argument("--preset", required=True, help=preset_help)
    fit.add_argument("--queries", type=_positive_int, default=100_000)
    fit.add_argument("--seed", type=int, default=20240601)
    fit.set_defaults(func=cmd_fit)
    return trace
