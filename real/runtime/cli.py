"""``gyre run --config FILE``: one real run (SGLang CPU engines, proxy, harnesses, training cells).

The TOML file holds a ``[job]`` table of ``runtime.job.JobConfig`` fields;
``--set name=value`` overrides one field (parsed as TOML, e.g. ``steps=20``).
Progress (start-up phases, one line per trained step, and a bar with the
current step, burst and cell roles on a terminal, else one ``progress:`` line
per step: ``runtime.progress``) goes to stderr; each step's metrics are
written live to ``WORKDIR/metrics.jsonl`` and ``WORKDIR/tb/``; the
run's summary (staleness, reward curve, replay check) is printed to stdout as
JSON; the whole summary is in ``WORKDIR/summary.json``. Exits 0 only when the
run finished and the replay differential check held; 2, with the reason and
before anything starts, on a bad job file or ``--set``.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="run a real job: SGLang engines + proxy + harnesses + training cells")
    parser.add_argument("--config", required=True, help="job configuration (.toml with a [job] table)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override one JobConfig field (TOML value)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import tomllib

    from gyre.real.runtime.job import load_job_config, run_job

    overrides = {}
    try:
        for item in args.set:
            name, _, value = item.partition("=")
            overrides[name.strip()] = tomllib.loads(f"v = {value}")["v"]
        job = load_job_config(args.config, **overrides)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"gyre run: error: {exc}", file=sys.stderr)
        return 2
    from gyre.real.runtime.lifetime import terminate_on_sigterm
    from gyre.real.runtime.progress import RunDisplay

    terminate_on_sigterm()  # `kill PID` stops engines, cells and harnesses in order, as Ctrl-C does
    display = RunDisplay(job.steps, sys.stderr)  # a bar on a terminal, plain lines otherwise
    try:
        summary = run_job(job, progress=display.line, watch=display.record)
    finally:
        display.close()
    keys = ("steps", "published", "replay_identical", "staleness_mean", "staleness_predicted", "reward_curve",
            "step_wall_s", "outcomes", "trace", "log", "timings")
    print(json.dumps({k: summary[k] for k in keys}, indent=2, default=str))
    return 0 if summary["replay_identical"] and summary["published"] >= summary["steps"] else 1
