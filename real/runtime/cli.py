"""``gyre run --config FILE``: one real run (SGLang CPU engines, proxy, harnesses, training cells).

The TOML file holds a ``[job]`` table read into ``runtime.job_config.JobConfig``;
``--set section.field=value`` overrides one field, in the syntax ``gyre sim``
takes too (``gyre.overrides``): a section of the job's tree and its field
(``--set training.lr=0.01``, ``--set harness.name=codex``), ``job.<key>`` for
any ``[job]`` key (``--set job.steps=20``, or ``--set steps=20``), or one entry
of a table: ``schedule.<SchedulerConfig field>`` (``--set schedule.phi=0.5``,
or ``--set phi=0.5``), ``model.<key>``, ``cluster.<key>``, ``layout.<key>``,
``harness_options.<key>`` (``set_sections``). Values are TOML; a bare word is
text (``--set workdir=runs/x``).
Progress (start-up phases, one line per trained step, and a bar with the
current step, burst and cell roles on a terminal, else one ``progress:`` line
per step: ``runtime.progress``) goes to stderr; each step's metrics are
written live to ``WORKDIR/metrics.jsonl`` and ``WORKDIR/tb/``; the
run's summary (staleness, reward curve, replay check) is printed to stdout as
JSON; the whole summary is in ``WORKDIR/summary.json``. Exits 0 only when the
run finished and the replay differential check held; 2, with the reason and
before anything starts, on a bad job file or ``--set``. ``--cluster ADDRESS``
places the run on that Ray cluster (the ``[cluster]`` table's ``address``;
``real.cluster``): run it on the cluster's head node. ``gyre run --resume
DIR`` goes on with a killed run from its last burst-boundary checkpoint
(``runtime.resume``); a folder that is not a run, a finished run or one a
live job holds exits 2 naming the problem, touching nothing. A training cell
that dies during the run comes back the same way: the job stops
(``runtime.job.CellFailed``) and resumes itself from its last checkpoint, up to
the job's ``cell_restarts`` times (the steps since that checkpoint are redone;
executions recorded since are re-admitted, those cut are re-run).

Quiet by default (``runtime.quiet``): third-party warnings and logs are
filtered, in this process and the ones it starts; ``--verbose`` shows
everything. Each engine's full output is in ``WORKDIR/engine-logs``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="run a real job: SGLang engines + proxy + harnesses + training cells")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="job configuration (.toml with a [job] table)")
    source.add_argument("--resume", metavar="DIR", help="go on with the killed run in DIR from its last checkpoint "
                                                        "(runtime.resume; its own job.json, no --set)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one field: job.steps=20 (or steps=20), schedule.phi=0.5 (or phi=0.5), "
                             "model.checkpoint=DIR, cluster.address=auto, ... (TOML value; a bare word is text)")
    parser.add_argument("--cluster", metavar="ADDRESS", default=None,
                        help="place the run on the Ray cluster at ADDRESS (HOST:PORT of the head, or auto); "
                             "overrides [cluster] address")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party warnings and logs too (default: Gyre's own lines only)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the placement and memory plan and exit (nothing starts; runtime.layout)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gyre.real.runtime.quiet import quiet_third_parties

    quiet_third_parties(verbose=args.verbose)  # before torch or any engine, cell or proxy is imported or started
    from gyre.real.runtime.job import load_job_config

    if args.resume is not None:
        return _resume(args)
    try:
        fields, tables = job_overrides(args.set)
        if args.cluster is not None:
            tables.setdefault("cluster", {})["address"] = args.cluster
        job = load_job_config(args.config, tables=tables, **fields)
        from gyre.real.runtime.layout import plan_lines, preflight

        if args.dry_run:
            print("\n".join(plan_lines(job)))
        preflight(job, device_check=not args.dry_run)  # no CUDA, or a plan that cannot fit: one line, nothing started
        if args.dry_run and job.cluster is not None:  # each cell and process placed for real, printed, released
            from gyre.real.cluster.dry_run import placed_plan_lines
            from gyre.real.cluster.placement import PlacementError

            try:
                print("\n".join(placed_plan_lines(job)))
            except PlacementError as exc:
                raise ValueError(f"placement: {exc}") from None
        if args.dry_run:
            return 0
    except ValueError as exc:
        given = " ".join(f"--set {item}" for item in args.set)
        print(f"gyre run: error: {exc}{f' (with {given})' if given and '--set' not in str(exc) else ''}",
              file=sys.stderr)
        return 2
    return _run(job)


def set_sections() -> dict[str, list[str] | None]:
    """What ``--set SECTION.FIELD`` names: ``job`` (any ``[job]`` key, as the file spells it), each section
    of the job's tree (``runtime.job_config``) with its fields, and the entries of the file's tables
    (``schedule``: SchedulerConfig fields; ``layout``: GpuLayout's; ``cluster``: ClusterConfig's;
    ``harness_options``: any key). ``job`` comes first, so a bare ``FIELD`` is a ``[job]`` key when it is one."""
    from gyre.config import SchedulerConfig
    from gyre.real.cluster.config import ClusterConfig
    from gyre.real.runtime.job_config import JobConfig
    from gyre.real.runtime.job_file import SECTIONS, job_to_table
    from gyre.real.runtime.layout import GpuLayout

    entries = {"schedule": SchedulerConfig, "layout": GpuLayout, "cluster": ClusterConfig}
    sections: dict[str, list[str] | None] = {"job": [*job_to_table(JobConfig()), "layout", "cluster"]}
    for name in (*SECTIONS, "cluster"):
        own = [f.name for f in dataclasses.fields(SECTIONS[name])] if name in SECTIONS else []
        table = entries.get(name)
        sections[name] = own + [f.name for f in dataclasses.fields(table) if f.name not in own] if table else own
    sections["harness_options"] = None
    return sections


def job_overrides(items: list[str]) -> tuple[dict, dict[str, dict]]:
    """``--set`` assignments as whole ``[job]`` keys and entries of its tables (``load_job_config``), each
    value checked against its field's type; errors name the flag and the field."""
    from gyre.overrides import check_type, parse_assignments, toml_value

    fields: dict[str, Any] = {}
    tables: dict[str, dict[str, Any]] = {}
    for a in parse_assignments("--set", items, set_sections()):
        path, default = _file_path(a.section, a.field)
        value = check_type(a, toml_value(a), default)
        if len(path) == 1:
            fields[path[0]] = value
        else:
            tables.setdefault(path[0], {})[path[1]] = value
    return fields, tables


def _file_path(section: str, name: str) -> tuple[tuple[str, ...], Any]:
    """Where ``section.name`` of ``--set`` lives in the job file, and the default its value is checked
    against (None: any value; the field's own check judges it)."""
    from gyre.config import SchedulerConfig
    from gyre.real.runtime.job_file import field_default, field_path

    path = (name,) if section == "job" else field_path(section, name) or (section, name)
    if path[0] == "schedule":
        defaults = {f.name: f.default for f in dataclasses.fields(SchedulerConfig)}
        return path, None if defaults.get(path[1]) is dataclasses.MISSING else defaults.get(path[1])
    return path, field_default(path)


def _resume(args: argparse.Namespace) -> int:
    from gyre.real.runtime.resume import ResumeError, plan_resume

    if args.set or args.cluster is not None:
        print("gyre run: error: --resume runs the folder's own job.json: --set and --cluster do not apply",
              file=sys.stderr)
        return 2
    try:
        plan = plan_resume(args.resume)
    except ResumeError as exc:
        print(f"gyre run: error: {exc}", file=sys.stderr)
        return 2
    print(f"gyre run: resuming {plan.work} at version {plan.version} (checkpoint "
          f"{plan.checkpoint.name if plan.checkpoint else 'none: from the start'}, events[0:{plan.position}] kept, "
          f"{plan.discarded} discarded{'; ' + plan.torn if plan.torn else ''})", file=sys.stderr)
    return _run(plan.job, plan)


def run_restarting(job, plan=None, *, run, replan) -> dict:
    """``run(job, plan)``'s summary; after a dead training cell (``CellFailed``) the job resumes from
    ``replan(job.workdir)`` (its last checkpoint), at most ``cell_restarts`` times, then the failure is
    raised. ``gyre run`` passes ``job.run_job`` and ``resume.plan_resume``."""
    from gyre.real.runtime.job import CellFailed

    restarts = job.training.cell_restarts
    for restart in range(restarts + 1):
        try:
            return run(job, plan)
        except CellFailed as exc:  # the cell comes back: the whole job resumes from its last checkpoint
            if restart == restarts:
                raise
            plan = replan(job.workdir)
            job = plan.job
            print(f"gyre run: {exc}; resuming at version {plan.version} from "
                  f"{plan.checkpoint.name if plan.checkpoint else 'the start'} (restart {restart + 1} of "
                  f"{restarts})", file=sys.stderr)
    raise AssertionError("unreachable: the last restart returns or raises")


def _run(job, plan=None) -> int:
    from gyre.real.runtime import job as job_module
    from gyre.real.runtime.lifetime import terminate_on_sigterm
    from gyre.real.runtime.progress import RunDisplay
    from gyre.real.runtime.resume import ResumeError, plan_resume

    terminate_on_sigterm()  # `kill PID` stops engines, cells and harnesses in order, as Ctrl-C does
    display = RunDisplay(job.steps, sys.stderr)  # a bar on a terminal, plain lines otherwise
    try:
        summary = run_restarting(job, plan, replan=plan_resume, run=lambda job, plan: job_module.run_job(
            job, progress=display.line, watch=display.record, resume=plan))
    except ResumeError as exc:  # a work folder a live job holds (nothing wiped or moved), or a resume that cannot go on
        print(f"gyre run: error: {exc}", file=sys.stderr)
        return 2
    finally:
        display.close()
    keys = ("steps", "published", "replay_identical", "staleness_mean", "staleness_predicted", "reward_curve",
            "reward_trend", "step_wall_s", "outcomes", "trace", "log", "timings")
    print(json.dumps({k: summary[k] for k in keys}, indent=2, default=str))
    return 0 if summary["replay_identical"] and summary["published"] >= summary["steps"] else 1
